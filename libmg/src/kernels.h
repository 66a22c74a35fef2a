/* mg kernels: the variadic ops, the SGD step, the epoch driver and the shuffling generator over
 * a frozen program's slot arrays. This one text is compiled into libmg's tape interpreter and
 * pasted verbatim into every C file the emitter writes, so both run literally the same code.
 * It includes only <math.h> and <stddef.h>. Slot arrays: d (data), g (gradients). libmg's eager
 * graph runs the variadic ops through these kernels as well (over a gathered scratch copy). */
#ifndef MGK_KERNELS_H
#define MGK_KERNELS_H
#include <math.h>
#include <stddef.h>

typedef unsigned int mgk_idx;
typedef unsigned long long mgk_u64;

/* The type of the slot arrays (data, gradients, packed weights, records). libmg uses double;
 * a program emitted with float32 storage defines MGK_REAL as float before this text: half the
 * memory traffic, results no longer equal to the double path (sums still accumulate in double
 * where a local accumulator holds them). */
#ifndef MGK_REAL
#define MGK_REAL double
#endif
typedef MGK_REAL mgk_real;

/* ---- generator: xoshiro256** seeded by splitmix64 (integer-only: bitwise portable) -------- */

typedef struct mgk_rng {
    mgk_u64 s[4];
} mgk_rng;

