/* The arithmetic peak of one core for float64 multiply-adds, for benchmarks/compile.py.
 *
 * Twelve independent chains x = x * m + a over vectors of W doubles (GNU C vector extensions),
 * so the floating-point units, not the latency of one chain, set the pace (12 chains cover the
 * latency of a multiply followed by an add, or of an FMA, on two pipes of current x86 and Arm
 * cores, and fit in 16 vector registers with the two constants). Compiled by the benchmark
 * twice: with -ffp-contract=off each step is a multiply and an add (what strict code such as
 * micrograd_c's can use); with -ffp-contract=fast the compiler fuses them into FMAs when the
 * target has them.
 *
 *     double peak_madds(int width, double seconds);
 *
 * runs the kernel over vectors of `width` doubles (1, 2, 4 or 8) for about `seconds` and returns
 * multiply-adds per second (one multiply-add = one multiply and one add, per lane). Returns 0
 * for an unsupported width. Built standalone with -DPEAK_MAIN it prints every width.
 */
#include <stddef.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define STEP(x) x = x * m + a
#define STEPS                                                                                      \
    STEP(x0);                                                                                      \
    STEP(x1);                                                                                      \
    STEP(x2);                                                                                      \
    STEP(x3);                                                                                      \
    STEP(x4);                                                                                      \
    STEP(x5);                                                                                      \
    STEP(x6);                                                                                      \
    STEP(x7);                                                                                      \
    STEP(x8);                                                                                      \
    STEP(x9);                                                                                      \
    STEP(x10);                                                                                     \
    STEP(x11)

/* One kernel per vector type T of L lanes: `iters` rounds of 12 chains x 8 steps. */
#define KERNEL(NAME, T, L)                                                                         \
    static __attribute__((noinline)) double NAME(long iters, double mm, double aa) {               \
        T zero = {0};                                                                              \
        T m = zero + mm, a = zero + aa;                                                            \
        T x0 = zero + 1.0, x1 = zero + 2.0, x2 = zero + 3.0, x3 = zero + 4.0;                      \
        T x4 = zero + 5.0, x5 = zero + 6.0, x6 = zero + 7.0, x7 = zero + 8.0;                      \
        T x8 = zero + 9.0, x9 = zero + 10.0, x10 = zero + 11.0, x11 = zero + 12.0;                 \
        for (long it = 0; it < iters; it++) {                                                      \
            STEPS;                                                                                 \
            STEPS;                                                                                 \
            STEPS;                                                                                 \
            STEPS;                                                                                 \
            STEPS;                                                                                 \
            STEPS;                                                                                 \
            STEPS;                                                                                 \
            STEPS;                                                                                 \
        }                                                                                          \
        T s = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7 + x8 + x9 + x10 + x11;                         \
        double r = 0.0;                                                                            \
        for (int l = 0; l < (L); l++) r += s[l];                                                   \
        return r;                                                                                  \
    }

typedef double v1 __attribute__((vector_size(8)));
typedef double v2 __attribute__((vector_size(16)));
typedef double v4 __attribute__((vector_size(32)));
typedef double v8 __attribute__((vector_size(64)));
KERNEL(k1, v1, 1)
KERNEL(k2, v2, 2)
KERNEL(k4, v4, 4)
KERNEL(k8, v8, 8)

volatile double peak_sink; /* keeps the results alive */

static double run(int width, long iters, volatile double *m, volatile double *a) {
    switch (width) {
    case 1: return k1(iters, *m, *a);
    case 2: return k2(iters, *m, *a);
    case 4: return k4(iters, *m, *a);
    case 8: return k8(iters, *m, *a);
    default: return 0.0;
    }
}

double peak_madds(int width, double seconds) {
    if (width != 1 && width != 2 && width != 4 && width != 8) return 0.0;
    volatile double m = 0.5, a = 0.25; /* x converges to 0.5: no overflow, no subnormals */
    long iters = 1000;
    double dt = 0.0, best = 0.0;
    for (;;) { /* grow until one run lasts a hundredth of the budget: short runs, many of them, so
                * the best one ran while nothing else used the core */
        double t0 = now();
        peak_sink = run(width, iters, &m, &a);
        dt = now() - t0;
        if (dt >= seconds / 100 || iters > (1L << 40)) break;
        iters *= 2;
    }
    double end = now() + seconds;
    do {
        double t0 = now();
        peak_sink = run(width, iters, &m, &a);
        dt = now() - t0;
        double rate = (double)iters * 12.0 * 8.0 * (double)width / dt;
        if (rate > best) best = rate;
    } while (now() < end);
    return best;
}

#ifdef PEAK_MAIN
#include <stdio.h>
int main(void) {
    for (int w = 1; w <= 8; w *= 2)
        printf("width %d: %.2f G multiply-adds/s\n", w, peak_madds(w, 0.3) / 1e9);
    return 0;
}
#endif
