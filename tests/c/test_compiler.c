/* The compiler's stages, inspected through the IR (libmg/src/ir.h): what rerolling, rolling,
 * autodiff and scheduling make of a convolution, a recurrent net, a layer and a scrambled
 * graph; and, for each, that the program computes what the scalar program computes. */
#include "tap.h"

#include "ir.h"
#include "mg/nn.h"

#include <string.h>

static double scale(void) {
    const char *s = getenv("MG_TEST_SCALE");
    return s ? atof(s) : 1.0;
}

/* Runs forward + backward on one sample with rerolling on and off: forward values must be
 * bitwise equal, parameter gradients within `tol` (sums over shared weights are reordered). */
static void check_against_scalar(mg_graph *g, mg_tape_spec spec, const double *x, const double *y,
                                 double tol) {
    double loss[2], grads[2][512], outs[2][16];
    size_t np = spec.nparams < 512 ? spec.nparams : 512;
    for (int raise = 0; raise < 2; raise++) {
        spec.no_raise = !raise;
        mg_tape *t = mg_tape_freeze(g, &spec);
        CHECK(t != NULL);
        if (!t) {
            printf("#   %s\n", mg_graph_last_error(g));
            return;
        }
        CHECK(mg_tape_forward(t, x, y) == MG_OK);
        CHECK(mg_tape_backward(t) == MG_OK);
        loss[raise] = mg_tape_loss(t);
        memcpy(grads[raise], mg_tape_grad(t), np * sizeof(double));
        mg_tape_outputs(t, outs[raise]);
        mg_tape_free(t);
    }
    CHECK(memcmp(&loss[0], &loss[1], sizeof(double)) == 0);
    CHECK(memcmp(outs[0], outs[1], spec.noutputs * sizeof(double)) == 0);
    for (size_t i = 0; i < np; i++) CHECK_CLOSE(grads[1][i], grads[0][i], tol);
}

/* ---- a convolution written op by op -------------------------------------------------------------
 */

enum { H = 10, C = 3, K = 3, O = H - K + 1 };

typedef struct conv_net {
    mg_value *x[H * H], *y, *w[C * K * K], *b[C], *W[2 * C * O * O], *B[2], *logits[2], *loss;
} conv_net;

static void build_conv(mg_graph *g, conv_net *n) {
    for (int i = 0; i < H * H; i++) n->x[i] = mg_scalar(g, 0.01 * (i % 17));
    n->y = mg_scalar(g, 1.0);
    for (int i = 0; i < C * K * K; i++) n->w[i] = mg_scalar(g, 0.05 * ((i * 7) % 11) - 0.25);
    for (int c = 0; c < C; c++) n->b[c] = mg_scalar(g, 0.1 * c);
    for (int i = 0; i < 2 * C * O * O; i++) n->W[i] = mg_scalar(g, 0.02 * ((i * 5) % 13) - 0.12);
    for (int k = 0; k < 2; k++) n->B[k] = mg_scalar(g, 0.0);
    mg_value *feat[C * O * O];
    for (int c = 0; c < C; c++)
        for (int i = 0; i < O; i++)
            for (int j = 0; j < O; j++) {
                mg_value *s = n->b[c];
                for (int a = 0; a < K; a++)
                    for (int bb = 0; bb < K; bb++)
                        s = mg_add(
                            g, s,
                            mg_mul(g, n->w[(c * K + a) * K + bb], n->x[(i + a) * H + j + bb]));
                feat[(c * O + i) * O + j] = mg_relu(g, s);
            }
    for (int k = 0; k < 2; k++) {
        mg_value *s = n->B[k];
        for (int f = 0; f < C * O * O; f++)
            s = mg_add(g, s, mg_mul(g, n->W[k * C * O * O + f], feat[f]));
        n->logits[k] = s;
    }
    n->loss = mg_cross_entropy(g, n->logits, 2, n->y);
}

static mg_tape_spec conv_spec(conv_net *n, mg_value **params) {
    memcpy(params, n->w, sizeof n->w);
    memcpy(params + C * K * K, n->b, sizeof n->b);
    memcpy(params + C * K * K + C, n->W, sizeof n->W);
    memcpy(params + C * K * K + C + 2 * C * O * O, n->B, sizeof n->B);
    mg_tape_spec spec = {
        n->loss, n->x, H * H, &n->y, 1, params, C * K * K + C + 2 * C * O * O + 2, n->logits, 2, 0};
    return spec;
}

static const mgk_nest *first_nest(const mg_tape *t, int mode, int term) {
    for (size_t k = 0; k < t->nfwd_nests; k++)
        if (t->nests[k].mode == mode && t->nests[k].term == term) return &t->nests[k];
    return NULL;
}

