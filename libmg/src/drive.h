/* Running and training tapes: single-sample calls, epochs, batches and threads. This text is the
 * one driver for both storage types: fit.c includes it over double slot arrays (the tape's own,
 * run by the interpreter or compiled kernels), fit32.c over float32 ones (code emitted with
 * float32 storage, every nest compiled). The includer defines mgk_real (kernels.h) and:
 *   MG_DRV(name)      the name of an entry point for this storage type (name_f64, name_f32)
 *   MG_R_DATA(t) ...  the tape's slot arrays of this type: data, grad, pw, pg
 *   MG_RUN_NEST(t, k, R)  runs nest k
 *   MG_DRV_LINK       the entry points' linkage (static where the includer alone calls them)
 *
 * Batch size 1 runs on the tape's own arrays, sample after sample, the parameters' gradient nests
 * applying SGD themselves where schedule.c fused it; where it paired such a nest with the forward
 * nest that alone reads those weights (pre-steps), the nest's step waits for the next sample's
 * forward: backward keeps the elements the nest would read, and the forward nest steps each
 * weight as it reads it (the last sample's backward runs the nest itself).
 *
 * A batch of B samples is cut into C = min(B, MG_FIT_CHUNKS) chunks of consecutive samples,
 * whatever the thread count. A chunk runs its samples through the programs nest by nest (at most
 * MG_FIT_SUB at a time, fewer where their slots would not stay in cache (MG_FIT_SUB_BYTES), in
 * per-sample arrays `ss` slots apart): each nest runs over all of them
 * (several samples per register tile where the nest is a matrix product), and a parameter's
 * gradient sums over the samples in sample order inside the nest. The chunks' gradients are added
 * in chunk order, then the step, in ranges of the parameters (on one thread, the parameters whose
 * gradient nest schedule.c fused are stepped by that nest as the last chunk ends, with the other
 * chunk's gradient added first: the same operations). Where the whole batch is in flight at once
 * and its samples' slots fit MG_FIT_BATCH_BYTES (and MG_FIT_SUB samples), those nests instead run
 * after the chunks, over the batch's samples, in bands of rows on threads (MG_FIT_DEFER_MAX
 * below). The chunks, the ranges and the bands are work
 * items that threads claim (see "threads" below); a thread only decides which item it runs, so
 * parameters come out bitwise the same for any thread count. Threads wait for each other by
 * spinning, then yielding: a batch lasts microseconds, and a sleeping wait per phase would cost a
 * large part of it. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

/* ---- prefetching the inputs -------------------------------------------------------------------
 * A fit reads each row of X once, in the epoch's order, which it knows ahead. Copying a row in
 * when it is needed waits for memory (the hardware prefetcher does not cross into a row's next
 * page in time, and not at all in a shuffled order), and asking for a whole batch's rows at once
 * achieved little more: of a burst of hundreds of prefetches most were lost (a float32 MLP at
 * batch 32, shuffled, still spent 10% of its fit copying rows in). So a run asks for the rows of
 * samples it runs later (the next ones in flight; at batch size 1, two samples ahead) a share at
 * a time, after each nest it runs: `budget` lines per nest, the rows spread evenly over the
 * nests (copying in: 3% of that fit; the same rows asked for at twice or four times the rate:
 * 3.5% and 4.5%, counting the asking). */
typedef struct mg_prefetch {
    const char *base;    /* X or X32 */
    size_t row;          /* bytes per row */
    const size_t *perm;  /* rows in the epoch's order (NULL: in order) */
    size_t at, end;      /* the positions in that order still to ask for */
    size_t line, budget; /* the next line of row perm[at]; lines per nest */
} mg_prefetch;

static void prefetch_some(mg_prefetch *P) {
#if defined(__GNUC__) || defined(__clang__)
    for (size_t left = P->budget; left && P->at < P->end;) {
        const size_t row = P->perm ? P->perm[P->at] : P->at;
        const uintptr_t p = (uintptr_t)(P->base + row * P->row);
        const uintptr_t a = p & ~(uintptr_t)63, end = p + P->row;
        for (; left && a + 64 * P->line < end; left--, P->line++)
            __builtin_prefetch((const void *)(a + 64 * P->line), 0, 2);
        if (a + 64 * P->line >= end) P->at++, P->line = 0;
    }
#else
    P->at = P->end;
#endif
}

/* ---- programs ---------------------------------------------------------------------------------
 * A run of a program: the kernels' view, and scratch (2 * nary_max slots) for the variadic ops of
 * a batch, whose operands are gathered per sample. */
typedef struct mg_exec {
    mgk_run R;
    mgk_real *scratch;
    mgk_idx *scratch_ix; /* nary_max entries: an operand list relative to the first input slot */
    /* batch 1 with pre-steps: where backward keeps the elements of deferred steps (the next
     * sample's QD and QG), and whether it defers them */
    mgk_real *keep_d, *keep_g;
    int defer;
    int skip_steps;  /* the fused steps' nests run after the chunks (fit_run::defer) */
    int loss_in_bwd; /* a fit: a cross-entropy loss is computed with its gradient (xent_last) */
    int batch;       /* a chunk of a batch: the shared values' programs run outside it */
    mg_prefetch pf;  /* input rows brought towards the cache while this run's nests compute */
} mg_exec;

/* The shared values' nests (ir.h: t->nsh_fwd, t->nsh_bwd) run in every run where a batch does not
 * run them apart: single samples, and a tape whose shared nests are not all before (after) the
 * others (then a batch runs on one thread: two chunks would write one slot). Their gradients start
 * from zero in each backward that runs them; in a batch, in each chunk (run_chunk). */
static int shared_inline(const mg_tape *t) { return t->shared0 < t->input0 && !t->nsh_fwd; }
/* Zeroes the shared values' gradients in g that a nest adds into before any writes them. */
static void zero_shared(const mg_tape *t, mgk_real *g) {
    for (size_t i = 0; i < t->nzero_sh; i += 2)
        memset(g + t->zero[i], 0, (t->zero[i + 1] - t->zero[i]) * sizeof(mgk_real));
}
/* Where a run's forward program starts and how much of the backward one it runs: a batch's
 * chunks leave the shared values' programs out. */
static size_t fwd0(const mg_tape *t, int batch) { return batch ? t->nsh_fwd : 0; }
static size_t bwd_len(const mg_tape *t, int batch) {
    return batch ? t->nbwd - t->nsh_bwd : t->nbwd;
}
/* Instruction i of a program on (a program without instructions may be NULL). */
static const mg_instr *from(const mg_instr *prog, size_t i) { return prog ? prog + i : prog; }

#define MG_FIT_CHUNKS 2
#define MG_FIT_SUB 64 /* samples of a chunk in flight at once, at most */
/* ... and at most as many as keep their slots and gradients within this many bytes (a quarter of
 * a 1 MB L2, which also holds the weights, their gradients and the next samples' input rows; at
 * least one sample): a nest runs over all samples in flight before the next nest starts, so a
 * model with large per-sample state (a CNN's activations) would otherwise stream it through
 * memory once per nest (cnn48 at batch 32: 2.2k -> 4.2k images/s). Half the L2 held 32 of the
 * MLP's float64 samples (64 of float32), whose slots with the weights and their gradients
 * overflowed it: on one thread batch 128 ran 3% (float32 7%) slower than with 16 (32), and the
 * zoo families at batch 32 up to 10% slower (two threads' float64 batch 128 and 256 lost 2-4%
 * with 16).
 * The number in flight depends on the batch size and the model, never on the
 * thread count; it decides in which order the contributions of different nests to one
 * parameter's gradient are added, so it is part of what a batch computes, the same on every
 * backend. */
#ifndef MG_FIT_SUB_BYTES
#define MG_FIT_SUB_BYTES (256 * 1024)
#endif
/* A whole batch whose samples' slots and gradients fit this many bytes (and MG_FIT_SUB samples)
 * runs its fused steps' gradient nests after its chunks (fit_run::defer). */
#ifndef MG_FIT_BATCH_BYTES
#define MG_FIT_BATCH_BYTES (512 * 1024)
#endif

/* Whether a run is one sample over the tape's own layout (the per-sample arrays are the shared
 * ones from the first input slot on): then variadic ops read their operand slots directly. */
static int flat(const mg_tape *t, const mgk_run *R) {
    return R->nb <= 1 && R->a[MGK_BD] == R->a[MGK_D] + t->input0 &&
           R->a[MGK_BG] == R->a[MGK_G] + t->input0;
}

