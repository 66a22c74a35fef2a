/* Every op's gradient against central finite differences, driven by the op table. */
#include "tap.h"

#include <mg/mg.h>
#include <string.h>

#define MAXLEAF 16

typedef mg_value *(*build_fn)(mg_graph *g, mg_value **leaf, int nleaf, const void *ctx);

/* f(x) for leaf values x: a fresh graph per evaluation, so the eager forward is what is tested. */
static double eval(build_fn f, const double *x, int n, const void *ctx) {
    mg_graph *g = mg_graph_new();
    mg_value *leaf[MAXLEAF];
    for (int i = 0; i < n; i++) leaf[i] = mg_scalar(g, x[i]);
    mg_value *y = f(g, leaf, n, ctx);
    double r = y ? mg_value_data(y) : NAN;
    mg_graph_free(g);
    return r;
}

/* Compares the backward gradient of every leaf listed in `check` (NULL: all) with a central
 * difference. Returns the number of mismatches. */
static int grad_check(const char *what, build_fn f, const double *x, int n, const void *ctx,
                      const int *check, double tol) {
    mg_graph *g = mg_graph_new();
    mg_value *leaf[MAXLEAF];
    for (int i = 0; i < n; i++) leaf[i] = mg_scalar(g, x[i]);
    mg_value *y = f(g, leaf, n, ctx);
    int bad = 0;
    if (!y || mg_backward(g, y) != MG_OK) {
        printf("#   %s: build or backward failed: %s\n", what, mg_graph_last_error(g));
        mg_graph_free(g);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        if (check && !check[i]) continue;
        /* two step sizes: a plain one and one relative to x (near poles such as log at 1e-8);
         * the check passes when either central difference agrees */
        double hs[2] = {1e-6 * (fabs(x[i]) > 1.0 ? fabs(x[i]) : 1.0), 1e-5 * fabs(x[i])};
        double an = mg_value_grad(leaf[i]), fd[2] = {NAN, NAN};
        int ok = 0;
        for (int k = 0; k < 2 && !ok; k++) {
            if (hs[k] == 0.0) continue;
            double xp[MAXLEAF], xm[MAXLEAF];
            memcpy(xp, x, sizeof(double) * (size_t)n);
            memcpy(xm, x, sizeof(double) * (size_t)n);
            xp[i] += hs[k];
            xm[i] -= hs[k];
            fd[k] = (eval(f, xp, n, ctx) - eval(f, xm, n, ctx)) / (xp[i] - xm[i]);
            double scale = fabs(fd[k]) > fabs(an) ? fabs(fd[k]) : fabs(an);
            ok = fabs(fd[k] - an) <= tol * (scale > 1.0 ? scale : 1.0);
        }
        if (!ok) {
            printf("#   %s: d/dx%d at x%d=%.17g: backward %.17g, finite differences %.17g, %.17g\n",
                   what, i, i, x[i], an, fd[0], fd[1]);
            bad++;
        }
    }
    mg_graph_free(g);
    return bad;
}

/* ---- elementwise ops, through mg_apply and the table --------------------------------------- */

typedef struct {
    int op;
    double k;
} ew_ctx;

static mg_value *build_ew(mg_graph *g, mg_value **leaf, int n, const void *vctx) {
    const ew_ctx *c = vctx;
    /* a downstream product makes the seed gradient something other than 1 */
    mg_value *y = mg_apply(g, c->op, leaf[0], n > 1 ? leaf[1] : NULL, c->k);
    return mg_mul(g, y, mg_scalar(g, 1.75));
}

/* Points per op, edges included. A switch without default: a new op without points fails to
 * compile under -Werror=switch-enum, and the loop below fails on an op with none. */
