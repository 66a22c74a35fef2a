/* Neurons, layers, MLPs: determinism, XOR training, and allocation failure at every step. */
#include "tap.h"

#include "failing_alloc.h"

#include <mg/mg.h>
#include <stdint.h>
#include <string.h>

/* One training step of MLP(2,[4,1]) on XOR: forward over 4 samples, MSE, backward, SGD update,
 * restore. Returns the loss, or NaN when an allocation failed (the graph must be as before). */
static double xor_step(mg_graph *g, mg_mlp *m, double lr) {
    static const double X[4][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}}, Y[4] = {0, 1, 1, 0};
    mg_graph_checkpoint cp = mg_graph_save(g);
    mg_value *pred[4], *tgt[4];
    for (int i = 0; i < 4; i++) {
        mg_value *x[2] = {mg_scalar(g, X[i][0]), mg_scalar(g, X[i][1])};
        tgt[i] = mg_scalar(g, Y[i]);
        if (!x[0] || !x[1] || mg_mlp_call(g, m, x, &pred[i]) != MG_OK) pred[i] = NULL;
    }
    mg_value *loss = mg_mse(g, pred, tgt, 4);
    if (!loss || mg_backward(g, loss) != MG_OK) {
        mg_graph_restore(g, cp);
        return NAN;
    }
    double l = mg_value_data(loss);
    mg_value *p[64];
    size_t np = mg_mlp_params(m, p);
    for (size_t i = 0; i < np; i++) {
        mg_value_set_data(p[i], mg_value_data(p[i]) - lr * mg_value_grad(p[i]));
        mg_value_set_grad(p[i], 0.0);
    }
    mg_graph_restore(g, cp);
    return l;
}

static void test_nn__param_counts_and_order(void) {
    mg_graph *g = mg_graph_new();
    mg_rng r;
    mg_rng_seed(&r, 1);
    size_t sizes[3] = {16, 16, 1};
    mg_mlp *m = mg_mlp_new(g, 2, sizes, 3, MG_ACT_RELU, MG_INIT_UNIFORM, &r);
    CHECK(m && mg_mlp_param_count(m) == 337); /* micrograd's MLP(2, [16, 16, 1]) */
    CHECK(mg_mlp_nin(m) == 2 && mg_mlp_nout(m) == 1 && mg_mlp_nlayers(m) == 3);
    CHECK(mg_neuron_activation(mg_layer_neuron(mg_mlp_layer(m, 0), 0)) == MG_ACT_RELU);
    CHECK(mg_neuron_activation(mg_layer_neuron(mg_mlp_layer(m, 2), 0)) == MG_ACT_LINEAR);
    mg_value *p[337];
    CHECK(mg_mlp_params(m, p) == 337);
    mg_neuron *n0 = mg_layer_neuron(mg_mlp_layer(m, 0), 0);
    mg_value *np0[3];
    CHECK(mg_neuron_params(n0, np0) == 3 && np0[0] == p[0] && np0[2] == p[2]);
    CHECK(mg_value_data(p[2]) == 0.0); /* bias starts at 0 */
    for (size_t i = 0; i < 337; i++)
        CHECK(mg_value_data(p[i]) >= -1.0 && mg_value_data(p[i]) < 1.0);
    CHECK(mg_graph_len(g) == 337);
    /* bad shapes are errors, not crashes */
    size_t zero[2] = {4, 0};
    CHECK(mg_mlp_new(g, 2, zero, 2, MG_ACT_RELU, MG_INIT_UNIFORM, &r) == NULL);
    CHECK(mg_mlp_new(g, 2, sizes, 0, MG_ACT_RELU, MG_INIT_UNIFORM, &r) == NULL);
    CHECK(mg_mlp_new(g, 0, sizes, 3, MG_ACT_RELU, MG_INIT_UNIFORM, &r) == NULL);
    CHECK(strstr(mg_graph_last_error(g), "at least one input") != NULL);
    CHECK(mg_neuron_new(g, 0, MG_ACT_RELU, MG_INIT_UNIFORM, &r) == NULL);
    CHECK(mg_graph_len(g) == 337);
    mg_value *out[1];
    CHECK(mg_mlp_call(g, m, NULL, out) != MG_OK);
    CHECK(mg_graph_len(g) == 337);
    /* a NULL input is named, not left to an earlier call's message (found by review) */
    mg_value *half[2] = {mg_scalar(g, 1.0), NULL};
    CHECK(mg_mlp_call(g, m, half, out) == MG_EINVAL);
    CHECK(strstr(mg_graph_last_error(g), "mg_mlp_call: input 1 is NULL") != NULL);
    CHECK(mg_graph_len(g) == 338);
    mg_mlp_free(m);
    mg_graph_free(g);
}