/* The element of slot `slot` for sample `s` of a run. */
static mgk_real *slot_at(const mg_tape *t, const mgk_run *R, int grad, mgk_idx slot, mgk_i64 s) {
    if (slot >= t->input0) return R->a[grad ? MGK_BG : MGK_BD] + s * R->ss + (slot - t->input0);
    return R->a[grad ? MGK_G : MGK_D] + slot;
}

/* A deferred step: what its gradient nest would read, kept for the next sample's forward. */
static void keep(const mg_prestep *P, mg_exec *E) {
    const mgk_run *R = &E->R;
    memcpy(E->keep_g + P->glo, R->a[MGK_BG] + P->glo, (size_t)(P->ghi - P->glo) * sizeof(mgk_real));
    memcpy(E->keep_d + P->xlo, R->a[MGK_BD] + P->xlo, (size_t)(P->xhi - P->xlo) * sizeof(mgk_real));
}

/* Whether a variadic op of a batch reads only per-sample slots (a loss over a sample's outputs and
 * its target) and writes one: then E->scratch_ix holds its operand list relative to the first
 * input slot, and each sample's op reads and adds into that sample's slots in place. (Otherwise
 * its operands are gathered per sample, since some are shared: a parameter, a constant.) A loss
 * of 10 classes gathered 11 operands and scattered 11 gradients per sample: 3% of a float32 MLP's
 * batch-32 fit. */
static int per_sample(const mg_tape *t, const mg_instr *in, mg_exec *E) {
    if (!E->scratch_ix || in->out < t->input0) return 0;
    for (uint32_t i = 0; i < in->b; i++) {
        const mgk_idx slot = t->ix[in->a + i];
        if (slot < t->input0) return 0;
        E->scratch_ix[i] = slot - t->input0;
    }
    return 1;
}

/* Whether `in`, a variadic op of a fit, is a cross-entropy that is the loss itself, whose value a
 * fit takes from the backward (mgk_xent_grad) instead of computing its exps twice (with copy_in's
 * targets: MLP batch 32 1.02x, float32 1.05x; batch 1 1.01x). Nothing in the forward reads the
 * loss; the backward seeds its gradient before the op's gradient runs. */
static int xent_last(const mg_tape *t, const mg_instr *in, const mg_exec *E) {
    return E->loss_in_bwd && in->op == MG_OP_XENT && in->out == t->loss;
}

static void run_one(const mg_tape *t, const mg_instr *in, mg_exec *E) {
    mgk_run *R = &E->R;
    const mgk_i64 nb = R->nb;
    /* shared slots alone (a batch that runs them in its chunks, shared_inline): once, not once
     * per sample, whose sums into a shared output would count it nb times */
    if (nb > 1 && (in->kind == MG_I_NEST ? t->info[in->a].shared : in->out < t->input0)) R->nb = 1;
    switch (in->kind) {
    case MG_I_NEST:
        if (E->defer && t->info[in->a].pre) keep(&t->pre[t->info[in->a].pre - 1], E);
        else if (!(E->skip_steps && (t->nests[in->a].flags & MGK_F_STEP))) MG_RUN_NEST(t, in->a, R);
        break;
    case MG_I_NARY:
        if (flat(t, R)) {
            if (xent_last(t, in, E)) break;
            mgk_real *d = R->a[MGK_D];
            d[in->out] =
                mg_op__nary_fwd(in->op, in->flags & MG_FLAG_BIAS, d, t->ix + in->a, in->b, in->n);
            break;
        }
        if (per_sample(t, in, E)) { /* each sample's slots read in place */
            if (xent_last(t, in, E)) break;
            const mgk_idx o = in->out - t->input0;
            for (mgk_i64 s = 0; s < (R->nb > 1 ? R->nb : 1); s++) {
                mgk_real *d = R->a[MGK_BD] + s * R->ss;
                d[o] = (mgk_real)mg_op__nary_fwd(in->op, in->flags & MG_FLAG_BIAS, d, E->scratch_ix,
                                                 in->b, in->n);
            }
            break;
        }
        /* a batch: each sample's operands gathered into scratch, read with the identity index */
        for (mgk_i64 s = 0; s < (R->nb > 1 ? R->nb : 1); s++) {
            for (uint32_t i = 0; i < in->b; i++)
                E->scratch[i] = *slot_at(t, R, 0, t->ix[in->a + i], s);
            *slot_at(t, R, 0, in->out, s) = (mgk_real)mg_op__nary_fwd(
                in->op, in->flags & MG_FLAG_BIAS, E->scratch, t->identity, in->b, in->n);
        }
        break;
    case MG_I_NARY_BWD:
        if (flat(t, R)) {
            mgk_real *d = R->a[MGK_D], *g = R->a[MGK_G];
            if (xent_last(t, in, E)) {
                double loss;
                mgk_xent_grad(d, g, t->ix + in->a, in->n, g[in->out], &loss);
                d[in->out] = (mgk_real)loss;
                break;
            }
            mg_op__nary_bwd(in->op, in->flags & MG_FLAG_BIAS, d, g, t->ix + in->a, in->b, in->n,
                            g[in->out]);
            break;
        }
        if (per_sample(t, in, E)) { /* the gradients added in place, as at batch size 1 */
            const mgk_idx o = in->out - t->input0;
            const int with_loss = xent_last(t, in, E);
            for (mgk_i64 s = 0; s < (R->nb > 1 ? R->nb : 1); s++) {
                mgk_real *d = R->a[MGK_BD] + s * R->ss, *g = R->a[MGK_BG] + s * R->ss;
                if (with_loss) {
                    double loss;
                    mgk_xent_grad(d, g, E->scratch_ix, in->n, g[o], &loss);
                    d[o] = (mgk_real)loss;
                    continue;
                }
                mg_op__nary_bwd(in->op, in->flags & MG_FLAG_BIAS, d, g, E->scratch_ix, in->b, in->n,
                                g[o]);
            }
            break;
        }
        for (mgk_i64 s = 0; s < (R->nb > 1 ? R->nb : 1); s++) {
            mgk_real *sd = E->scratch, *sg = E->scratch + t->nary_max;
            for (uint32_t i = 0; i < in->b; i++) {
                sd[i] = *slot_at(t, R, 0, t->ix[in->a + i], s);
                sg[i] = 0.0;
            }
            mg_op__nary_bwd(in->op, in->flags & MG_FLAG_BIAS, sd, sg, t->identity, in->b, in->n,
                            *slot_at(t, R, 1, in->out, s));
            for (uint32_t i = 0; i < in->b; i++) {
                mgk_idx slot = t->ix[in->a + i];
                if (slot >= t->shared0 || slot < t->nparams) *slot_at(t, R, 1, slot, s) += sg[i];
            }
        }
        break;
    default: break;
    }
    R->nb = nb;
}

/* Runs a program; with `cone` nonzero, only instructions with one of those cone flags. */
static void run_prog(const mg_tape *t, const mg_instr *prog, size_t len, mg_exec *E, int cone) {
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
                        if (!cone || (body[q].cone & cone)) {
                            run_one(t, &body[q], E);
                            if (E->pf.at < E->pf.end) prefetch_some(&E->pf);
                        }
                }
                R->t = 0;
            }
            i += blen;
            continue;
        }
        if (!cone || (in->cone & cone)) {
            run_one(t, in, E);
            if (E->pf.at < E->pf.end) prefetch_some(&E->pf);
        }
    }
}

/* How many nests run_prog runs (what prefetch_some's budget is spread over). */
static size_t prog_calls(const mg_instr *prog, size_t len, int cone) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        const mg_instr *in = &prog[i];
        if (in->kind == MG_I_SEQ) {
            if (!cone || (in->cone & cone))
                for (size_t q = 0; q < in->a; q++)
                    n += !cone || (in[1 + q].cone & cone) ? in->b : 0;
            i += in->a;
            continue;
        }
        n += !cone || (in->cone & cone);
    }
    return n;
}

/* Nests a fit runs per sample (batch size 1) or per samples in flight (`batch`: without the
 * shared values' programs). */
static size_t fit_calls(const mg_tape *t, int batch) {
    const size_t f0 = fwd0(t, batch);
    return prog_calls(from(t->fwd, f0), t->nfwd - f0, MG_FZ_LOSS_CONE) +
           prog_calls(t->bwd, bwd_len(t, batch), 0);
}

/* Batch size 1: the row asked for while a sample runs is this many samples ahead. */
#define MG_FIT_AHEAD 2

/* Sets `P` up to ask for the rows of X (or X32) in `perm` order, spread over `calls` nests. */
static void prefetch_init(mg_prefetch *P, const mg_tape *t, const double *X, const float *X32,
                          const size_t *perm, size_t rows, size_t calls) {
    memset(P, 0, sizeof *P);
    if (!t->ninputs || (!X && !X32)) return;
    P->base = X32 ? (const char *)X32 : (const char *)X;
    P->row = t->ninputs * (X32 ? sizeof(float) : sizeof(double));
    P->perm = perm;
    const size_t lines = rows * (P->row / 64 + 2);
    P->budget = calls ? (lines + calls - 1) / calls : lines;
}

