/* The interpreter: runs one nest over double slot arrays, with the kernel of nest_kernels.h
 * (interp_kernels.c's instances, built for the widest vector unit the CPU has) or the compiled
 * kernel a generated library provides for it. The programs' walk (variadic ops, sequential
 * loops) is the driver's, drive.h. */
#include "ir.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The kernel builds (interp_kernels.c), the widest the CPU runs chosen on first use: each one's
 * nest kernel and the driver's loops (ir.h). */
typedef struct isa_build {
    const char *name;
    void (*run_nest)(const mgk_nest *, const mgk_run *);
    void (*step_d)(double *, double *, double *, size_t, size_t, double, int);
    void (*step_f)(float *, float *, float *, size_t, size_t, float, int);
    void (*to_float)(float *, const double *, size_t);
    void (*from_float)(double *, const float *, size_t);
} isa_build;

#define MG__ISA_DECL(isa)                                                                          \
    void mg__run_nest_##isa(const mgk_nest *N, const mgk_run *R);                                  \
    void mg__step_d_##isa(double *w, double *g0, double *g1, size_t from, size_t to, double scale, \
                          int zero);                                                               \
    void mg__step_f_##isa(float *w, float *g0, float *g1, size_t from, size_t to, float scale,     \
                          int zero);                                                               \
    void mg__to_float_##isa(float *dst, const double *src, size_t n);                              \
    void mg__from_float_##isa(double *dst, const float *src, size_t n);                            \
    static const isa_build isa_##isa = {#isa,                                                      \
                                        mg__run_nest_##isa,                                        \
                                        mg__step_d_##isa,                                          \
                                        mg__step_f_##isa,                                          \
                                        mg__to_float_##isa,                                        \
                                        mg__from_float_##isa};
MG__ISA_DECL(base)
#if defined(MG_HAVE_ISA_BUILDS)
MG__ISA_DECL(avx2)
MG__ISA_DECL(avx512)
#endif
#undef MG__ISA_DECL

static _Atomic(const isa_build *) chosen;

/* Whether `s`, without blanks around it and in any case, is `word` (lower case). */
static int is_word(const char *s, const char *word) {
    while (*s == ' ' || *s == '\t') s++;
    for (; *word; s++, word++)
        if ((*s >= 'A' && *s <= 'Z' ? *s - 'A' + 'a' : *s) != *word) return 0;
    while (*s == ' ' || *s == '\t') s++;
    return *s == '\0';
}

/* The environment variable MG_ISA (`baseline`, `avx2` or `avx512`, in any case) caps the choice,
 * read once (the first nest run or mg_tape_kernel_isa() call): valgrind 3.19, for one, reports
 * AVX2 but cannot decode all of it (`vmovq xmm, xmm`); it also lets one kernel build be compared
 * with another. Other values are ignored (mg_tape_kernel_isa() says which build runs). */
static int isa_cap(void) {
    const char *s = getenv("MG_ISA");
    if (!s) return 2;
    if (is_word(s, "baseline")) return 0;
    if (is_word(s, "avx2")) return 1;
    return 2;
}

static const isa_build *choose(void) {
    const isa_build *b = &isa_base;
    int cap = isa_cap();
    (void)cap;
#if defined(MG_HAVE_ISA_BUILDS)
    __builtin_cpu_init();
    if (cap >= 2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
        b = &isa_avx512;
    else if (cap >= 1 && __builtin_cpu_supports("avx2")) b = &isa_avx2;
#endif
    atomic_store_explicit(&chosen, b, memory_order_relaxed);
    return b;
}

static const isa_build *build(void) {
    const isa_build *b = atomic_load_explicit(&chosen, memory_order_relaxed);
    return b ? b : choose();
}

const char *mg_tape_kernel_isa(void) {
    const isa_build *b = build();
    return b == &isa_base ? "baseline" : b->name;
}

void mg_ir__run_nest(const mg_tape *t, size_t k, const mgk_run *R) {
    if (t->kern && t->kern[k]) {
        t->kern[k](R);
        return;
    }
    build()->run_nest(&t->nests[k], R);
}

void mg_ir__step_d(double *w, double *g0, double *g1, size_t from, size_t to, double scale,
                   int zero) {
    build()->step_d(w, g0, g1, from, to, scale, zero);
}

void mg_ir__step_f(float *w, float *g0, float *g1, size_t from, size_t to, float scale, int zero) {
    build()->step_f(w, g0, g1, from, to, scale, zero);
}

void mg_ir__to_float(float *dst, const double *src, size_t n) { build()->to_float(dst, src, n); }

void mg_ir__from_float(double *dst, const float *src, size_t n) {
    build()->from_float(dst, src, n);
}

/* ---- fingerprint: what generated code must have been written from --------------------------- */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001B3ull;
    return h;
}

uint64_t mg_ir__fingerprint(const mg_tape *t) {
    uint64_t h = 0xCBF29CE484222325ull;
    size_t sizes[] = {t->nslots,   t->nparams, t->nconsts, t->ninputs, t->ntargets,
                      t->noutputs, t->nnests,  t->nfwd,    t->nbwd,    t->nix,
                      t->shared0,  t->nsh_fwd, t->nsh_bwd};
    h = fnv(h, sizes, sizeof sizes);
    if (t->nnests) h = fnv(h, t->nests, t->nnests * sizeof(mgk_nest));
    if (t->nfwd) h = fnv(h, t->fwd, t->nfwd * sizeof(mg_instr));
    if (t->nbwd) h = fnv(h, t->bwd, t->nbwd * sizeof(mg_instr));
    if (t->nix) h = fnv(h, t->ix, t->nix * sizeof(mgk_idx));
    return h ? h : 1;
}
