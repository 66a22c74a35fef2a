/* Running and training tapes: single-sample calls, epochs, batches and threads.
 *
 * A batch of B samples is cut into C = min(B, MG_FIT_CHUNKS) chunks of consecutive samples,
 * whatever the thread count; each chunk runs its samples in order on private slot arrays and
 * sums its parameter gradients in sample order; the chunks' sums are added in chunk order. A
 * thread only decides which chunks it runs, so parameters come out bitwise the same for any
 * thread count. Threads meet at spin-then-yield barriers: a batch lasts microseconds, and a
 * sleeping wait per phase would cost a large part of it. */
#define _POSIX_C_SOURCE 200809L /* sched_yield */
#include "ir.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#define MG_FIT_CHUNKS 2

static void init_run(const mg_tape *t, mgk_run *R, double *d, double *g) {
    memset(R, 0, sizeof *R);
    R->a[MGK_D] = d;
    R->a[MGK_G] = g;
    R->a[MGK_PW] = t->pw;
    R->a[MGK_PG] = t->pg;
    R->ix = t->ix;
}

static void load(const mg_tape *t, double *d, const double *x, const double *y) {
    if (x) memcpy(d + t->input0, x, t->ninputs * sizeof(double));
    if (y) memcpy(d + t->target0, y, t->ntargets * sizeof(double));
}

/* Backward of one sample: fresh gradients for every computed value, the loss seeded. */
static void backward(const mg_tape *t, mgk_run *R) {
    double *g = R->a[MGK_G];
    if (t->rerolled) /* only what is not written first by a nest (schedule.c) */
        for (size_t i = 0; i < t->nzero; i += 2) memset(g + t->zero[i], 0, (t->zero[i + 1] - t->zero[i]) * sizeof(double));
    else
        memset(g + t->first_op, 0, (t->nslots - t->first_op) * sizeof(double));
    g[t->loss] = 1.0;
    mg_ir__run(t, t->bwd, t->nbwd, R, 0);
}

/* ---- targets ---------------------------------------------------------------------------------- */

/* Cross-entropy targets read from Y must be class indices: checks rows [0, n) before anything
 * trains, naming the first bad row. */
static int check_targets(mg_tape *t, const double *Y, size_t n, const char *what) {
    if (!Y || !t->ntargets) return MG_OK;
    for (size_t i = 0; i < t->nfwd; i++) {
        const mg_instr *in = &t->fwd[i];
        if (in->kind != MG_I_NARY || in->op != MG_OP_XENT) continue;
        mgk_idx ts = t->ix[in->a + in->n];
        if (ts < t->target0 || ts >= t->target0 + t->ntargets) continue;
        size_t col = ts - t->target0;
        for (size_t r = 0; r < n; r++) {
            double y = Y[r * t->ntargets + col];
            if (!(y >= 0.0 && y < (double)in->n && y == floor(y)))
                return mg_tape__fail(t, MG_EINVAL,
                                     "%s: the target of row %zu is %g, not a class index in [0, %u) "
                                     "(cross-entropy over %u classes)",
                                     what, r, y, in->n, in->n);
        }
    }
    return MG_OK;
}

/* ---- single samples --------------------------------------------------------------------------- */

int mg_tape_forward(mg_tape *t, const double *x, const double *y) {
    if (!t) return MG_EINVAL;
    t->err[0] = '\0';
    if (check_targets(t, y, 1, "forward") != MG_OK) return MG_EINVAL;
    load(t, t->data, x, y);
    mg_tape__pack(t);
    mgk_run R;
    init_run(t, &R, t->data, t->grad);
    mg_ir__run(t, t->fwd, t->nfwd, &R, 0);
    return MG_OK;
}

int mg_tape_backward(mg_tape *t) {
    if (!t) return MG_EINVAL;
    t->err[0] = '\0';
    if (!t->has_loss) return mg_tape__fail(t, MG_EINVAL, "backward: this program has no loss");
    mg_tape__pack(t);
    mgk_run R;
    init_run(t, &R, t->data, t->grad);
    backward(t, &R);
    mg_tape__unpack_grad(t);
    return MG_OK;
}