static inline mgk_u64 mgk_splitmix64(mgk_u64 *x) {
    mgk_u64 z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline void mgk_rng_seed(mgk_rng *r, mgk_u64 seed) {
    int i;
    for (i = 0; i < 4; i++) r->s[i] = mgk_splitmix64(&seed);
}

static inline mgk_u64 mgk_rotl(mgk_u64 x, int k) { return (x << k) | (x >> (64 - k)); }

static inline mgk_u64 mgk_rng_next(mgk_rng *r) {
    mgk_u64 *s = r->s;
    mgk_u64 result = mgk_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = mgk_rotl(s[3], 45);
    return result;
}

/* uniform in [0, n), unbiased (rejection of the short last interval) */
static inline size_t mgk_rng_below(mgk_rng *r, size_t n) {
    mgk_u64 bound = (mgk_u64)n, limit = (0ull - bound) % bound, x;
    do x = mgk_rng_next(r);
    while (x < limit);
    return (size_t)(x % bound);
}

/* ---- variadic ops: ix lists slots; orders of additions match libmg's eager ops ------------ */

static inline double mgk_sum_fwd(const mgk_real *d, const mgk_idx *ix, size_t len) {
    double acc = 0.0;
    size_t i;
    for (i = 0; i < len; i++) acc += d[ix[i]];
    return acc;
}

static inline void mgk_sum_bwd(mgk_real *g, const mgk_idx *ix, size_t len, double gy) {
    size_t i;
    for (i = 0; i < len; i++) g[ix[i]] += gy;
}

/* ix: a[n], b[n], then the bias when `bias` */
static inline double mgk_dot_fwd(const mgk_real *d, const mgk_idx *ix, size_t n, int bias) {
    double acc = bias ? d[ix[2 * n]] : 0.0;
    size_t i;
    for (i = 0; i < n; i++) acc += d[ix[i]] * d[ix[n + i]];
    return acc;
}

static inline void mgk_dot_bwd(const mgk_real *d, mgk_real *g, const mgk_idx *ix, size_t n, int bias, double gy) {
    size_t i;
    if (bias) g[ix[2 * n]] += gy;
    for (i = 0; i < n; i++) {
        g[ix[i]] += d[ix[n + i]] * gy;
        g[ix[n + i]] += d[ix[i]] * gy;
    }
}

/* ix: pred[n], target[n] */
static inline double mgk_mse_fwd(const mgk_real *d, const mgk_idx *ix, size_t n) {
    double acc = 0.0;
    size_t i;
    for (i = 0; i < n; i++) {
        double e = d[ix[i]] - d[ix[n + i]];
        acc += e * e;
    }
    return acc / (double)n;
}

static inline void mgk_mse_bwd(const mgk_real *d, mgk_real *g, const mgk_idx *ix, size_t n, double gy) {
    double s = 2.0 / (double)n;
    size_t i;
    for (i = 0; i < n; i++) {
        double e = (d[ix[i]] - d[ix[n + i]]) * s * gy;
        g[ix[i]] += e;
        g[ix[n + i]] -= e;
    }
}

/* ix: score[n], label[n]; micrograd's demo: sum(relu(1 + -y*s)) * (1/n) */
static inline double mgk_hinge_fwd(const mgk_real *d, const mgk_idx *ix, size_t n) {
    double acc = 0.0;
    size_t i;
    for (i = 0; i < n; i++) {
        double m = d[ix[i]] * -d[ix[n + i]] + 1.0;
        acc += m < 0.0 ? 0.0 : m;
    }
    return acc * (1.0 / (double)n);
}

static inline void mgk_hinge_bwd(const mgk_real *d, mgk_real *g, const mgk_idx *ix, size_t n, double gy) {
    double s = 1.0 / (double)n;
    size_t i;
    for (i = 0; i < n; i++) {
        double y = -d[ix[n + i]], sc = d[ix[i]];
        if (sc * y + 1.0 > 0.0) {
            g[ix[i]] += y * s * gy;
            g[ix[n + i]] -= sc * s * gy;
        }
    }
}

/* ix: logits[n], then the target (a class index; anything else gives NaN) */
static inline int mgk_xent_target(const mgk_real *d, const mgk_idx *ix, size_t n, size_t *t) {
    double tv = d[ix[n]];
    if (!(tv >= 0.0 && tv < (double)n && tv == floor(tv))) return 0;
    *t = (size_t)tv;
    return 1;
}

static inline double mgk_xent_max(const mgk_real *d, const mgk_idx *ix, size_t n) {
    double m = d[ix[0]];
    size_t i;
    for (i = 1; i < n; i++)
        if (d[ix[i]] > m || d[ix[i]] != d[ix[i]]) m = d[ix[i]];
    return isinf(m) ? 0.0 : m; /* keep exp(z - m) defined; inf logits give inf/NaN as IEEE does */
}

static inline double mgk_xent_fwd(const mgk_real *d, const mgk_idx *ix, size_t n) {
    size_t t, i;
    double m, acc = 0.0;
    if (!mgk_xent_target(d, ix, n, &t)) return NAN;
    m = mgk_xent_max(d, ix, n);
    for (i = 0; i < n; i++) acc += exp(d[ix[i]] - m);
    return log(acc) + m - d[ix[t]];
}

static inline void mgk_xent_bwd(const mgk_real *d, mgk_real *g, const mgk_idx *ix, size_t n, double gy) {
    size_t t, i;
    double m, sum = 0.0;
    if (!mgk_xent_target(d, ix, n, &t)) {
        for (i = 0; i < n; i++) g[ix[i]] += NAN;
        return;
    }
    m = mgk_xent_max(d, ix, n);
    for (i = 0; i < n; i++) sum += exp(d[ix[i]] - m);
    for (i = 0; i < n; i++) g[ix[i]] += (exp(d[ix[i]] - m) / sum - (i == t ? 1.0 : 0.0)) * gy;
}

/* ---- matrix-vector products over packed weights ------------------------------------------ */

/* A layer raised from scalar dot products: pre[j] = b[j] + sum_i W[j][i] * x[i] for j < m.
 * Slots: W[j][i] = d[w0 + j*ldw + i], b[j] = d[b0 + j*ldb], x[i] = d[x0 + i], pre[j] = d[out0 + j].
 * During a run the weights live packed and transposed, pw[p0 + i*m + j], so that one input
 * index touches consecutive outputs: the loops vectorise across outputs while every output's
 * sum still adds its terms in order (no reassociation, so results equal the scalar program). */
typedef struct mgk_mv {
    mgk_idx m, n, w0, ldw, b0, ldb, x0, out0, p0, need_gx;
    mgk_idx roff; /* where this layer's x and gy go in a sample's record row (batched training) */
} mgk_mv;

/* What kernels see besides the slot arrays: the packed weights and their gradients. */
typedef struct mgk_ctx {
    mgk_real *pw;
    mgk_real *pg;
    const void *prog; /* the interpreter's program; unused by generated code */
    double lr;        /* nonzero: apply SGD to packed weights inside backward (batch size 1) */
    mgk_real *rec;      /* non-NULL: record x and gy of each layer here instead (batched training) */
} mgk_ctx;

/* Generated code calls these with constant shapes; inlining them specialises the loops. */
#if defined(__GNUC__) || defined(__clang__)
#define MGK_HOT static inline __attribute__((always_inline))
#else
#define MGK_HOT static inline
#endif

#define MGK_BLOCK 8 /* outputs per register block */

#if defined(__clang__)
/* clang vectorises the plain restrict-qualified loops well (and the blocked ones below badly);
 * both forms add every output's terms in the same order, so they compute the same values. */
MGK_HOT void mgk_mv_fwd(mgk_real *d, const mgk_real *pw, size_t m, size_t n, size_t b0, size_t ldb,
                        size_t x0, size_t out0, size_t p0) {
    mgk_real *restrict o = d + out0;
    const mgk_real *restrict x = d + x0;
    const mgk_real *restrict w = pw + p0;
    size_t i, j;
    for (j = 0; j < m; j++) o[j] = d[b0 + j * ldb];
    for (i = 0; i < n; i++) {
        const mgk_real xi = x[i];
        const mgk_real *restrict wi = w + i * m;
        for (j = 0; j < m; j++) o[j] += wi[j] * xi;
    }
}

MGK_HOT void mgk_mv_bwd(const mgk_real *d, mgk_real *g, mgk_real *pw, mgk_real *pg, size_t m, size_t n,
                        size_t b0, size_t ldb, size_t x0, size_t out0, size_t p0, int need_gx,
                        double lr, mgk_real *rec, size_t roff) {
    const mgk_real *restrict gy = g + out0;
    const mgk_real *restrict x = d + x0;
    size_t i, j;
    for (j = 0; j < m; j++) g[b0 + j * ldb] += gy[j];
    if (need_gx)
        for (i = 0; i < n; i++) {
            const mgk_real *restrict wi = pw + p0 + i * m;
            mgk_real acc = g[x0 + i];
            for (j = m; j-- > 0;) acc += wi[j] * gy[j];
            g[x0 + i] = acc;
        }
    if (rec) {
        for (i = 0; i < n; i++) rec[roff + i] = x[i];
        for (j = 0; j < m; j++) rec[roff + n + j] = gy[j];
        return;
    }
    const mgk_real rlr = (mgk_real)lr; /* exact for double storage */
    for (i = 0; i < n; i++) {
        const mgk_real xi = x[i];
        if (lr != 0.0) {
            mgk_real *restrict w = pw + p0 + i * m;
            for (j = 0; j < m; j++) w[j] -= rlr * (gy[j] * xi);
        } else {
            mgk_real *restrict gw = pg + p0 + i * m;
            for (j = 0; j < m; j++) gw[j] += gy[j] * xi;
        }
    }
}
#else
/* Outputs go in blocks of MGK_BLOCK: a block's partial sums live in a local array the compiler
 * keeps in vector registers (no aliasing with the slot arrays to rule out), while each output's
 * sum still runs over i in order. */
MGK_HOT void mgk_mv_fwd(mgk_real *d, const mgk_real *pw, size_t m, size_t n, size_t b0, size_t ldb,
                        size_t x0, size_t out0, size_t p0) {
    const mgk_real *x = d + x0;
    const mgk_real *w = pw + p0;
    size_t i, j, j0;
    for (j0 = 0; j0 < m; j0 += MGK_BLOCK) {
        mgk_real a[MGK_BLOCK];
        if (j0 + MGK_BLOCK <= m) {
            for (j = 0; j < MGK_BLOCK; j++) a[j] = d[b0 + (j0 + j) * ldb];
            for (i = 0; i < n; i++) {
                const mgk_real xi = x[i];
                const mgk_real *wi = w + i * m + j0;
                for (j = 0; j < MGK_BLOCK; j++) a[j] += wi[j] * xi;
            }
            for (j = 0; j < MGK_BLOCK; j++) d[out0 + j0 + j] = a[j];
        } else {
            size_t jn = m - j0;
            for (j = 0; j < jn; j++) a[j] = d[b0 + (j0 + j) * ldb];
            for (i = 0; i < n; i++) {
                const mgk_real xi = x[i];
                const mgk_real *wi = w + i * m + j0;
                for (j = 0; j < jn; j++) a[j] += wi[j] * xi;
            }
            for (j = 0; j < jn; j++) d[out0 + j0 + j] = a[j];
        }
    }
}

/* Gradients: bias += gy; inputs (when needed) receive sum_j W[j][i] * gy[j] with j descending,
 * the order the scalar backward adds them in; then the packed weight gradient += gy (outer) x,
 * or, with lr nonzero (batch size 1), the SGD step on the weights at once: w -= lr * (gy * x),
 * which is exactly what accumulating gy * x into a zero gradient and stepping computes. */
MGK_HOT void mgk_mv_bwd(const mgk_real *d, mgk_real *g, mgk_real *pw, mgk_real *pg, size_t m, size_t n,
                        size_t b0, size_t ldb, size_t x0, size_t out0, size_t p0, int need_gx,
                        double lr, mgk_real *rec, size_t roff) {
    const mgk_real *x = d + x0;
    size_t i, j, j0;
    for (j = 0; j < m; j++) g[b0 + j * ldb] += g[out0 + j];
    if (need_gx)
        for (i = 0; i < n; i++) {
            const mgk_real *wi = pw + p0 + i * m;
            mgk_real acc = g[x0 + i];
            for (j = m; j-- > 0;) acc += wi[j] * g[out0 + j];
            g[x0 + i] = acc;
        }
    if (rec) {
        for (i = 0; i < n; i++) rec[roff + i] = x[i];
        for (j = 0; j < m; j++) rec[roff + n + j] = g[out0 + j];
        return;
    }
    const mgk_real rlr = (mgk_real)lr; /* exact for double storage */
    for (j0 = 0; j0 < m; j0 += MGK_BLOCK) {
        mgk_real gy[MGK_BLOCK];
        size_t jn = m - j0 < MGK_BLOCK ? m - j0 : MGK_BLOCK;
        for (j = 0; j < jn; j++) gy[j] = g[out0 + j0 + j];
        if (lr != 0.0 && jn == MGK_BLOCK) {
            for (i = 0; i < n; i++) {
                const mgk_real xi = x[i];
                mgk_real *wi = pw + p0 + i * m + j0;
                for (j = 0; j < MGK_BLOCK; j++) wi[j] -= rlr * (gy[j] * xi);
            }
        } else if (lr != 0.0) {
            for (i = 0; i < n; i++) {
                const mgk_real xi = x[i];
                mgk_real *wi = pw + p0 + i * m + j0;
                for (j = 0; j < jn; j++) wi[j] -= rlr * (gy[j] * xi);
            }
        } else if (jn == MGK_BLOCK) {
            for (i = 0; i < n; i++) {
                const mgk_real xi = x[i];
                mgk_real *gw = pg + p0 + i * m + j0;
                for (j = 0; j < MGK_BLOCK; j++) gw[j] += gy[j] * xi;
            }
        } else {
            for (i = 0; i < n; i++) {
                const mgk_real xi = x[i];
                mgk_real *gw = pg + p0 + i * m + j0;
                for (j = 0; j < jn; j++) gw[j] += gy[j] * xi;
            }
        }
    }
}
#endif

/* The batch's weight gradients from its records, fused with the SGD step, for input rows
 * [i0, i1) of one layer: w[j][i] -= scale * (pg + gy_0[j]*x_0[i] + gy_1[j]*x_1[i] + ...), the sum
 * in sample order, exactly as accumulating sample by sample would add it. Outputs go in blocks
 * whose partial sums stay in registers, so the gradient is touched once per batch, not per sample. */
static inline void mgk_mv_outer_step(mgk_real *pw, mgk_real *pg, size_t m, size_t n, size_t p0,
                                     const mgk_real *rec, size_t nrec, size_t roff, size_t batch,
                                     double scale, size_t i0, size_t i1) {
    size_t i, j, j0, s;
    const mgk_real rscale = (mgk_real)scale; /* exact for double storage */
    for (i = i0; i < i1; i++) {
        for (j0 = 0; j0 < m; j0 += MGK_BLOCK) {
            mgk_real acc[MGK_BLOCK];
            size_t jn = m - j0 < MGK_BLOCK ? m - j0 : MGK_BLOCK;
            mgk_real *w = pw + p0 + i * m + j0, *gw = pg + p0 + i * m + j0;
            for (j = 0; j < jn; j++) acc[j] = gw[j];
            if (jn == MGK_BLOCK) {
                for (s = 0; s < batch; s++) {
                    const mgk_real *r = rec + s * nrec + roff;
                    const mgk_real xi = r[i];
                    const mgk_real *gy = r + n + j0;
                    for (j = 0; j < MGK_BLOCK; j++) acc[j] += gy[j] * xi;
                }
            } else {
                for (s = 0; s < batch; s++) {
                    const mgk_real *r = rec + s * nrec + roff;
                    const mgk_real xi = r[i];
                    const mgk_real *gy = r + n + j0;
                    for (j = 0; j < jn; j++) acc[j] += gy[j] * xi;
                }
            }
            for (j = 0; j < jn; j++) {
                w[j] -= rscale * acc[j];
                gw[j] = 0.0;
            }
        }
    }
}

/* ---- training ----------------------------------------------------------------------------- */

/* Where a program keeps its roles: parameters are slots [0, nparams); inputs and targets are
 * contiguous runs starting at input0 and target0. */
typedef struct mgk_layout {
    size_t nslots, nparams, ninputs, ntargets, noutputs, input0, target0, loss;
    const mgk_idx *outputs;
    const mgk_mv *mvs;          /* raised layers (nmv of them), whose weights run packed */
    size_t nmv, npacked;        /* npacked: doubles of packed weights (and of their gradients) */
    const mgk_idx *free_params; /* parameters outside every packed block (nfree of them) */
    size_t nfree;
    size_t nrec;                /* doubles of one sample's record row (sum of n + m) */
} mgk_layout;

typedef void (*mgk_forward_fn)(void *ctx, mgk_real *d);
typedef void (*mgk_backward_fn)(void *ctx, const mgk_real *d, mgk_real *g);

/* SGD: data -= scale * grad over the parameters, then their gradients restart at zero. */
static inline void mgk_step(mgk_real *restrict d, mgk_real *restrict g, size_t nparams, double scale) {
    size_t i;
    const mgk_real rscale = (mgk_real)scale; /* exact for double storage */
    for (i = 0; i < nparams; i++) {
        d[i] -= rscale * g[i];
        g[i] = 0.0;
    }
}

/* Packed weights: W -> pw before a run, pw -> W after it. */
static inline void mgk_pack(const mgk_layout *L, const mgk_real *d, mgk_real *pw) {
    size_t k, i, j;
    for (k = 0; k < L->nmv; k++) {
        const mgk_mv *v = &L->mvs[k];
        for (j = 0; j < v->m; j++)
            for (i = 0; i < v->n; i++) pw[v->p0 + i * v->m + j] = d[v->w0 + j * v->ldw + i];
    }
}

static inline void mgk_unpack(const mgk_layout *L, mgk_real *d, const mgk_real *pw) {
    size_t k, i, j;
    for (k = 0; k < L->nmv; k++) {
        const mgk_mv *v = &L->mvs[k];
        for (j = 0; j < v->m; j++)
            for (i = 0; i < v->n; i++) d[v->w0 + j * v->ldw + i] = pw[v->p0 + i * v->m + j];
    }
}

/* Adds the packed gradients into the slot gradients and clears them. */
static inline void mgk_unpack_grad(const mgk_layout *L, mgk_real *g, mgk_real *pg) {
    size_t k, i, j;
    for (k = 0; k < L->nmv; k++) {
        const mgk_mv *v = &L->mvs[k];
        for (j = 0; j < v->m; j++)
            for (i = 0; i < v->n; i++) {
                g[v->w0 + j * v->ldw + i] += pg[v->p0 + i * v->m + j];
                pg[v->p0 + i * v->m + j] = 0.0;
            }
    }
}

/* SGD over a program whose raised weights are packed: the packed block is one loop, skipped
 * when backward already stepped it (fused). */
static inline void mgk_step_all(const mgk_layout *L, mgk_real *d, mgk_real *g, mgk_real *pw, mgk_real *pg,
                                double scale, int packed_done) {
    size_t k;
    if (!L->nmv) {
        mgk_step(d, g, L->nparams, scale);
        return;
    }
    for (k = 0; k < L->nfree; k++) {
        size_t p = L->free_params[k];
        d[p] -= scale * g[p];
        g[p] = 0.0;
    }
    if (!packed_done) mgk_step(pw, pg, L->npacked, scale);
}

static inline void mgk_load(const mgk_layout *L, mgk_real *d, const double *x, const double *y) {
    size_t i;
    if (x)
        for (i = 0; i < L->ninputs; i++) d[L->input0 + i] = x[i];
    if (y)
        for (i = 0; i < L->ntargets; i++) d[L->target0 + i] = y[i];
}

/* The order samples are visited in: 0..n-1, or a Fisher-Yates shuffle seeded by (seed, epoch). */
static inline void mgk_order(size_t *perm, size_t n, int shuffle, mgk_u64 seed, mgk_u64 epoch) {
    size_t i;
    mgk_rng r;
    for (i = 0; i < n; i++) perm[i] = i;
    if (!shuffle || n < 2) return;
    mgk_rng_seed(&r, seed ^ (0xD1B54A32D192ED03ull * (epoch + 1)));
    for (i = n - 1; i > 0; i--) {
        size_t j = mgk_rng_below(&r, i + 1), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
}

/* One epoch: per sample forward and backward (parameter gradients accumulate), one SGD step per
 * batch with the gradient averaged over the batch. Returns the mean loss. `perm` is scratch for
 * n indices. Samples are rows: X[n][ninputs], Y[n][ntargets]. */
static inline double mgk_fit_epoch(const mgk_layout *L, mgk_forward_fn fwd, mgk_backward_fn bwd,
                                   mgk_ctx *ctx, mgk_real *d, mgk_real *g, const double *X,
                                   const double *Y, size_t n, size_t batch, double lr, size_t *perm,
                                   int shuffle, mgk_u64 seed, mgk_u64 epoch) {
    size_t k, in_batch = 0;
    double total = 0.0;
    if (batch < 1) batch = 1;
    mgk_order(perm, n, shuffle, seed, epoch);
    mgk_pack(L, d, ctx->pw);
    /* batch size 1: the packed weights take their step inside backward (one pass fewer) */
    ctx->lr = batch == 1 && L->nmv ? lr : 0.0;
    for (k = 0; k < n; k++) {
        size_t s = perm[k];
        mgk_load(L, d, X + s * L->ninputs, Y ? Y + s * L->ntargets : NULL);
        fwd(ctx, d);
        total += d[L->loss];
        bwd(ctx, d, g);
        if (++in_batch == batch || k + 1 == n) {
            mgk_step_all(L, d, g, ctx->pw, ctx->pg, lr / (double)in_batch, ctx->lr != 0.0);
            in_batch = 0;
        }
    }
    ctx->lr = 0.0;
    mgk_unpack(L, d, ctx->pw);
    return n ? total / (double)n : 0.0;
}

/* Forward over each row of X, writing the outputs: out[n][noutputs]. */
static inline void mgk_predict(const mgk_layout *L, mgk_forward_fn fwd, mgk_ctx *ctx, mgk_real *d,
                               const double *X, size_t n, double *out) {
    size_t k, j;
    mgk_pack(L, d, ctx->pw);
    for (k = 0; k < n; k++) {
        mgk_load(L, d, X + k * L->ninputs, NULL);
        fwd(ctx, d);
        for (j = 0; j < L->noutputs; j++) out[k * L->noutputs + j] = d[L->outputs[j]];
    }
}

#endif /* MGK_KERNELS_H */
