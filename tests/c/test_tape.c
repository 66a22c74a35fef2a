/* Tapes: frozen programs agree with the eager graph; training; emission; failures. */
#include "failing_alloc.h"
#include "tap.h"

#include <math.h>
#include <mg/mg.h>
#include <string.h>

/* A graph using every op of the table, over `nin` inputs, one target and `np` parameters. */
typedef struct {
    mg_value *in[4], *tgt, *p[6], *loss, *out[2];
} every_op;

static int build_every_op(mg_graph *g, every_op *e, const double *x, double y, const double *pv) {
    for (int i = 0; i < 4; i++) e->in[i] = mg_scalar(g, x[i]);
    e->tgt = mg_scalar(g, y);
    for (int i = 0; i < 6; i++) e->p[i] = mg_scalar(g, pv[i]);
    mg_value **in = e->in, **p = e->p;
    mg_value *c = mg_scalar(g, 0.75); /* a constant */
    mg_value *t[40];
    int k = 0;
    /* every elementwise op, through mg_apply, so a new table row shows up here */
    for (int op = 0; op < MG_OP_COUNT; op++) {
        int ar = mg_op_arity(op);
        if (ar < 1) continue;
        mg_value *a = mg_add(g, mg_mul(g, p[k % 6], in[k % 4]), c);
        mg_value *b = mg_add(g, p[(k + 1) % 6], mg_scalar(g, 1.5));
        double kk =
            op == MG_OP_POW
                ? -1.5
                : 0.0; /* negative: once cast to size_t by the interpreter (found by fuzzing) */
        if (op == MG_OP_LOG || op == MG_OP_POW || op == MG_OP_POWV)
            a = mg_add(g, mg_square(g, a), c);
        t[k++] = mg_apply(g, op, a, b, kk);
    }
    mg_value *logits[3] = {mg_sum(g, t, 4), mg_dot(g, t + 4, in, 4), mg_affine(g, p, in, 4, t[8])};
    mg_value *pred[2] = {logits[0], logits[1]}, *targ[2] = {e->tgt, c};
    mg_value *cls = mg_scalar(g, 1.0);
    mg_value *l1 = mg_cross_entropy(g, logits, 3, cls);
    mg_value *l2 = mg_mse(g, pred, targ, 2);
    mg_value *l3 = mg_hinge(g, pred, (mg_value *[]){mg_scalar(g, 1.0), mg_scalar(g, -1.0)}, 2);
    mg_value *rest = mg_sum(g, t + 9, (size_t)(k - 9));
    e->loss = mg_add(g, mg_add(g, l1, mg_mul(g, l2, mg_scalar(g, 0.01))),
                     mg_add(g, l3, mg_mul(g, mg_tanh(g, rest), c)));
    e->out[0] = logits[2];
    e->out[1] = t[0];
    return e->loss != NULL;
}

static const double X0[4] = {0.3, -0.8, 1.2, 0.5}, P0[6] = {0.2, -0.4, 0.9, 0.1, -0.3, 0.7};

static int fit(mg_tape *t, const double *X, const double *Y, size_t n, size_t batch, double lr,
               int shuffle, uint64_t seed, uint64_t epoch, size_t threads, double *mean) {
    mg_fit_options o = {batch, lr, shuffle, seed, epoch, threads, NULL};
    return mg_tape_fit(t, X, Y, n, &o, mean);
}

static void test_tape__every_op_matches_eager(void) {
    mg_graph *g = mg_graph_new();
    every_op e;
    CHECK(build_every_op(g, &e, X0, 0.6, P0));
    CHECK(mg_backward(g, e.loss) == MG_OK);
    mg_tape_spec spec = {e.loss, e.in, 4, &e.tgt, 1, e.p, 6, e.out, 2, 0};
    mg_tape *t = mg_tape_freeze(g, &spec);
    CHECK(t != NULL);
    if (!t) {
        printf("#   %s\n", mg_graph_last_error(g));
        mg_graph_free(g);
        return;
    }
    CHECK(mg_tape_nparams(t) == 6 && mg_tape_ninputs(t) == 4 && mg_tape_ntargets(t) == 1);
    /* forward on new inputs: same as a fresh eager graph, bitwise */
    double x1[4] = {-0.1, 0.4, 0.9, -1.1}, y1 = -0.2;
    CHECK(mg_tape_forward(t, x1, &y1) == MG_OK);
    CHECK(mg_tape_backward(t) == MG_OK);
    mg_graph *h = mg_graph_new();
    every_op f;
    build_every_op(h, &f, x1, y1, P0);
    mg_backward(h, f.loss);
    CHECK(mg_tape_loss(t) == mg_value_data(f.loss));
    double outs[2];
    mg_tape_outputs(t, outs);
    CHECK(outs[0] == mg_value_data(f.out[0]) && outs[1] == mg_value_data(f.out[1]));
    const double *gr = mg_tape_grad(t);
    for (int i = 0; i < 6; i++) CHECK_CLOSE(gr[i], mg_value_grad(f.p[i]), 1e-12);
    /* the parameters are the first slots, as one array */
    for (int i = 0; i < 6; i++) CHECK(mg_tape_data(t)[i] == P0[i]);
    mg_tape_free(t);
    mg_graph_free(h);
    mg_graph_free(g);
}

