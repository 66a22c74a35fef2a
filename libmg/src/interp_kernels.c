/* The interpreter's instances of the nest kernel (nest_kernels.h): one per term kind and op, so
 * that no per-element dispatch remains. This file is compiled once for the baseline target and,
 * on x86-64 with gcc or clang, again with AVX2 and with AVX-512 enabled (MG_ISA names the build);
 * interpret.c picks the widest the CPU runs. Each build adds the same terms in the same order
 * (lanewise IEEE arithmetic, no contraction), so all compute the same bits. */
/* elementwise rows without per-block set-up (nest_kernels.h, mgk_elem_rows) */
#define MGK_ELEM_ROWS 1
#include "ir.h"

#ifndef MG_ISA
#define MG_ISA base
#endif
#define MG__CAT2(a, b) a##b
#define MG__CAT(a, b) MG__CAT2(a, b)

/* Nests with at most three outer and two reduction dims (nearly all: the third outer dim is, for
 * example, the steps of a recurrent chain that hoist.c sank out of its loop) run an instance for
 * their term and op that skips the other loops (mgk_nest_shape's `small`); the others run one
 * instance per term kind with the op dispatched per element (rare, and kept few: every instance
 * costs compile time, three times over). */
#define MG__SMALL(N) ((N)->n[0] == 1 && (N)->n[4] == 1 && (N)->n[5] == 1)

static void general_op(const mgk_nest *N, const mgk_run *R) {
    mgk_nest_shape(N, R, MGK_T_OP, N->op, 0);
}
static void general_da(const mgk_nest *N, const mgk_run *R) {
    mgk_nest_shape(N, R, MGK_T_DA, N->op, 0);
}
static void general_db(const mgk_nest *N, const mgk_run *R) {
    mgk_nest_shape(N, R, MGK_T_DB, N->op, 0);
}

typedef void (*nest_fn)(const mgk_nest *, const mgk_run *);

static void nest_one(const mgk_nest *N, const mgk_run *R) {
    if (MG__SMALL(N)) mgk_nest_shape(N, R, MGK_T_ONE, 0, 1);
    else mgk_nest_shape(N, R, MGK_T_ONE, 0, 0);
}
static void nest_mul(const mgk_nest *N, const mgk_run *R) {
    if (MG__SMALL(N)) mgk_nest_shape(N, R, MGK_T_MUL, 0, 1);
    else mgk_nest_shape(N, R, MGK_T_MUL, 0, 0);
}
/* max reductions (reroll.c folds chains of max alone), of their elements or of their ReLUs */
static void nest_maxr(const mgk_nest *N, const mgk_run *R) {
    if (N->pre == MG_OP_RELU) mgk_maxr(N, R, MGK_T_MAXR, MG_OP_MAX, MG_OP_RELU);
    else if (!N->pre) mgk_maxr(N, R, MGK_T_MAXR, MG_OP_MAX, 0);
    else mgk_maxr(N, R, MGK_T_MAXR, MG_OP_MAX, N->pre);
}
static void nest_dmaxr(const mgk_nest *N, const mgk_run *R) {
    if (N->pre == MG_OP_RELU) mgk_maxr(N, R, MGK_T_DMAXR, MG_OP_MAX, MG_OP_RELU);
    else if (!N->pre) mgk_maxr(N, R, MGK_T_DMAXR, MG_OP_MAX, 0);
    else mgk_maxr(N, R, MGK_T_DMAXR, MG_OP_MAX, N->pre);
}

#if defined(MG_FEW_KERNELS)
/* sanitizer builds: the per-term instances only (instrumenting ~50 inlined kernels takes minutes);
 * the same code, with the op read at run time */
#define MG__NEST_FNS(id, name, sym, ar, f, da, db)                                                 \
    static void nest_op_##id(const mgk_nest *N, const mgk_run *R) { general_op(N, R); }            \
    static void nest_da_##id(const mgk_nest *N, const mgk_run *R) { general_da(N, R); }            \
    static void nest_db_##id(const mgk_nest *N, const mgk_run *R) { general_db(N, R); }
