/**
 * @file nn.h
 * @brief micrograd's Neuron, Layer and MLP, over graph values.
 *
 * @defgroup nn Neural networks
 * @brief Neurons, layers and MLPs whose parameters are leaves of a graph.
 *
 * A neuron computes `act(b + w[0]*x[0] + ... + w[n-1]*x[n-1])` as one MG_OP_DOT node with a
 * bias plus the activation, which is bit for bit what micrograd's `Neuron.__call__` computes.
 * Parameters are created in the graph passed to mg_neuron_new(), mg_layer_new() or mg_mlp_new()
 * and hold one reference each for the struct; the struct must be freed before the graph. A restore
 * to a checkpoint saved before the struct was created releases its parameters: the struct keeps
 * each parameter's serial and detects it, so calls then fail with MG_EINVAL, the `*_params`
 * functions write nothing and return 0, `*_is_live` returns 0, and freeing the struct releases
 * nothing else. Sizes are checked before anything is allocated: counts whose array sizes could wrap
 * are refused.
 * @{
 */
#ifndef MG_NN_H
#define MG_NN_H

#include "graph.h"
#include "rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * The activation table: one row per activation, `X(ID, name, op)`, the op of the op table it
 * applies (-1: none). It generates ::mg_activation, mg_activation_name() and mg_activation_op();
 * neurons, the bindings and the Python classes all read it.
 */
#define MG_ACTIVATION_LIST(X)                                                                      \
    X(LINEAR, "linear", -1)                                                                        \
    X(RELU, "relu", MG_OP_RELU)                                                                    \
    X(TANH, "tanh", MG_OP_TANH)                                                                    \
    X(SIGMOID, "sigmoid", MG_OP_SIGMOID)

#define MG__ACT_ENUM(id, name, op) MG_ACT_##id,
/** Activation applied by a neuron (MG_ACT_RELU is micrograd's default); from #MG_ACTIVATION_LIST.
 */
typedef enum mg_activation {
    /* clang-format off */
    MG_ACTIVATION_LIST(MG__ACT_ENUM)
    MG_ACT_COUNT /**< Number of activations; not an activation. */
    /* clang-format on */
} mg_activation;
#undef MG__ACT_ENUM

/**
 * @brief Name of an activation, such as `"relu"`.
 * @param act an activation
 * @return a static string; NULL when out of range.
 */
MG_API const char *mg_activation_name(int act);

/**
 * @brief Looks an activation up by name.
 * @param name a name as returned by mg_activation_name()
 * @return the activation, or -1 when none has that name (or @p name is NULL).
 */
MG_API int mg_activation_from_name(const char *name);

/**
 * @brief The op an activation applies.
 * @param act an activation
 * @return an op of the op table; -1 for MG_ACT_LINEAR and for out-of-range values.
 */
MG_API int mg_activation_op(int act);

/** Weight initialisation. Biases start at 0 in both, as in micrograd. */
typedef enum mg_init {
    MG_INIT_UNIFORM = 0, /**< uniform(-1, 1), micrograd's. */
    MG_INIT_SCALED = 1   /**< uniform(-1, 1) / sqrt(fan_in). */
} mg_init;

/** A neuron: `nin` weights and a bias, all leaves of its graph. */
typedef struct mg_neuron mg_neuron;
/** A layer of `nout` neurons over the same `nin` inputs. */
typedef struct mg_layer mg_layer;
/** A multi-layer perceptron; the last layer is linear. */
typedef struct mg_mlp mg_mlp;

/**
 * @brief Creates a neuron with random weights.
 * @param g the graph that owns the parameters
 * @param nin number of inputs, at least 1
 * @param act activation
 * @param init weight initialisation
 * @param rng generator; NULL sets every weight to 0
 * @return the neuron, freed with mg_neuron_free(); NULL on failure (the graph is unchanged).
 */
MG_API mg_neuron *mg_neuron_new(mg_graph *g, size_t nin, mg_activation act, mg_init init,
                                mg_rng *rng);
/**
 * @brief Applies a neuron to @p x.
 * @param g the neuron's graph
 * @param n the neuron
 * @param x `nin` inputs
 * @return the activation, owned by @p g; NULL on failure (MG_EINVAL when a parameter was released).
 */
MG_API mg_value *mg_neuron_call(mg_graph *g, const mg_neuron *n, mg_value *const *x);
/** @brief Parameter count (`nin + 1`). @param n the neuron @return the count; 0 for NULL. */
MG_API size_t mg_neuron_param_count(const mg_neuron *n);
/**
 * @brief Writes the parameters, weights then bias (micrograd's order).
 * @param n the neuron
 * @param[out] out room for mg_neuron_param_count() pointers (borrowed; owned by the graph)
 * @return the number written; 0 when a parameter was released (MG_EINVAL is recorded on the
 *         neuron's graph).
 */
MG_API size_t mg_neuron_params(const mg_neuron *n, mg_value **out);
/**
 * @brief Whether every parameter of a neuron is still live (no restore released one).
 * @param n the neuron
 * @return 1 when live; 0 when a parameter was released, and for NULL.
 */
MG_API int mg_neuron_is_live(const mg_neuron *n);
/** @brief Number of inputs. @param n the neuron @return `nin`; 0 for NULL. */
MG_API size_t mg_neuron_nin(const mg_neuron *n);
/** @brief Activation. @param n the neuron @return the activation; MG_ACT_LINEAR for NULL. */
MG_API mg_activation mg_neuron_activation(const mg_neuron *n);
/** @brief Changes the activation. @param n the neuron; NULL is a no-op
 *  @param act the activation; one out of range is ignored */