/* Per-sample SGD on XOR, eagerly, visiting samples in order: what mg_tape_fit must reproduce. */
static void test_tape__fit_matches_eager_sgd(void) {
    static const double X[4][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}}, Y[4] = {0, 1, 1, 0};
    mg_graph *g = mg_graph_new();
    mg_rng r;
    mg_rng_seed(&r, 3);
    size_t sizes[2] = {4, 1};
    mg_mlp *m = mg_mlp_new(g, 2, sizes, 2, MG_ACT_TANH, MG_INIT_UNIFORM, &r);
    mg_value *p[17];
    mg_mlp_params(m, p);
    /* freeze a placeholder graph */
    mg_value *x[2] = {mg_scalar(g, 0), mg_scalar(g, 0)}, *y = mg_scalar(g, 0), *out;
    mg_mlp_call(g, m, x, &out);
    mg_value *loss = mg_mse(g, &out, &y, 1);
    mg_tape_spec spec = {loss, x, 2, &y, 1, p, 17, &out, 1, 0};
    mg_tape *t = mg_tape_freeze(g, &spec);
    CHECK(t != NULL);
    double mean = 0;
    for (int epoch = 0; epoch < 3; epoch++)
        CHECK(fit(t, &X[0][0], Y, 4, 2, 0.3, 0, 0, (uint64_t)epoch, 1, &mean) == MG_OK);
    /* eager: batches of 2, gradients averaged */
    mg_graph_checkpoint cp = mg_graph_save(g);
    double eager_total = 0;
    for (int epoch = 0; epoch < 3; epoch++) {
        eager_total = 0;
        for (int b = 0; b < 4; b += 2) {
            for (int s = b; s < b + 2; s++) {
                mg_value *xi[2] = {mg_scalar(g, X[s][0]), mg_scalar(g, X[s][1])},
                         *yi = mg_scalar(g, Y[s]), *o;
                mg_mlp_call(g, m, xi, &o);
                mg_value *l = mg_mse(g, &o, &yi, 1);
                mg_backward(g, l);
                eager_total += mg_value_data(l);
                mg_graph_restore(g, cp);
            }
            for (int i = 0; i < 17; i++) {
                mg_value_set_data(p[i], mg_value_data(p[i]) - 0.3 / 2 * mg_value_grad(p[i]));
                mg_value_set_grad(p[i], 0);
            }
        }
    }
    for (int i = 0; i < 17; i++) CHECK_CLOSE(mg_tape_data(t)[i], mg_value_data(p[i]), 1e-12);
    CHECK_CLOSE(mean, eager_total / 4, 1e-12);
    /* shuffling is deterministic per (seed, epoch) */
    double before[17];
    memcpy(before, mg_tape_data(t), sizeof before);
    double l1, l2;
    fit(t, &X[0][0], Y, 4, 1, 0.1, 1, 42, 7, 1, &l1);
    double after1[17];
    memcpy(after1, mg_tape_data(t), sizeof after1);
    memcpy(mg_tape_data(t), before, sizeof before);
    fit(t, &X[0][0], Y, 4, 1, 0.1, 1, 42, 7, 1, &l2);
    CHECK(memcmp(after1, mg_tape_data(t), sizeof after1) == 0 && l1 == l2);
    /* write-back reaches the model */
    CHECK(mg_tape_write_back(t, g) == 17);
    CHECK(mg_value_data(p[3]) == mg_tape_data(t)[3]);
    /* predict */
    double pred[4];
    CHECK(mg_tape_predict(t, &X[0][0], 4, pred) == MG_OK);
    mg_value *xi[2] = {mg_scalar(g, X[2][0]), mg_scalar(g, X[2][1])}, *o;
    mg_mlp_call(g, m, xi, &o);
    CHECK(pred[2] == mg_value_data(o));
    CHECK(fit(t, NULL, Y, 4, 1, 0.1, 0, 0, 0, 1, NULL) == MG_EINVAL);
    CHECK(strstr(mg_tape_last_error(t), "NULL inputs") != NULL);
    CHECK(fit(t, &X[0][0], Y, 4, 1, NAN, 0, 0, 0, 1, NULL) == MG_EINVAL);
    mg_tape_free(t);
    mg_mlp_free(m);
    mg_graph_free(g);
}