/* Asks for the rows at positions [at, end) of the epoch's order, from their first line. */
static void prefetch_rows(mg_prefetch *P, size_t at, size_t end) {
    P->at = at;
    P->end = P->base ? end : at;
    P->line = 0;
}

/* One sample over the tape's own arrays (the per-sample ones are views of them). */
static void init_flat(const mg_tape *t, mg_exec *E, mgk_real *d, mgk_real *g) {
    memset(E, 0, sizeof *E);
    mgk_run *R = &E->R;
    R->a[MGK_D] = d;
    R->a[MGK_G] = g;
    R->a[MGK_PW] = MG_R_PW(t);
    R->a[MGK_PG] = MG_R_PG(t);
    R->a[MGK_BD] = d + t->input0;
    R->a[MGK_BG] = g + t->input0;
    R->ix = t->ix;
    R->nb = 1;
}

/* Per-sample slots from the first input on, padded (nest_kernels.h's partial blocks). */
static size_t sample_stride(const mg_tape *t) { return t->nslots - t->input0 + MGK_PAD; }

/* n values of the caller's (double) into slots of this storage type. */
static void copy_in(mgk_real *dst, const double *src, size_t n) {
#if MGK_REAL_BYTES == 8
    memcpy(dst, src, n * sizeof(double));
#else
    if (n < 16) /* a sample's targets: a call through the kernel build costs more than they do */
        for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
    else mg_ir__to_float(dst, src, n); /* in the CPU's vectors */
#endif
}

/* n of the caller's float values (mg_fit_options.X32) into slots of this storage type. */
static void copy_in32(mgk_real *dst, const float *src, size_t n) {
#if MGK_REAL_BYTES == 8
    mg_ir__from_float(dst, src, n);
#else
    memcpy(dst, src, n * sizeof(float));
#endif
}

/* Input row `row` of the caller's doubles X, or floats X32 when not NULL, into `dst`: in column
 * order, or through the layout reroll.c chose (t->in_perm), each element converted as copy_in and
 * copy_in32 convert it. */
static void load_row(const mg_tape *t, mgk_real *dst, const double *X, const float *X32,
                     size_t row) {
    const size_t n = t->ninputs;
    const mgk_idx *perm = t->in_perm;
    if (!n) return;
    if (perm && X32) {
        for (size_t k = 0; k < n; k++) dst[k] = (mgk_real)X32[row * n + perm[k]];
    } else if (perm) {
        for (size_t k = 0; k < n; k++) dst[k] = (mgk_real)X[row * n + perm[k]];
    } else if (X32) {
        copy_in32(dst, X32 + row * n, n);
    } else {
        copy_in(dst, X + row * n, n);
    }
}

static void load(const mg_tape *t, mgk_real *d, const double *x, const double *y) {
    if (x) load_row(t, d + t->input0, x, NULL, 0);
    if (y) copy_in(d + t->target0, y, t->ntargets);
}

/* The loss of a run's sample `q` (per-sample arrays `ss` apart); a loss below the inputs is a
 * shared leaf, read where a call keeps it (pw for a packed parameter). */
static double loss_of(const mg_tape *t, const mgk_run *R, mgk_i64 q) {
    if (t->loss >= t->input0) return R->a[MGK_BD][q * R->ss + (mgk_i64)(t->loss - t->input0)];
    if (t->loss_pw != SIZE_MAX) return MG_R_PW(t)[t->loss_pw];
    return MG_R_DATA(t)[t->loss];
}

/* Packing in and out of calls (below). */
static void pack_in(mg_tape *t);
static void pack_out(mg_tape *t);
static void unpack_grad(mg_tape *t);

/* Backward of the run's samples: fresh gradients for every computed value, each loss seeded. */
static void backward(const mg_tape *t, mg_exec *E) {
    const mgk_run *R = &E->R;
    const size_t in0 = t->input0;
    for (mgk_i64 s = 0; s < R->nb; s++) {
        mgk_real *bg = R->a[MGK_BG] + s * R->ss; /* slot k of this sample at bg[k - input0] */
        if (t->rerolled) /* only what is not written first by a nest (schedule.c) */
            for (size_t i = t->nzero_sh; i < t->nzero; i += 2)
                memset(bg + (t->zero[i] - in0), 0,
                       (t->zero[i + 1] - t->zero[i]) * sizeof(mgk_real));
        else memset(bg + (t->first_op - in0), 0, (t->nslots - t->first_op) * sizeof(mgk_real));
        if (t->loss >= in0) bg[t->loss - in0] = 1.0;
        else if (t->loss_pw != SIZE_MAX) /* a packed parameter: its gradient lives in pg */
            R->a[MGK_PG][t->loss_pw] += 1.0;
        else if (t->loss < t->nparams)
            R->a[MGK_G][t->loss] += 1.0; /* the loss is a parameter itself: d loss/d p = 1 */
    }
    if (!E->batch || shared_inline(t)) zero_shared(t, R->a[MGK_G]); /* fresh, as the values' */
    run_prog(t, t->bwd, bwd_len(t, E->batch), E, 0);
}

/* ---- targets ----------------------------------------------------------------------------------
 */

/* Targets read from the data that a loss gives a meaning: cross-entropy's (from Y, or from X when
 * a graph uses an input as the class) must be class indices, anything else is a NaN loss; hinge's
 * labels in Y must be -1 or +1 (its sign convention: a 0/1 dataset would train class 0 to
 * nothing). Checks rows [0, n) before anything trains, naming the first bad row and its column.
 * Labels that a graph computes, eager code passes, or inputs give hinge are not checked: the
 * ops take any real there (hinge is then the margin loss of real-valued labels). */
static int check_targets(mg_tape *t, const double *X, const float *X32, const double *Y, size_t n,
                         const char *what) {
    for (size_t i = 0; i < t->nfwd; i++) {
        const mg_instr *in = &t->fwd[i];
        if (in->kind != MG_I_NARY || (in->op != MG_OP_XENT && in->op != MG_OP_HINGE)) continue;
        int xent = in->op == MG_OP_XENT;
        size_t count = xent ? 1 : in->n; /* the target operands follow the n scores */
        for (size_t k = 0; k < count; k++) {
            mgk_idx ts = t->ix[in->a + in->n + k];
            const double *data = NULL;
            const float *data32 = NULL;
            size_t col, width;
            const char *name;
            if (Y && ts >= t->target0 && ts < t->target0 + t->ntargets) {
                data = Y, col = ts - t->target0, width = t->ntargets, name = "Y";
            } else if (xent && (X || X32) && ts >= t->input0 && ts < t->input0 + t->ninputs) {
                col = t->in_perm ? t->in_perm[ts - t->input0] : ts - t->input0;
                data = X, data32 = X32, width = t->ninputs, name = "X";
            } else {
                continue;
            }
            for (size_t r = 0; r < n; r++) {
                double y = data ? data[r * width + col] : (double)data32[r * width + col];
                if (xent && !(y >= 0.0 && y < (double)in->n && y == floor(y)))
                    return mg_tape__fail(t, MG_EINVAL,
                                         "%s: the target in row %zu, column %zu of %s is %.17g, "
                                         "not a class index in [0, %u) (cross-entropy over %u "
                                         "classes)",
                                         what, r, col, name, y, in->n, in->n);
                if (!xent && y != 1.0 && y != -1.0)
                    return mg_tape__fail(t, MG_EINVAL,
                                         "%s: the label in row %zu, column %zu of %s is %.17g: "
                                         "hinge labels are -1 or +1",
                                         what, r, col, name, y);
            }
        }
    }
    return MG_OK;
}

/* ---- single samples ---------------------------------------------------------------------------
 */

MG_DRV_LINK int MG_DRV(forward)(mg_tape *t, const double *x, const double *y) {
    if (!t) return MG_EINVAL;
    t->err[0] = '\0';
    if (check_targets(t, x, NULL, y, 1, "forward") != MG_OK) return MG_EINVAL;
    load(t, MG_R_DATA(t), x, y);
    pack_in(t);
    mg_exec E;
    init_flat(t, &E, MG_R_DATA(t), MG_R_GRAD(t));
    run_prog(t, t->fwd, t->nfwd, &E, 0);
    return MG_OK;
}

