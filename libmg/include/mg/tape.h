/**
 * @file tape.h
 * @brief Frozen graphs: a flat program over slot arrays, its interpreter and its C emitter.
 *
 * @defgroup tape Tapes
 * @brief Freeze a graph once, then train it without building, sorting or walking a graph.
 *
 * A tape is the graph reachable from a loss (and from extra outputs) in topological order, as
 * instructions over slot indices into two contiguous arrays, `data` and `grad`. Slots have roles:
 * parameters occupy slots `[0, nparams)` in the order given (so the parameters read and write as
 * one array), then the inputs, the targets, the constants (every other leaf, frozen at its
 * current data), then one slot per op node. The tape owns its arrays; it does not refer to the
 * graph after mg_tape_freeze() returns, except to copy parameters back (mg_tape_write_back()).
 *
 * The backward pass follows mg_backward(): every non-parameter gradient is recomputed from zero
 * for each sample, and parameter gradients accumulate until mg_tape_step() applies and clears them.
 *
 * Freezing raises loops from the scalar graph (unless mg_tape_spec::no_raise): chains of additions
 * of products become dot products, dot products over one input vector with parameters laid out
 * as rows become a matrix-vector product, an activation over them an elementwise loop. Values are
 * unchanged (the order of every sum is kept); inputs of a raised layer get no gradient.
 * @{
 */
#ifndef MG_TAPE_H
#define MG_TAPE_H

#include "graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A frozen program. */
typedef struct mg_tape mg_tape;

/** What to freeze: the roots and the leaves with roles. Arrays are read, not kept. */
typedef struct mg_tape_spec {
    mg_value *loss;            /**< The value to differentiate; NULL for an inference-only tape. */
    mg_value *const *inputs;   /**< Leaves loaded from each sample's input row. */
    size_t ninputs;            /**< Number of inputs. */
    mg_value *const *targets;  /**< Leaves loaded from each sample's target row. */
    size_t ntargets;           /**< Number of targets. */
    mg_value *const *params;   /**< Leaves trained by mg_tape_step(). */
    size_t nparams;            /**< Number of parameters. */
    mg_value *const *outputs;  /**< Values mg_tape_predict() returns (any values). */
    size_t noutputs;           /**< Number of outputs. */
    int no_raise;              /**< Nonzero: keep the scalar program (no loops recovered). */
} mg_tape_spec;

/** Kernels a compiled program provides in place of the interpreter; `ctx` is the tape's
 * kernel context (its packed weights). */
typedef void (*mg_tape_forward_fn)(void *ctx, double *data);
/** Backward kernel: zeroes non-parameter gradients, seeds the loss, accumulates. */
typedef void (*mg_tape_backward_fn)(void *ctx, const double *data, double *grad);

/**
 * @brief Freezes the graph reachable from the spec's loss and outputs.
 * @param g the graph owning every value of @p spec
 * @param spec roots and roles; inputs, targets and parameters must be distinct leaves
 * @return the tape, freed with mg_tape_free(); NULL on failure (message in mg_graph_last_error(g);
 *         the graph is unchanged).
 */
MG_API mg_tape *mg_tape_freeze(mg_graph *g, const mg_tape_spec *spec);

/** @brief Frees a tape. @param t NULL is a no-op */
MG_API void mg_tape_free(mg_tape *t);

/** @brief Number of slots. @param t the tape @return the count. */
MG_API size_t mg_tape_nslots(const mg_tape *t);
/** @brief Number of instructions. @param t the tape @return the count. */
MG_API size_t mg_tape_ninstr(const mg_tape *t);
/** @brief Number of parameters. @param t the tape @return the count. */
MG_API size_t mg_tape_nparams(const mg_tape *t);
/** @brief Number of inputs. @param t the tape @return the count. */
MG_API size_t mg_tape_ninputs(const mg_tape *t);
/** @brief Number of targets. @param t the tape @return the count. */
MG_API size_t mg_tape_ntargets(const mg_tape *t);
/** @brief Number of outputs. @param t the tape @return the count. */
MG_API size_t mg_tape_noutputs(const mg_tape *t);
/** @brief Whether the tape has a loss (can train). @param t the tape @return 1 or 0. */
MG_API int mg_tape_has_loss(const mg_tape *t);