static void test_compiler__reroll_finds_the_convolution(void) {
    mg_graph *g = mg_graph_new();
    conv_net n;
    build_conv(g, &n);
    mg_value *params[C * K * K + C + 2 * C * O * O + 2];
    mg_tape_spec spec = conv_spec(&n, params);
    mg_tape *t = mg_tape_freeze(g, &spec);
    CHECK(t != NULL);
    if (!t) return;
    /* statements: C*O*O conv sums, their ReLUs, 2 dense sums, the loss */
    CHECK(t->nstatements == (size_t)(2 * C * O * O + 2 + 1));
    /* forward: conv, relu, dense, the loss */
    CHECK(t->nfwd_nests == 3 && t->nfwd == 4);
    const mgk_nest *conv = first_nest(t, MGK_SUMI, MGK_T_MUL);
    CHECK(conv != NULL);
    if (conv) {
        /* outer (c, i, j) with j the vector dim, reduction (a, b); dims contiguous for every
         * operand are merged. The schedule may order c and i either way (tiles want the dim along
         * which x0 is the same at dim 2), so they are found by size. */
        const int dc = conv->n[1] == C ? 1 : 2, di = 3 - dc;
        CHECK(conv->n[0] == 1 && conv->n[dc] == C && conv->n[di] == O && conv->n[3] == O);
        CHECK(conv->n[6] == K && conv->n[7] == K);
        /* the product's factors in either order (the schedule puts the unit-stride lanes first) */
        const mgk_ref *w = conv->x[0].arr == MGK_D ? &conv->x[0] : &conv->x[1];
        const mgk_ref *x = w == &conv->x[0] ? &conv->x[1] : &conv->x[0];
        /* weight w[c][a][b], a shared slot: a broadcast over (i, j) */
        CHECK(w->arr == MGK_D && w->base < (mgk_i64)t->nparams);
        CHECK(w->s[dc] == K * K && w->s[di] == 0 && w->s[3] == 0);
        CHECK(w->s[6] == K && w->s[7] == 1);
        /* input x[(i + a) * H + (j + b)], a per-sample slot (positions from the first input on):
         * the same for every channel */
        CHECK(x->arr == MGK_BD && x->base == 0);
        CHECK(x->s[dc] == 0 && x->s[di] == H && x->s[3] == 1);
        CHECK(x->s[6] == H && x->s[7] == 1);
        /* bias b[c] */
        CHECK(conv->init.s[dc] == 1 && conv->init.s[di] == 0 && conv->init.s[3] == 0);
        CHECK(conv->flags & MGK_F_BLOCK);
    }
    /* backward: the weight's gradient reduces over the positions it is shared by */
    int found = 0;
    for (size_t k = t->nfwd_nests; k < t->nnests; k++) {
        const mgk_nest *G = &t->nests[k];
        if (G->out.arr != MGK_G || G->out.base != 0 || G->mode != MGK_ACC) continue;
        found = 1;
        mgk_i64 red = 1, outer = 1;
        for (int d = 0; d < MGK_MAXO; d++) outer *= G->n[d];
        for (int d = MGK_MAXO; d < MGK_MAXD; d++) red *= G->n[d];
        CHECK(outer == C * K * K && red == O * O);
    }
    CHECK(found);
    mg_tape_free(t);
    double y = 1.0, x[H * H];
    for (int i = 0; i < H * H; i++) x[i] = 0.03 * ((i * 3) % 7) - 0.05;
    check_against_scalar(g, spec, x, &y, 1e-12);
    mg_graph_free(g);
}

/* ---- a padded, strided convolution: its border nests read windows of the packed weights -------
 */

enum { H2 = 12, C2 = 8, K2 = 5, P2 = 2, S2 = 2, O2 = (H2 + 2 * P2 - K2) / S2 + 1 };

static void test_compiler__schedule_runs_a_strided_convolution_along_its_channels(void) {
    mg_graph *g = mg_graph_new();
    mg_value *x[H2 * H2], *y = mg_scalar(g, 1.0), *w[C2 * K2 * K2], *b[C2], *W[2 * C2 * O2 * O2];
    mg_value *B[2], *feat[C2 * O2 * O2], *logits[2];
    mg_value *params[C2 * K2 * K2 + C2 + 2 * C2 * O2 * O2 + 2];
    for (int i = 0; i < H2 * H2; i++) x[i] = mg_scalar(g, 0.01 * (i % 19) - 0.07);
    for (int i = 0; i < C2 * K2 * K2; i++) w[i] = mg_scalar(g, 0.03 * ((i * 7) % 11) - 0.15);
    for (int c = 0; c < C2; c++) b[c] = mg_scalar(g, 0.05 * c);
    for (int i = 0; i < 2 * C2 * O2 * O2; i++) W[i] = mg_scalar(g, 0.02 * ((i * 5) % 13) - 0.12);
    for (int k = 0; k < 2; k++) B[k] = mg_scalar(g, 0.0);
    for (int c = 0; c < C2; c++) /* zero padding: taps outside the image are left out */
        for (int i = 0; i < O2; i++)
            for (int j = 0; j < O2; j++) {
                mg_value *s = b[c];
                for (int a = 0; a < K2; a++)
                    for (int bb = 0; bb < K2; bb++) {
                        int r = S2 * i + a - P2, q = S2 * j + bb - P2;
                        if (r < 0 || r >= H2 || q < 0 || q >= H2) continue;
                        s = mg_add(g, s, mg_mul(g, w[(c * K2 + a) * K2 + bb], x[r * H2 + q]));
                    }
                feat[(c * O2 + i) * O2 + j] = mg_relu(g, s);
            }
    for (int k = 0; k < 2; k++) {
        mg_value *s = B[k];
        for (int f = 0; f < C2 * O2 * O2; f++)
            s = mg_add(g, s, mg_mul(g, W[k * C2 * O2 * O2 + f], feat[f]));
        logits[k] = s;
    }
    mg_value *loss = mg_cross_entropy(g, logits, 2, y);
    memcpy(params, w, sizeof w);
    memcpy(params + C2 * K2 * K2, b, sizeof b);
    memcpy(params + C2 * K2 * K2 + C2, W, sizeof W);
    memcpy(params + C2 * K2 * K2 + C2 + 2 * C2 * O2 * O2, B, sizeof B);
    mg_tape_spec spec = {loss,   x, H2 * H2, &y, 1, params, sizeof params / sizeof params[0],
                         logits, 2, 0};
    mg_tape *t = mg_tape_freeze(g, &spec);
    CHECK(t != NULL);
    if (t) {
        /* every conv nest (the interior and each border window) reads the weights from one pack
         * whose lanes run along the channels */
        size_t convs = 0, best = 0;
        const mgk_nest *interior = NULL;
        for (size_t k = 0; k < t->nfwd_nests; k++) {
            const mgk_nest *N = &t->nests[k];
            if (N->mode != MGK_SUMI || N->term != MGK_T_MUL || N->n[7] > K2) continue;
            convs++;
            const mgk_ref *wr = N->x[0].arr == MGK_PW ? &N->x[0] : &N->x[1];
            CHECK(wr->arr == MGK_PW);
            CHECK(N->n[3] == C2 && wr->s[3] == 1);
            size_t outs = (size_t)(N->n[0] * N->n[1] * N->n[2] * N->n[3]);
            if (outs > best) best = outs, interior = N;
        }
        CHECK(convs > 1);
        /* the interior: the packed weights times the input broadcast along the channels, in
         * register tiles whose rows are output positions */
        CHECK(interior != NULL && (interior->flags & MGK_F_TILE));
        CHECK(t->npacked >= (size_t)(C2 * K2 * K2));
        mg_tape_free(t);
    }
    double xs[H2 * H2], ys = 1.0;
    for (int i = 0; i < H2 * H2; i++) xs[i] = 0.04 * ((i * 5) % 9) - 0.1;
    check_against_scalar(g, spec, xs, &ys, 1e-12);
    mg_graph_free(g);
}