MG_DRV_LINK int MG_DRV(backward)(mg_tape *t) {
    if (!t) return MG_EINVAL;
    t->err[0] = '\0';
    if (!t->has_loss) return mg_tape__fail(t, MG_EINVAL, "backward: this program has no loss");
    pack_in(t);
    mg_exec E;
    init_flat(t, &E, MG_R_DATA(t), MG_R_GRAD(t));
    backward(t, &E);
    unpack_grad(t);
    return MG_OK;
}

/* A learning rate is a finite number of the slots' type (float32 storage: 1e39 would be inf, and
 * inf * 0 a NaN in every parameter with a zero gradient). */
#if MGK_REAL_BYTES == 8
#define MG_LR_OK(lr) isfinite(lr)
#define MG_LR_TYPE ""
#else
#define MG_LR_OK(lr) (isfinite(lr) && fabs(lr) <= FLT_MAX)
#define MG_LR_TYPE " in float32"
#endif

MG_DRV_LINK int MG_DRV(step)(mg_tape *t, double lr, size_t count) {
    if (!t) return MG_EINVAL;
    t->err[0] = '\0';
    if (!MG_LR_OK(lr))
        return mg_tape__fail(t, MG_EINVAL, "step: the learning rate %g is not finite" MG_LR_TYPE,
                             lr);
    mgk_step(MG_R_DATA(t), MG_R_GRAD(t), t->nparams, lr / (double)(count ? count : 1));
    return MG_OK;
}

/* The per-sample slots of `held` samples, `ss` apart, set to the values' frozen slots (what a
 * nest does not write reads as the frozen value). */
static void fill_frozen(const mg_tape *t, mgk_real *bd, size_t held, size_t ss) {
    for (size_t q = 0; q < held; q++)
        memcpy(bd + q * ss, MG_R_DATA(t) + t->input0, ss * sizeof(mgk_real));
}

/* Samples whose slots and gradients fit `bytes`: at least one, at most MG_FIT_SUB. */
static size_t samples_within(const mg_tape *t, size_t bytes) {
    const size_t ss = sample_stride(t);
    const size_t fits = bytes / (2 * ss * sizeof(mgk_real));
    return fits < 1 ? 1 : fits < MG_FIT_SUB ? fits : MG_FIT_SUB;
}

/* Samples in flight at once in a batched run (MG_FIT_SUB_BYTES). */
static size_t in_flight(const mg_tape *t) { return samples_within(t, MG_FIT_SUB_BYTES); }

/* predict in batches: rows run through the forward nests `sub` at a time, as a batched fit's
 * forward does (several samples per register tile where a nest is a matrix product: MLP rows
 * 3.2x faster than one at a time), each output computed as at batch size 1, so the same bits.
 * The tape's own slots are not touched. Returns 0, having done nothing, when a row at a time is
 * as good (one sample in flight) or there is no memory for the samples' slots. */
static int predict_rows(mg_tape *t, const double *X, size_t n, double *out) {
    const size_t ss = sample_stride(t), cap = in_flight(t), sub = n < cap ? n : cap;
    if (sub < 2) return 0; /* slots for at most the rows there are, in whole tiles */
    const size_t held = (sub + MGK_TS_MAX - 1) / MGK_TS_MAX * MGK_TS_MAX;
    mgk_real *bd = mg_tape__ws(t, MG_WS_BD, held, ss * sizeof(mgk_real), NULL); /* kept */
    mgk_real *scratch = mg_tape__ws(t, MG_WS_SCR, 2 * t->nary_max + 2, sizeof(mgk_real), NULL);
    mgk_idx *scratch_ix = mg_tape__ws(t, MG_WS_SIX, t->nary_max + 1, sizeof(mgk_idx), NULL);
    int done = bd && scratch && scratch_ix;
    if (done) {
        fill_frozen(t, bd, held, ss);
        mg_exec E;
        memset(&E, 0, sizeof E);
        mgk_run *R = &E.R;
        R->a[MGK_D] = MG_R_DATA(t);
        R->a[MGK_G] = MG_R_GRAD(t); /* not read: no forward nest reads gradients */
        R->a[MGK_PW] = MG_R_PW(t);
        R->a[MGK_PG] = MG_R_PG(t);
        R->a[MGK_BD] = R->a[MGK_BG] = bd;
        R->ix = t->ix;
        R->ss = (mgk_i64)ss;
        E.scratch = scratch;
        E.scratch_ix = scratch_ix;
        prefetch_init(&E.pf, t, X, NULL, NULL, sub, prog_calls(t->fwd, t->nfwd, MG_FZ_OUT_CONE));
        for (size_t k0 = 0; k0 < n; k0 += sub) {
            const size_t nb = n - k0 < sub ? n - k0 : sub;
            for (size_t q = 0; q < nb; q++) load_row(t, bd + q * ss, X, NULL, k0 + q);
            prefetch_rows(&E.pf, k0 + nb, n - (k0 + nb) < sub ? n : k0 + nb + sub);
            R->nb = (mgk_i64)nb;
            run_prog(t, t->fwd, t->nfwd, &E, MG_FZ_OUT_CONE);
            for (size_t q = 0; q < nb; q++)
                for (size_t j = 0; j < t->noutputs; j++)
                    out[(k0 + q) * t->noutputs + j] =
                        (double)*slot_at(t, R, 0, (mgk_idx)t->outputs[j], (mgk_i64)q);
        }
    }
    if (!done) { /* the call goes on a row at a time: no error */
        t->err[0] = '\0';
        t->status = MG_OK;
    }
    return done;
}

MG_DRV_LINK int MG_DRV(predict)(mg_tape *t, const double *X, size_t n, double *out) {
    if (!t) return MG_EINVAL;
    t->err[0] = '\0';
    if (n && ((!X && t->ninputs) || (!out && t->noutputs)))
        return mg_tape__fail(t, MG_EINVAL, "predict: NULL inputs or outputs");
    if (t->target_output < t->noutputs)
        return mg_tape__fail(t, MG_EINVAL,
                             "predict: output %zu is computed from the targets, which predict "
                             "does not take (use mg_tape_forward() with them, or leave that "
                             "output out)",
                             t->target_output);
    const size_t w = t->ninputs > t->noutputs ? t->ninputs : t->noutputs;
    if (w && n > SIZE_MAX / w / sizeof(double))
        return mg_tape__fail(t, MG_EINVAL,
                             "predict: %zu rows of %zu values overflow the address space", n, w);
    pack_in(t);
    if (n > 1 && predict_rows(t, X, n, out)) return MG_OK;
    mg_exec E; /* one row at a time over the tape's own arrays (a row, or no memory for more) */
    init_flat(t, &E, MG_R_DATA(t), MG_R_GRAD(t));
    for (size_t k = 0; k < n; k++) {
        load(t, MG_R_DATA(t), X + k * t->ninputs, NULL);
        run_prog(t, t->fwd, t->nfwd, &E, MG_FZ_OUT_CONE);
        for (size_t j = 0; j < t->noutputs; j++)
            out[k * t->noutputs + j] = MG_R_DATA(t)[t->outputs[j]];
    }
    return MG_OK;
}

/* ---- packing (schedule.c decides what is packed) -----------------------------------------------
 */

enum { PACK, UNPACK, UNPACK_GRAD };

/* PACK: pw[p] = data[slot] (pw is t->pw, or another array of t->npacked); UNPACK: the reverse;
 * UNPACK_GRAD: the packed gradients added into the parameters' gradients. Every call that runs
 * the program packs (the parameters may have changed through mg_tape_data()), so this is a
 * transposing copy, not a walk of each element's multi-index (which made a single-sample forward
 * of MLP(784,[50,10]) 190 us): rows of the last dim, and where that dim is strided in the slots
 * and the one before it is not (a layer's weights packed input by input), 8 rows at a time, so
 * that every slot line is touched once per 8 rows. */
static void pack_walk(mg_tape *t, int dir, mgk_real *pw) {
    mgk_real *data = MG_R_DATA(t), *grad = MG_R_GRAD(t), *tpw = MG_R_PW(t), *pg = MG_R_PG(t);
    for (size_t k = 0; k < t->npacks; k++) {
        const mg_pack *P = &t->packs[k];
        const int last = P->nd - 1;
        if (last < 0 || P->len == 0) continue; /* schedule.c packs at least one dim */
        const mgk_i64 n = P->n[last], s = P->s[last];
        const int tiled = last >= 1 && s != 1 && P->s[last - 1] == 1;
        mgk_i64 idx[MGK_MAXD] = {0};
        for (size_t i = 0; i < P->len;) {
            mgk_i64 rows = tiled ? P->n[last - 1] - idx[last - 1] : 1; /* rows 1 slot apart */
            if (rows > 8) rows = 8;
            const mgk_i64 slot = mg_pack__slot(P, idx);
            mgk_real *q = (dir == PACK ? pw : dir == UNPACK ? tpw : pg) + P->p0 + i;
            mgk_real *d = (dir == UNPACK_GRAD ? grad : data) + slot;
            for (mgk_i64 j = 0; j < n; j++)
                for (mgk_i64 r = 0; r < rows; r++) {
                    mgk_real *qq = q + r * n + j, *dd = d + r + j * s;
                    if (dir == PACK) *qq = *dd;
                    else if (dir == UNPACK) *dd = *qq;
                    else {
                        *dd += *qq;
                        *qq = 0;
                    }
                }
            i += (size_t)(rows * n);
            if (tiled) idx[last - 1] += rows - 1;
            idx[last] = n - 1; /* the next row (group) */
            mg_pack__next(P, idx);
        }
    }
}