static void test_nn__neuron_matches_micrograd_formula(void) {
    mg_graph *g = mg_graph_new();
    mg_rng r;
    mg_rng_seed(&r, 7);
    mg_neuron *n = mg_neuron_new(g, 3, MG_ACT_RELU, MG_INIT_SCALED, &r);
    mg_value *p[4];
    mg_neuron_params(n, p);
    mg_value_set_data(p[3], 0.25);
    for (int i = 0; i < 3; i++) CHECK(fabs(mg_value_data(p[i])) < 1.0 / sqrt(3.0));
    mg_value *x[3] = {mg_scalar(g, 0.5), mg_scalar(g, -1.5), mg_scalar(g, 2.0)};
    mg_value *y = mg_neuron_call(g, n, x);
    double act = 0.25;
    for (int i = 0; i < 3; i++) act = act + mg_value_data(p[i]) * mg_value_data(x[i]);
    CHECK(mg_value_data(y) == (act < 0 ? 0.0 : act));
    mg_neuron_free(n);
    mg_graph_free(g);
}

static void test_nn__same_seed_same_weights_bitwise(void) {
    size_t sizes[2] = {8, 3};
    double w1[4 * 8 + 9 * 3], w2[4 * 8 + 9 * 3];
    for (int run = 0; run < 2; run++) {
        mg_graph *g = mg_graph_new();
        mg_rng r;
        mg_rng_seed(&r, 1337);
        mg_mlp *m = mg_mlp_new(g, 3, sizes, 2, MG_ACT_TANH, MG_INIT_SCALED, &r);
        mg_value *p[59];
        CHECK(mg_mlp_params(m, p) == 59);
        for (int i = 0; i < 59; i++) (run ? w2 : w1)[i] = mg_value_data(p[i]);
        mg_mlp_free(m);
        mg_graph_free(g);
    }
    CHECK(memcmp(w1, w2, sizeof w1) == 0);
    /* and the generator is the documented one: splitmix64-seeded xoshiro256** */
    mg_rng r;
    mg_rng_seed(&r, 0);
    uint64_t first = mg_rng_next(&r);
    mg_rng_seed(&r, 0);
    CHECK(mg_rng_next(&r) == first);
    mg_rng_seed(&r, 1);
    CHECK(mg_rng_next(&r) != first);
    mg_rng_seed(&r, 3);
    for (int i = 0; i < 1000; i++) {
        double u = mg_rng_uniform(&r, -1.0, 1.0);
        CHECK(u >= -1.0 && u < 1.0);
    }
}

static void test_nn__xor_trains_below_1e3(void) {
    mg_graph *g = mg_graph_new();
    mg_rng r;
    mg_rng_seed(&r, 42);
    size_t sizes[2] = {4, 1};
    mg_mlp *m = mg_mlp_new(g, 2, sizes, 2, MG_ACT_TANH, MG_INIT_UNIFORM, &r);
    size_t len = mg_graph_len(g);
    double first = xor_step(g, m, 0.5), loss = first;
    for (int step = 0; step < 3000 && loss >= 1e-4; step++) loss = xor_step(g, m, 0.5);
    printf("# XOR MLP(2,[4,1]) tanh: loss %.3g -> %.3g\n", first, loss);
    CHECK(loss < 1e-3);
    CHECK(mg_graph_len(g) == len); /* restore freed every step's graph */
    mg_mlp_free(m);
    mg_graph_free(g);
}