/* ---- a recurrent net: one shared cell over T steps
 * ----------------------------------------------- */

enum { T = 12, NI = 4, NH = 8 };

static void test_compiler__roll_finds_the_time_steps(void) {
    mg_graph *g = mg_graph_new();
    mg_value *x[T * NI], *y = mg_scalar(g, 0.0), *p[NH * NI + NH * NH + NH + NH + 1];
    size_t np = 0;
    for (int i = 0; i < T * NI; i++) x[i] = mg_scalar(g, 0.0);
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        p[np++] = mg_scalar(g, 0.07 * (double)((i * 5) % 9) - 0.3);
    mg_value **Wx = p, **Wh = p + NH * NI, **bh = Wh + NH * NH, **wy = bh + NH, *by = wy[NH];
    mg_value *h[NH], *nh[NH];
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < NH; j++) {
            mg_value *s = bh[j];
            for (int i = 0; i < NI; i++) s = mg_add(g, s, mg_mul(g, Wx[j * NI + i], x[t * NI + i]));
            if (t > 0)
                for (int k = 0; k < NH; k++) s = mg_add(g, s, mg_mul(g, Wh[j * NH + k], h[k]));
            nh[j] = mg_tanh(g, s);
        }
        memcpy(h, nh, sizeof h);
    }
    mg_value *out = by;
    for (int j = 0; j < NH; j++) out = mg_add(g, out, mg_mul(g, wy[j], h[j]));
    mg_value *loss = mg_mse(g, &out, &y, 1);
    mg_tape_spec spec = {loss, x, T * NI, &y, 1, p, np, &out, 1, 0};
    mg_tape *t = mg_tape_freeze(g, &spec);
    CHECK(t != NULL);
    if (!t) return;
    /* steps 1..T-1 are one sequential loop; step 0 (no recurrent term) stays outside */
    size_t seqs = 0;
    for (size_t i = 0; i < t->nfwd; i++)
        if (t->fwd[i].kind == MG_I_SEQ) {
            seqs++;
            CHECK(t->fwd[i].b == T - 1);
            /* the recurrent term stays in the loop: h moves by one step, Wh does not */
            int recurrent = 0, input = 0;
            for (size_t q = 1; q <= t->fwd[i].a; q++) {
                const mgk_nest *M = &t->nests[t->fwd[i + q].a];
                recurrent += M->term == MGK_T_MUL && M->mode == MGK_ACC &&
                             (M->x[0].ts == 0) != (M->x[1].ts == 0);
                input += M->term == MGK_T_MUL && M->mode == MGK_SUMI;
            }
            CHECK(recurrent == 1 && input == 0);
            /* the input term (bias + Wx x_t) does not depend on the loop: hoisted before it, one
             * nest whose steps are a dim along which x moves by a row and Wx does not */
            CHECK(i > 0 && t->fwd[i - 1].kind == MG_I_NEST);
            if (i > 0) {
                const mgk_nest *N = &t->nests[t->fwd[i - 1].a];
                int step_dim = 0;
                for (int d = 0; d < MGK_MAXD; d++)
                    step_dim += N->n[d] == T - 1 && N->x[0].ts == 0 && N->x[1].ts == 0 &&
                                ((N->x[1].s[d] == NI && N->x[0].s[d] == 0) ||
                                 (N->x[0].s[d] == NI && N->x[1].s[d] == 0));
                CHECK(N->term == MGK_T_MUL && N->mode == MGK_SUMI && step_dim == 1);
                CHECK(t->info[t->fwd[i - 1].a].seq == 1);
            }
        }
    CHECK(seqs == 1 && t->nseq == 1);
    /* the backward program runs the same loop in reverse; Wh's gradient, which every step adds
     * into and nothing else in the loop touches, is summed after it, the steps a reduction dim */
    size_t rseqs = 0;
    for (size_t i = 0; i < t->nbwd; i++)
        if (t->bwd[i].kind == MG_I_SEQ) {
            rseqs += t->bwd[i].flags == 1 && t->bwd[i].b == T - 1;
            const size_t after = i + 1 + t->bwd[i].a;
            int sums_steps = 0;
            for (size_t j = after; j < t->nbwd && t->bwd[j].kind == MG_I_NEST; j++) {
                const mgk_nest *N = &t->nests[t->bwd[j].a];
                for (int d = MGK_MAXO; d < MGK_MAXD; d++)
                    sums_steps += N->n[d] == T - 1 && N->out.ts == 0 && N->term == MGK_T_MUL;
            }
            CHECK(sums_steps >= 1);
        }
    CHECK(rseqs == 1);
    mg_tape_stats st;
    CHECK(mg_tape_get_stats(t, &st) == MG_OK && st.loops == 1 && st.hoisted >= 2);
    mg_tape_free(t);
    double xs[T * NI], yv = 0.5;
    for (int i = 0; i < T * NI; i++) xs[i] = 0.1 * ((i * 7) % 5) - 0.2;
    check_against_scalar(g, spec, xs, &yv, 1e-12);
    mg_graph_free(g);
}