static void pack_in(mg_tape *t) { pack_walk(t, PACK, MG_R_PW(t)); }
static void pack_out(mg_tape *t) { pack_walk(t, UNPACK, MG_R_PW(t)); }
static void unpack_grad(mg_tape *t) { pack_walk(t, UNPACK_GRAD, MG_R_PW(t)); }
#if MGK_REAL_BYTES == 8
void mg_tape__packed_values(mg_tape *t, double *pw) { pack_walk(t, PACK, pw); }
#endif

/* SGD over the parameters outside packs and over the packs, skipping what the backward pass
 * stepped itself (fused) when `fused` is set. */
static void step_all(mg_tape *t, mgk_real *g, mgk_real *pg, double scale_d, int fused) {
    mgk_real *d = MG_R_DATA(t), *pw = MG_R_PW(t);
    const mgk_real scale = (mgk_real)scale_d;
    const mgk_idx *sd = fused ? t->step_d1 : t->step_d;
    size_t nd = fused ? t->nstep_d1 : t->nstep_d;
    for (size_t i = 0; i < nd; i++) {
        mgk_idx p = sd[i];
        d[p] -= scale * g[p];
        g[p] = 0.0;
    }
    if (fused) {
        for (size_t i = 0; i < t->nstep_p1; i++) {
            mgk_idx q = t->step_p1[i];
            pw[q] -= scale * pg[q];
            pg[q] = 0.0;
        }
    } else {
        for (size_t q = 0; q < t->npacked; q++) {
            pw[q] -= scale * pg[q];
            pg[q] = 0.0;
        }
    }
}

/* ---- epochs -----------------------------------------------------------------------------------
 */

typedef struct fit_chunk {
    mgk_real *bd, *bg; /* per-sample slots and gradients of the samples in flight, ss apart */
    mgk_real *g, *pg;  /* shared-slot (parameter) gradients and packed gradients */
    mgk_real *scratch; /* variadic ops' gathered operands */
    mgk_idx *scratch_ix;
    double loss;
    size_t from, to; /* positions in the epoch's order */
    /* one thread (fit_run::fuse): the chunk whose last samples step the fused parameters, with
     * the other chunk's gradients (NULL: the batch is this chunk), and lr / batch size */
    int step;
    const struct fit_chunk *other;
    double scale;
} fit_chunk;

/* ---- threads ---------------------------------------------------------------------------------
 * A batch is two phases of work items: its chunks (an item each), then the sum of the chunks'
 * gradients and the step (MG_FIT_STEP_ITEMS items, ranges of the parameters). Phases run in
 * order: a thread starts on phase p once every item of the phases before it is done (`done`
 * counts finished items, and every thread knows how many items precede a phase). In a phase a
 * thread first claims its own items (item i is thread i % threads's: with every thread on a CPU,
 * each keeps the same chunk and the same ranges, whose memory stays in its cache), then any item
 * still unclaimed. So a thread the OS has taken off its CPU (a busy machine) holds the others up
 * by the one item it has claimed at most, not by a time slice per phase: on a machine whose cores
 * were all busy, two threads waiting at barriers for each other trained 50 times slower than one.
 * Which thread runs an item never changes what it computes. A thread that waits spins, then
 * yields. */
#define MG_FIT_STEP_ITEMS 4
/* Where a whole batch's samples are in flight at once (both chunks' per-sample slots within the
 * cache budget), the nests that step fused parameters (MGK_F_STEP) leave the chunks for the step
 * phase, on any thread count: a thread runs a band of a nest's rows (MGK_F_BAND; a whole nest
 * otherwise; one thread runs every band whole) over the batch's samples in order, in one pass
 * where the chunks' per-sample arrays adjoin (the first chunk fills its tiles), and steps the
 * parameters with the sum: no chunk's gradient is stored and read back. (Where the first chunk
 * does not fill its tiles, over the first chunk's samples into its gradients, then over the
 * last's, stepping with the first's added.) On two threads a weight's gradient then stays on one
 * core: split by chunks, every gradient of a batch was read by the other thread's step, which
 * moved half of them between the cores (MLP batch 32: 1.07x, then 1.05x more for the one pass).
 * Such a nest reads per-sample operands alone, so no step of the same phase changes what it
 * reads. At most this many items: */
#define MG_FIT_DEFER_MAX 60
/* the most items of a phase */
#define MG_FIT_ITEMS (MG_FIT_STEP_ITEMS + MG_FIT_DEFER_MAX)
_Static_assert(MG_FIT_CHUNKS <= MG_FIT_ITEMS, "a phase of chunks fits the items");
_Static_assert(MG_WS_PG - MG_WS_G == MG_FIT_CHUNKS, "mg_tape::ws holds a buffer per chunk");

/* An item of the step phase that runs a nest (fit_run::defer): its rows [lo2, hi2) of dim 2
 * (hi2 = 0: every row). */
typedef struct fit_defer {
    size_t nest;
    mgk_i64 lo2, hi2;
} fit_defer;

typedef struct fit_run {
    mg_tape *t;
    fit_chunk ch[MG_FIT_CHUNKS];
    size_t nch, ss, sub; /* nch: the chunks of a whole batch; sub: samples in flight per chunk */
    size_t n, batch;
    const double *X, *Y;
    const float *X32; /* the inputs as floats instead of X (mg_fit_options.X32) */
    const size_t *perm;
    size_t threads;
    size_t calls; /* nests a chunk's samples in flight run (forward with losses, backward) */
    int fuse;     /* one thread: the last chunk's MGK_F_STEP nests step their parameters */
    size_t held;  /* samples each chunk's per-sample arrays hold (chunk c's at c * held) */
    fit_defer defer[MG_FIT_DEFER_MAX]; /* the step phase's nests (see above) */
    size_t ndefer;
    double lr;
    double total;                      /* the batches' losses so far, in batch and chunk order */
    atomic_size_t done;                /* items finished */
    atomic_size_t claim[MG_FIT_ITEMS]; /* 1 + the last phase each item was claimed in */
} fit_run;

/* Positions [*from, *to) of chunk i of the batch that starts at position b0 (empty where there is
 * no such batch or chunk). */
static void chunk_range(const fit_run *F, size_t b0, size_t i, size_t *from, size_t *to) {
    *from = *to = b0;
    if (b0 >= F->n) return;
    const size_t bn = F->n - b0 < F->batch ? F->n - b0 : F->batch;
    const size_t nch = bn < F->nch ? bn : F->nch;
    if (i >= nch) return;
    *from = b0 + bn * i / nch;
    *to = b0 + bn * (i + 1) / nch;
}

/* A run over chunk c's arrays (the parameters, read only during the batch; its gradients and
 * per-sample slots), one sample until the caller says more. */
static void chunk_exec(const fit_run *F, fit_chunk *c, mg_exec *E) {
    const mg_tape *t = F->t;
    memset(E, 0, sizeof *E);
    mgk_run *R = &E->R;
    R->a[MGK_D] = MG_R_DATA(t);
    R->a[MGK_G] = c->g;
    R->a[MGK_PW] = MG_R_PW(t);
    R->a[MGK_PG] = c->pg;
    R->a[MGK_BD] = c->bd;
    R->a[MGK_BG] = c->bg;
    R->ix = t->ix;
    R->ss = (mgk_i64)F->ss;
    R->nb = 1;
    E->scratch = c->scratch;
    E->scratch_ix = c->scratch_ix;
}

