/* The interpreter: runs one nest over double slot arrays, with the kernel of nest_kernels.h
 * (interp_kernels.c's instances, built for the widest vector unit the CPU has) or the compiled
 * kernel a generated library provides for it. The programs' walk (variadic ops, sequential
 * loops) is the driver's, drive.h. */
#include "ir.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The kernel builds (interp_kernels.c), the widest the CPU runs chosen on first use. */
typedef void (*run_fn)(const mgk_nest *, const mgk_run *);
void mg__run_nest_base(const mgk_nest *N, const mgk_run *R);
#if defined(MG_HAVE_ISA_BUILDS)
void mg__run_nest_avx2(const mgk_nest *N, const mgk_run *R);
void mg__run_nest_avx512(const mgk_nest *N, const mgk_run *R);
#endif

static _Atomic(run_fn) chosen;

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

static run_fn choose(void) {
    run_fn fn = mg__run_nest_base;
    int cap = isa_cap();
    (void)cap;
#if defined(MG_HAVE_ISA_BUILDS)
    __builtin_cpu_init();
    if (cap >= 2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
        fn = mg__run_nest_avx512;
    else if (cap >= 1 && __builtin_cpu_supports("avx2")) fn = mg__run_nest_avx2;
#endif
    atomic_store_explicit(&chosen, fn, memory_order_relaxed);
    return fn;
}

const char *mg_tape_kernel_isa(void) {
    run_fn fn = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (!fn) fn = choose();
#if defined(MG_HAVE_ISA_BUILDS)
    if (fn == mg__run_nest_avx512) return "avx512";
    if (fn == mg__run_nest_avx2) return "avx2";
#endif
    return "baseline";
}

void mg_ir__run_nest(const mg_tape *t, size_t k, const mgk_run *R) {
    if (t->kern && t->kern[k]) {
        t->kern[k](R);
        return;
    }
    run_fn fn = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (!fn) fn = choose();
    fn(&t->nests[k], R);
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
                      t->noutputs, t->nnests,  t->nfwd,    t->nbwd,    t->nix};
    h = fnv(h, sizes, sizeof sizes);
    if (t->nnests) h = fnv(h, t->nests, t->nnests * sizeof(mgk_nest));
    if (t->nfwd) h = fnv(h, t->fwd, t->nfwd * sizeof(mg_instr));
    if (t->nbwd) h = fnv(h, t->bwd, t->nbwd * sizeof(mg_instr));
    if (t->nix) h = fnv(h, t->ix, t->nix * sizeof(mgk_idx));
    return h ? h : 1;
}