/* Layers of one shape with their own weights (an MLP's equal hidden layers) repeat nest for nest,
 * each reading its weights a layer's parameters after the last. Rolled into a loop over the
 * layers, the weights' base moved with the loop, which no packed copy of a weight block
 * describes: an MLP 64-32-32-32-32-10 trained 1.7x slower compiled. Such a block is not rolled:
 * a nest per layer, every hidden layer packed, the scalar program's values. */
static void test_compiler__equal_layers_are_not_rolled_over_their_weights(void) {
    enum { NIN = 6, NW = 8, NL = 5, NOUT = 3 };
    mg_graph *g = mg_graph_new();
    mg_rng r;
    mg_rng_seed(&r, 3);
    size_t sizes[NL] = {NW, NW, NW, NW, NOUT};
    mg_mlp *m = mg_mlp_new(g, NIN, sizes, NL, MG_ACT_RELU, MG_INIT_SCALED, &r);
    mg_value *x[NIN], *y = mg_scalar(g, 1.0), *out[NOUT],
                      *p[NIN * NW + NW + 3 * (NW * NW + NW) + NW * NOUT + NOUT];
    size_t np = mg_mlp_param_count(m);
    CHECK(m != NULL && np == sizeof p / sizeof p[0] && mg_mlp_params(m, p) == np);
    for (int i = 0; i < NIN; i++) x[i] = mg_scalar(g, 0.0);
    CHECK(mg_mlp_call(g, m, x, out) == MG_OK);
    mg_value *loss = mg_cross_entropy(g, out, NOUT, y);
    mg_tape_spec spec = {loss, x, NIN, &y, 1, p, np, out, NOUT, 0};
    mg_tape *t = mg_tape_freeze(g, &spec);
    CHECK(t != NULL);
    if (t) {
        /* every hidden layer's weights and biases (the 3 outputs' are read as they are) */
        CHECK(t->nseq == 0 && t->npacked >= np - (NW * NOUT + NOUT));
        for (size_t k = 0; k < t->nfwd_nests; k++) {
            const mgk_nest *N = &t->nests[k];
            const mgk_ref *refs[6] = {&N->out, &N->init, &N->x[0], &N->x[1], &N->x[2], &N->x[3]};
            for (int j = 0; j < 6; j++) CHECK(refs[j]->ts == 0);
        }
    }
    mg_tape_free(t);
    double xs[NIN], yv = 1.0;
    for (int i = 0; i < NIN; i++) xs[i] = 0.3 * ((i * 7) % 5) - 0.5;
    check_against_scalar(g, spec, xs, &yv, 1e-12);
    mg_mlp_free(m);
    mg_graph_free(g);
}

/* ---- scheduling: packed weights and fused SGD
 * ------------------------------------------------------ */