/* Chunk ci's samples, F->sub at a time, through forward and backward. */
static void run_chunk(fit_run *F, fit_chunk *c, size_t ci) {
    const mg_tape *t = F->t;
    const size_t ss = F->ss;
    mg_exec E;
    chunk_exec(F, c, &E);
    mgk_run *R = &E.R;
    R->lr = c->scale;
    R->og[0] = c->other ? c->other->g : NULL;
    R->og[1] = c->other ? c->other->pg : NULL;
    E.skip_steps = F->ndefer > 0;
    E.loss_in_bwd = 1;
    E.batch = 1;
    prefetch_init(&E.pf, t, F->X, F->X32, F->perm, F->sub, F->calls);
    c->loss = 0.0;
    /* this batch's gradients start from zero (step_item only reads them with threads): the
     * fused parameters' in their nests (`first` below), the others here: outside packs (a packed
     * parameter's gradient is in pg; its slot in g, like a constant's, is never read, as in
     * step_all), and in packs where the step does not zero them as it goes (threads) */
    for (size_t i = 0; i < t->nstep_d1; i++) c->g[t->step_d1[i]] = 0;
    if (t->nsh_fwd) zero_shared(t, c->g); /* this chunk's samples' sums (shared_item) */
    if (t->nstep_p1 && F->threads > 1) {
        if (t->nstep_p1 == t->npacked) memset(c->pg, 0, t->npacked * sizeof(mgk_real));
        else
            for (size_t i = 0; i < t->nstep_p1; i++) c->pg[t->step_p1[i]] = 0;
    }
    for (size_t k0 = c->from; k0 < c->to; k0 += F->sub) {
        size_t nb = c->to - k0 < F->sub ? c->to - k0 : F->sub;
        for (size_t q = 0; q < nb; q++) { /* inputs first in the per-sample region, then targets */
            size_t s = F->perm[k0 + q];
            load_row(t, c->bd + q * ss, F->X, F->X32, s);
            if (F->Y) copy_in(c->bd + q * ss + t->ninputs, F->Y + s * t->ntargets, t->ntargets);
        }
        /* while they run: the rows of this chunk's next samples in flight, or of this chunk's
         * first ones in the next batch (which the same thread runs, where threads keep theirs) */
        size_t at = k0 + nb, end = c->to;
        if (at >= c->to) chunk_range(F, c->from - c->from % F->batch + F->batch, ci, &at, &end);
        prefetch_rows(&E.pf, at, end - at < F->sub ? end : at + F->sub);
        R->nb = (mgk_i64)nb;
        R->first = k0 == c->from;
        R->bstep = c->step && k0 + nb == c->to;
        run_prog(t, from(t->fwd, fwd0(t, 1)), t->nfwd - fwd0(t, 1), &E, MG_FZ_LOSS_CONE);
        backward(t, &E);
        for (size_t q = 0; q < nb; q++) c->loss += loss_of(t, R, (mgk_i64)q); /* xent_last */
    }
}

/* MG_STEP_RANGE: one range of an array of gradients, the sum over the chunks (in chunk order) and
 * the step, in the CPU's vectors (ir.h's mg_ir__step_d/_f, interp_kernels.c: in libmg's baseline
 * SSE2 build this phase was 12% of a float64 MLP's batch-32 fit, 9% of a float32 one's). With
 * threads, it only reads the chunks' gradients: each chunk's thread zeroes its own when its next
 * batch starts (run_chunk), so the lines stay in that thread's cache instead of moving to the
 * thread that stepped them and back. On one thread (`zero`) it zeroes them as it goes, which saves
 * the separate pass (MLP b32: 7% of a fit). (The tape's own gradients stay zero through a batched
 * fit.) */
#if MGK_REAL_BYTES == 8
#define MG_STEP_RANGE mg_ir__step_d
#else
#define MG_STEP_RANGE mg_ir__step_f
#endif

/* Step item i of MG_FIT_STEP_ITEMS of a batch of bn samples in nch chunks: its ranges of the
 * parameters, each the sum of the chunks' gradients (in chunk order) and the step. With `fuse`
 * (one thread), only the parameters that no nest stepped (the lists of batch size 1, whose
 * gradients nests add into, and which this zeroes). */
_Static_assert(MG_FIT_CHUNKS == 2, "step_item adds one or two chunks");
static void step_item(fit_run *F, size_t i, size_t bn, size_t nch) {
    mg_tape *t = F->t;
    const size_t S = MG_FIT_STEP_ITEMS;
    const int nested = F->fuse || F->ndefer; /* the fused parameters are their nests' to step */
    const size_t D = nested ? t->nstep_d1 : t->nstep_d, d0 = D * i / S, d1 = D * (i + 1) / S;
    const mgk_idx *const sd = nested ? t->step_d1 : t->step_d;
    const mgk_real scale = (mgk_real)(F->lr / (double)bn);
    const mgk_real *g0 = F->ch[0].g, *g1 = nch > 1 ? F->ch[1].g : NULL;
    mgk_real *data = MG_R_DATA(t);
    for (size_t k = d0; k < d1; k++) { /* the parameters outside packs */
        const mgk_idx p = sd[k];
        data[p] -= scale * (g1 ? g0[p] + g1[p] : g0[p]);
    }
    mgk_real *pw = MG_R_PW(t), *pg0 = F->ch[0].pg, *pg1 = nch > 1 ? F->ch[1].pg : NULL;
    if (!nested || t->nstep_p1 == t->npacked) {
        const size_t Q = t->npacked, q0 = Q * i / S, q1 = Q * (i + 1) / S;
        MG_STEP_RANGE(pw, pg0, pg1, q0, q1, scale, F->threads == 1);
        return;
    }
    const size_t Q = t->nstep_p1, q0 = Q * i / S, q1 = Q * (i + 1) / S;
    for (size_t k = q0; k < q1; k++) { /* the packed elements no nest stepped */
        const mgk_idx q = t->step_p1[k];
        pw[q] -= scale * (pg1 ? pg0[q] + pg1[q] : pg0[q]);
        pg0[q] = 0;
        if (pg1) pg1[q] = 0;
    }
}

/* Item `D` of the step phase: its band of a fused step's nest, the sums from zero, stepping the
 * parameters: in one pass over the batch's samples where the chunks' arrays adjoin, else over the
 * first chunk's samples into its gradients, then over the last's with the first's added (the
 * arithmetic of run_chunk with fit_chunk::step). The choice depends on the chunk sizes alone. */
static void defer_item(fit_run *F, const fit_defer *D, size_t bn, size_t nch) {
    const mg_tape *t = F->t;
    mgk_run R;
    memset(&R, 0, sizeof R);
    R.a[MGK_D] = MG_R_DATA(t);
    R.a[MGK_PW] = MG_R_PW(t);
    R.ix = t->ix;
    R.ss = (mgk_i64)F->ss;
    R.lr = F->lr / (double)bn;
    R.first = 1;
    R.lo2 = D->lo2;
    R.hi2 = D->hi2;
    if (nch == 2 && F->ch[0].to - F->ch[0].from == F->held) { /* the chunks' samples adjoin */
        R.a[MGK_G] = F->ch[0].g;
        R.a[MGK_PG] = F->ch[0].pg;
        R.a[MGK_BD] = F->ch[0].bd;
        R.a[MGK_BG] = F->ch[0].bg;
        R.nb = (mgk_i64)(F->ch[1].to - F->ch[0].from);
        R.bstep = 1;
        MG_RUN_NEST(t, D->nest, &R);
        return;
    }
    for (size_t c = 0; c < nch; c++) {
        const fit_chunk *ch = &F->ch[c];
        R.a[MGK_G] = ch->g;
        R.a[MGK_PG] = ch->pg;
        R.a[MGK_BD] = ch->bd;
        R.a[MGK_BG] = ch->bg;
        R.nb = (mgk_i64)(ch->to - ch->from);
        R.bstep = c + 1 == nch;
        R.og[0] = c ? F->ch[0].g : NULL;
        R.og[1] = c ? F->ch[0].pg : NULL;
        MG_RUN_NEST(t, D->nest, &R);
    }
}

/* Edge b of `bands` bands of n2 rows: n2 * b / bands rounded to the nearest multiple of
 * MGK_TS_MAX. With bands <= n2 / MGK_TS_MAX the edges are at least MGK_TS_MAX apart before
 * rounding, so every band is non-empty (the last ends at n2, at least MGK_TS_MAX / 2 rows on). */
static mgk_i64 band_edge(mgk_i64 n2, size_t b, size_t bands) {
    const mgk_i64 x = n2 * (mgk_i64)b;
    return (x + (mgk_i64)bands * (MGK_TS_MAX / 2)) / ((mgk_i64)bands * MGK_TS_MAX) * MGK_TS_MAX;
}

/* The bands of nest N on `threads` threads: one per thread where MGK_F_BAND, of whole register
 * tiles (lo2 < hi2 in every band; hi2 = 0 would be every row). */
