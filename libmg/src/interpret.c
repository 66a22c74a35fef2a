/* The interpreter: runs programs over slot arrays. Each nest runs the kernel of nest_kernels.h
 * (interp_kernels.c's instances, built for the widest vector unit the CPU has), or the compiled
 * kernel a generated library provides for it. */
#include "ir.h"

#include <stdatomic.h>
#include <string.h>

/* The kernel builds (interp_kernels.c), the widest the CPU runs chosen on first use. */
typedef void (*run_fn)(const mgk_nest *, const mgk_run *);
void mg__run_nest_base(const mgk_nest *N, const mgk_run *R);
#if defined(MG_HAVE_ISA_BUILDS)
void mg__run_nest_avx2(const mgk_nest *N, const mgk_run *R);
void mg__run_nest_avx512(const mgk_nest *N, const mgk_run *R);
#endif

static _Atomic(run_fn) chosen;

static run_fn choose(void) {
    run_fn fn = mg__run_nest_base;
#if defined(MG_HAVE_ISA_BUILDS)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
        fn = mg__run_nest_avx512;
    else if (__builtin_cpu_supports("avx2")) fn = mg__run_nest_avx2;
#endif
    atomic_store_explicit(&chosen, fn, memory_order_relaxed);
    return fn;
}

const char *mg_ir__isa(void) {
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

/* Whether a run is one sample over the tape's own layout (the per-sample arrays are the shared
 * ones from the first input slot on): then variadic ops read their operand slots directly. */
static int flat(const mg_tape *t, const mgk_run *R) {
    return R->nb <= 1 && R->a[MGK_BD] == R->a[MGK_D] + t->input0 &&
           R->a[MGK_BG] == R->a[MGK_G] + t->input0;
}

/* The element of slot `slot` for sample `s` of a run. */
static double *slot_at(const mg_tape *t, const mgk_run *R, int grad, mgk_idx slot, mgk_i64 s) {
    if (slot >= t->input0) return R->a[grad ? MGK_BG : MGK_BD] + s * R->ss + (slot - t->input0);
    return R->a[grad ? MGK_G : MGK_D] + slot;
}

static void run_one(const mg_tape *t, const mg_instr *in, mg_exec *E) {
    mgk_run *R = &E->R;
    switch (in->kind) {
    case MG_I_NEST: mg_ir__run_nest(t, in->a, R); break;
    case MG_I_NARY:
        if (flat(t, R)) {
            double *d = R->a[MGK_D];
            d[in->out] =
                mg_op__nary_fwd(in->op, in->flags & MG_FLAG_BIAS, d, t->ix + in->a, in->b, in->n);
            break;
        }
        /* a batch: each sample's operands gathered into scratch, read with the identity index */
        for (mgk_i64 s = 0; s < (R->nb > 1 ? R->nb : 1); s++) {
            for (uint32_t i = 0; i < in->b; i++)
                E->scratch[i] = *slot_at(t, R, 0, t->ix[in->a + i], s);
            *slot_at(t, R, 0, in->out, s) = mg_op__nary_fwd(in->op, in->flags & MG_FLAG_BIAS,
                                                            E->scratch, t->identity, in->b, in->n);
        }
        break;
    case MG_I_NARY_BWD:
        if (flat(t, R)) {
            double *d = R->a[MGK_D], *g = R->a[MGK_G];
            mg_op__nary_bwd(in->op, in->flags & MG_FLAG_BIAS, d, g, t->ix + in->a, in->b, in->n,
                            g[in->out]);
            break;
        }
        for (mgk_i64 s = 0; s < (R->nb > 1 ? R->nb : 1); s++) {
            double *sd = E->scratch, *sg = E->scratch + t->nary_max;
            for (uint32_t i = 0; i < in->b; i++) {
                sd[i] = *slot_at(t, R, 0, t->ix[in->a + i], s);
                sg[i] = 0.0;
            }
            mg_op__nary_bwd(in->op, in->flags & MG_FLAG_BIAS, sd, sg, t->identity, in->b, in->n,
                            *slot_at(t, R, 1, in->out, s));
            for (uint32_t i = 0; i < in->b; i++) {
                mgk_idx slot = t->ix[in->a + i];
                if (slot >= t->input0 || slot < t->nparams) *slot_at(t, R, 1, slot, s) += sg[i];
            }
        }
        break;
    default: break;
    }
}

void mg_ir__run(const mg_tape *t, const mg_instr *prog, size_t len, mg_exec *E, int cone) {
    mgk_run *R = &E->R;
    for (size_t i = 0; i < len; i++) {
        const mg_instr *in = &prog[i];
        if (in->kind == MG_I_SEQ) {
            const mg_instr *body = in + 1;
            size_t blen = in->a, T = in->b;
            if (!cone || (in->cone & cone)) {
                for (size_t it = 0; it < T; it++) {
                    R->t = (mgk_i64)(in->flags ? T - 1 - it : it);
                    for (size_t q = 0; q < blen; q++)
                        if (!cone || (body[q].cone & cone)) run_one(t, &body[q], E);
                }
                R->t = 0;
            }
            i += blen;
            continue;
        }
        if (!cone || (in->cone & cone)) run_one(t, in, E);
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
    size_t sizes[] = {t->nslots,   t->nparams, t->nconsts, t->ninputs, t->ntargets,
                      t->noutputs, t->nnests,  t->nfwd,    t->nbwd,    t->nix};
    h = fnv(h, sizes, sizeof sizes);
    if (t->nnests) h = fnv(h, t->nests, t->nnests * sizeof(mgk_nest));
    if (t->nfwd) h = fnv(h, t->fwd, t->nfwd * sizeof(mg_instr));
    if (t->nbwd) h = fnv(h, t->bwd, t->nbwd * sizeof(mg_instr));
    if (t->nix) h = fnv(h, t->ix, t->nix * sizeof(mgk_idx));
    return h ? h : 1;
}