static void test_compiler__schedule_packs_and_fuses_a_layer(void) {
    enum { NIN = 20, NOUT = 12 };
    mg_graph *g = mg_graph_new();
    mg_value *x[NIN], *y = mg_scalar(g, 3.0), *p[NOUT * (NIN + 1)], *out[NOUT];
    for (int i = 0; i < NIN; i++) x[i] = mg_scalar(g, 0.0);
    for (int i = 0; i < NOUT * (NIN + 1); i++) p[i] = mg_scalar(g, 0.01 * ((i * 13) % 17) - 0.08);
    for (int j = 0; j < NOUT; j++) { /* micrograd's parameter order: w..., b per neuron */
        mg_value *s = p[j * (NIN + 1) + NIN];
        for (int i = 0; i < NIN; i++) s = mg_add(g, s, mg_mul(g, p[j * (NIN + 1) + i], x[i]));
        out[j] = s;
    }
    mg_value *loss = mg_cross_entropy(g, out, NOUT, y);
    mg_tape_spec spec = {loss, x, NIN, &y, 1, p, NOUT * (NIN + 1), out, NOUT, 0};
    mg_tape *t = mg_tape_freeze(g, &spec);
    CHECK(t != NULL);
    if (!t) return;
    /* W[j][i] is read along j with stride NIN+1: packed so that j is contiguous; so is b[j] */
    CHECK(t->npacks == 2 && t->npacked == NOUT * (NIN + 1));
    const mgk_nest *L = &t->nests[0];
    CHECK(L->x[0].arr == MGK_PW && L->x[0].s[3] == 1 && L->init.arr == MGK_PW && L->init.s[3] == 1);
    /* at batch size 1 the weights' and biases' gradient nests apply SGD themselves */
    size_t steps = 0;
    for (size_t k = t->nfwd_nests; k < t->nnests; k++)
        steps += (t->nests[k].flags & MGK_F_STEP) != 0;
    CHECK(steps == 2);
    /* training through packs and fused steps equals the scalar program's training */
    enum { N = 6 };
    double X[N * NIN], Y[N], ref[NOUT * (NIN + 1)];
    for (int i = 0; i < N * NIN; i++) X[i] = 0.05 * ((i * 11) % 9) - 0.2;
    for (int s = 0; s < N; s++) Y[s] = (double)((s * 5) % NOUT);
    spec.no_raise = 1;
    mg_tape *u = mg_tape_freeze(g, &spec);
    for (size_t batch = 1; batch <= 2; batch++) {
        memcpy(mg_tape_data(t), mg_tape_data(u), sizeof ref);
        mg_fit_options o = {batch, 0.2, 1, 5, 0, 1, NULL};
        double l1, l2;
        CHECK(mg_tape_fit(t, X, Y, N, &o, &l1) == MG_OK);
        memcpy(ref, mg_tape_data(u), sizeof ref);
        CHECK(mg_tape_fit(u, X, Y, N, &o, &l2) == MG_OK);
        CHECK_CLOSE(l1, l2, 1e-14);
        for (int i = 0; i < NOUT * (NIN + 1); i++)
            CHECK_CLOSE(mg_tape_data(t)[i], mg_tape_data(u)[i], 1e-13);
        memcpy(mg_tape_data(u), ref, sizeof ref);
    }
    mg_tape_free(u);
    mg_tape_free(t);
    mg_graph_free(g);
}

/* Batch-1 training defers each layer's weight step to the next sample's forward through the
 * layer (pre-steps): one pass over the weights per sample, and the same bits as forward, backward
 * and step per sample. A weight that a second layer also reads (tied) keeps its step in backward.
 */
static void test_compiler__batch1_fit_steps_weights_as_the_next_forward_reads_them(void) {
    enum { NIN = 20, NHID = 20, NOUT = 10, NW = NHID * NIN + NHID + NOUT * NHID + NOUT, N = 7 };
    for (int tied = 0; tied < 2; tied++) {
        mg_graph *g = mg_graph_new();
        mg_value *x[NIN], *y = mg_scalar(g, 0.0), *p[NW], *h[NHID], *out[NOUT];
        for (int i = 0; i < NIN; i++) x[i] = mg_scalar(g, 0.0);
        for (int i = 0; i < NW; i++) p[i] = mg_scalar(g, 0.02 * ((i * 13) % 17) - 0.15);
        mg_value **W1 = p, **b1 = p + NHID * NIN, **W2 = b1 + NHID, **b2 = W2 + NOUT * NHID;
        for (int j = 0; j < NHID; j++) {
            mg_value *s = b1[j];
            for (int i = 0; i < NIN; i++) s = mg_add(g, s, mg_mul(g, W1[j * NIN + i], x[i]));
            h[j] = mg_relu(g, s);
        }
        for (int j = 0; j < NOUT; j++) { /* tied: the output layer reads W1's first rows too */
            mg_value *s = b2[j];
            for (int i = 0; i < NHID; i++)
                s = mg_add(g, s, mg_mul(g, tied ? W1[j * NIN + i] : W2[j * NHID + i], h[i]));
            out[j] = s;
        }
        mg_value *loss = mg_cross_entropy(g, out, NOUT, y);
        mg_tape_spec spec = {loss, x, NIN, &y, 1, p, NW, out, NOUT, 0};
        mg_tape *t = mg_tape_freeze(g, &spec);
        CHECK(t != NULL);
        if (!t) return;
        /* untied: both layers' weight steps wait for the forward; tied: W1 is read by both
         * layers, so its step stays in backward (and W2 is unused) */
        size_t pre_fwd = 0;
        for (size_t k = 0; k < t->nfwd_nests; k++)
            pre_fwd += (t->nests[k].flags & MGK_F_PRESTEP) != 0;
        CHECK(t->npre == (tied ? 0u : 2u) && pre_fwd == t->npre);
        for (size_t q = 0; q < t->npre; q++) {
            const mg_prestep *P = &t->pre[q];
            CHECK(P->fwd < t->nfwd_nests && P->bwd >= t->nfwd_nests);
            CHECK(t->info[P->bwd].pre == q + 1 && (t->nests[P->bwd].flags & MGK_F_STEP));
        }
        double X[N * NIN], Y[N], p0[NW], fit[NW], l_fit, l_hand = 0.0;
        for (int i = 0; i < N * NIN; i++) X[i] = 0.05 * ((i * 11) % 9) - 0.2;
        for (int s = 0; s < N; s++) Y[s] = (double)((s * 3) % NOUT);
        memcpy(p0, mg_tape_data(t), sizeof p0);
        for (int n = 1; n <= N; n += N - 1) { /* one sample: nothing waits */
            for (int zero_lr = 0; zero_lr < 2; zero_lr++) {
                double lr = zero_lr ? 0.0 : 0.3;
                memcpy(mg_tape_data(t), p0, sizeof p0);
                mg_fit_options o = {1, lr, 0, 0, 0, 1, NULL};
                CHECK(mg_tape_fit(t, X, Y, (size_t)n, &o, &l_fit) == MG_OK);
                memcpy(fit, mg_tape_data(t), sizeof fit);
                memcpy(mg_tape_data(t), p0, sizeof p0);
                l_hand = 0.0;
                for (int s = 0; s < n; s++) {
                    CHECK(mg_tape_forward(t, X + s * NIN, Y + s) == MG_OK);
                    CHECK(mg_tape_backward(t) == MG_OK);
                    CHECK(mg_tape_step(t, lr, 1) == MG_OK);
                    l_hand += mg_tape_loss(t);
                }
                l_hand /= n;
                CHECK(memcmp(&l_fit, &l_hand, sizeof l_fit) == 0);
                CHECK(memcmp(fit, mg_tape_data(t), sizeof fit) == 0);
                CHECK(zero_lr || memcmp(fit, p0, sizeof fit) != 0);
            }
        }
        mg_tape_free(t);
        mg_graph_free(g);
    }
}

