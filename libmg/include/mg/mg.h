/**
 * @file mg.h
 * @brief Umbrella header of libmg, a scalar reverse-mode autograd engine in C11.
 *
 * A worked example: build `a*b + c`, differentiate it, read a gradient.
 * @code
 * #include <mg/mg.h>
 * #include <stdio.h>
 *
 * int main(void) {
 *     mg_graph *g = mg_graph_new();
 *     mg_value *a = mg_scalar(g, 2.0), *b = mg_scalar(g, -3.0), *c = mg_scalar(g, 10.0);
 *     mg_value *y = mg_add(g, mg_mul(g, a, b), c);   // NULL propagates: one check suffices
 *     if (!y || mg_backward(g, y) != MG_OK) {
 *         fprintf(stderr, "error: %s\n", mg_graph_last_error(g));
 *         return 1;
 *     }
 *     printf("y = %g, dy/da = %g\n", mg_data(y), mg_grad(a));   // y = 4, dy/da = -3
 *     mg_graph_free(g);                                       // frees every value
 *     return 0;
 * }
 * @endcode
 *
 * Training loops save a checkpoint after building the model and restore it after each step, so
 * the per-step graph is freed in time proportional to its size (see examples/c/xor.c).
 */
#ifndef MG_MG_H
#define MG_MG_H

#include "common.h"
#include "ops.h"
#include "graph.h"
#include "nn.h"
#include "tape.h"

/** libmg's version as a string. */
#define MG_VERSION "0.1.0"

#endif /* MG_MG_H */