static void test_nn__allocation_failure_at_every_k(void) {
    /* For every k: fail the k-th allocation somewhere in init + two training steps. The failing
     * call reports it, the graph is exactly as before, a retry succeeds, and nothing leaks. */
    int ks = 0, failures = 0;
    for (long k = 1;; k++) {
        failing_alloc fa = {0, k, 0, 0};
        mg_allocator al = failing_allocator(&fa);
        mg_graph *g = mg_graph_new_with(&al);
        if (!g) { /* the graph struct itself was the k-th */
            CHECK(fa.live == 0);
            continue;
        }
        mg_rng r;
        mg_rng_seed(&r, 5);
        size_t sizes[2] = {4, 1};
        mg_mlp *m = mg_mlp_new(g, 2, sizes, 2, MG_ACT_TANH, MG_INIT_UNIFORM, &r);
        if (!m) {
            CHECK(mg_graph_len(g) == 0);
            CHECK(mg_graph_last_status(g) == MG_ENOMEM);
            mg_rng_seed(&r, 5);
            m = mg_mlp_new(g, 2, sizes, 2, MG_ACT_TANH, MG_INIT_UNIFORM, &r);
            CHECK(m != NULL);
        }
        size_t len = mg_graph_len(g);
        for (int step = 0; step < 2; step++) {
            mg_value *p[17];
            mg_mlp_params(m, p);
            double before = mg_value_data(p[5]);
            double l = xor_step(g, m, 0.1);
            CHECK(mg_graph_len(g) == len);
            if (isnan(l)) {
                CHECK(mg_value_data(p[5]) == before); /* nothing applied */
                CHECK(!isnan(xor_step(g, m, 0.1)));   /* usable afterwards */
                failures++;
            }
        }
        mg_mlp_free(m);
        mg_graph_free(g);
        CHECK(fa.live == 0);
        ks++;
        if (!fa.failed) break; /* k beyond the workload's last allocation */
    }
    printf("# injected %d allocation failures, %d inside training steps\n", ks - 1, failures);
    CHECK(failures > 0);
}

static void test_nn__activation_table_is_complete(void) {
    CHECK(MG_ACT_COUNT >= 4 && MG_ACT_LINEAR == 0 && MG_ACT_RELU == 1);
    for (int a = 0; a < MG_ACT_COUNT; a++) {
        CHECK(mg_activation_name(a) != NULL);
        CHECK(mg_activation_from_name(mg_activation_name(a)) == a);
        int op = mg_activation_op(a);
        CHECK(a == MG_ACT_LINEAR ? op == -1 : mg_op_arity(op) == 1);
    }
    CHECK(mg_activation_name(MG_ACT_COUNT) == NULL && mg_activation_from_name("gelu") == -1);
    CHECK(mg_activation_op(MG_ACT_RELU) == MG_OP_RELU);
}