MG_API void mg_neuron_set_activation(mg_neuron *n, mg_activation act);
/** @brief Frees a neuron and drops its references to its parameters. @param n NULL is a no-op */
MG_API void mg_neuron_free(mg_neuron *n);

/**
 * @brief Creates a layer of @p nout neurons.
 * @param g the graph that owns the parameters
 * @param nin inputs per neuron, at least 1
 * @param nout number of neurons, at least 1
 * @param act activation of every neuron
 * @param init weight initialisation
 * @param rng generator (NULL: zero weights)
 * @return the layer, freed with mg_layer_free(); NULL on failure (the graph is unchanged).
 */
MG_API mg_layer *mg_layer_new(mg_graph *g, size_t nin, size_t nout, mg_activation act, mg_init init,
                              mg_rng *rng);
/**
 * @brief Applies a layer.
 * @param g the layer's graph
 * @param l the layer
 * @param x `nin` inputs
 * @param[out] out room for `nout` outputs (owned by @p g)
 * @return MG_OK or a negative status (the graph is unchanged then); MG_EINVAL when a parameter
 *         was released.
 */
MG_API int mg_layer_call(mg_graph *g, const mg_layer *l, mg_value *const *x, mg_value **out);
/** @brief Parameter count. @param l the layer @return the count; 0 for NULL. */
MG_API size_t mg_layer_param_count(const mg_layer *l);
/** @brief Writes the parameters neuron by neuron. @param l the layer
 *  @param[out] out room for mg_layer_param_count() pointers
 *  @return the number written; 0 when a parameter was released. */
MG_API size_t mg_layer_params(const mg_layer *l, mg_value **out);
/** @brief Whether every parameter of a layer is still live. @param l the layer
 *  @return 1 when live; 0 when a parameter was released, and for NULL. */
MG_API int mg_layer_is_live(const mg_layer *l);
/** @brief Inputs per neuron. @param l the layer @return `nin`; 0 for NULL. */
MG_API size_t mg_layer_nin(const mg_layer *l);
/** @brief Number of neurons. @param l the layer @return `nout`; 0 for NULL. */
MG_API size_t mg_layer_nout(const mg_layer *l);
/** @brief The i-th neuron (owned by the layer). @param l the layer @param i index
 *  @return the neuron; NULL when out of range. */
MG_API mg_neuron *mg_layer_neuron(const mg_layer *l, size_t i);
/** @brief Frees a layer and its neurons. @param l NULL is a no-op */
MG_API void mg_layer_free(mg_layer *l);

/**
 * @brief Creates an MLP `nin -> nouts[0] -> ... -> nouts[nlayers-1]`.
 * @param g the graph that owns the parameters
 * @param nin number of inputs, at least 1
 * @param nouts layer widths, each at least 1
 * @param nlayers number of layers, at least 1 (checked before @p nouts is read)
 * @param act activation of every layer but the last, which is linear
 * @param init weight initialisation
 * @param rng generator (NULL: zero weights)
 * @return the MLP, freed with mg_mlp_free(); NULL on failure (the graph is unchanged).
 */
MG_API mg_mlp *mg_mlp_new(mg_graph *g, size_t nin, const size_t *nouts, size_t nlayers,
                          mg_activation act, mg_init init, mg_rng *rng);
/**
 * @brief Applies an MLP.
 * @param g the MLP's graph
 * @param m the MLP
 * @param x `nin` inputs
 * @param[out] out room for mg_mlp_nout() outputs (owned by @p g)
 * @return MG_OK or a negative status (the graph is unchanged then); MG_EINVAL when a parameter
 *         was released.
 */
MG_API int mg_mlp_call(mg_graph *g, const mg_mlp *m, mg_value *const *x, mg_value **out);
/** @brief Parameter count. @param m the MLP @return the count; 0 for NULL. */
MG_API size_t mg_mlp_param_count(const mg_mlp *m);
/** @brief Writes the parameters layer by layer (micrograd's order). @param m the MLP
 *  @param[out] out room for mg_mlp_param_count() pointers
 *  @return the number written; 0 when a parameter was released. */
MG_API size_t mg_mlp_params(const mg_mlp *m, mg_value **out);
/** @brief Whether every parameter of an MLP is still live. @param m the MLP
 *  @return 1 when live; 0 when a parameter was released, and for NULL. */
MG_API int mg_mlp_is_live(const mg_mlp *m);
/** @brief Number of inputs. @param m the MLP @return `nin`; 0 for NULL. */
MG_API size_t mg_mlp_nin(const mg_mlp *m);
/** @brief Number of outputs. @param m the MLP @return the last layer's width. */
MG_API size_t mg_mlp_nout(const mg_mlp *m);
/** @brief Number of layers. @param m the MLP @return the count; 0 for NULL. */
MG_API size_t mg_mlp_nlayers(const mg_mlp *m);
/** @brief The i-th layer (owned by the MLP). @param m the MLP @param i index
 *  @return the layer; NULL when out of range. */
MG_API mg_layer *mg_mlp_layer(const mg_mlp *m, size_t i);
/** @brief Frees an MLP and its layers. @param m NULL is a no-op */
MG_API void mg_mlp_free(mg_mlp *m);

#ifdef __cplusplus
}
#endif

/** @} */
#endif /* MG_NN_H */