static int points_for(int op, double pts[][3], int max) {
    int n = 0;
#define P(a, b, k)                                                                                 \
    do {                                                                                           \
        if (n < max) {                                                                             \
            pts[n][0] = (a);                                                                       \
            pts[n][1] = (b);                                                                       \
            pts[n][2] = (k);                                                                       \
            n++;                                                                                   \
        }                                                                                          \
    } while (0)
    switch ((mg_op)op) {
    case MG_OP_ADD:
    case MG_OP_SUB:
    case MG_OP_MUL:
        P(1.5, -2.25, 0);
        P(-3.0, 0.5, 0);
        P(0.0, 7.0, 0);
        P(100.0, 1e-3, 0);
        break;
    case MG_OP_DIV:
        P(1.5, -2.25, 0);
        P(-3.0, 0.5, 0);
        P(2.0, 1e-3, 0);
        break;
    case MG_OP_NEG:
    case MG_OP_SQUARE:
        P(1.5, 0, 0);
        P(-3.0, 0, 0);
        P(0.0, 0, 0);
        break;
    case MG_OP_POW:
        P(1.7, 0, 2);
        P(-1.3, 0, 3);
        P(2.5, 0, -1);
        P(0.7, 0, -0.5);
        P(3.0, 0, 1.5);
        P(4.0, 0, 0.5);
        P(-2.0, 0, -2);
        P(1.1, 0, 0);
        break;
    case MG_OP_POWV:
        P(1.7, 2.0, 0);
        P(0.3, -1.5, 0);
        P(2.5, 0.5, 0);
        break;
    case MG_OP_RELU:
        P(1.5, 0, 0);
        P(-0.5, 0, 0);
        P(1e-9, 0, 0);
        break;
    case MG_OP_TANH:
        P(0.3, 0, 0);
        P(-1.2, 0, 0);
        P(20.0, 0, 0);
        P(-20.0, 0, 0);
        P(0.0, 0, 0);
        break;
    case MG_OP_EXP:
        P(0.3, 0, 0);
        P(-5.0, 0, 0);
        P(10.0, 0, 0);
        break;
    case MG_OP_LOG:
        P(0.3, 0, 0);
        P(5.0, 0, 0);
        P(1e-8, 0, 0);
        break;
    case MG_OP_SIGMOID:
        P(0.3, 0, 0);
        P(-4.0, 0, 0);
        P(30.0, 0, 0);
        P(-30.0, 0, 0);
        break;
    case MG_OP_MAX:
        P(1.0, 2.0, 0);
        P(3.0, -1.0, 0);
        P(0.5, 0.5, 0); /* tie: 0.5 each, as the central difference */
        break;
    case MG_OP_LEAF:
    case MG_OP_SUM:
    case MG_OP_DOT:
    case MG_OP_MSE:
    case MG_OP_HINGE:
    case MG_OP_XENT:
    case MG_OP_COUNT: break;
    }
#undef P
    return n;
}

static void test_ops__table_is_complete(void) {
    CHECK(MG_OP_COUNT > 15);
    for (int op = 0; op < MG_OP_COUNT; op++) {
        CHECK(mg_op_name(op) != NULL);
        CHECK(mg_op_symbol(op) != NULL);
        CHECK(mg_op_from_name(mg_op_name(op)) == op);
        int ar = mg_op_arity(op);
        CHECK(ar >= -1 && ar <= 2);
        if (ar > 0) CHECK(mg_op_formula(op, 0) && mg_op_formula(op, 1) && mg_op_formula(op, 2));
        for (int j = 0; j < op; j++) CHECK(strcmp(mg_op_name(op), mg_op_name(j)) != 0);
    }
    CHECK(mg_op_name(MG_OP_COUNT) == NULL && mg_op_name(-1) == NULL);
    CHECK(mg_op_from_name("nope") == -1 && mg_op_from_name(NULL) == -1);
    CHECK(strcmp(mg_op_formula(MG_OP_MUL, 0), "A * B") == 0);
    CHECK(strcmp(mg_status_name(MG_ENOMEM), "ENOMEM") == 0);
    CHECK(strcmp(mg_strerror(12345), "unknown status") == 0);
}

static void test_ops__elementwise_gradients_match_finite_differences(void) {
    for (int op = 0; op < MG_OP_COUNT; op++) {
        int ar = mg_op_arity(op);
        if (ar < 1) continue;
        double pts[16][3];
        int np = points_for(op, pts, 16);
        if (np == 0) printf("#   op %s has no test points\n", mg_op_name(op));
        CHECK(np > 0);
        for (int p = 0; p < np; p++) {
            ew_ctx c = {op, pts[p][2]};
            double x[2] = {pts[p][0], pts[p][1]};
            char what[64];
            snprintf(what, sizeof what, "%s(%g, %g; k=%g)", mg_op_name(op), x[0], x[1], c.k);
            CHECK(grad_check(what, build_ew, x, ar, &c, NULL, 1e-6) == 0);
        }
    }
}