static void test_tape__freeze_errors(void) {
    mg_graph *g = mg_graph_new();
    mg_value *a = mg_scalar(g, 1.0), *b = mg_scalar(g, 2.0);
    mg_value *y = mg_mul(g, a, b);
    mg_tape_spec s1 = {y, (mg_value *[]){a}, 1, NULL, 0, (mg_value *[]){a}, 1, NULL, 0, 0};
    CHECK(mg_tape_freeze(g, &s1) == NULL);
    CHECK(strstr(mg_graph_last_error(g), "listed twice") != NULL);
    mg_tape_spec s2 = {y, NULL, 0, NULL, 0, (mg_value *[]){y}, 1, NULL, 0, 0};
    CHECK(mg_tape_freeze(g, &s2) == NULL);
    CHECK(strstr(mg_graph_last_error(g), "not a leaf") != NULL);
    mg_tape_spec s3 = {NULL, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0};
    CHECK(mg_tape_freeze(g, &s3) == NULL);
    mg_graph *h = mg_graph_new();
    mg_value *z = mg_scalar(h, 1.0);
    mg_tape_spec s4 = {y, NULL, 0, NULL, 0, (mg_value *[]){z}, 1, NULL, 0, 0};
    CHECK(mg_tape_freeze(g, &s4) == NULL);
    mg_graph_free(h);
    /* an inference-only tape has no backward */
    mg_tape_spec s5 = {NULL, (mg_value *[]){a}, 1, NULL, 0, (mg_value *[]){b}, 1, &y, 1, 0};
    mg_tape *t = mg_tape_freeze(g, &s5);
    CHECK(t && !mg_tape_has_loss(t) && mg_tape_backward(t) == MG_EINVAL);
    double x = 3.0, out;
    mg_tape_predict(t, &x, 1, &out);
    CHECK(out == 6.0);
    mg_tape_free(t);
    CHECK(mg_graph_len(g) == 3);
    mg_graph_free(g);
}

static void test_tape__emission_is_deterministic_and_self_contained(void) {
    mg_graph *g = mg_graph_new();
    every_op e;
    build_every_op(g, &e, X0, 0.6, P0);
    mg_tape_spec spec = {e.loss, e.in, 4, &e.tgt, 1, e.p, 6, e.out, 2, 0};
    mg_tape *t1 = mg_tape_freeze(g, &spec), *t2 = mg_tape_freeze(g, &spec);
    size_t n1, n2;
    char *s1 = mg_tape_emit_c(t1, NULL, &n1), *s2 = mg_tape_emit_c(t2, NULL, &n2);
    CHECK(s1 && s2 && n1 == n2 && memcmp(s1, s2, n1) == 0);
    CHECK(strlen(s1) == n1);
    /* only <math.h> and <stddef.h> */
    int includes = 0;
    for (const char *p = s1; (p = strstr(p, "#include")) != NULL; p++) {
        includes++;
        CHECK(strncmp(p, "#include <math.h>", 17) == 0 ||
              strncmp(p, "#include <stddef.h>", 19) == 0);
    }
    CHECK(includes == 2);
    CHECK(strstr(s1, "const mg_compiled_t mgc_program = {") != NULL);
    mg_emit_options o = {"model_", 1, 0, 0};
    char *s3 = mg_tape_emit_c(t1, &o, NULL);
    CHECK(s3 && strstr(s3, "void model_infer(") != NULL && strstr(s3, "mgc_program") == NULL);
    mg_emit_options bad = {"9bad", 0, 0, 0};
    CHECK(mg_tape_emit_c(t1, &bad, NULL) == NULL);
    CHECK(strstr(mg_tape_last_error(t1), "C identifier") != NULL);
    mg_tape_free_source(t1, s1);
    mg_tape_free_source(t2, s2);
    mg_tape_free_source(t1, s3);
    mg_tape_free(t1);
    mg_tape_free(t2);
    mg_graph_free(g);
}

static void test_tape__allocation_failure_in_freeze_and_emit(void) {
    int hit = 0;
    for (long k = 1; k < 10000; k++) {
        failing_alloc fa = {0};
        mg_allocator al = failing_allocator(&fa);
        mg_graph *g = mg_graph_new_with(&al);
        every_op e;
        build_every_op(g, &e, X0, 0.6, P0);
        size_t len = mg_graph_len(g);
        fa.fail_at = fa.count + k; /* fail inside freeze or emit only */
        mg_tape_spec spec = {e.loss, e.in, 4, &e.tgt, 1, e.p, 6, e.out, 2, 0};
        mg_tape *t = mg_tape_freeze(g, &spec);
        char *src = t ? mg_tape_emit_c(t, NULL, NULL) : NULL;
        /* and training: batches over two threads allocate chunk buffers and the order */
        static const double X[8 * 4] = {0.1, 0.2, 0.3,  0.4, -0.1, 0.5,  0.2, 0.0,  0.3, 0.3,  -0.2,
                                        0.1, 0.9, -0.4, 0.2, 0.6,  0.1,  0.1, 0.1,  0.1, -0.5, 0.2,
                                        0.8, 0.3, 0.4,  0.4, 0.0,  -0.3, 0.2, -0.6, 0.7, 0.5};
        static const double Y[8] = {0.1, -0.2, 0.3, 0.5, 0.0, 0.2, -0.1, 0.4};
        int fit_st = MG_OK;
        if (t && src) {
            double before[6];
            memcpy(before, mg_tape_data(t), sizeof before);
            fit_st = fit(t, X, Y, 8, 3, 0.01, 1, 5, 0, 2, NULL);
            CHECK(fit_st == MG_OK || fit_st == MG_ENOMEM);
            if (fit_st == MG_ENOMEM) CHECK(memcmp(before, mg_tape_data(t), sizeof before) == 0);
        }
        int done = t && src && fit_st == MG_OK;
        CHECK(mg_graph_len(g) == len);
        if (!t) CHECK(mg_graph_last_status(g) == MG_ENOMEM);
        mg_tape_free_source(t, src);
        mg_tape_free(t);
        mg_graph_free(g);
        CHECK(fa.live == 0);
        if (done && fa.count < fa.fail_at) break;
        hit++;
    }
    printf("# %d allocation failures injected into freeze, emit and threaded fit\n", hit);
    CHECK(hit > 3);
}

