/* The reference a C programmer would write for benchmarks/zoo.py's `cnn` family: conv 3x3 with
 * CH channels (4 unless -DCH=...) and PAD pixels of padding (0 unless -DPAD=..., the taps that
 * fall on it skipped, as zoo's _conv does), ReLU, 2x2 max pooling, dense 10, softmax
 * cross-entropy, one SGD step per sample. The obvious loops, strict floating point (build with
 * -O2 -ffp-contract=off, as micrograd_c builds its own code). Parameters in zoo's order:
 * w[c][a][b], b[c], W[k][f], B[k]. benchmarks/models.py compiles it (-DCH=48 -DPAD=1 for
 * `cnn48`) and calls train_epoch through ctypes. */
#include <math.h>
#include <stddef.h>

#define IN 28
#ifndef CH
#define CH 4
#endif
#ifndef PAD
#define PAD 0
#endif
#define KS 3
#define CO (IN + 2 * PAD - KS + 1) /* 26 without padding */
#define PO (CO / 2)                /* 13 */

/* Input pixel (i, j) of the padded image: 0 on the padding, where no tap adds anything. */
#define IN_IMAGE(i, j) ((i) >= 0 && (i) < IN && (j) >= 0 && (j) < IN)
#define NF (CH * PO * PO)
#define NC 10

typedef struct params {
    double w[CH][KS][KS], b[CH], W[NC][NF], B[NC];
} params;

size_t cnn_nparams(void) { return sizeof(params) / sizeof(double); }

double cnn_train_epoch(double *pp, const double *X, const double *Y, const size_t *order, size_t n,
                       double lr) {
    params *p = (params *)pp;
    static double act[CH][CO][CO], pool[NF], gpool[NF], gw[CH][KS][KS], gb[CH];
    static int arg[NF];
    double total = 0.0;
    for (size_t s = 0; s < n; s++) {
        const double *x = X + order[s] * IN * IN;
        int y = (int)Y[order[s]];
        /* forward: conv + relu, pool, dense */
        for (int c = 0; c < CH; c++)
            for (int i = 0; i < CO; i++)
                for (int j = 0; j < CO; j++) {
                    double acc = p->b[c];
                    for (int a = 0; a < KS; a++)
                        for (int b = 0; b < KS; b++) {
                            const int ii = i + a - PAD, jj = j + b - PAD;
                            if (IN_IMAGE(ii, jj)) acc += p->w[c][a][b] * x[ii * IN + jj];
                        }
                    act[c][i][j] = acc > 0.0 ? acc : 0.0;
                }
        for (int c = 0; c < CH; c++)
            for (int i = 0; i < PO; i++)
                for (int j = 0; j < PO; j++) {
                    int f = (c * PO + i) * PO + j, best = 0;
                    double m = act[c][2 * i][2 * j];
                    for (int q = 1; q < 4; q++) {
                        double v = act[c][2 * i + q / 2][2 * j + q % 2];
                        if (v > m) m = v, best = q;
                    }
                    pool[f] = m;
                    arg[f] = best;
                }
        double logits[NC], mx = -INFINITY, sum = 0.0;
        for (int k = 0; k < NC; k++) {
            double acc = p->B[k];
            for (int f = 0; f < NF; f++) acc += p->W[k][f] * pool[f];
            logits[k] = acc;
            if (acc > mx) mx = acc;
        }
        for (int k = 0; k < NC; k++) sum += exp(logits[k] - mx);
        total += log(sum) + mx - logits[y];
        /* backward and SGD */
        for (int f = 0; f < NF; f++) gpool[f] = 0.0;
        for (int k = 0; k < NC; k++) {
            double g = exp(logits[k] - mx) / sum - (k == y ? 1.0 : 0.0);
            for (int f = 0; f < NF; f++) {
                gpool[f] += p->W[k][f] * g;
                p->W[k][f] -= lr * g * pool[f];
            }
            p->B[k] -= lr * g;
        }
        for (int c = 0; c < CH; c++) {
            gb[c] = 0.0;
            for (int a = 0; a < KS; a++)
                for (int b = 0; b < KS; b++) gw[c][a][b] = 0.0;
        }
        for (int c = 0; c < CH; c++)
            for (int i = 0; i < PO; i++)
                for (int j = 0; j < PO; j++) {
                    int f = (c * PO + i) * PO + j, q = arg[f];
                    int ii = 2 * i + q / 2, jj = 2 * j + q % 2;
                    if (act[c][ii][jj] <= 0.0) continue; /* relu */
                    double g = gpool[f];
                    gb[c] += g;
                    for (int a = 0; a < KS; a++)
                        for (int b = 0; b < KS; b++) {
                            const int xi = ii + a - PAD, xj = jj + b - PAD;
                            if (IN_IMAGE(xi, xj)) gw[c][a][b] += g * x[xi * IN + xj];
                        }
                }
        for (int c = 0; c < CH; c++) {
            p->b[c] -= lr * gb[c];
            for (int a = 0; a < KS; a++)
                for (int b = 0; b < KS; b++) p->w[c][a][b] -= lr * gw[c][a][b];
        }
    }
    return n ? total / (double)n : 0.0;
}
