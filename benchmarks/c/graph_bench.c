/* libmg graph benchmark: build and backward a ~1,000,000-value MLP-shaped graph, op by op as
 * micrograd builds it (MLP(784,[637,10]): every neuron a chain of mul and add), plus the cost of
 * a value and the 10,000,000-deep chain.
 *
 *     build/release/benchmarks/graph_bench [repeats]
 *
 * Prints medians of the repeats. */
#define _POSIX_C_SOURCE 200809L
#include <mg/mg.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (reps < 1 || reps > 50) reps = 5;
    mg_graph *g = mg_graph_new();
    mg_rng r;
    mg_rng_seed(&r, 0);
    size_t sizes[2] = {637, 10};
    mg_mlp *m = mg_mlp_new(g, 784, sizes, 2, MG_ACT_RELU, MG_INIT_SCALED, &r);
    if (!m) return 1;
    mg_value **p = malloc(mg_mlp_param_count(m) * sizeof *p);
    mg_mlp_params(m, p);
    mg_graph_checkpoint cp = mg_graph_save(g);
    double tb[50], tw[50];
    size_t nodes = 0;
    double loss = 0;
    for (int k = 0; k < reps; k++) {
        double t0 = now();
        mg_value *x[784], *h[637], *o[10];
        for (int i = 0; i < 784; i++) x[i] = mg_scalar(g, (double)(i % 17) / 17.0);
        size_t q = 0;
        for (int j = 0; j < 637; j++, q += 785) { /* micrograd: sum((wi*xi ...), b).relu() */
            mg_value *acc = p[q + 784];
            for (int i = 0; i < 784; i++) acc = mg_add(g, acc, mg_mul(g, p[q + (size_t)i], x[i]));
            h[j] = mg_relu(g, acc);
        }
        for (int j = 0; j < 10; j++, q += 638) {
            mg_value *acc = p[q + 637];
            for (int i = 0; i < 637; i++) acc = mg_add(g, acc, mg_mul(g, p[q + (size_t)i], h[i]));
            o[j] = acc;
        }
        mg_value *t = mg_scalar(g, 3.0);
        mg_value *l = mg_cross_entropy(g, o, 10, t);
        double t1 = now();
        if (!l || mg_backward(g, l) != MG_OK) return 1;
        double t2 = now();
        tb[k] = t1 - t0;
        tw[k] = t2 - t1;
        nodes = mg_graph_len(g) - (size_t)mg_mlp_param_count(m);
        loss = mg_value_data(l);
        mg_graph_restore(g, cp);
    }
    printf(
        "MLP(784,[637,10]) built op by op: %zu values per graph (plus %zu parameters), loss %.6f\n",
        nodes, mg_mlp_param_count(m), loss);
    printf("build    median %.1f ms  (%.1f ns per value)\n", median(tb, reps) * 1e3,
           median(tb, reps) * 1e9 / (double)nodes);
    printf("backward median %.1f ms  (%.1f ns per value)\n", median(tw, reps) * 1e3,
           median(tw, reps) * 1e9 / (double)nodes);
    printf("medians of %d runs; each run restores the checkpoint taken after the model\n", reps);
    mg_mlp_free(m);
    free(p);
    mg_graph_free(g);
    return 0;
}