/* A 2-layer MLP over 5 inputs, built as chains of mg_add/mg_mul (as micrograd builds it) or with
 * mg_mlp_call; both must reroll to one reduction nest per layer, with the scalar program's
 * forward values bit for bit and its gradients within 1e-12. */
static mg_value *chain_mlp(mg_graph *g, mg_mlp *m, mg_value **x, int op_by_op, mg_value **out3) {
    if (!op_by_op) {
        mg_mlp_call(g, m, x, out3);
    } else {
        mg_value *h[6], *cur = NULL;
        for (size_t l = 0; l < mg_mlp_nlayers(m); l++) {
            mg_layer *L = mg_mlp_layer(m, l);
            mg_value **in = l == 0 ? x : h, *outs[6];
            for (size_t j = 0; j < mg_layer_nout(L); j++) {
                mg_neuron *n = mg_layer_neuron(L, j);
                mg_value *p[8];
                mg_neuron_params(n, p);
                cur = p[mg_neuron_nin(n)]; /* the bias */
                for (size_t i = 0; i < mg_neuron_nin(n); i++)
                    cur = mg_add(g, cur, mg_mul(g, p[i], in[i]));
                outs[j] = mg_neuron_activation(n) == MG_ACT_RELU ? mg_relu(g, cur) : cur;
            }
            for (size_t j = 0; j < mg_layer_nout(L); j++)
                (l + 1 == mg_mlp_nlayers(m) ? out3 : h)[j] = outs[j];
        }
    }
    return mg_cross_entropy(g, out3, 3, x[5]);
}

static void test_tape__rerolled_mlp_equals_the_scalar_program(void) {
    mg_graph *g = mg_graph_new();
    mg_rng r;
    mg_rng_seed(&r, 11);
    size_t sizes[2] = {6, 3};
    mg_mlp *m = mg_mlp_new(g, 5, sizes, 2, MG_ACT_RELU, MG_INIT_SCALED, &r);
    mg_value *p[64];
    size_t np = mg_mlp_params(m, p);
    mg_value *x[6];
    for (int i = 0; i < 6; i++) x[i] = mg_scalar(g, i == 5 ? 2.0 : 0.1 * i - 0.2);
    double ref_loss = 0, ref_grad[64];
    for (int variant = 0; variant < 3; variant++) {
        mg_value *out[3];
        mg_value *loss = chain_mlp(g, m, x, variant == 2, out);
        mg_tape_spec spec = {loss, x, 5, x + 5, 1, p, np, out, 3, variant == 0};
        mg_tape *t = mg_tape_freeze(g, &spec);
        CHECK(t != NULL);
        if (!t) break;
        mg_tape_stats st;
        CHECK(mg_tape_get_stats(t, &st) == MG_OK);
        CHECK(st.rerolled == (variant != 0));
        if (variant) CHECK(st.forward_nests == 3); /* layer 1, its ReLU, layer 2 */
        double xs[5] = {0.3, -0.1, 0.8, 0.05, -0.6}, y = 1.0;
        mg_tape_forward(t, xs, &y);
        mg_tape_backward(t);
        if (variant == 0) {
            ref_loss = mg_tape_loss(t);
            memcpy(ref_grad, mg_tape_grad(t), np * sizeof(double));
        } else {
            CHECK(mg_tape_loss(t) == ref_loss);
            for (size_t i = 0; i < np; i++) CHECK_CLOSE(mg_tape_grad(t)[i], ref_grad[i], 1e-12);
        }
        mg_tape_free(t);
    }
    mg_mlp_free(m);
    mg_graph_free(g);
}

/* A softmax classifier over 2 inputs and a class target, for the fit contract tests. */
typedef struct {
    mg_graph *g;
    mg_value *x[2], *y, *p[6], *logits[2], *loss;
    mg_tape *t;
} clf;

