/* Trains MLP(2,[4,1]) on XOR with libmg, one checkpoint per step.
 *
 * Build against an installed libmg:
 *     cc -std=c11 xor.c $(pkg-config --cflags --libs libmg) -o xor && ./xor
 */
#include <mg/mg.h>
#include <stdio.h>

int main(void) {
    static const double X[4][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
    static const double Y[4] = {0, 1, 1, 0};

    mg_graph *g = mg_graph_new();
    if (!g) return 1;
    mg_rng rng;
    mg_rng_seed(&rng, 42);
    size_t sizes[2] = {4, 1};
    mg_mlp *model = mg_mlp_new(g, 2, sizes, 2, MG_ACT_TANH, MG_INIT_UNIFORM, &rng);
    if (!model) {
        fprintf(stderr, "xor: %s\n", mg_graph_last_error(g));
        mg_graph_free(g);
        return 1;
    }
    size_t nparams = mg_mlp_param_count(model);
    mg_value *params[17];
    mg_mlp_params(model, params);

    /* Everything created after this point is one step's graph, freed by the restore. */
    mg_graph_checkpoint cp = mg_graph_save(g);
    double loss = 1.0;
    for (int step = 0; step < 2000 && loss > 1e-4; step++) {
        mg_value *pred[4], *target[4];
        for (int i = 0; i < 4; i++) {
            mg_value *x[2] = {mg_scalar(g, X[i][0]), mg_scalar(g, X[i][1])};
            target[i] = mg_scalar(g, Y[i]);
            if (mg_mlp_call(g, model, x, &pred[i]) != MG_OK) pred[i] = NULL;
        }
        mg_value *l = mg_mse(g, pred, target, 4);
        if (!l || mg_backward(g, l) != MG_OK) {
            fprintf(stderr, "xor: %s\n", mg_graph_last_error(g));
            break;
        }
        loss = mg_value_data(l);
        for (size_t i = 0; i < nparams; i++) {
            mg_value_set_data(params[i], mg_value_data(params[i]) - 0.5 * mg_value_grad(params[i]));
            mg_value_set_grad(params[i], 0.0);
        }
        if (step % 100 == 0) printf("step %4d  loss %.6f\n", step, loss);
        mg_graph_restore(g, cp);
    }
    printf("final loss %.6g\n", loss);

    int correct = 0;
    for (int i = 0; i < 4; i++) {
        mg_value *x[2] = {mg_scalar(g, X[i][0]), mg_scalar(g, X[i][1])}, *y = NULL;
        if (mg_mlp_call(g, model, x, &y) != MG_OK) break;
        printf("xor(%g, %g) = %.4f\n", X[i][0], X[i][1], mg_value_data(y));
        correct += (mg_value_data(y) > 0.5) == (Y[i] > 0.5);
        mg_graph_restore(g, cp);
    }
    mg_mlp_free(model);
    mg_graph_free(g);
    return correct == 4 && loss < 1e-3 ? 0 : 1;
}
