/* The interpreter: runs programs over slot arrays. Each nest runs the kernel of nest_kernels.h,
 * instantiated here once per term kind and op (so that no per-element dispatch remains), or the
 * compiled kernel a generated library provides for it. */
#include "ir.h"

#include <string.h>

static void nest_one(const mgk_nest *N, const mgk_run *R) { mgk_nest_run(N, R, MGK_T_ONE, 0); }
static void nest_mul(const mgk_nest *N, const mgk_run *R) { mgk_nest_run(N, R, MGK_T_MUL, 0); }

#define MG__NEST_FNS(id, name, sym, ar, f, da, db)                                                          \
    static void nest_op_##id(const mgk_nest *N, const mgk_run *R) { mgk_nest_run(N, R, MGK_T_OP, MG_OP_##id); } \
    static void nest_da_##id(const mgk_nest *N, const mgk_run *R) { mgk_nest_run(N, R, MGK_T_DA, MG_OP_##id); } \
    static void nest_db_##id(const mgk_nest *N, const mgk_run *R) { mgk_nest_run(N, R, MGK_T_DB, MG_OP_##id); }
#define MG__NEST_NONE(id, name, sym)
MG_OP_LIST(MG__NEST_FNS, MG__NEST_NONE)
#undef MG__NEST_FNS

typedef void (*nest_fn)(const mgk_nest *, const mgk_run *);

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

void mg_ir__run_nest(const mg_tape *t, size_t k, const mgk_run *R) {
    if (t->kern && t->kern[k]) {
        t->kern[k](R);
        return;
    }
    const mgk_nest *N = &t->nests[k];
    nest_fn fn = NULL;
    switch (N->term) {
    case MGK_T_ONE: fn = nest_one; break;
    case MGK_T_MUL: fn = nest_mul; break;
    case MGK_T_OP: fn = op_fns[N->op]; break;
    case MGK_T_DA: fn = da_fns[N->op]; break;
    case MGK_T_DB: fn = db_fns[N->op]; break;
    default: break;
    }
    if (fn) fn(N, R);
}

static void run_one(const mg_tape *t, const mg_instr *in, mgk_run *R) {
    switch (in->kind) {
    case MG_I_NEST: mg_ir__run_nest(t, in->a, R); break;
    case MG_I_NARY: {
        double *d = R->a[MGK_D];
        d[in->out] = mg_op__nary_fwd(in->op, in->flags & MG_FLAG_BIAS, d, t->ix + in->a, in->b, in->n);
        break;
    }
    case MG_I_NARY_BWD: {
        double *d = R->a[MGK_D], *g = R->a[MGK_G];
        mg_op__nary_bwd(in->op, in->flags & MG_FLAG_BIAS, d, g, t->ix + in->a, in->b, in->n, g[in->out]);
        break;
    }
    default: break;
    }
}

void mg_ir__run(const mg_tape *t, const mg_instr *prog, size_t len, mgk_run *R, int cone) {
    for (size_t i = 0; i < len; i++) {
        const mg_instr *in = &prog[i];
        if (in->kind == MG_I_SEQ) {
            const mg_instr *body = in + 1;
            size_t blen = in->a, T = in->b;
            if (!cone || (in->cone & cone)) {
                for (size_t it = 0; it < T; it++) {
                    R->t = (mgk_i64)(in->flags ? T - 1 - it : it);
                    for (size_t q = 0; q < blen; q++)
                        if (!cone || (body[q].cone & cone)) run_one(t, &body[q], R);
                }
                R->t = 0;
            }
            i += blen;
            continue;
        }
        if (!cone || (in->cone & cone)) run_one(t, in, R);
    }
}

/* ---- fingerprint: what generated code must have been written from --------------------------- */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001B3ull;
    return h;
}

uint64_t mg_ir__fingerprint(const mg_tape *t) {
    uint64_t h = 0xCBF29CE484222325ull;
    size_t sizes[] = {t->nslots, t->nparams, t->nconsts, t->ninputs, t->ntargets, t->noutputs, t->nnests, t->nfwd,
                      t->nbwd, t->nix};
    h = fnv(h, sizes, sizeof sizes);
    if (t->nnests) h = fnv(h, t->nests, t->nnests * sizeof(mgk_nest));
    if (t->nfwd) h = fnv(h, t->fwd, t->nfwd * sizeof(mg_instr));
    if (t->nbwd) h = fnv(h, t->bwd, t->nbwd * sizeof(mg_instr));
    if (t->nix) h = fnv(h, t->ix, t->nix * sizeof(mgk_idx));
    return h ? h : 1;
}