/* ---- what is not affine: index tables
 * --------------------------------------------------------------- */

static void test_compiler__scrambled_operands_read_through_tables(void) {
    enum { M = 16, NT = 24 };
    mg_graph *g = mg_graph_new();
    mg_value *x[NT], *p[M * NT], *y = mg_scalar(g, 0.0), *out[M];
    for (int i = 0; i < NT; i++) x[i] = mg_scalar(g, 0.0);
    for (int i = 0; i < M * NT; i++) p[i] = mg_scalar(g, 0.01 * ((i * 37) % 23) - 0.1);
    for (int j = 0; j < M; j++) {
        mg_value *s = mg_scalar(g, 0.5);
        for (int r = 0; r < NT; r++) {
            /* weights in a scrambled order: no affine function of (j, r) */
            int q = (j * 97 + r * 31 + (r * r) % 7) % (M * NT);
            s = mg_add(g, s, mg_mul(g, p[q], x[(r * 5) % NT]));
        }
        out[j] = mg_tanh(g, s);
    }
    mg_value *loss = mg_sum(g, out, M);
    mg_tape_spec spec = {loss, x, NT, &y, 1, p, M * NT, out, M, 0};
    mg_tape *t = mg_tape_freeze(g, &spec);
    CHECK(t != NULL);
    if (!t) return;
    int gathers = 0;
    for (size_t k = 0; k < t->nfwd_nests; k++)
        gathers += t->nests[k].x[0].gather || t->nests[k].x[1].gather;
    CHECK(gathers > 0 && t->nix > 0);
    CHECK(t->nfwd_nests <= 4); /* never one instruction per scalar */
    mg_tape_free(t);
    double xs[NT], yv = 0.0;
    for (int i = 0; i < NT; i++) xs[i] = 0.1 * i - 1.0;
    check_against_scalar(g, spec, xs, &yv, 1e-12);
    mg_graph_free(g);
}

/* ---- layouts: inputs in read order, parameter runs cut at blocks ------------------------------
 */

/* A layer over its inputs in a permuted order (permuted pixels): stored as the program reads
 * them, the layer reads them affinely, with no index table; the driver loads rows through the
 * order, so the program computes what the scalar program computes from the caller's x. */
static void test_compiler__inputs_are_stored_in_the_order_the_program_reads_them(void) {
    enum { M = 16, NT = 24 };
    mg_graph *g = mg_graph_new();
    mg_value *x[NT], *p[M * NT + M], *y = mg_scalar(g, 0.0), *out[M];
    for (int i = 0; i < NT; i++) x[i] = mg_scalar(g, 0.0);
    for (int i = 0; i < M * NT + M; i++) p[i] = mg_scalar(g, 0.01 * ((i * 37) % 23) - 0.1);
    for (int j = 0; j < M; j++) {
        mg_value *s = p[M * NT + j];
        for (int r = 0; r < NT; r++) s = mg_add(g, s, mg_mul(g, p[j * NT + r], x[(r * 5) % NT]));
        out[j] = mg_tanh(g, s);
    }
    mg_value *loss = mg_sum(g, out, M);
    mg_tape_spec spec = {loss, x, NT, &y, 1, p, M * NT + M, out, M, 0};
    mg_tape *t = mg_tape_freeze(g, &spec);
    CHECK(t != NULL);
    if (!t) return;
    CHECK(t->in_perm != NULL && t->nix == 0);
    for (size_t k = 0; t->in_perm && k < NT; k++) CHECK(t->in_perm[k] == (k * 5) % NT);
    CHECK(t->npacked == M * NT);
    mg_tape_free(t);
    double xs[NT], yv = 0.0;
    for (int i = 0; i < NT; i++) xs[i] = 0.1 * i - 1.0;
    check_against_scalar(g, spec, xs, &yv, 1e-12);
    mg_graph_free(g);
}