#else
#define MG__NEST_FNS(id, name, sym, ar, f, da, db)                                                 \
    static void nest_op_##id(const mgk_nest *N, const mgk_run *R) {                                \
        mgk_nest_shape(N, R, MGK_T_OP, MG_OP_##id, 1);                                             \
    }                                                                                              \
    static void nest_da_##id(const mgk_nest *N, const mgk_run *R) {                                \
        mgk_nest_shape(N, R, MGK_T_DA, MG_OP_##id, 1);                                             \
    }                                                                                              \
    static void nest_db_##id(const mgk_nest *N, const mgk_run *R) {                                \
        mgk_nest_shape(N, R, MGK_T_DB, MG_OP_##id, 1);                                             \
    }
#endif
#define MG__NEST_NONE(id, name, sym)
MG_OP_LIST(MG__NEST_FNS, MG__NEST_NONE)
#undef MG__NEST_FNS

#define MG__ROW_OP(id, name, sym, ar, f, da, db) [MG_OP_##id] = nest_op_##id,
#define MG__ROW_DA(id, name, sym, ar, f, da, db) [MG_OP_##id] = nest_da_##id,
#define MG__ROW_DB(id, name, sym, ar, f, da, db) [MG_OP_##id] = nest_db_##id,
static const nest_fn op_fns[MG_OP_COUNT] = {MG_OP_LIST(MG__ROW_OP, MG__NEST_NONE)};
static const nest_fn da_fns[MG_OP_COUNT] = {MG_OP_LIST(MG__ROW_DA, MG__NEST_NONE)};
static const nest_fn db_fns[MG_OP_COUNT] = {MG_OP_LIST(MG__ROW_DB, MG__NEST_NONE)};
#undef MG__ROW_OP
#undef MG__ROW_DA
#undef MG__ROW_DB
#undef MG__NEST_NONE

void MG__CAT(mg__run_nest_, MG_ISA)(const mgk_nest *N, const mgk_run *R);
void MG__CAT(mg__run_nest_, MG_ISA)(const mgk_nest *N, const mgk_run *R) {
    nest_fn fn = NULL;
    int small = MG__SMALL(N);
    switch (N->term) {
    case MGK_T_ONE: fn = nest_one; break;
    case MGK_T_MUL: fn = nest_mul; break;
    case MGK_T_OP: fn = small ? op_fns[N->op] : general_op; break;
    case MGK_T_DA: fn = small ? da_fns[N->op] : general_da; break;
    case MGK_T_DB: fn = small ? db_fns[N->op] : general_db; break;
    case MGK_T_MAXR: fn = nest_maxr; break;
    case MGK_T_DMAXR: fn = nest_dmaxr; break;
    default: break;
    }
    if (fn) fn(N, R);
}

/* The driver's loops (ir.h, mg_ir__step_d): separate arrays (restrict), so that they vectorise. */
#define MG__STEP_FN(name, T)                                                                       \
    void name(T *restrict w, T *restrict g0, T *restrict g1, size_t from, size_t to, T scale,      \
              int zero);                                                                           \
    void name(T *restrict w, T *restrict g0, T *restrict g1, size_t from, size_t to, T scale,      \
              int zero) {                                                                          \
        size_t q;                                                                                  \
        if (g1 && zero)                                                                            \
            for (q = from; q < to; q++) {                                                          \
                w[q] -= scale * (g0[q] + g1[q]);                                                   \
                g0[q] = 0;                                                                         \
                g1[q] = 0;                                                                         \
            }                                                                                      \
        else if (g1)                                                                               \
            for (q = from; q < to; q++) w[q] -= scale * (g0[q] + g1[q]);                           \
        else if (zero)                                                                             \
            for (q = from; q < to; q++) {                                                          \
                w[q] -= scale * g0[q];                                                             \
                g0[q] = 0;                                                                         \
            }                                                                                      \
        else                                                                                       \
            for (q = from; q < to; q++) w[q] -= scale * g0[q];                                     \
    }
MG__STEP_FN(MG__CAT(mg__step_d_, MG_ISA), double)
MG__STEP_FN(MG__CAT(mg__step_f_, MG_ISA), float)
#undef MG__STEP_FN

void MG__CAT(mg__to_float_, MG_ISA)(float *restrict dst, const double *restrict src, size_t n);
void MG__CAT(mg__to_float_, MG_ISA)(float *restrict dst, const double *restrict src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
}

void MG__CAT(mg__from_float_, MG_ISA)(double *restrict dst, const float *restrict src, size_t n);
void MG__CAT(mg__from_float_, MG_ISA)(double *restrict dst, const float *restrict src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
}