static void clf_build(clf *c) {
    c->g = mg_graph_new();
    for (int i = 0; i < 2; i++) c->x[i] = mg_scalar(c->g, 0.0);
    c->y = mg_scalar(c->g, 0.0);
    for (int i = 0; i < 6; i++) c->p[i] = mg_scalar(c->g, 0.1 * (i + 1) - 0.3);
    for (int k = 0; k < 2; k++)
        c->logits[k] = mg_affine(c->g, c->p + 3 * k, c->x, 2, c->p[3 * k + 2]);
    c->loss = mg_cross_entropy(c->g, c->logits, 2, c->y);
    mg_tape_spec spec = {c->loss, c->x, 2, &c->y, 1, c->p, 6, c->logits, 2, 0};
    c->t = mg_tape_freeze(c->g, &spec);
}

static void clf_free(clf *c) {
    mg_tape_free(c->t);
    mg_graph_free(c->g);
}

static void test_tape__fit_refuses_targets_that_are_not_class_indices(void) {
    clf c;
    clf_build(&c);
    CHECK(c.t != NULL);
    static const double X[3][2] = {{0.1, 0.2}, {0.3, -0.4}, {0.5, 0.6}};
    double before[6];
    memcpy(before, mg_tape_data(c.t), sizeof before);
    const double bad[3][3] = {
        {0, 1, 2}, {0, -1, 1}, {0, 1, 0.5}}; /* out of range, negative, fractional */
    for (int k = 0; k < 3; k++) {
        CHECK(fit(c.t, &X[0][0], bad[k], 3, 1, 0.1, 0, 0, 0, 1, NULL) == MG_EINVAL);
        CHECK(strstr(mg_tape_last_error(c.t), k == 1 ? "row 1" : "row 2") != NULL);
        CHECK(memcmp(before, mg_tape_data(c.t), sizeof before) == 0); /* nothing trained */
    }
    double y = 2.0;
    CHECK(mg_tape_forward(c.t, X[0], &y) == MG_EINVAL);
    const double good[3] = {0, 1, 1};
    double mean = NAN;
    CHECK(fit(c.t, &X[0][0], good, 3, 1, 0.1, 0, 0, 0, 1, &mean) == MG_OK && isfinite(mean));
    clf_free(&c);
}

static void test_tape__batches_larger_than_the_data_train(void) {
    clf c;
    clf_build(&c);
    static const double X[3][2] = {{0.1, 0.2}, {0.3, -0.4}, {0.5, 0.6}}, Y[3] = {0, 1, 1};
    double ref[6], mean1, mean2;
    memcpy(ref, mg_tape_data(c.t), sizeof ref);
    CHECK(fit(c.t, &X[0][0], Y, 3, 3, 0.1, 0, 0, 0, 1, &mean1) == MG_OK);
    double whole[6];
    memcpy(whole, mg_tape_data(c.t), sizeof whole);
    memcpy(mg_tape_data(c.t), ref, sizeof ref);
    /* 2^61 samples per batch: once an overflowing allocation size, now the whole data */
    CHECK(fit(c.t, &X[0][0], Y, 3, (size_t)1 << 61, 0.1, 0, 0, 0, 2, &mean2) == MG_OK);
    CHECK(memcmp(whole, mg_tape_data(c.t), sizeof whole) == 0 && mean1 == mean2);
    CHECK(fit(c.t, &X[0][0], Y, 3, SIZE_MAX, 0.1, 1, 9, 0, SIZE_MAX, NULL) == MG_OK);
    clf_free(&c);
}

/* mg_fit_options.X32: float inputs train exactly as the same values given as doubles (bitwise,
 * at batch 1 and in chunks, on 1 and 2 threads); X and X32 together, or neither, are refused; a
 * class index read from float inputs is checked as one read from doubles. */