static void test_nn__restored_parameters_are_detected(void) {
    /* A model created inside a checkpoint outlives the restore that releases its parameters; new
     * values (a variadic node among them) reuse the slots. Every use of the model is refused,
     * and freeing it releases nothing else. */
    mg_graph *g = mg_graph_new();
    mg_graph_set_autofree(g, 1);
    mg_rng r;
    mg_rng_seed(&r, 3);
    mg_graph_checkpoint cp = mg_graph_save(g);
    size_t sizes[2] = {3, 1};
    mg_mlp *m = mg_mlp_new(g, 2, sizes, 2, MG_ACT_RELU, MG_INIT_UNIFORM, &r);
    mg_layer *l = mg_layer_new(g, 2, 2, MG_ACT_TANH, MG_INIT_UNIFORM, &r);
    mg_neuron *n = mg_neuron_new(g, 2, MG_ACT_RELU, MG_INIT_UNIFORM, &r);
    CHECK(m && l && n);
    CHECK(mg_graph_restore(g, cp) == 13 + 6 + 3);
    mg_value *others[40];
    for (int i = 0; i < 40; i++) {
        others[i] = mg_scalar(g, 100.0 + i);
        mg_value_retain(others[i]);
    }
    mg_value *s = mg_sum(g, others, 40);
    mg_value_retain(s);
    size_t len = mg_graph_len(g);
    mg_value *x[2] = {others[0], others[1]}, *out[2];
    CHECK(mg_mlp_call(g, m, x, out) == MG_EINVAL);
    CHECK(strstr(mg_graph_last_error(g), "released") != NULL);
    CHECK(mg_layer_call(g, l, x, out) == MG_EINVAL);
    CHECK(mg_neuron_call(g, n, x) == NULL && mg_graph_last_status(g) == MG_EINVAL);
    mg_value *p[13];
    CHECK(mg_mlp_params(m, p) == 0 && mg_layer_params(l, p) == 0 && mg_neuron_params(n, p) == 0);
    CHECK(mg_graph_len(g) == len);
    mg_mlp_free(m);
    mg_layer_free(l);
    mg_neuron_free(n);
    CHECK(mg_graph_len(g) == len); /* no unrelated value lost a reference */
    for (int i = 0; i < 40; i++) CHECK(mg_value_data(others[i]) == 100.0 + i);
    CHECK(mg_backward(g, s) == MG_OK && mg_value_grad(others[7]) == 1.0);
    mg_graph_free(g);
}

static void test_nn__sizes_that_overflow_are_refused(void) {
    mg_graph *g = mg_graph_new();
    mg_rng r;
    mg_rng_seed(&r, 1);
    size_t one[1] = {1};
    /* a layer count whose array size wraps is refused before the widths are read */
    CHECK(mg_mlp_new(g, 2, one, SIZE_MAX / 4, MG_ACT_RELU, MG_INIT_UNIFORM, &r) == NULL);
    CHECK(mg_graph_last_status(g) == MG_EINVAL);
    CHECK(strstr(mg_graph_last_error(g), "too many") != NULL);
    CHECK(mg_neuron_new(g, SIZE_MAX, MG_ACT_RELU, MG_INIT_UNIFORM, &r) == NULL);
    CHECK(mg_layer_new(g, 2, SIZE_MAX, MG_ACT_RELU, MG_INIT_UNIFORM, &r) == NULL);
    CHECK(mg_layer_new(g, SIZE_MAX / 2, 3, MG_ACT_RELU, MG_INIT_UNIFORM, &r) == NULL);
    size_t huge[2] = {SIZE_MAX / 3, 1};
    CHECK(mg_mlp_new(g, 2, huge, 2, MG_ACT_RELU, MG_INIT_UNIFORM, &r) == NULL);
    CHECK(mg_graph_len(g) == 0);
    mg_graph_free(g);
}

static void test_nn__null_generator_is_harmless(void) {
    CHECK(mg_rng_next(NULL) == 0);
    CHECK(isnan(mg_rng_uniform(NULL, -1.0, 1.0)));
    mg_rng_seed(NULL, 1);
}

int main(void) {
    RUN(test_nn__activation_table_is_complete);
    RUN(test_nn__param_counts_and_order);
    RUN(test_nn__neuron_matches_micrograd_formula);
    RUN(test_nn__same_seed_same_weights_bitwise);
    RUN(test_nn__xor_trains_below_1e3);
    RUN(test_nn__allocation_failure_at_every_k);
    RUN(test_nn__restored_parameters_are_detected);
    RUN(test_nn__sizes_that_overflow_are_refused);
    RUN(test_nn__null_generator_is_harmless);
    TAP_DONE();
}