static void test_ops__forward_values(void) {
    mg_graph *g = mg_graph_new();
    mg_value *a = mg_scalar(g, 2.0), *b = mg_scalar(g, -3.0);
    CHECK(mg_value_data(mg_add(g, a, b)) == -1.0);
    CHECK(mg_value_data(mg_sub(g, a, b)) == 5.0);
    CHECK(mg_value_data(mg_mul(g, a, b)) == -6.0);
    CHECK(mg_value_data(mg_div(g, a, b)) == 2.0 / -3.0);
    CHECK(mg_value_data(mg_neg(g, a)) == -2.0);
    CHECK(mg_value_data(mg_pow(g, a, 3)) == 8.0);
    CHECK(mg_value_data(mg_powv(g, a, mg_scalar(g, 0.5))) == sqrt(2.0));
    CHECK(mg_value_data(mg_square(g, b)) == 9.0);
    CHECK(mg_value_data(mg_relu(g, b)) == 0.0 && mg_value_data(mg_relu(g, a)) == 2.0);
    CHECK(mg_value_data(mg_tanh(g, a)) == tanh(2.0));
    CHECK(mg_value_data(mg_exp(g, a)) == exp(2.0));
    CHECK(mg_value_data(mg_log(g, a)) == log(2.0));
    CHECK(mg_value_data(mg_sigmoid(g, mg_scalar(g, 0.0))) == 0.5);
    CHECK(mg_value_data(mg_max(g, a, b)) == 2.0 && mg_value_data(mg_max(g, b, a)) == 2.0);
    CHECK(isnan(mg_value_data(mg_max(g, mg_scalar(g, NAN), a))));
    CHECK(isnan(mg_value_data(mg_max(g, a, mg_scalar(g, NAN)))));
    /* IEEE, not errors: division by zero and log of zero */
    CHECK(isinf(mg_value_data(mg_div(g, a, mg_scalar(g, 0.0)))));
    CHECK(mg_value_data(mg_log(g, mg_scalar(g, 0.0))) == -INFINITY);
    mg_graph_free(g);
}

static void test_ops__relu_at_zero_has_zero_gradient(void) {
    /* micrograd's and PyTorch's convention; the central difference would say 0.5 */
    mg_graph *g = mg_graph_new();
    mg_value *a = mg_scalar(g, 0.0);
    mg_value *y = mg_relu(g, a);
    CHECK(mg_backward(g, y) == MG_OK);
    CHECK(mg_value_data(y) == 0.0 && mg_value_grad(a) == 0.0);
    mg_graph_free(g);
}

/* ---- variadic ops ------------------------------------------------------------------------ */

typedef struct {
    int kind; /* 0 sum, 1 dot, 2 affine, 3 mse, 4 hinge, 5 xent */
    int n;
} nary_ctx;

static mg_value *build_nary(mg_graph *g, mg_value **l, int nl, const void *vctx) {
    const nary_ctx *c = vctx;
    (void)nl;
    mg_value *y = NULL;
    switch (c->kind) {
    case 0: y = mg_sum(g, l, (size_t)c->n); break;
    case 1: y = mg_dot(g, l, l + c->n, (size_t)c->n); break;
    case 2: y = mg_affine(g, l, l + c->n, (size_t)c->n, l[2 * c->n]); break;
    case 3: y = mg_mse(g, l, l + c->n, (size_t)c->n); break;
    case 4: y = mg_hinge(g, l, l + c->n, (size_t)c->n); break;
    case 5: y = mg_cross_entropy(g, l, (size_t)c->n, l[c->n]); break;
    }
    return mg_mul(g, mg_tanh(g, y), mg_scalar(g, 2.5)); /* nontrivial upstream gradient */
}

static void test_ops__variadic_gradients_match_finite_differences(void) {
    double x[MAXLEAF] = {0.5, -1.25, 2.0, 0.75, -0.3, 1.1, 0.2, -0.9, 0.4};
    nary_ctx c;
    c = (nary_ctx){0, 5};
    CHECK(grad_check("sum", build_nary, x, 5, &c, NULL, 1e-6) == 0);
    c = (nary_ctx){1, 4};
    CHECK(grad_check("dot", build_nary, x, 8, &c, NULL, 1e-6) == 0);
    c = (nary_ctx){2, 4};
    CHECK(grad_check("affine", build_nary, x, 9, &c, NULL, 1e-6) == 0);
    c = (nary_ctx){3, 4};
    CHECK(grad_check("mse", build_nary, x, 8, &c, NULL, 1e-6) == 0);
    double h[8] = {0.5, -1.25, 2.0, 0.3, 1, -1, -1, 1}; /* margins away from the kink */
    c = (nary_ctx){4, 4};
    CHECK(grad_check("hinge", build_nary, h, 8, &c, NULL, 1e-6) == 0);
    double z[5] = {0.5, -1.25, 2.0, 0.3, 2.0}; /* logits then the target class 2 */
    int logits_only[5] = {1, 1, 1, 1, 0};
    c = (nary_ctx){5, 4};
    CHECK(grad_check("xent", build_nary, z, 5, &c, logits_only, 1e-6) == 0);
    double zbig[5] = {1000.0, 999.0, -1000.0, 998.5, 0.0}; /* stable: no overflow */
    CHECK(grad_check("xent-large", build_nary, zbig, 5, &c, logits_only, 1e-6) == 0);
    CHECK(isfinite(eval(build_nary, zbig, 5, &c)));
}