/* An L2 term over every parameter, `sum(p*p)` in the caller's order, reads W, b, V, c as one run:
 * split.c cuts it at the blocks (W read as its rows), so the layers' weights are packed; the
 * pieces of the sum continue it in order, so the loss is the scalar program's bit for bit. */
static void test_compiler__an_l2_run_is_cut_at_the_weight_blocks(void) {
    enum { M = 16, NT = 64, NP = M * NT + M + M + 1 }; /* W: split.c's smallest block */
    mg_graph *g = mg_graph_new();
    mg_value *x[NT], *p[NP], *y = mg_scalar(g, 0.0), *h[M], *out;
    for (int i = 0; i < NT; i++) x[i] = mg_scalar(g, 0.0);
    for (int i = 0; i < NP; i++) p[i] = mg_scalar(g, 0.01 * ((i * 37) % 23) - 0.1);
    for (int j = 0; j < M; j++) {
        mg_value *s = p[M * NT + j];
        for (int r = 0; r < NT; r++) s = mg_add(g, s, mg_mul(g, p[j * NT + r], x[r]));
        h[j] = mg_tanh(g, s);
    }
    out = p[NP - 1];
    for (int j = 0; j < M; j++) out = mg_add(g, out, mg_mul(g, p[M * NT + M + j], h[j]));
    mg_value *reg = mg_scalar(g, 0.0); /* as Python's sum() starts */
    for (int i = 0; i < NP; i++) reg = mg_add(g, reg, mg_mul(g, p[i], p[i]));
    mg_value *loss = mg_add(g, mg_mul(g, out, out), mg_mul(g, mg_scalar(g, 1e-2), reg));
    mg_tape_spec spec = {loss, x, NT, &y, 1, p, NP, &out, 1, 0};
    mg_tape *t = mg_tape_freeze(g, &spec);
    CHECK(t != NULL);
    if (!t) return;
    int pieces = 0; /* the sum is a shared value: parameters alone, for the loss alone */
    for (size_t k = 0; k < t->nfwd_nests; k++)
        pieces += t->nests[k].mode == MGK_ACC && t->nests[k].out.arr == MGK_D;
    CHECK(pieces >= 1);
    CHECK(t->shared0 < t->input0 && t->nsh_fwd > (size_t)pieces && t->nsh_bwd > 0);
    CHECK(t->npacked >= M * NT);
    mg_tape_free(t);
    double xs[NT], yv = 0.0;
    for (int i = 0; i < NT; i++) xs[i] = 0.1 * i - 0.5;
    check_against_scalar(g, spec, xs, &yv, 1e-12);
    mg_graph_free(g);
}

/* The shared values (an L2 term: parameters alone, for the loss alone) run once per batch, in
 * phases of their own (drive.h). Were they found anywhere but at the programs' ends, a batch would
 * compute them in its chunks on one thread instead (shared_inline): forced here, both plans give
 * the definition of a batch (each sample's forward and backward, then one step of the mean) to
 * rounding, and each is bitwise the same for 1 and 2 threads. */
static void test_compiler__shared_values_run_once_per_batch_or_in_every_chunk(void) {
    enum { NT = 3, M = 4, NP = M * NT + M, N = 13, B = 5 };
    mg_graph *g = mg_graph_new();
    mg_value *x[NT], *p[NP], *y = mg_scalar(g, 0.0), *out = mg_scalar(g, 0.0);
    for (int i = 0; i < NT; i++) x[i] = mg_scalar(g, 0.0);
    for (int i = 0; i < NP; i++) p[i] = mg_scalar(g, 0.05 * ((i * 7) % 11) - 0.25);
    for (int j = 0; j < M; j++) {
        mg_value *s = p[M * NT + j];
        for (int r = 0; r < NT; r++) s = mg_add(g, s, mg_mul(g, p[j * NT + r], x[r]));
        out = mg_add(g, out, mg_tanh(g, s));
    }
    mg_value *reg = mg_scalar(g, 0.0);
    for (int i = 0; i < NP; i++) reg = mg_add(g, reg, mg_mul(g, p[i], p[i]));
    mg_value *err = mg_sub(g, out, y);
    mg_value *loss = mg_add(g, mg_mul(g, err, err), mg_mul(g, mg_scalar(g, 1e-2), reg));
    mg_tape_spec spec = {loss, x, NT, &y, 1, p, NP, NULL, 0, 0};
    double X[N * NT], Y[N], want[NP], got[2][2][NP];
    for (int i = 0; i < N * NT; i++) X[i] = 0.1 * ((i * 5) % 17) - 0.8;
    for (int i = 0; i < N; i++) Y[i] = 0.2 * (i % 7) - 0.6;
    for (int plan = 0; plan < 2; plan++) {
        mg_tape *t = mg_tape_freeze(g, &spec);
        CHECK(t != NULL);
        if (!t) break;
        CHECK(t->shared0 < t->input0 && t->nsh_fwd > 0 && t->nsh_bwd > 0);
        if (plan) t->nsh_fwd = t->nsh_bwd = 0; /* as if found elsewhere: every chunk runs them */
        double p0[NP];
        for (int i = 0; i < NP; i++) p0[i] = mg_tape_data(t)[i];
        if (!plan) { /* the definition */
            for (int b = 0; b < N; b += B) {
                int n = N - b < B ? N - b : B;
                for (int s = b; s < b + n; s++) {
                    CHECK(mg_tape_forward(t, X + s * NT, Y + s) == MG_OK);
                    CHECK(mg_tape_backward(t) == MG_OK);
                }
                CHECK(mg_tape_step(t, 0.1, (size_t)n) == MG_OK);
            }
            for (int i = 0; i < NP; i++) want[i] = mg_tape_data(t)[i];
        }
        for (int th = 0; th < 2; th++) {
            for (int i = 0; i < NP; i++) mg_tape_data(t)[i] = p0[i];
            mg_fit_options o = {B, 0.1, 0, 0, 0, (size_t)th + 1, NULL};
            double l = 0.0;
            CHECK(mg_tape_fit(t, X, Y, N, &o, &l) == MG_OK);
            for (int i = 0; i < NP; i++) got[plan][th][i] = mg_tape_data(t)[i];
        }
        mg_tape_free(t);
    }
    int moved = 0;
    for (int i = 0; i < NP; i++) {
        moved |= want[i] != spec.params[i]->data;
        for (int plan = 0; plan < 2; plan++) {
            CHECK(got[plan][0][i] == got[plan][1][i]);
            CHECK(fabs(got[plan][0][i] - want[i]) <= 1e-12 * (1.0 + fabs(want[i])));
        }
    }
    CHECK(moved);
    mg_graph_free(g);
}