static void test_tape__float_inputs_train_as_their_doubles(void) {
    clf c;
    clf_build(&c);
    static const double X[5][2] = {{0.25, -0.5}, {1.5, 0.125}, {-2, 0.75}, {0.5, 3}, {-0.25, 1}},
                        Y[5] = {0, 1, 1, 0, 1};
    float X32[5][2];
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 2; j++) X32[i][j] = (float)X[i][j];
    double ref[6], want[6];
    memcpy(ref, mg_tape_data(c.t), sizeof ref);
    static const size_t batches[] = {1, 2, 5};
    for (size_t b = 0; b < 3; b++)
        for (size_t threads = 1; threads <= 2; threads++) {
            double m64 = NAN, m32 = NAN;
            memcpy(mg_tape_data(c.t), ref, sizeof ref);
            CHECK(fit(c.t, &X[0][0], Y, 5, batches[b], 0.3, 1, 4, 0, threads, &m64) == MG_OK);
            memcpy(want, mg_tape_data(c.t), sizeof want);
            memcpy(mg_tape_data(c.t), ref, sizeof ref);
            mg_fit_options o = {batches[b], 0.3, 1, 4, 0, threads, &X32[0][0]};
            CHECK(mg_tape_fit(c.t, NULL, Y, 5, &o, &m32) == MG_OK);
            CHECK(memcmp(want, mg_tape_data(c.t), sizeof want) == 0 && m64 == m32);
            CHECK(memcmp(want, ref, sizeof ref) != 0); /* it trained */
        }
    mg_fit_options o = {2, 0.3, 0, 0, 0, 1, &X32[0][0]};
    CHECK(mg_tape_fit(c.t, &X[0][0], Y, 5, &o, NULL) == MG_EINVAL);
    CHECK(strstr(mg_tape_last_error(c.t), "not both") != NULL);
    o.X32 = NULL;
    CHECK(mg_tape_fit(c.t, NULL, Y, 5, &o, NULL) == MG_EINVAL);
    CHECK(strstr(mg_tape_last_error(c.t), "NULL inputs") != NULL);
    clf_free(&c);

    /* the class is input 2: float rows are checked for class indices too */
    mg_graph *g = mg_graph_new();
    mg_value *x[3], *p[2], *logits[2];
    for (int i = 0; i < 3; i++) x[i] = mg_scalar(g, 0.0);
    for (int i = 0; i < 2; i++) p[i] = mg_scalar(g, 0.5 - i);
    for (int k = 0; k < 2; k++) logits[k] = mg_mul(g, p[k], x[k]);
    mg_value *loss = mg_cross_entropy(g, logits, 2, x[2]);
    mg_tape_spec spec = {loss, x, 3, NULL, 0, p, 2, logits, 2, 0};
    mg_tape *t = mg_tape_freeze(g, &spec);
    CHECK(t != NULL);
    if (t) {
        float rows[2][3] = {{0.5f, 1.0f, 1.0f}, {0.25f, -1.0f, 0.5f}};
        mg_fit_options f = {1, 0.1, 0, 0, 0, 1, &rows[0][0]};
        CHECK(mg_tape_fit(t, NULL, NULL, 2, &f, NULL) == MG_EINVAL);
        CHECK(strstr(mg_tape_last_error(t), "row 1, column 2 of X is 0.5") != NULL);
        rows[1][2] = 0.0f;
        double mean = NAN;
        CHECK(mg_tape_fit(t, NULL, NULL, 2, &f, &mean) == MG_OK && isfinite(mean));
    }
    mg_tape_free(t);
    mg_graph_free(g);
}

/* backward() leaves gradients in the tape; fit() starts from zero gradients for every parameter,
 * whether or not a nest keeps it packed during calls. */
static void test_tape__fit_starts_from_zero_gradients(void) {
    clf c;
    clf_build(&c);
    static const double X[3][2] = {{0.1, 0.2}, {0.3, -0.4}, {0.5, 0.6}}, Y[3] = {0, 1, 1};
    double ref[6], clean[6];
    memcpy(ref, mg_tape_data(c.t), sizeof ref);
    CHECK(fit(c.t, &X[0][0], Y, 3, 2, 0.1, 0, 0, 0, 1, NULL) == MG_OK);
    memcpy(clean, mg_tape_data(c.t), sizeof clean);
    memcpy(mg_tape_data(c.t), ref, sizeof ref);
    double y = 1.0;
    CHECK(mg_tape_forward(c.t, X[1], &y) == MG_OK && mg_tape_backward(c.t) == MG_OK);
    CHECK(mg_tape_grad(c.t)[0] != 0.0);
    CHECK(fit(c.t, &X[0][0], Y, 3, 2, 0.1, 0, 0, 0, 1, NULL) == MG_OK);
    CHECK(memcmp(clean, mg_tape_data(c.t), sizeof clean) == 0);
    for (int i = 0; i < 6; i++) CHECK(mg_tape_grad(c.t)[i] == 0.0);
    clf_free(&c);
}

/* A batched fit keeps its working memory for the next call and mg_tape_trim() frees it: calls of
 * one batch each, on 1 and 2 threads in turn, train bitwise as one call over the batches, before
 * and after a trim. The model is an MLP whose first neuron's weights a second term also reads, so
 * they are packed and their gradient nest does not step them: a one-thread step zeroes their
 * packed gradients as it goes and two threads leave them, which a later one-thread call must
 * zero again. predict over the rows (on the kept memory) gives each row's single-row outputs. */