static void test_ops__variadic_forward_orders(void) {
    mg_graph *g = mg_graph_new();
    mg_value *w[3], *x[3], *b = mg_scalar(g, 0.1);
    double wv[3] = {0.3, -0.7, 1e-17}, xv[3] = {1.1, 0.2, 3.0};
    for (int i = 0; i < 3; i++) {
        w[i] = mg_scalar(g, wv[i]);
        x[i] = mg_scalar(g, xv[i]);
    }
    /* micrograd's chain order: ((b + w0*x0) + w1*x1) + w2*x2 */
    double expect = ((0.1 + 0.3 * 1.1) + -0.7 * 0.2) + 1e-17 * 3.0;
    CHECK(mg_value_data(mg_affine(g, w, x, 3, b)) == expect);
    CHECK(mg_value_has_bias(mg_affine(g, w, x, 3, b)));
    CHECK(!mg_value_has_bias(mg_dot(g, w, x, 3)));
    CHECK(mg_value_data(mg_sum(g, x, 0)) == 0.0);
    /* hinge: sum(relu(1 + -y*s)) * (1/n) */
    mg_value *s[2] = {mg_scalar(g, 0.5), mg_scalar(g, -2.0)},
             *y[2] = {mg_scalar(g, 1), mg_scalar(g, 1)};
    CHECK(mg_value_data(mg_hinge(g, s, y, 2)) == (0.5 + 3.0) * 0.5);
    /* cross-entropy: bad target is an error, not a crash */
    mg_value *t = mg_scalar(g, 7.0);
    CHECK(mg_cross_entropy(g, x, 3, t) == NULL);
    CHECK(mg_graph_last_status(g) == MG_EINVAL);
    CHECK(strstr(mg_graph_last_error(g), "class index") != NULL);
    CHECK(mg_mse(g, x, x, 0) == NULL);
    mg_graph_free(g);
}

static void test_ops__powers_at_zero_have_pytorchs_gradients(void) {
    /* d/da a**0 is 0 everywhere (also at a = 0, where K * pow(A, K - 1) is 0 * inf); for a**b at
     * a = 0 and b >= 0 the exponent's gradient b**... * log(0) is 0, as PyTorch masks it */
    mg_graph *g = mg_graph_new();
    mg_value *a = mg_scalar(g, 0.0), *r = mg_relu(g, mg_scalar(g, -2.0));
    mg_value *y = mg_add(g, mg_pow(g, a, 0.0), mg_pow(g, r, 0.0));
    CHECK(mg_backward(g, y) == MG_OK);
    CHECK(mg_value_data(y) == 2.0 && mg_value_grad(a) == 0.0 && mg_value_grad(r) == 0.0);
    mg_value *b = mg_scalar(g, 2.0), *z = mg_scalar(g, 0.0);
    mg_value *p = mg_powv(g, a, b), *q = mg_powv(g, z, a);
    CHECK(mg_backward(g, p) == MG_OK);
    CHECK(mg_value_data(p) == 0.0 && mg_value_grad(a) == 0.0 && mg_value_grad(b) == 0.0);
    CHECK(mg_backward(g, q) == MG_OK); /* 0 ** 0 = 1 */
    CHECK(mg_value_data(q) == 1.0 && mg_value_grad(z) == 0.0 && mg_value_grad(a) == 0.0);
    /* away from zero nothing changes */
    mg_value *e = mg_scalar(g, 2.0), *c = mg_scalar(g, 3.0);
    mg_value *w = mg_powv(g, e, c);
    CHECK(mg_backward(g, w) == MG_OK);
    CHECK(mg_value_grad(e) == 3.0 * pow(2.0, 2.0) && mg_value_grad(c) == 8.0 * log(2.0));
    mg_graph_free(g);
}

int main(void) {
    RUN(test_ops__table_is_complete);
    RUN(test_ops__elementwise_gradients_match_finite_differences);
    RUN(test_ops__forward_values);
    RUN(test_ops__relu_at_zero_has_zero_gradient);
    RUN(test_ops__powers_at_zero_have_pytorchs_gradients);
    RUN(test_ops__variadic_gradients_match_finite_differences);
    RUN(test_ops__variadic_forward_orders);
    TAP_DONE();
}