static size_t band_count(const mgk_nest *N, size_t threads) {
    size_t bands = N->flags & MGK_F_BAND ? threads : 1;
    if (bands > (size_t)(N->n[2] / MGK_TS_MAX)) bands = (size_t)(N->n[2] / MGK_TS_MAX);
    return bands < 1 ? 1 : bands;
}

/* The step phase's nests of a batch on `threads` threads (fit_run::defer): every MGK_F_STEP nest
 * of the backward program, each band of rows an item. None (0) where one reads anything but
 * per-sample operands, where there could be more than MG_FIT_DEFER_MAX items, or where the nests
 * without bands are more than an eighth of the work (on two threads one thread would run each
 * over both chunks: a CNN's kernel gradient, a split sum, is most of it). Whether nests leave the
 * chunks changes the order of a batch's sums, so it never depends on the thread count: the plan
 * is decided for MG_FIT_CHUNKS threads, then cut into `threads` bands. `*nests`: how many. */
static size_t plan_defer(const mg_tape *t, size_t threads, fit_defer *D, size_t *nests) {
    size_t n = 0, most = 0;
    double banded = 0.0, whole = 0.0;
    *nests = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < t->nbwd; i++) {
            const mg_instr *in = &t->bwd[i];
            if (in->kind == MG_I_SEQ) { /* schedule.c fuses no nest inside a sequential loop */
                i += in->a;
                continue;
            }
            if (in->kind != MG_I_NEST || !(t->nests[in->a].flags & MGK_F_STEP)) continue;
            const mgk_nest *N = &t->nests[in->a];
            if (pass == 0) { /* the decision */
                if (!mg_nest__reads_samples(N)) return 0;
                const size_t bands = band_count(N, MG_FIT_CHUNKS);
                double terms = 1.0; /* per sample */
                for (int d = 0; d < MGK_MAXD; d++) terms *= (double)N->n[d];
                *(bands > 1 ? &banded : &whole) += terms;
                most += bands;
                continue;
            }
            if (most > MG_FIT_DEFER_MAX || whole * 8.0 > banded) return 0;
            const size_t bands = band_count(N, threads);
            for (size_t b = 0; b < bands; b++) { /* edges at the nearest tile, the last at n[2] */
                D[n].nest = in->a;
                D[n].lo2 = band_edge(N->n[2], b, bands);
                D[n].hi2 = bands == 1       ? 0
                           : b + 1 == bands ? N->n[2]
                                            : band_edge(N->n[2], b + 1, bands);
                n++;
            }
            ++*nests;
        }
    return n;
}

/* A spinning wait's pause: it leaves the core's resources to the other hardware thread where two
 * share a core (a virtual machine's CPUs may), and spaces the loads of a line another core is
 * about to write. */
