/* mg kernels: the variadic ops (the losses), the SGD step and the shuffling generator over a
 * frozen program's slot arrays. This one text is compiled into libmg (the eager graph runs the
 * variadic ops through it too, over a gathered scratch copy) and pasted verbatim into every C
 * file the emitter writes, so both run literally the same code. It includes only <math.h> and
 * <stddef.h>. Slot arrays: d (data), g (gradients). The loop nests live in nest_kernels.h. */
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

/* Every function here is static: a generated file uses some of them (an inference program only
 * its loss's forward, a training program none), so the others are marked as possibly unused. */
#if defined(__GNUC__) || defined(__clang__)
#define MGK_FN static inline __attribute__((unused))
#else
#define MGK_FN static inline
#endif

/* ---- generator: xoshiro256** seeded by splitmix64 (integer-only: bitwise portable) -------- */

typedef struct mgk_rng {
    mgk_u64 s[4];
} mgk_rng;

MGK_FN mgk_u64 mgk_splitmix64(mgk_u64 *x) {
    mgk_u64 z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

MGK_FN void mgk_rng_seed(mgk_rng *r, mgk_u64 seed) {
    int i;
    for (i = 0; i < 4; i++) r->s[i] = mgk_splitmix64(&seed);
}

MGK_FN mgk_u64 mgk_rotl(mgk_u64 x, int k) { return (x << k) | (x >> (64 - k)); }

MGK_FN mgk_u64 mgk_rng_next(mgk_rng *r) {
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
MGK_FN size_t mgk_rng_below(mgk_rng *r, size_t n) {
    mgk_u64 bound = (mgk_u64)n, limit = (0ull - bound) % bound, x;
    do x = mgk_rng_next(r);
    while (x < limit);
    return (size_t)(x % bound);
}

/* ---- variadic ops: ix lists slots; orders of additions match libmg's eager ops ------------ */

MGK_FN double mgk_sum_fwd(const mgk_real *d, const mgk_idx *ix, size_t len) {
    double acc = 0.0;
    size_t i;
    for (i = 0; i < len; i++) acc += d[ix[i]];
    return acc;
}

MGK_FN void mgk_sum_bwd(mgk_real *g, const mgk_idx *ix, size_t len, double gy) {
    size_t i;
    for (i = 0; i < len; i++) g[ix[i]] += gy;
}

/* ix: a[n], b[n], then the bias when `bias` */
MGK_FN double mgk_dot_fwd(const mgk_real *d, const mgk_idx *ix, size_t n, int bias) {
    double acc = bias ? d[ix[2 * n]] : 0.0;
    size_t i;
    for (i = 0; i < n; i++) acc += d[ix[i]] * d[ix[n + i]];
    return acc;
}

MGK_FN void mgk_dot_bwd(const mgk_real *d, mgk_real *g, const mgk_idx *ix, size_t n, int bias,
                        double gy) {
    size_t i;
    if (bias) g[ix[2 * n]] += gy;
    for (i = 0; i < n; i++) {
        g[ix[i]] += d[ix[n + i]] * gy;
        g[ix[n + i]] += d[ix[i]] * gy;
    }
}

/* ix: pred[n], target[n] */
MGK_FN double mgk_mse_fwd(const mgk_real *d, const mgk_idx *ix, size_t n) {
    double acc = 0.0;
    size_t i;
    for (i = 0; i < n; i++) {
        double e = d[ix[i]] - d[ix[n + i]];
        acc += e * e;
    }
    return acc / (double)n;
}

MGK_FN void mgk_mse_bwd(const mgk_real *d, mgk_real *g, const mgk_idx *ix, size_t n, double gy) {
    double s = 2.0 / (double)n;
    size_t i;
    for (i = 0; i < n; i++) {
        double e = (d[ix[i]] - d[ix[n + i]]) * s * gy;
        g[ix[i]] += e;
        g[ix[n + i]] -= e;
    }
}

/* ix: score[n], label[n]; micrograd's demo: sum(relu(1 + -y*s)) * (1/n) */
MGK_FN double mgk_hinge_fwd(const mgk_real *d, const mgk_idx *ix, size_t n) {
    double acc = 0.0;
    size_t i;
    for (i = 0; i < n; i++) {
        double m = d[ix[i]] * -d[ix[n + i]] + 1.0;
        acc += m < 0.0 ? 0.0 : m;
    }
    return acc * (1.0 / (double)n);
}

MGK_FN void mgk_hinge_bwd(const mgk_real *d, mgk_real *g, const mgk_idx *ix, size_t n, double gy) {
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
MGK_FN int mgk_xent_target(const mgk_real *d, const mgk_idx *ix, size_t n, size_t *t) {
    double tv = d[ix[n]];
    if (!(tv >= 0.0 && tv < (double)n && tv == floor(tv))) return 0;
    *t = (size_t)tv;
    return 1;
}

MGK_FN double mgk_xent_max(const mgk_real *d, const mgk_idx *ix, size_t n) {
    double m = d[ix[0]];
    size_t i;
    for (i = 1; i < n; i++)
        if (d[ix[i]] > m || d[ix[i]] != d[ix[i]]) m = d[ix[i]];
    return isinf(m) ? 0.0 : m; /* keep exp(z - m) defined; inf logits give inf/NaN as IEEE does */
}

MGK_FN double mgk_xent_fwd(const mgk_real *d, const mgk_idx *ix, size_t n) {
    size_t t, i;
    double m, acc = 0.0;
    if (!mgk_xent_target(d, ix, n, &t)) return NAN;
    m = mgk_xent_max(d, ix, n);
    for (i = 0; i < n; i++) acc += exp(d[ix[i]] - m);
    return log(acc) + m - d[ix[t]];
}

/* The gradient, and where `loss` is not NULL the loss (mgk_xent_fwd's bits: the same sum of the
 * same exps), of one sample's cross-entropy. */
MGK_FN void mgk_xent_grad(const mgk_real *d, mgk_real *g, const mgk_idx *ix, size_t n, double gy,
                          double *loss) {
    size_t t, i;
    double m, sum = 0.0;
    if (!mgk_xent_target(d, ix, n, &t)) {
        for (i = 0; i < n; i++) g[ix[i]] += NAN;
        if (loss) *loss = NAN;
        return;
    }
    m = mgk_xent_max(d, ix, n);
    if (n <= 64) { /* each exp once (the same values as computing them again) */
        double e[64];
        for (i = 0; i < n; i++) {
            e[i] = exp(d[ix[i]] - m);
            sum += e[i];
        }
        for (i = 0; i < n; i++) g[ix[i]] += (e[i] / sum - (i == t ? 1.0 : 0.0)) * gy;
    } else {
        for (i = 0; i < n; i++) sum += exp(d[ix[i]] - m);
        for (i = 0; i < n; i++) g[ix[i]] += (exp(d[ix[i]] - m) / sum - (i == t ? 1.0 : 0.0)) * gy;
    }
    if (loss) *loss = log(sum) + m - d[ix[t]];
}

MGK_FN void mgk_xent_bwd(const mgk_real *d, mgk_real *g, const mgk_idx *ix, size_t n, double gy) {
    mgk_xent_grad(d, g, ix, n, gy, NULL);
}

/* ---- training ----------------------------------------------------------------------------- */

/* SGD: data -= scale * grad over the parameters, then their gradients restart at zero. */
MGK_FN void mgk_step(mgk_real *restrict d, mgk_real *restrict g, size_t nparams, double scale) {
    size_t i;
    const mgk_real rscale = (mgk_real)scale; /* exact for double storage */
    for (i = 0; i < nparams; i++) {
        d[i] -= rscale * g[i];
        g[i] = 0.0;
    }
}

/* The order samples are visited in: 0..n-1, or a Fisher-Yates shuffle seeded by (seed, epoch). */
MGK_FN void mgk_order(size_t *perm, size_t n, int shuffle, mgk_u64 seed, mgk_u64 epoch) {
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

#endif /* MGK_KERNELS_H */
