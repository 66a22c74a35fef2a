/* What a register tile of a batched matrix product costs on this CPU: by how its broadcast operand
 * reaches the registers, and by the stride of the matrix's rows. A measurement for issue 13
 * (batches as matrix products).
 *
 *     cc -O2 -ffp-contract=off -march=native benchmarks/c/tile_bench.c -o tile_bench &&
 * ./tile_bench
 *
 * (./dev test's C stage builds it with the project's flags and -march=native:
 * build/release/benchmarks/tile_bench.) The workload is the batched forward of MLP(784,[50,10])'s
 * first layer at batch 32, out[s][j] = sum_r W[r][j] * x[s][r], run in tiles of 4 samples x 8
 * outputs held in native vectors, 7 blocks of 8 outputs per row (the last block of a 50-output row
 * computes all 8 lanes and stores 2, as libmg's does). libmg's mgk_tile holds 8 samples on AVX2,
 * and gcc keeps 4 of its 16 accumulators on the stack; with 4 samples it keeps them all in
 * registers, and MLP(784,[50,10]) at batch 32 trained at the same speed (59,864 and 59,763
 * images/s on the Zen 1 below). Every variant adds each
 * output's terms in the order of r, with separate multiplies and adds (-ffp-contract=off), so all
 * compute the same bits (checked). Per term a tile loads its block of W once and needs x[s][r] in
 * every lane for each of its 4 samples:
 *
 *   broadcast     splat x[s][r] from memory per term (what mgk_tile does);
 *   panel         the tile's x values splatted once into a panel, panel[r][q] a whole vector, read
 *                 by all 7 blocks (the packing is timed);
 *   panel, K=64   the same in chunks of 64 terms, so that the panel stays in L1 (the sums continue
 *                 from the output between chunks: the same order of additions);
 *   registers     x held in registers (not the product: the ceiling of the multiplies and adds
 *                 with the loads of W alone).
 *
 * each with W's rows (and the outputs') 50 doubles apart, as libmg packs MLP(784,[50,10])'s first
 * layer (400 bytes: most rows start inside a cache line, and a block's loads cross lines), and 56
 * apart (448 bytes, a multiple of 64). It prints multiply-adds per second (lanes counted, all 56),
 * best of many runs. On a Zen 1 (2 GHz EPYC, AVX2; peak.c's mul+add peak 10.1 G/s): broadcast 5.8
 * G/s with rows 50 apart, 6.35 with rows 56 apart; the panels gain nothing (5.1-6.0: the
 * broadcasts are not what limits the tile there); registers 7.8 and 8.5.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#include <stdio.h>
#include <string.h>
#include <time.h>

#if defined(__AVX512F__)
#define VBYTES 64
#elif defined(__AVX__)
#define VBYTES 32
#else
#define VBYTES 16
#endif
#define VW (VBYTES / 8) /* doubles per native vector */
#define LANES 8         /* outputs per block */
#define NV (LANES / VW) /* native vectors per block */
#define TS 4            /* samples per tile */
#define K 784           /* terms (inputs) */
#define M 56            /* outputs computed per row: 7 blocks */
#define B 32            /* samples */
#define KC 64           /* terms per chunk (panel, K=64) */
_Static_assert(TS == 4, "registers() holds the x of 4 samples");

typedef double vec __attribute__((vector_size(VBYTES)));
typedef double vec_u __attribute__((vector_size(VBYTES), aligned(8), may_alias));

static double W[K * M + M], X[B * K], OUT[8][B * M + M];
static vec PANEL[K * TS];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* x in every lane, written as libmg's MGK_VSPLAT writes it */
#if VW == 2
#define splat(x) ((vec){(x), (x)})
#elif VW == 4
#define splat(x) ((vec){(x), (x), (x), (x)})
#else
#define splat(x) ((vec){(x), (x), (x), (x), (x), (x), (x), (x)})
#endif

/* One tile over terms [r0, r1): acc continues from out when r0 > 0. `xp(q, r)` gives sample q's
 * x[r] as a vector (the variants differ only there). */
#define TILE(XV)                                                                                   \
    do {                                                                                           \
        vec acc[TS][NV];                                                                           \
        _Pragma("GCC unroll 8") for (int q = 0; q < TS; q++) {                                     \
            _Pragma("GCC unroll 8") for (int k = 0; k < NV; k++) {                                 \
                if (r0) acc[q][k] = *(const vec_u *)(o + q * LD + k * VW);                         \
                else acc[q][k] = splat(0.0);                                                       \
            }                                                                                      \
        }                                                                                          \
        for (int r = r0; r < r1; r++) {                                                            \
            vec a[NV];                                                                             \
            _Pragma("GCC unroll 8") for (int k = 0; k < NV; k++) a[k] =                            \
                *(const vec_u *)(w + r * LD + k * VW);                                             \
            _Pragma("GCC unroll 8") for (int q = 0; q < TS; q++) {                                 \
                const vec b = XV;                                                                  \
                _Pragma("GCC unroll 8") for (int k = 0; k < NV; k++) acc[q][k] += a[k] * b;        \
            }                                                                                      \
        }                                                                                          \
        for (int q = 0; q < TS; q++) { /* the last block of a 50-output row: its 2 valid lanes */  \
            if (j0 + LANES <= LD) {                                                                \
                _Pragma("GCC unroll 8") for (int k = 0; k < NV; k++) {                             \
                    *(vec_u *)(o + q * LD + k * VW) = acc[q][k];                                   \
                }                                                                                  \
            } else {                                                                               \
                for (int l = 0; l < LD - j0; l++) o[q * LD + l] = acc[q][l / VW][l % VW];          \
            }                                                                                      \
        }                                                                                          \
    } while (0)

