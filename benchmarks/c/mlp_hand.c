/* MLP(784,[50,10]) with softmax cross-entropy trained by SGD: the obvious loops a C programmer
 * writes, as the reference for benchmarks/compile.py.
 *
 * Parameters are one array in PyTorch's layout: W1 (NH x NI, row-major), b1 (NH), W2 (NO x NH),
 * b2 (NO). Gradients have the same layout, so the SGD step is one loop. Each sample runs three
 * phases: forward (one dot product per neuron, bias first, then the products in input order),
 * backward (into the gradient arrays), and either the SGD step (per sample) or accumulation until
 * the end of the batch (mlp_train_epoch_batched: one step of lr / (samples in the batch)).
 *
 * Built twice by the benchmark: strict (-O2 -ffp-contract=off -march=native, micrograd_c's own
 * flags: the dot products stay scalar chains) and -O3 -ffast-math -march=native.
 *
 *     double mlp_train_epoch(double *params, const double *X, const double *Y,
 *                            const size_t *order, size_t n, double lr);
 *     double mlp_train_epoch_batched(double *params, const double *X, const double *Y,
 *                                    const size_t *order, size_t n, double lr, size_t batch);
 *
 * X is n rows of NI doubles, Y n class indices (as doubles), order the sample visited at each
 * step. Both return the epoch's mean loss (each sample's loss before its step); the batched
 * version returns -1 when it cannot allocate its working memory.
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#ifndef NI
#define NI 784
#endif
#ifndef NH
#define NH 50
#endif
#ifndef NO
#define NO 10
#endif
#define NP (NH * NI + NH + NO * NH + NO)

size_t mlp_nparams(void) { return NP; }

/* Forward of one sample: h (after ReLU), p (softmax); returns the loss. */
static double forward(const double *params, const double *x, int y, double *h, double *p) {
    const double *W1 = params, *b1 = W1 + NH * NI, *W2 = b1 + NH, *b2 = W2 + NO * NH;
    for (int j = 0; j < NH; j++) {
        double a = b1[j];
        for (int i = 0; i < NI; i++) a += W1[j * NI + i] * x[i];
        h[j] = a > 0.0 ? a : 0.0;
    }
    double z[NO], zmax = -INFINITY;
    for (int k = 0; k < NO; k++) {
        double a = b2[k];
        for (int j = 0; j < NH; j++) a += W2[k * NH + j] * h[j];
        z[k] = a;
        if (a > zmax) zmax = a;
    }
    double s = 0.0;
    for (int k = 0; k < NO; k++) {
        p[k] = exp(z[k] - zmax);
        s += p[k];
    }
    for (int k = 0; k < NO; k++) p[k] /= s;
    return log(s) + zmax - z[y];
}

/* Backward of one sample into g (same layout as params); adds to g when accumulate, else
 * overwrites it. */
static void backward(const double *params, const double *x, int y, const double *h, const double *p,
                     double *g, int accumulate) {
    const double *W2 = params + NH * NI + NH;
    double *gW1 = g, *gb1 = gW1 + NH * NI, *gW2 = gb1 + NH, *gb2 = gW2 + NO * NH;
    double dz[NO];
    for (int k = 0; k < NO; k++) dz[k] = p[k] - (k == y ? 1.0 : 0.0);
    for (int k = 0; k < NO; k++) {
        if (accumulate) {
            for (int j = 0; j < NH; j++) gW2[k * NH + j] += dz[k] * h[j];
            gb2[k] += dz[k];
        } else {
            for (int j = 0; j < NH; j++) gW2[k * NH + j] = dz[k] * h[j];
            gb2[k] = dz[k];
        }
    }
    for (int j = 0; j < NH; j++) {
        double dh = 0.0;
        for (int k = 0; k < NO; k++) dh += W2[k * NH + j] * dz[k];
        double d = h[j] > 0.0 ? dh : 0.0;
        if (accumulate) {
            for (int i = 0; i < NI; i++) gW1[j * NI + i] += d * x[i];
            gb1[j] += d;
        } else {
            for (int i = 0; i < NI; i++) gW1[j * NI + i] = d * x[i];
            gb1[j] = d;
        }
    }
}

static void sgd(double *params, const double *g, double lr) {
    for (size_t q = 0; q < NP; q++) params[q] -= lr * g[q];
}

double mlp_train_epoch(double *params, const double *X, const double *Y, const size_t *order,
                       size_t n, double lr) {
    static double g[NP];
    double h[NH], p[NO], total = 0.0;
    for (size_t k = 0; k < n; k++) {
        const double *x = X + order[k] * NI;
        int y = (int)Y[order[k]];
        total += forward(params, x, y, h, p);
        backward(params, x, y, h, p, g, 0);
        sgd(params, g, lr);
    }
    return n ? total / (double)n : 0.0;
}

double mlp_train_epoch_batched(double *params, const double *X, const double *Y,
                               const size_t *order, size_t n, double lr, size_t batch) {
    double *g = malloc(NP * sizeof *g);
    if (!g) return -1.0;
    double h[NH], p[NO], total = 0.0;
    if (batch < 1) batch = 1;
    for (size_t b0 = 0; b0 < n; b0 += batch) {
        size_t bn = n - b0 < batch ? n - b0 : batch;
        memset(g, 0, NP * sizeof *g);
        for (size_t k = b0; k < b0 + bn; k++) {
            const double *x = X + order[k] * NI;
            int y = (int)Y[order[k]];
            total += forward(params, x, y, h, p);
            backward(params, x, y, h, p, g, 1);
        }
        sgd(params, g, lr / (double)bn);
    }
    free(g);
    return n ? total / (double)n : 0.0;
}