int mg_tape_step(mg_tape *t, double lr, size_t count) {
    if (!t) return MG_EINVAL;
    t->err[0] = '\0';
    if (!isfinite(lr)) return mg_tape__fail(t, MG_EINVAL, "step: the learning rate %g is not finite", lr);
    mgk_step(t->data, t->grad, t->nparams, lr / (double)(count ? count : 1));
    return MG_OK;
}

int mg_tape_predict(mg_tape *t, const double *X, size_t n, double *out) {
    if (!t) return MG_EINVAL;
    t->err[0] = '\0';
    if (n && ((!X && t->ninputs) || (!out && t->noutputs)))
        return mg_tape__fail(t, MG_EINVAL, "predict: NULL inputs or outputs");
    mg_tape__pack(t);
    mgk_run R;
    init_run(t, &R, t->data, t->grad);
    for (size_t k = 0; k < n; k++) {
        load(t, t->data, X + k * t->ninputs, NULL);
        mg_ir__run(t, t->fwd, t->nfwd, &R, MG_FZ_OUT_CONE);
        for (size_t j = 0; j < t->noutputs; j++) out[k * t->noutputs + j] = t->data[t->outputs[j]];
    }
    return MG_OK;
}

/* ---- packing (schedule.c decides what is packed) ----------------------------------------------- */

enum { PACK, UNPACK, UNPACK_GRAD };

static void pack_walk(mg_tape *t, int dir) {
    for (size_t k = 0; k < t->npacks; k++) {
        const mg_pack *P = &t->packs[k];
        mgk_i64 idx[MGK_MAXD] = {0};
        for (size_t i = 0; i < P->len; i++) {
            mgk_i64 slot = P->base;
            for (int q = 0; q < P->nd; q++) slot += idx[q] * P->s[q];
            size_t p = P->p0 + i;
            if (dir == PACK) t->pw[p] = t->data[slot];
            else if (dir == UNPACK) t->data[slot] = t->pw[p];
            else {
                t->grad[slot] += t->pg[p];
                t->pg[p] = 0.0;
            }
            for (int q = P->nd - 1; q >= 0 && ++idx[q] == P->n[q]; q--) idx[q] = 0;
        }
    }
}

void mg_tape__pack(mg_tape *t) { pack_walk(t, PACK); }
void mg_tape__unpack(mg_tape *t) { pack_walk(t, UNPACK); }
void mg_tape__unpack_grad(mg_tape *t) { pack_walk(t, UNPACK_GRAD); }

/* SGD over the parameters outside packs and over the packs, skipping what the backward pass
 * stepped itself (fused) when `fused` is set. */