static void test_tape__calls_of_one_batch_train_as_one_call(void) {
    mg_graph *g = mg_graph_new();
    mg_rng r;
    mg_rng_seed(&r, 5);
    size_t sizes[2] = {8, 3};
    mg_mlp *m = mg_mlp_new(g, 5, sizes, 2, MG_ACT_RELU, MG_INIT_SCALED, &r);
    mg_value *p[128], *x[6], *out[3];
    size_t np = mg_mlp_params(m, p);
    for (int i = 0; i < 6; i++) x[i] = mg_scalar(g, 0.0);
    mg_mlp_call(g, m, x, out);
    mg_value *loss = mg_add(g, mg_cross_entropy(g, out, 3, x[5]),
                            mg_mul(g, mg_sum(g, p, 5), mg_scalar(g, 0.01)));
    mg_tape_spec spec = {loss, x, 5, x + 5, 1, p, np, out, 3, 0};
    mg_tape *t = mg_tape_freeze(g, &spec);
    CHECK(t != NULL && np <= 128);
    if (t) {
        double X[12][5], Y[12], ref[128], want[128];
        for (int i = 0; i < 12; i++) {
            for (int j = 0; j < 5; j++) X[i][j] = 0.1 * ((i * 7 + j * 3) % 11) - 0.5;
            Y[i] = i % 3;
        }
        const size_t bytes = np * sizeof(double);
        CHECK(mg_tape_trim(NULL) == 0 && mg_tape_trim(t) == 0); /* nothing kept yet */
        memcpy(ref, mg_tape_data(t), bytes);
        CHECK(fit(t, &X[0][0], Y, 12, 4, 0.5, 0, 0, 0, 1, NULL) == MG_OK);
        memcpy(want, mg_tape_data(t), bytes);
        CHECK(memcmp(want, ref, bytes) != 0); /* it trained */
        static const size_t turns[2][3] = {{2, 1, 1}, {1, 2, 1}};
        for (int round = 0; round < 4; round++) {
            memcpy(mg_tape_data(t), ref, bytes);
            for (int k = 0; k < 3; k++)
                CHECK(fit(t, &X[4 * k][0], Y + 4 * k, 4, 4, 0.5, 0, 0, 0, turns[round % 2][k],
                          NULL) == MG_OK);
            CHECK(memcmp(want, mg_tape_data(t), bytes) == 0);
            if (round == 1) CHECK(mg_tape_trim(t) > 0 && mg_tape_trim(t) == 0);
        }
        double rows[4][3], one[3];
        CHECK(mg_tape_predict(t, &X[0][0], 4, &rows[0][0]) == MG_OK);
        CHECK(mg_tape_predict(t, X[2], 1, one) == MG_OK);
        CHECK(memcmp(one, rows[2], sizeof one) == 0);
    }
    mg_tape_free(t);
    mg_mlp_free(m);
    mg_graph_free(g);
}

static void test_tape__attach_refuses_code_for_another_program(void) {
    clf c;
    clf_build(&c);
    mg_compiled bad = {MG_COMPILED_ABI, 8, mg_tape_fingerprint(c.t) ^ 1, 0, NULL, NULL};
    CHECK(mg_tape_attach(c.t, &bad) == MG_EINVAL);
    CHECK(strstr(mg_tape_last_error(c.t), "another program") != NULL);
    bad.fingerprint ^= 1;
    bad.abi = MG_COMPILED_ABI + 1;
    CHECK(mg_tape_attach(c.t, &bad) == MG_EINVAL);
    bad.abi = 1; /* code whose kernels read the run of 6 arrays, before pre-steps: it would read
                    the run's other fields at the wrong offsets */
    CHECK(mg_tape_attach(c.t, &bad) == MG_EINVAL && strstr(mg_tape_last_error(c.t), "ABI 1"));
    CHECK(mg_tape_attach(c.t, NULL) == MG_EINVAL);
    CHECK(mg_tape_fingerprint(c.t) != 0);
    /* slots of another size; float32 code with a nest libmg would have to interpret */
    mg_tape_stats st;
    CHECK(mg_tape_get_stats(c.t, &st) == MG_OK);
    mg_kernel_fn none[64] = {0};
    mg_compiled f32 = {MG_COMPILED_ABI,
                       2,
                       mg_tape_fingerprint(c.t),
                       st.forward_nests + st.backward_nests,
                       none,
                       NULL};
    CHECK(f32.nnests > 0 && f32.nnests <= 64);
    CHECK(mg_tape_attach(c.t, &f32) == MG_EINVAL);
    CHECK(strstr(mg_tape_last_error(c.t), "2-byte slots") != NULL);
    f32.real_bytes = 4;
    CHECK(mg_tape_attach(c.t, &f32) == MG_EINVAL);
    CHECK(strstr(mg_tape_last_error(c.t), "float32 code must compile every nest") != NULL);
    /* still the interpreter over double slots */
    double x[2] = {0.5, -1.0}, y = 1.0;
    CHECK(mg_tape_forward(c.t, x, &y) == MG_OK && isfinite(mg_tape_loss(c.t)));
    clf_free(&c);
}

/* Every call that can fail clears the tape's error on entry and records message and status on
 * failure, so the bindings raise with libmg's message instead of validating again. */