/* ---- big graphs: freezing is linear
 * ---------------------------------------------------------------- */

static void test_compiler__million_value_conv_freezes_to_a_few_nests(void) {
    /* conv 3x3 with 16 channels over a 64x64 image, as chains: 64*62*62*... values */
    int hsz = scale() < 1.0 ? 16 : 64, ch = scale() < 1.0 ? 2 : 16, o = hsz - 2;
    mg_graph *g = mg_graph_new();
    size_t nx = (size_t)hsz * hsz, nw = (size_t)ch * 9;
    mg_value **x = malloc(nx * sizeof *x), **w = malloc(nw * sizeof *w),
             **f = malloc((size_t)ch * o * o * sizeof *f);
    for (size_t i = 0; i < nx; i++) x[i] = mg_scalar(g, 0.0);
    for (size_t i = 0; i < nw; i++) w[i] = mg_scalar(g, 0.01 * (double)(i % 7));
    for (int c = 0; c < ch; c++)
        for (int i = 0; i < o; i++)
            for (int j = 0; j < o; j++) {
                mg_value *s = mg_scalar(g, 0.0);
                for (int a = 0; a < 3; a++)
                    for (int b = 0; b < 3; b++)
                        s = mg_add(g, s, mg_mul(g, w[c * 9 + a * 3 + b], x[(i + a) * hsz + j + b]));
                f[(c * o + i) * o + j] = mg_relu(g, s);
            }
    mg_value *loss = mg_sum(g, f, (size_t)ch * o * o);
    mg_tape_spec spec = {loss, x, nx, NULL, 0, w, nw, NULL, 0, 0};
    mg_tape *t = mg_tape_freeze(g, &spec);
    CHECK(t != NULL);
    if (t) {
        printf("# %zu values -> %zu forward and %zu backward nests\n", t->nodes, t->nfwd_nests,
               t->nnests - t->nfwd_nests);
        CHECK(t->nfwd_nests <= 3);
        CHECK(t->nodes > (size_t)ch * o * o * 19);
    }
    mg_tape_free(t);
    free(x);
    free(w);
    free(f);
    mg_graph_free(g);
}

/* The interpreter's kernel build: one of the three names, chosen once; MG_ISA=baseline (the
 * valgrind stage) caps it to the baseline build. */
static void test_compiler__kernel_isa_names_the_build_it_runs(void) {
    const char *isa = mg_tape_kernel_isa();
    CHECK(isa && (!strcmp(isa, "avx512") || !strcmp(isa, "avx2") || !strcmp(isa, "baseline")));
    const char *cap = getenv("MG_ISA");
    if (isa && cap && !strcmp(cap, "baseline")) CHECK(!strcmp(isa, "baseline"));
    if (isa && cap && !strcmp(cap, "avx2")) CHECK(strcmp(isa, "avx512") != 0);
    CHECK(mg_tape_kernel_isa() == isa);
}

int main(void) {
    RUN(test_compiler__reroll_finds_the_convolution);
    RUN(test_compiler__schedule_runs_a_strided_convolution_along_its_channels);
    RUN(test_compiler__roll_finds_the_time_steps);
    RUN(test_compiler__equal_layers_are_not_rolled_over_their_weights);
    RUN(test_compiler__schedule_packs_and_fuses_a_layer);
    RUN(test_compiler__batch1_fit_steps_weights_as_the_next_forward_reads_them);
    RUN(test_compiler__scrambled_operands_read_through_tables);
    RUN(test_compiler__inputs_are_stored_in_the_order_the_program_reads_them);
    RUN(test_compiler__an_l2_run_is_cut_at_the_weight_blocks);
    RUN(test_compiler__shared_values_run_once_per_batch_or_in_every_chunk);
    RUN(test_compiler__million_value_conv_freezes_to_a_few_nests);
    RUN(test_compiler__kernel_isa_names_the_build_it_runs);
    TAP_DONE();
}