static void step_all(mg_tape *t, double *g, double *pg, double scale, int fused) {
    double *d = t->data, *pw = t->pw;
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

/* ---- epochs ----------------------------------------------------------------------------------- */

typedef struct fit_chunk {
    double *d, *g, *pg; /* private slots, gradients and packed gradients */
    double loss;
    size_t from, to; /* positions in the epoch's order */
} fit_chunk;

typedef struct spin_barrier {
    atomic_uint count;
    atomic_uint sense;
    unsigned n;
} spin_barrier;

static void sb_init(spin_barrier *b, unsigned n) {
    atomic_init(&b->count, 0);
    atomic_init(&b->sense, 0);
    b->n = n;
}

static void sb_wait(spin_barrier *b, unsigned *local_sense) {
    unsigned s = !*local_sense;
    *local_sense = s;
    if (atomic_fetch_add(&b->count, 1) + 1 == b->n) {
        atomic_store(&b->count, 0);
        atomic_store(&b->sense, s);
    } else {
        unsigned spins = 0;
        while (atomic_load(&b->sense) != s)
            if (++spins > 2000) sched_yield(); /* oversubscribed machine: let the others run */
    }
}

typedef struct fit_run {
    mg_tape *t;
    fit_chunk ch[MG_FIT_CHUNKS];
    size_t nch;
    const double *X, *Y;
    const size_t *perm;
    size_t threads;
    spin_barrier start, done;
    unsigned main_start, main_done;
    atomic_int stop;
} fit_run;

static void run_chunk(fit_run *F, fit_chunk *c) {
    const mg_tape *t = F->t;
    mgk_run R;
    init_run(t, &R, c->d, c->g);
    R.a[MGK_PG] = c->pg;
    c->loss = 0.0;
    for (size_t k = c->from; k < c->to; k++) {
        size_t s = F->perm[k];
        load(t, c->d, F->X + s * t->ninputs, F->Y ? F->Y + s * t->ntargets : NULL);
        mg_ir__run(t, t->fwd, t->nfwd, &R, MG_FZ_LOSS_CONE);
        c->loss += c->d[t->loss];
        backward(t, &R);
    }
}

static void run_share(fit_run *F, size_t w) {
    for (size_t c = w; c < F->nch; c += F->threads) run_chunk(F, &F->ch[c]);
}

typedef struct worker_arg {
    fit_run *F;
    size_t id;
} worker_arg;

static void *fit_worker(void *p) {
    worker_arg *w = p;
    unsigned s_start = 0, s_done = 0;
    for (;;) {
        sb_wait(&w->F->start, &s_start);
        if (atomic_load(&w->F->stop)) return NULL;
        run_share(w->F, w->id);
        sb_wait(&w->F->done, &s_done);
    }
}

static int check_fit_args(mg_tape *t, const double *X, const double *Y, size_t n, const mg_fit_options *o) {
    if (!t->has_loss) return mg_tape__fail(t, MG_EINVAL, "fit: this program has no loss");
    if (n && !X && t->ninputs) return mg_tape__fail(t, MG_EINVAL, "fit: NULL inputs");
    if (n && !Y && t->ntargets) return mg_tape__fail(t, MG_EINVAL, "fit: this program has targets: pass Y");
    if (!isfinite(o->lr)) return mg_tape__fail(t, MG_EINVAL, "fit: the learning rate %g is not finite", o->lr);
    if (t->ninputs && n > SIZE_MAX / t->ninputs / sizeof(double))
        return mg_tape__fail(t, MG_EINVAL, "fit: %zu rows of %zu inputs overflow the address space", n, t->ninputs);
    return check_targets(t, Y, n, "fit");
}

int mg_tape_fit(mg_tape *t, const double *X, const double *Y, size_t n, const mg_fit_options *opt,
                double *mean_loss) {
    if (!t) return MG_EINVAL;
    t->err[0] = '\0';
    mg_fit_options o;
    memset(&o, 0, sizeof o);
    if (opt) o = *opt;
    if (check_fit_args(t, X, Y, n, &o) != MG_OK) return t->status;
    size_t batch = o.batch_size ? o.batch_size : 1;
    if (batch > n && n) batch = n; /* a batch larger than the data is the whole data */
    size_t threads = o.threads ? o.threads : 1;
    const mg_allocator *A = &t->alloc;
    size_t *perm = mg_tape__alloc(t, n ? n : 1, sizeof(size_t));
    if (!perm) return MG_ENOMEM;
    mgk_order(perm, n, o.shuffle, o.seed, o.epoch);
    /* an epoch starts from zero gradients, for every parameter */
    memset(t->grad, 0, t->nparams * sizeof(double));
    if (t->npacked) memset(t->pg, 0, t->npacked * sizeof(double));
    double total = 0.0;
    int st = MG_OK;

    if (batch == 1) {
        mg_tape__pack(t);
        mgk_run R;
        init_run(t, &R, t->data, t->grad);
        R.lr = o.lr; /* fused nests step their parameters in backward */
        for (size_t k = 0; k < n; k++) {
            size_t s = perm[k];
            load(t, t->data, X + s * t->ninputs, Y ? Y + s * t->ntargets : NULL);
            mg_ir__run(t, t->fwd, t->nfwd, &R, MG_FZ_LOSS_CONE);
            total += t->data[t->loss];
            backward(t, &R);
            step_all(t, t->grad, t->pg, o.lr, o.lr != 0.0);
        }
        mg_tape__unpack(t);
        A->free_fn(perm, A->ctx);
        if (mean_loss) *mean_loss = n ? total / (double)n : 0.0;
        return MG_OK;
    }

    fit_run F;
    memset(&F, 0, sizeof F);
    F.t = t;
    F.X = X;
    F.Y = Y;
    F.perm = perm;
    size_t nch = batch < MG_FIT_CHUNKS ? batch : MG_FIT_CHUNKS;
    if (threads > nch) threads = nch;
    F.threads = threads;
    for (size_t c = 0; c < nch; c++) {
        fit_chunk *ch = &F.ch[c];
        ch->d = mg_tape__alloc(t, t->nslots + MGK_PAD, sizeof(double));
        ch->g = mg_tape__alloc(t, t->nslots + MGK_PAD, sizeof(double));
        ch->pg = mg_tape__alloc(t, t->npacked + MGK_PAD, sizeof(double));
        if (!ch->d || !ch->g || !ch->pg) {
            st = MG_ENOMEM;
            break;
        }
        memcpy(ch->d, t->data, (t->nslots + MGK_PAD) * sizeof(double));
        memset(ch->g, 0, (t->nslots + MGK_PAD) * sizeof(double));
        memset(ch->pg, 0, (t->npacked + MGK_PAD) * sizeof(double));
    }
    pthread_t tid[MG_FIT_CHUNKS];
    worker_arg wa[MG_FIT_CHUNKS];
    size_t started = 0;
    if (st == MG_OK && threads > 1) {
        sb_init(&F.start, (unsigned)threads);
        sb_init(&F.done, (unsigned)threads);
        atomic_init(&F.stop, 0);
        for (size_t w = 1; w < threads; w++) {
            wa[w].F = &F;
            wa[w].id = w;
            if (pthread_create(&tid[w], NULL, fit_worker, &wa[w]) != 0) break;
            started++;
        }
        if (started + 1 < threads) {
            /* fewer threads than asked: release and end the started ones, run on this thread
             * (the same result: the split of the work does not change the sums) */
            atomic_store(&F.stop, 1);
            spin_barrier *b = &F.start;
            for (size_t w = started + 1; w < threads; w++) {
                unsigned ls = F.main_start;
                unsigned s = !ls;
                if (atomic_fetch_add(&b->count, 1) + 1 == b->n) {
                    atomic_store(&b->count, 0);
                    atomic_store(&b->sense, s);
                }
            }
            sb_wait(&F.start, &F.main_start);
            for (size_t w = 1; w <= started; w++) pthread_join(tid[w], NULL);
            atomic_store(&F.stop, 0);
            started = 0;
            F.threads = threads = 1;
        }
    }
    if (st == MG_OK) {
        mg_tape__pack(t);
        for (size_t b0 = 0; b0 < n; b0 += batch) {
            size_t bn = n - b0 < batch ? n - b0 : batch;
            F.nch = bn < nch ? bn : nch;
            for (size_t c = 0; c < F.nch; c++) {
                fit_chunk *ch = &F.ch[c];
                ch->from = b0 + bn * c / F.nch;
                ch->to = b0 + bn * (c + 1) / F.nch;
                memcpy(ch->d, t->data, t->nparams * sizeof(double)); /* the parameters moved */
            }
            if (F.threads > 1) {
                sb_wait(&F.start, &F.main_start);
                run_share(&F, 0);
                sb_wait(&F.done, &F.main_done);
            } else {
                run_share(&F, 0);
            }
            for (size_t c = 0; c < F.nch; c++) { /* chunk order */
                fit_chunk *ch = &F.ch[c];
                total += ch->loss;
                for (size_t p = 0; p < t->nparams; p++) {
                    t->grad[p] += ch->g[p];
                    ch->g[p] = 0.0;
                }
                for (size_t q = 0; q < t->npacked; q++) {
                    t->pg[q] += ch->pg[q];
                    ch->pg[q] = 0.0;
                }
            }
            step_all(t, t->grad, t->pg, o.lr / (double)bn, 0);
        }
        mg_tape__unpack(t);
    }
    if (threads > 1 && started) {
        atomic_store(&F.stop, 1);
        sb_wait(&F.start, &F.main_start);
        for (size_t w = 1; w <= started; w++) pthread_join(tid[w], NULL);
    }
    for (size_t c = 0; c < nch; c++) {
        if (F.ch[c].d) A->free_fn(F.ch[c].d, A->ctx);
        if (F.ch[c].g) A->free_fn(F.ch[c].g, A->ctx);
        if (F.ch[c].pg) A->free_fn(F.ch[c].pg, A->ctx);
    }
    A->free_fn(perm, A->ctx);
    if (st == MG_ENOMEM) return mg_tape__fail(t, MG_ENOMEM, "fit: out of memory for the chunks' slots");
    if (mean_loss) *mean_loss = n ? total / (double)n : 0.0;
    return MG_OK;
}