static inline __attribute__((always_inline)) void broadcast(double *out, const int LD) {
    for (int s0 = 0; s0 < B; s0 += TS) {
        const double *x = X + s0 * K;
        for (int j0 = 0; j0 < M; j0 += LANES) {
            const double *w = W + j0;
            double *o = out + s0 * LD + j0;
            const int r0 = 0, r1 = K;
            TILE(splat(x[q * K + r]));
        }
    }
}

static inline __attribute__((always_inline)) void panel(double *out, const int LD) {
    for (int s0 = 0; s0 < B; s0 += TS) {
        const double *x = X + s0 * K;
        for (int r = 0; r < K; r++)
            for (int q = 0; q < TS; q++) PANEL[r * TS + q] = splat(x[q * K + r]);
        for (int j0 = 0; j0 < M; j0 += LANES) {
            const double *w = W + j0;
            double *o = out + s0 * LD + j0;
            const int r0 = 0, r1 = K;
            TILE(PANEL[r * TS + q]);
        }
    }
}

static inline __attribute__((always_inline)) void panel_chunks(double *out, const int LD) {
    for (int s0 = 0; s0 < B; s0 += TS) {
        const double *x = X + s0 * K;
        for (int r0 = 0; r0 < K; r0 += KC) {
            const int r1 = r0 + KC < K ? r0 + KC : K;
            for (int r = r0; r < r1; r++)
                for (int q = 0; q < TS; q++) PANEL[(r - r0) * TS + q] = splat(x[q * K + r]);
            for (int j0 = 0; j0 < M; j0 += LANES) {
                const double *w = W + j0;
                double *o = out + s0 * LD + j0;
                TILE(PANEL[(r - r0) * TS + q]);
            }
        }
    }
}

static inline __attribute__((always_inline)) void registers(double *out, const int LD) {
    for (int s0 = 0; s0 < B; s0 += TS) {
        const double *x = X + s0 * K;
        const vec xr[TS] = {splat(x[0]), splat(x[K]), splat(x[2 * K]), splat(x[3 * K])};
        for (int j0 = 0; j0 < M; j0 += LANES) {
            const double *w = W + j0;
            double *o = out + s0 * LD + j0;
            const int r0 = 0, r1 = K;
            TILE(xr[q]);
        }
    }
}

/* each variant at a constant row stride, as generated code has them */
#define AT_STRIDE(name, ld)                                                                        \
    static __attribute__((noinline)) void name##_##ld(double *out) { name(out, ld); }
AT_STRIDE(broadcast, 50)
AT_STRIDE(panel, 50)
AT_STRIDE(panel_chunks, 50)
AT_STRIDE(registers, 50)
AT_STRIDE(broadcast, 56)
AT_STRIDE(panel, 56)
AT_STRIDE(panel_chunks, 56)
AT_STRIDE(registers, 56)

int main(void) {
    static const struct {
        const char *name;
        int ld;
        void (*run)(double *);
    } variants[] = {{"broadcast", 50, broadcast_50},      {"panel", 50, panel_50},
                    {"panel, K=64", 50, panel_chunks_50}, {"registers", 50, registers_50},
                    {"broadcast", 56, broadcast_56},      {"panel", 56, panel_56},
                    {"panel, K=64", 56, panel_chunks_56}, {"registers", 56, registers_56}};
    for (int i = 0; i < K * M + M; i++) W[i] = 1e-3 * (double)(i % 97) - 0.04;
    for (int i = 0; i < B * K; i++) X[i] = 1e-2 * (double)(i % 89) - 0.3;
    printf("register tile of %d samples x %d doubles (%d-byte vectors), %d terms, %d outputs, "
           "batch %d\n",
           TS, LANES, VBYTES, K, M, B);
    for (int v = 0; v < 8; v++) {
        double best = 0.0, end = now() + 0.5;
        do {
            const double t0 = now();
            for (int it = 0; it < 20; it++) variants[v].run(OUT[v]);
            const double rate = 20.0 * B * M * K / (now() - t0);
            if (rate > best) best = rate;
        } while (now() < end);
        printf("  rows %d apart  %-12s %6.2f G multiply-adds/s", variants[v].ld, variants[v].name,
               best / 1e9);
        if (v % 4 == 1 || v % 4 == 2) /* the panels against the broadcast at the same stride */
            printf("  (%s bits)",
                   memcmp(OUT[v], OUT[v - v % 4], sizeof OUT[0]) ? "NOT the same" : "the same");
        printf("\n");
    }
    return 0;
}
