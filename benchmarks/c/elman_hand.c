/* The reference a C programmer would write for benchmarks/zoo.py's `elman` family: an Elman RNN
 * (16 tanh units) over the 28 rows of an image, dense 10 on the last state, softmax
 * cross-entropy, backpropagation through time, one SGD step per sample. The obvious loops, strict
 * floating point (build with -O2 -ffp-contract=off, as micrograd_c builds its own code).
 * Parameters in zoo's order: Wx[j][i], Wh[j][k], bh[j], Wy[k][j], by[k]. benchmarks/models.py
 * compiles it and calls train_epoch through ctypes. */
#include <math.h>
#include <stddef.h>

#define T 28
#define NI 28
#define NH 16
#define NC 10

typedef struct params {
    double Wx[NH][NI], Wh[NH][NH], bh[NH], Wy[NC][NH], by[NC];
} params;

size_t elman_nparams(void) { return sizeof(params) / sizeof(double); }

double elman_train_epoch(double *pp, const double *X, const double *Y, const size_t *order,
                         size_t n, double lr) {
    params *p = (params *)pp;
    static params g;
    static double h[T][NH], gh[NH], ga[NH];
    double total = 0.0;
    for (size_t s = 0; s < n; s++) {
        const double *x = X + order[s] * T * NI;
        int y = (int)Y[order[s]];
        for (int t = 0; t < T; t++)
            for (int j = 0; j < NH; j++) {
                double acc = p->bh[j];
                for (int i = 0; i < NI; i++) acc += p->Wx[j][i] * x[t * NI + i];
                if (t > 0)
                    for (int k = 0; k < NH; k++) acc += p->Wh[j][k] * h[t - 1][k];
                h[t][j] = tanh(acc);
            }
        double logits[NC], mx = -INFINITY, sum = 0.0;
        for (int k = 0; k < NC; k++) {
            double acc = p->by[k];
            for (int j = 0; j < NH; j++) acc += p->Wy[k][j] * h[T - 1][j];
            logits[k] = acc;
            if (acc > mx) mx = acc;
        }
        for (int k = 0; k < NC; k++) sum += exp(logits[k] - mx);
        total += log(sum) + mx - logits[y];
        /* backward through time */
        double *gp = (double *)&g;
        for (size_t q = 0; q < sizeof g / sizeof(double); q++) gp[q] = 0.0;
        for (int j = 0; j < NH; j++) gh[j] = 0.0;
        for (int k = 0; k < NC; k++) {
            double gl = exp(logits[k] - mx) / sum - (k == y ? 1.0 : 0.0);
            g.by[k] += gl;
            for (int j = 0; j < NH; j++) {
                g.Wy[k][j] += gl * h[T - 1][j];
                gh[j] += p->Wy[k][j] * gl;
            }
        }
        for (int t = T - 1; t >= 0; t--) {
            for (int j = 0; j < NH; j++) ga[j] = gh[j] * (1.0 - h[t][j] * h[t][j]);
            for (int j = 0; j < NH; j++) gh[j] = 0.0;
            for (int j = 0; j < NH; j++) {
                g.bh[j] += ga[j];
                for (int i = 0; i < NI; i++) g.Wx[j][i] += ga[j] * x[t * NI + i];
                if (t > 0)
                    for (int k = 0; k < NH; k++) {
                        g.Wh[j][k] += ga[j] * h[t - 1][k];
                        gh[k] += p->Wh[j][k] * ga[j];
                    }
            }
        }
        for (size_t q = 0; q < sizeof g / sizeof(double); q++) pp[q] -= lr * gp[q];
    }
    return n ? total / (double)n : 0.0;
}