static void test_tape__last_error_and_status(void) {
    clf c;
    clf_build(&c);
    CHECK(mg_tape_last_status(c.t) == MG_OK && mg_tape_last_error(c.t)[0] == '\0');
    static const double X[2] = {0.1, 0.2}, Y[1] = {1};
    CHECK(fit(c.t, X, Y, 1, 1, NAN, 0, 0, 0, 1, NULL) == MG_EINVAL);
    CHECK(mg_tape_last_status(c.t) == MG_EINVAL);
    CHECK(strstr(mg_tape_last_error(c.t), "fit: the learning rate") != NULL);
    CHECK(fit(c.t, X, NULL, 1, 1, 0.1, 0, 0, 0, 1, NULL) == MG_EINVAL);
    CHECK(strstr(mg_tape_last_error(c.t), "pass Y") != NULL);
    CHECK(mg_tape_step(c.t, INFINITY, 1) == MG_EINVAL);
    CHECK(strstr(mg_tape_last_error(c.t), "step: the learning rate") != NULL);
    mg_emit_options bad = {"not an identifier", 0, 0, 0};
    CHECK(mg_tape_emit_c(c.t, &bad, NULL) == NULL);
    CHECK(mg_tape_last_status(c.t) == MG_EINVAL && strstr(mg_tape_last_error(c.t), "prefix"));
    /* a call that succeeds clears both */
    CHECK(mg_tape_forward(c.t, X, Y) == MG_OK);
    CHECK(mg_tape_last_status(c.t) == MG_OK && mg_tape_last_error(c.t)[0] == '\0');
    CHECK(mg_tape_last_status(NULL) == MG_EINVAL &&
          strcmp(mg_tape_last_error(NULL), "no tape") == 0);
    clf_free(&c);
}

/* predict takes no targets: an output computed from one is refused (it would be computed from
 * whatever the target slots last held), and rows that overflow the address space are refused
 * before anything is read (found by review). */
static void test_tape__predict_refuses_outputs_of_targets_and_overflowing_rows(void) {
    mg_graph *g = mg_graph_new();
    mg_value *x = mg_scalar(g, 0), *y = mg_scalar(g, 0), *w = mg_scalar(g, 2.0);
    mg_value *pred = mg_mul(g, x, w), *d = mg_sub(g, pred, y), *loss = mg_mul(g, d, d);
    mg_value *both[2] = {pred, loss};
    mg_tape_spec spec = {loss, &x, 1, &y, 1, &w, 1, both, 2, 0};
    mg_tape *t = mg_tape_freeze(g, &spec);
    CHECK(t != NULL);
    static const double X[2] = {1, 2}, Y1 = 10;
    double out[4] = {-1, -1, -1, -1};
    CHECK(mg_tape_forward(t, &X[0], &Y1) == MG_OK); /* the slots now hold a target */
    CHECK(mg_tape_predict(t, X, 2, out) == MG_EINVAL);
    CHECK(strstr(mg_tape_last_error(t), "output 1 is computed from the targets") != NULL);
    CHECK(out[0] == -1 && out[3] == -1);
    CHECK(mg_tape_predict(t, X, 0, out) == MG_EINVAL); /* refused whatever the rows */
    mg_tape_free(t);
    /* the prediction alone: predicted */
    mg_tape_spec one = {loss, &x, 1, &y, 1, &w, 1, both, 1, 0};
    t = mg_tape_freeze(g, &one);
    CHECK(t != NULL);
    CHECK(mg_tape_predict(t, X, 2, out) == MG_OK && out[0] == 2.0 && out[1] == 4.0);
    CHECK(mg_tape_predict(t, X, SIZE_MAX, out) == MG_EINVAL);
    CHECK(strstr(mg_tape_last_error(t), "overflow the address space") != NULL);
    CHECK(mg_tape_predict(t, X, SIZE_MAX / 4, out) == MG_EINVAL);
    mg_tape_free(t);
    mg_graph_free(g);
}

int main(void) {
    RUN(test_tape__every_op_matches_eager);
    RUN(test_tape__fit_matches_eager_sgd);
    RUN(test_tape__freeze_errors);
    RUN(test_tape__emission_is_deterministic_and_self_contained);
    RUN(test_tape__allocation_failure_in_freeze_and_emit);
    RUN(test_tape__rerolled_mlp_equals_the_scalar_program);
    RUN(test_tape__fit_refuses_targets_that_are_not_class_indices);
    RUN(test_tape__batches_larger_than_the_data_train);
    RUN(test_tape__float_inputs_train_as_their_doubles);
    RUN(test_tape__fit_starts_from_zero_gradients);
    RUN(test_tape__calls_of_one_batch_train_as_one_call);
    RUN(test_tape__attach_refuses_code_for_another_program);
    RUN(test_tape__last_error_and_status);
    RUN(test_tape__predict_refuses_outputs_of_targets_and_overflowing_rows);
    TAP_DONE();
}