static inline void mg_spin_pause(void) {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    __builtin_ia32_pause();
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Waits until `count` items are done; the items' writes are then visible. */
static void wait_done(fit_run *F, size_t count) {
    unsigned spins = 0;
    while (atomic_load_explicit(&F->done, memory_order_acquire) < count) {
        if (++spins > 2000) sched_yield(); /* a busy machine: let the others run */
        else mg_spin_pause();
    }
}

/* The shared values' programs of a batch (t->nsh_fwd, t->nsh_bwd), each one item of its own phase:
 * the forward before the chunks (from the stepped parameters), the backward after them, from the
 * sum of the chunks' gradients of the shared values (in chunk order) into the first chunk's
 * gradients, which the step adds to the others'. Per batch, not per sample: micrograd's L2 term
 * at batch 32 is one sum over the parameters instead of 32. */
static void shared_item(fit_run *F, int backward_prog, size_t nch) {
    const mg_tape *t = F->t;
    fit_chunk *c = &F->ch[0];
    mg_exec E;
    chunk_exec(F, c, &E);
    if (!backward_prog) {
        run_prog(t, t->fwd, t->nsh_fwd, &E, MG_FZ_LOSS_CONE);
        return;
    }
    for (size_t i = 0; nch > 1 && i < t->nzero_sh; i += 2) /* what the chunks added into */
        for (size_t v = t->zero[i]; v < t->zero[i + 1]; v++) c->g[v] += F->ch[1].g[v];
    run_prog(t, from(t->bwd, t->nbwd - t->nsh_bwd), t->nsh_bwd, &E, 0);
}

/* Thread w's part of an epoch: every phase in order, its own items first, then the others'. A
 * batch's phases: its chunks, then the step (with shared values: the shared forward first, and
 * the shared backward between the chunks and the step). */
enum { PH_PRE, PH_CHUNKS, PH_POST, PH_STEP };
static void fit_share(fit_run *F, size_t w) {
    const size_t T = F->threads, S = MG_FIT_STEP_ITEMS + F->ndefer; /* the step phase's items */
    const size_t nbatches = (F->n + F->batch - 1) / F->batch;
    const size_t sh = F->t->nsh_fwd > 0, NP = sh ? 4 : 2, per = F->nch + S + 2 * sh;
    for (size_t p = 0; p < NP * nbatches; p++) {
        const size_t k = p / NP, b0 = k * F->batch;
        const int ph = sh ? (int)(p % NP) : p % NP ? PH_STEP : PH_CHUNKS;
        const size_t bn = F->n - b0 < F->batch ? F->n - b0 : F->batch;
        const size_t nch = bn < F->nch ? bn : F->nch;
        const size_t items = ph == PH_CHUNKS ? nch : ph == PH_STEP ? S : 1;
        /* every batch before this one is whole (per items); this one's earlier phases */
        wait_done(F, k * per + (sh && ph > PH_PRE) + (ph > PH_CHUNKS ? nch : 0) +
                         (sh && ph > PH_POST));
        for (int pass = 0; pass < 2; pass++)
            for (size_t i = 0; i < items; i++) {
                if ((i % T == w) != (pass == 0)) continue;
                size_t v = atomic_load_explicit(&F->claim[i], memory_order_relaxed);
                if (v > p || !atomic_compare_exchange_strong(&F->claim[i], &v, p + 1)) continue;
                if (ph == PH_PRE || ph == PH_POST) {
                    shared_item(F, ph == PH_POST, nch);
                } else if (ph == PH_CHUNKS) {
                    fit_chunk *c = &F->ch[i];
                    chunk_range(F, b0, i, &c->from, &c->to);
                    c->step = F->fuse && i + 1 == nch;
                    c->other = c->step && nch > 1 ? &F->ch[0] : NULL;
                    c->scale = c->step ? F->lr / (double)bn : 0.0;
                    run_chunk(F, c, i);
                } else {
                    if (i == 0)
                        for (size_t c = 0; c < nch; c++) F->total += F->ch[c].loss; /* in order */
                    if (i < MG_FIT_STEP_ITEMS) step_item(F, i, bn, nch);
                    else defer_item(F, &F->defer[i - MG_FIT_STEP_ITEMS], bn, nch);
                }
                atomic_fetch_add_explicit(&F->done, 1, memory_order_release);
            }
    }
}

typedef struct worker_arg {
    fit_run *F;
    size_t id;
} worker_arg;

static void *fit_worker(void *p) {
    worker_arg *w = p;
    fit_share(w->F, w->id);
    return NULL;
}

static int check_fit_args(mg_tape *t, const double *X, const double *Y, size_t n,
                          const mg_fit_options *o) {
    if (!t->has_loss) return mg_tape__fail(t, MG_EINVAL, "fit: this program has no loss");
    if (X && o->X32)
        return mg_tape__fail(t, MG_EINVAL, "fit: pass the inputs as X or as X32, not both");
    if (n && !X && !o->X32 && t->ninputs) return mg_tape__fail(t, MG_EINVAL, "fit: NULL inputs");
    if (n && !Y && t->ntargets)
        return mg_tape__fail(t, MG_EINVAL, "fit: this program has targets: pass Y");
    if (!MG_LR_OK(o->lr))
        return mg_tape__fail(t, MG_EINVAL, "fit: the learning rate %g is not finite" MG_LR_TYPE,
                             o->lr);
    if (t->ninputs && n > SIZE_MAX / t->ninputs / sizeof(double))
        return mg_tape__fail(t, MG_EINVAL, "fit: %zu rows of %zu inputs overflow the address space",
                             n, t->ninputs);
    return check_targets(t, X, o->X32, Y, n, "fit");
}

MG_DRV_LINK int MG_DRV(fit)(mg_tape *t, const double *X, const double *Y, size_t n,
                            const mg_fit_options *opt, double *mean_loss) {
    if (!t) return MG_EINVAL;
    t->err[0] = '\0';
    mg_fit_options o;
    memset(&o, 0, sizeof o);
    if (opt) o = *opt;
    if (check_fit_args(t, X, Y, n, &o) != MG_OK) return t->status;
    size_t batch = o.batch_size ? o.batch_size : 1;
    if (batch > n && n) batch = n; /* a batch larger than the data is the whole data */
    size_t threads = o.threads ? o.threads : 1;
    size_t *perm = mg_tape__alloc(t, n ? n : 1, sizeof(size_t));
    if (!perm) return MG_ENOMEM;
    mgk_order(perm, n, o.shuffle, o.seed, o.epoch);
    /* an epoch starts from zero gradients, for every parameter */
    memset(MG_R_GRAD(t), 0, t->nparams * sizeof(mgk_real));
    if (t->npacked) memset(MG_R_PG(t), 0, t->npacked * sizeof(mgk_real));
    double total = 0.0;
    int st = MG_OK;

    if (batch == 1) {
        pack_in(t);
        mg_exec E;
        init_flat(t, &E, MG_R_DATA(t), MG_R_GRAD(t));
        E.R.lr = o.lr; /* fused nests step their parameters in backward */
        E.R.first = 1;
        E.R.bstep = o.lr != 0.0;
        /* pre-steps: the kept elements, per-sample positions (without memory for them, every
         * step runs in backward: the same bits) */
        const size_t ss = sample_stride(t);
        mgk_real *kept =
            t->npre && o.lr != 0.0 && n > 1 ? mg_tape__alloc(t, 2 * ss, sizeof(mgk_real)) : NULL;
        if (kept) memset(kept, 0, 2 * ss * sizeof(mgk_real));
        E.keep_d = kept;
        E.keep_g = kept ? kept + ss : NULL;
        E.loss_in_bwd = 1;
        prefetch_init(&E.pf, t, X, o.X32, perm, 1, fit_calls(t, 0));
        for (size_t k = 0; k < n; k++) {
            size_t s = perm[k];
            load_row(t, MG_R_DATA(t) + t->input0, X, o.X32, s);
            if (k + MG_FIT_AHEAD < n) prefetch_rows(&E.pf, k + MG_FIT_AHEAD, k + MG_FIT_AHEAD + 1);
            if (Y) copy_in(MG_R_DATA(t) + t->target0, Y + s * t->ntargets, t->ntargets);
            E.R.a[MGK_QD] = k ? E.keep_d : NULL; /* the previous sample's, once there is one */
            E.R.a[MGK_QG] = k ? E.keep_g : NULL;
            run_prog(t, t->fwd, t->nfwd, &E, MG_FZ_LOSS_CONE);
            E.defer = kept && k + 1 < n;
            backward(t, &E);
            total += loss_of(t, &E.R, 0); /* xent_last */
            step_all(t, MG_R_GRAD(t), MG_R_PG(t), o.lr, o.lr != 0.0);
        }
        pack_out(t);
        if (kept) t->alloc.free_fn(kept, t->alloc.ctx);
        t->alloc.free_fn(perm, t->alloc.ctx);
        if (mean_loss) *mean_loss = n ? total / (double)n : 0.0;
        return MG_OK;
    }

    fit_run F;
    memset(&F, 0, sizeof F);
    F.t = t;
    F.X = X;
    F.X32 = o.X32;
    F.Y = Y;
    F.perm = perm;
    F.ss = sample_stride(t);
    size_t nch = batch < MG_FIT_CHUNKS ? batch : MG_FIT_CHUNKS;
    F.nch = nch;
    size_t per = (batch + nch - 1) / nch, sub = per;
    const size_t cap = in_flight(t);
    if (per > cap) { /* a chunk in parts as even as possible, of whole register tiles where the
                      * cache allows: the MLP's chunks of 64 samples ran as 36 + 28 (5 + 4 tiles
                      * of 8, a tenth of them padding: batch 128 ran 5% slower than batch 32) */
        const size_t parts = (per + cap - 1) / cap;
        const size_t up = ((per + parts - 1) / parts + MGK_TS_MAX - 1) / MGK_TS_MAX * MGK_TS_MAX;
        sub = up <= cap ? up : (per + parts - 1) / parts;
    }
    F.sub = sub;
    F.calls = fit_calls(t, 1);
    /* the per-sample arrays hold whole register tiles of samples (mgk_run) */
    const size_t held = (sub + MGK_TS_MAX - 1) / MGK_TS_MAX * MGK_TS_MAX;
    if (threads > nch) threads = nch;
    if (shared_inline(t)) threads = 1; /* each chunk would compute the shared values */
    F.threads = threads;
    F.held = held;
    if (!t->kern_contracts && sub >= per &&
        nch * held <= samples_within(t, MG_FIT_BATCH_BYTES)) { /* every sample at once */
        size_t nests;
        F.ndefer = plan_defer(t, threads, F.defer, &nests);
        if (F.ndefer) F.calls -= nests;
    }
    F.fuse = threads == 1 && !t->kern_contracts && !F.ndefer;
    /* the chunks' per-sample arrays one after the other (defer_item runs over both at once);
     * these buffers stay on the tape for the next call (mg_tape::ws): zeroed where new, and
     * below where a batch reads them before writing */
    int fresh_bg = 0;
    mgk_real *bd_all = mg_tape__ws(t, MG_WS_BD, nch * held, F.ss * sizeof(mgk_real), NULL);
    mgk_real *bg_all =
        bd_all ? mg_tape__ws(t, MG_WS_BG, nch * held, F.ss * sizeof(mgk_real), &fresh_bg) : NULL;
    if (!bg_all) st = MG_ENOMEM;
    else if (fresh_bg) memset(bg_all, 0, nch * held * F.ss * sizeof(mgk_real));
    for (size_t c = 0; c < nch && st == MG_OK; c++) {
        fit_chunk *ch = &F.ch[c];
        const int i = (int)c;
        int fresh_g = 0, fresh_pg = 0;
        ch->bd = bd_all + c * held * F.ss;
        ch->bg = bg_all + c * held * F.ss;
        ch->g = mg_tape__ws(t, MG_WS_G + i, t->input0 + MGK_PAD, sizeof(mgk_real), &fresh_g);
        ch->pg = mg_tape__ws(t, MG_WS_PG + i, t->npacked + MGK_PAD, sizeof(mgk_real), &fresh_pg);
        ch->scratch = mg_tape__ws(t, MG_WS_SCR + i, 2 * t->nary_max + 2, sizeof(mgk_real), NULL);
        ch->scratch_ix = mg_tape__ws(t, MG_WS_SIX + i, t->nary_max + 1, sizeof(mgk_idx), NULL);
        if (!ch->bd || !ch->bg || !ch->g || !ch->pg || !ch->scratch || !ch->scratch_ix) {
            st = MG_ENOMEM;
            break;
        }
        fill_frozen(t, ch->bd, held, F.ss);
        /* what a batch reads of these before writing it: in g and bg nothing (run_chunk zeroes
         * the gradients that nests add into, backward its per-sample ones); in pg the packed
         * gradients that no nest steps, which a one-thread step zeroes as it goes (step_item), so
         * a one-thread batch leaves them zero for the next; threads zero them in run_chunk.
         * Zeroing all three every call was 9-12% of a loop of fit calls of 32 MLP samples. */
        if (fresh_g) memset(ch->g, 0, (t->input0 + MGK_PAD) * sizeof(mgk_real));
        if (fresh_pg || (threads == 1 && !t->ws_pg_zero))
            memset(ch->pg, 0, (t->npacked + MGK_PAD) * sizeof(mgk_real));
    }
    if (st == MG_OK) {
        pack_in(t);
        F.n = n;
        F.batch = batch;
        F.lr = o.lr;
        atomic_init(&F.done, 0);
        for (size_t i = 0; i < MG_FIT_ITEMS; i++) atomic_init(&F.claim[i], 0);
        /* the workers; where one cannot start, the others claim its items */
        pthread_t tid[MG_FIT_CHUNKS];
        worker_arg wa[MG_FIT_CHUNKS];
        size_t started = 0;
        for (size_t w = 1; w < threads; w++) {
            wa[w].F = &F;
            wa[w].id = w;
            if (pthread_create(&tid[started + 1], NULL, fit_worker, &wa[w]) != 0) break;
            started++;
        }
        fit_share(&F, 0);
        for (size_t w = 1; w <= started; w++) pthread_join(tid[w], NULL);
        total = F.total;
        pack_out(t);
    }
    t->ws_pg_zero = st == MG_OK && threads == 1; /* see the zeroing above */
    t->alloc.free_fn(perm, t->alloc.ctx);
    if (st == MG_ENOMEM)
        return mg_tape__fail(t, MG_ENOMEM, "fit: out of memory for the chunks' slots");
    if (mean_loss) *mean_loss = n ? total / (double)n : 0.0;
    return MG_OK;
}