/**
 * @brief The data slots; parameters are the first mg_tape_nparams() entries.
 * @param t the tape
 * @return the array, owned by the tape (mg_tape_nslots() doubles).
 */
MG_API double *mg_tape_data(mg_tape *t);

/**
 * @brief The gradient slots, laid out as mg_tape_data().
 * @param t the tape
 * @return the array, owned by the tape.
 */
MG_API double *mg_tape_grad(mg_tape *t);

/**
 * @brief Runs the program on one sample.
 * @param t the tape
 * @param x ninputs values, or NULL to keep the input slots as they are
 * @param y ntargets values, or NULL to keep the target slots
 * @return MG_OK.
 */
MG_API int mg_tape_forward(mg_tape *t, const double *x, const double *y);

/**
 * @brief The loss computed by the last forward.
 * @param t the tape
 * @return the loss; NaN without a loss.
 */
MG_API double mg_tape_loss(const mg_tape *t);

/**
 * @brief The slot holding the loss (for code that runs emitted programs itself).
 * @param t the tape
 * @return the slot index; 0 without a loss.
 */
MG_API size_t mg_tape_loss_slot(const mg_tape *t);

/**
 * @brief Copies the outputs computed by the last forward.
 * @param t the tape
 * @param[out] out room for mg_tape_noutputs() values
 */
MG_API void mg_tape_outputs(const mg_tape *t, double *out);

/**
 * @brief Backward pass after a forward: parameter gradients accumulate.
 * @param t the tape
 * @return MG_OK, or MG_EINVAL for a tape without a loss.
 */
MG_API int mg_tape_backward(mg_tape *t);

/**
 * @brief SGD step: `param -= lr / count * grad`, then parameter gradients are zeroed.
 * @param t the tape
 * @param lr learning rate
 * @param count samples the gradients were summed over (the batch size; 0 counts as 1)
 */
MG_API void mg_tape_step(mg_tape *t, double lr, size_t count);

/**
 * @brief One epoch of training in one call: per sample forward and backward, one SGD step per
 * batch (gradients averaged over the batch).
 * @param t the tape
 * @param X inputs, row-major: n rows of mg_tape_ninputs() values
 * @param Y targets, row-major: n rows of mg_tape_ntargets() values (NULL when ntargets is 0)
 * @param n number of samples
 * @param batch_size samples per step (at least 1)
 * @param lr learning rate
 * @param shuffle nonzero to visit the samples in a shuffled order
 * @param seed seed of the shuffle
 * @param epoch epoch number, mixed into the shuffle's seed
 * @param[out] mean_loss the mean loss over the epoch (may be NULL)
 * @return MG_OK, MG_EINVAL (no loss, bad arguments), MG_ENOMEM (scratch for the order).
 */
MG_API int mg_tape_fit(mg_tape *t, const double *X, const double *Y, size_t n, size_t batch_size,
                       double lr, int shuffle, uint64_t seed, uint64_t epoch, double *mean_loss);

/**
 * @brief mg_tape_fit() with the samples of each batch spread over @p threads threads.
 *
 * Each batch is cut into at most 4 chunks of consecutive samples, whatever the thread count;
 * each chunk sums its gradients in sample order and the chunks are added in chunk order, so the
 * parameters are bitwise the same for every thread count (mg_tape_fit() takes the same path for
 * batches of more than one sample). Batch size 1 runs on the calling thread.
 * @param t the tape
 * @param X inputs (n rows)
 * @param Y targets (n rows, or NULL without targets)
 * @param n number of samples
 * @param batch_size samples per step
 * @param lr learning rate
 * @param shuffle nonzero to shuffle
 * @param seed shuffle seed
 * @param epoch epoch number
 * @param threads threads to use (at least 1; more than 4 are not used)
 * @param[out] mean_loss the mean loss (may be NULL)
 * @return MG_OK, MG_EINVAL or MG_ENOMEM.
 */
MG_API int mg_tape_fit_threads(mg_tape *t, const double *X, const double *Y, size_t n,
                               size_t batch_size, double lr, int shuffle, uint64_t seed,
                               uint64_t epoch, size_t threads, double *mean_loss);

/**
 * @brief Forward over each row of @p X.
 * @param t the tape
 * @param X inputs, row-major: n rows of mg_tape_ninputs() values
 * @param n number of samples
 * @param[out] out n rows of mg_tape_noutputs() values
 * @return MG_OK or MG_EINVAL.
 */
MG_API int mg_tape_predict(mg_tape *t, const double *X, size_t n, double *out);

/**
 * @brief Replaces the interpreter with compiled kernels (from mg_tape_emit_c() output for this
 * same tape), or restores the interpreter.
 * @param t the tape
 * @param forward forward kernel, NULL for the interpreter
 * @param backward backward kernel, NULL for the interpreter
 */
MG_API void mg_tape_set_kernels(mg_tape *t, mg_tape_forward_fn forward,
                                mg_tape_backward_fn backward);

/** Batch kernel of raised layers (see mgk_mv_outer_step in the generated code): applies the
 * batch's weight gradients, formed from per-sample records, for input rows [i0, i1). */
typedef void (*mg_tape_outer_fn)(double *pw, double *pg, size_t m, size_t n, size_t p0,
                                 const double *rec, size_t nrec, size_t roff, size_t batch,
                                 double scale, size_t i0, size_t i1);

/**
 * @brief Replaces libmg's batch kernel with a compiled one (`<prefix>outer_step` of the emitted
 * code, built for the machine), or restores libmg's with NULL.
 * @param t the tape
 * @param outer the kernel, or NULL
 */
MG_API void mg_tape_set_outer_kernel(mg_tape *t, mg_tape_outer_fn outer);

/**
 * @brief Number of matrix-vector products the raising pass recovered.
 * @param t the tape
 * @return the count (0 for a scalar program).
 */
MG_API size_t mg_tape_nraised(const mg_tape *t);

/**
 * @brief Copies the tape's parameters into the graph values they were frozen from.
 * @param t the tape
 * @param g the graph the tape was frozen from
 * @return the number of values written; values released since the freeze are skipped.
 */
MG_API size_t mg_tape_write_back(const mg_tape *t, mg_graph *g);

/** Options of mg_tape_emit_c(). Zero-initialise, then set what differs. */
typedef struct mg_emit_options {
    const char *prefix;  /**< Symbol prefix of the generated functions; NULL means "mgc_". */
    int inference_only;  /**< Nonzero: only `<prefix>infer`, parameters inlined as constants. */
    int float32;         /**< Nonzero: float32 slot arrays (a speed trade; results change).
                              Such code runs through its own `fit_epoch` and `predict`, not
                              mg_tape_set_kernels(). Ignored with inference_only. */
} mg_emit_options;

/**
 * @brief Writes self-contained C for the tape (it includes only `<math.h>` and `<stddef.h>`).
 *
 * Training code exports, with the default prefix: `mgc_init(data)` (writes the parameters'
 * current values and the constants), `mgc_forward(ctx, data)`, `mgc_backward(ctx, data, grad)`,
 * `mgc_step(data, grad, scale)`, `mgc_fit_epoch(...)`, `mgc_predict(...)` and the layout
 * constants `mgc_nslots` and friends. Inference-only code exports
 * `mgc_infer(const double *x, double *y, double *work)`. `mgc_real_bytes` tells the slot type
 * (8, or 4 with mg_emit_options::float32). The same tape gives byte-identical
 * source: names derive from slot numbers only.
 * @param t the tape
 * @param opt options; NULL for the defaults
 * @param[out] len length of the source (may be NULL)
 * @return a NUL-terminated string, freed with mg_tape_free_source(); NULL when out of memory
 *         or when the prefix is not a C identifier.
 */
MG_API char *mg_tape_emit_c(const mg_tape *t, const mg_emit_options *opt, size_t *len);

/** @brief Frees a string returned by mg_tape_emit_c(). @param t the tape @param src NULL is a no-op */
MG_API void mg_tape_free_source(const mg_tape *t, char *src);

/**
 * @brief Version of the code generator; part of compiled-code cache keys.
 * @return a positive integer, raised whenever generated code changes.
 */
MG_API int mg_emitter_version(void);

#ifdef __cplusplus
}
#endif

/** @} */
#endif /* MG_TAPE_H */
