/**
 * @file tape.h
 * @brief Frozen graphs: loop programs over slot arrays, their interpreter, training and C emitter.
 *
 * @defgroup tape Tapes
 * @brief Freeze a graph once, then train it without building, sorting or walking a graph.
 *
 * A tape is the graph reachable from a loss (and from extra outputs), compiled into two
 * programs (forward and backward) of loop nests over two arrays of slots, `data` and `grad`.
 * Slots have roles: parameters occupy slots `[0, nparams)` in the order given (so they read and
 * write as one array), then the constants (every other leaf, frozen at its current value, equal
 * bit patterns sharing a slot), the inputs, the targets, and the values ops compute. The tape owns
 * its arrays; after mg_tape_freeze() returns it refers to the graph only to copy parameters back
 * (mg_tape_write_back()).
 *
 * Freezing recovers the loops the scalar graph was written with (unless mg_tape_spec::no_raise):
 * chains of additions become reductions, nodes of one shape that do not depend on each other
 * become one loop nest whose operands are affine functions of the loop indices (a weight shared
 * across positions is a stride-0 operand), and repeated runs of nests (the steps of a recurrent
 * model) become a sequential loop. Forward values keep the order of every sum, so they equal the
 * scalar program's bit for bit; gradient sums over shared weights are new reductions in a fixed
 * order (within 1e-12 of the scalar program's, identical on every backend and thread count).
 *
 * The backward pass follows mg_backward(): every non-parameter gradient is recomputed from zero
 * for each sample, and parameter gradients accumulate until mg_tape_step() applies and clears
 * them. Inputs, targets and constants get no gradient.
 *
 * Errors: mg_tape_freeze() reports on the graph (mg_graph_last_error()). Every call that can
 * fail on a tape (forward, backward, step, fit, predict, emit, attach) starts by clearing the
 * tape's error and, when it fails, records a message and a status, read with
 * mg_tape_last_error() and mg_tape_last_status(); the bindings raise with that message.
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
    mg_value *loss;           /**< The value to differentiate; NULL for an inference-only tape. */
    mg_value *const *inputs;  /**< Leaves loaded from each sample's input row. */
    size_t ninputs;           /**< Number of inputs. */
    mg_value *const *targets; /**< Leaves loaded from each sample's target row. */
    size_t ntargets;          /**< Number of targets. */
    mg_value *const *params;  /**< Leaves trained by mg_tape_step(). */
    size_t nparams;           /**< Number of parameters. */
    mg_value *const *outputs; /**< Values mg_tape_predict() returns (any values). */
    size_t noutputs;          /**< Number of outputs. */
    int no_raise;             /**< Nonzero: one instruction per node (no loops recovered). */
} mg_tape_spec;

/**
 * @brief Freezes the graph reachable from the spec's loss and outputs.
 * @param g the graph owning every value of @p spec
 * @param spec roots and roles; inputs, targets and parameters must be distinct leaves
 * @return the tape, freed with mg_tape_free(); NULL on failure (message in mg_graph_last_error(g);
 *         the graph is unchanged).
 */
MG_API mg_tape *mg_tape_freeze(mg_graph *g, const mg_tape_spec *spec);

/** @brief Frees a tape. @param t the tape; NULL is a no-op */
MG_API void mg_tape_free(mg_tape *t);

/**
 * @brief The message of the last call on this tape that can fail, when it failed.
 * @param t the tape
 * @return a string owned by the tape, valid until its next call; "" when that call succeeded
 *         (or none was made); `"no tape"` for NULL.
 */
MG_API const char *mg_tape_last_error(const mg_tape *t);

/**
 * @brief The status of the last call on this tape that can fail (see mg_tape_last_error()).
 * @param t the tape
 * @return MG_OK when it succeeded (or none was made), else its MG_E* status; MG_EINVAL for NULL.
 */
MG_API int mg_tape_last_status(const mg_tape *t);

/** @brief Number of slots. @param t the tape @return the count (0 for NULL). */
MG_API size_t mg_tape_nslots(const mg_tape *t);
/** @brief Number of forward instructions (nests, variadic ops, loops). @param t the tape
 *  @return the count (0 for NULL). */
MG_API size_t mg_tape_ninstr(const mg_tape *t);
/** @brief Number of parameters. @param t the tape @return the count (0 for NULL). */
MG_API size_t mg_tape_nparams(const mg_tape *t);
/** @brief Number of inputs. @param t the tape @return the count (0 for NULL). */
MG_API size_t mg_tape_ninputs(const mg_tape *t);
/** @brief Number of targets. @param t the tape @return the count (0 for NULL). */
MG_API size_t mg_tape_ntargets(const mg_tape *t);
/** @brief Number of outputs. @param t the tape @return the count (0 for NULL). */
MG_API size_t mg_tape_noutputs(const mg_tape *t);
/** @brief Whether the tape has a loss (can train). @param t the tape
 *  @return 1 or 0 (0 for NULL). */
MG_API int mg_tape_has_loss(const mg_tape *t);

/** What freezing made of a graph (mg_tape_get_stats()). */
typedef struct mg_tape_stats {
    size_t nodes;          /**< Graph values frozen. */
    size_t statements;     /**< Computations after folding chains of additions into reductions. */
    size_t forward_nests;  /**< Loop nests of the forward program. */
    size_t backward_nests; /**< Loop nests of the backward program. */
    size_t loops;          /**< Sequential loops (recovered time steps). */
    size_t packed;         /**< Parameters kept in packed, vector-friendly order during calls. */
    int rerolled;          /**< 1 when loops were recovered, 0 for a scalar program. */
    size_t deferred_steps; /**< Layers whose weights batch-1 training steps as the next sample's
                                forward reads them (one pass over those weights per sample). */
    size_t hoisted;        /**< Nests moved out of sequential loops because they do not depend
                                on them (a recurrent model's input projections before the loop,
                                its weight gradients after it), the iterations one of their dims. */
} mg_tape_stats;

/**
 * @brief Statistics of the frozen program. (Named with `get` because the bare name is the type
 * it fills: docs/ARCHITECTURE.md, "Naming".)
 * @param t the tape
 * @param[out] out the statistics
 * @return MG_OK, or MG_EINVAL for NULL arguments (nothing recorded on the tape).
 */
MG_API int mg_tape_get_stats(const mg_tape *t, mg_tape_stats *out);

/**
 * @brief A readable listing of the frozen programs: every loop nest with its sizes, what it
 * computes and the affine index of each operand, the sequential loops, the losses.
 * @param t the tape
 * @param[out] len length of the text (may be NULL)
 * @return a NUL-terminated string, freed with mg_tape_free_source(); NULL for a NULL tape or when
 *         out of memory.
 */
MG_API char *mg_tape_describe(mg_tape *t, size_t *len);

/**
 * @brief The data slots; parameters are the first mg_tape_nparams() entries.
 * @param t the tape
 * @return the array, owned by the tape (mg_tape_nslots() doubles); NULL for NULL.
 */
MG_API double *mg_tape_data(mg_tape *t);

/**
 * @brief The gradient slots, laid out as mg_tape_data().
 * @param t the tape
 * @return the array, owned by the tape; NULL for NULL.
 */
MG_API double *mg_tape_grad(mg_tape *t);

/**
 * @brief Runs the program on one sample.
 * @param t the tape
 * @param x ninputs values, or NULL to keep the input slots as they are
 * @param y ntargets values, or NULL to keep the target slots
 * @return MG_OK, or MG_EINVAL for a NULL tape or a cross-entropy target in @p y that is not a
 *         class index (nothing is run then).
 */
MG_API int mg_tape_forward(mg_tape *t, const double *x, const double *y);

/**
 * @brief The loss computed by the last forward.
 * @param t the tape
 * @return the loss; NaN without a loss or for NULL.
 */
MG_API double mg_tape_loss(const mg_tape *t);

/**
 * @brief The slot holding the loss.
 * @param t the tape
 * @return the slot index; 0 without a loss or for NULL.
 */
MG_API size_t mg_tape_loss_slot(const mg_tape *t);

/**
 * @brief Copies the outputs computed by the last forward.
 * @param t the tape; NULL is a no-op
 * @param[out] out room for mg_tape_noutputs() values; NULL is a no-op
 */
MG_API void mg_tape_outputs(const mg_tape *t, double *out);

/**
 * @brief Backward pass after a forward: parameter gradients accumulate.
 * @param t the tape
 * @return MG_OK, or MG_EINVAL for a NULL tape or a tape without a loss.
 */
MG_API int mg_tape_backward(mg_tape *t);

/**
 * @brief SGD step: `param -= lr / count * grad`, then parameter gradients are zeroed.
 * @param t the tape
 * @param lr learning rate
 * @param count samples the gradients were summed over (the batch size; 0 counts as 1)
 * @return MG_OK, or MG_EINVAL for a NULL tape or a non-finite @p lr.
 */
MG_API int mg_tape_step(mg_tape *t, double lr, size_t count);

/** Options of mg_tape_fit(). Zero-initialise, then set what differs (zeros mean the defaults). */
typedef struct mg_fit_options {
    size_t batch_size; /**< Samples per SGD step; 0 means 1. Clamped to the sample count. */
    double lr;         /**< Learning rate (finite). */
    int shuffle;       /**< Nonzero: visit the samples in a shuffled order. */
    uint64_t seed;     /**< Seed of the shuffle. */
    uint64_t epoch;    /**< Epoch number, mixed into the shuffle's seed. */
    size_t threads;    /**< Threads sharing each batch (0 means 1). Results do not depend on it. */
    const float *X32;  /**< Non-NULL: the inputs as float (float32) values, n rows of
                            mg_tape_ninputs(), read in place of X, which must then be NULL. Half
                            the memory of doubles; each value is the same number in either
                            storage type, so results equal those of the same values as doubles. */
} mg_fit_options;

/**
 * @brief One epoch of training in one call: per sample forward and backward, one SGD step per
 * batch (gradients averaged over the batch).
 *
 * Gradients accumulated before the call (by mg_tape_backward()) are discarded first: an epoch
 * starts from zero gradients, for every parameter. Each batch is cut into the same chunks of
 * consecutive samples whatever the thread count, and chunk results are added in chunk order, so
 * parameters are bitwise the same for every thread count. Targets of cross-entropy must be class
 * indices (integers in `[0, classes)`); any other target fails the call before training.
 * @param t the tape
 * @param X inputs, row-major: n rows of mg_tape_ninputs() values (NULL with mg_fit_options.X32)
 * @param Y targets, row-major: n rows of mg_tape_ntargets() values (NULL when ntargets is 0)
 * @param n number of samples
 * @param opt options (NULL: batch 1, lr 0, no shuffle)
 * @param[out] mean_loss the mean loss over the epoch (may be NULL)
 * @return MG_OK, MG_EINVAL (no loss, bad arguments or targets: see mg_tape_last_error()),
 *         MG_ENOMEM (working memory; the parameters are then unchanged).
 *
 * A batched epoch (batch_size above 1) keeps its working memory (the samples in flight and each
 * chunk's gradients: about twice the tape's own gradient arrays) on the tape for the next call,
 * so that a loop calling this once per batch does not allocate it every time; mg_tape_trim()
 * frees it.
 */
MG_API int mg_tape_fit(mg_tape *t, const double *X, const double *Y, size_t n,
                       const mg_fit_options *opt, double *mean_loss);

/**
 * @brief Forward over each row of @p X, computing only what the outputs need.
 *
 * Rows run through the forward nests many at a time, as a batched mg_tape_fit() runs them
 * (several rows per register tile where a nest is a matrix product); each output is computed as
 * for one row, so the results are bitwise those of mg_tape_forward() row by row. (Where the
 * slots of several rows would not fit in the cache, or in memory, rows run one at a time over
 * the tape's own values.) Predict takes no targets: a tape with an output computed from a target
 * (a loss among the outputs) is refused, not run on whatever targets its slots last held.
 * @param t the tape
 * @param X inputs, row-major: n rows of mg_tape_ninputs() values
 * @param n number of samples
 * @param[out] out n rows of mg_tape_noutputs() values
 * @return MG_OK, or MG_EINVAL for a NULL tape, a NULL @p X or @p out where rows are needed, an
 *         output computed from a target, or rows that overflow the address space.
 */
MG_API int mg_tape_predict(mg_tape *t, const double *X, size_t n, double *out);

/**
 * @brief Frees the working memory that batched mg_tape_fit() and mg_tape_predict() calls keep on
 * the tape for the next call (mg_tape_free() frees it too). The next such call allocates it again.
 * @param t the tape (NULL: nothing to free)
 * @return the bytes freed (0 when none was kept).
 */
MG_API size_t mg_tape_trim(mg_tape *t);

/**
 * @brief Copies the tape's parameters into the graph values they were frozen from.
 * @param t the tape
 * @param g the graph the tape was frozen from
 * @return the number of values written; values released since the freeze are skipped; 0 for
 *         NULL arguments or another graph.
 */
MG_API size_t mg_tape_write_back(const mg_tape *t, mg_graph *g);

/** Options of mg_tape_emit_c(). Zero-initialise, then set what differs. */
typedef struct mg_emit_options {
    const char *prefix; /**< Symbol prefix of the generated code; NULL means "mgc_". */
    int inference_only; /**< Nonzero: only `<prefix>infer`, parameters inlined as constants. */
    int float32;        /**< Nonzero: training code over float32 slot arrays (results agree
                             with double to float32's precision); mg_tape_attach() takes it only
                             when every nest is specialised (max_kernels at least the tape's
                             nest count). Ignored with inference_only. */
    size_t max_kernels; /**< Nests to specialise, hottest first (0: the default budget, 32);
                             the others run libmg's interpreter kernels. Inference-only code
                             specialises every nest it runs. */
} mg_emit_options;

/** A compiled program's kernel: one nest over a `mgk_run` (see the generated code). */
typedef void (*mg_kernel_fn)(const void *run);

/** Version of the mg_compiled layout and of the run its kernels read (2: the run gained the
 * arrays of pre-steps; 3: the fields of a batch's fused steps; 4: the step probe; 5: the band of
 * rows a thread runs); generated code records the one it was written for, and mg_tape_attach()
 * refuses any other. */
#define MG_COMPILED_ABI 5

/** What generated training code exports as `<prefix>program`. */
typedef struct mg_compiled {
    unsigned abi;                   /**< MG_COMPILED_ABI */
    unsigned real_bytes;            /**< 8 (double slots) or 4 (float32 storage) */
    unsigned long long fingerprint; /**< mg_tape_fingerprint() of the tape it was emitted from */
    size_t nnests;                  /**< entries of `kernels` */
    const mg_kernel_fn *kernels;    /**< per nest: a specialised kernel, or NULL */
    /** The SGD step `w - lr * (o + a)` in the kernels' slot type, compiled with the kernels'
     * flags (NULL: as libmg computes it). Flags that contract it into a fused multiply-add round
     * otherwise than libmg's own step, which never contracts; mg_tape_attach() calls it once, and
     * where it differs, batches are stepped by libmg on every thread count instead of inside the
     * gradient nests on one thread, so the thread count still never changes a bit. */
    double (*step_probe)(double w, double lr, double o, double a);
} mg_compiled;

/**
 * @brief Writes C for the tape, self-contained: it includes only `<math.h>` and `<stddef.h>`.
 *
 * Training code exports `<prefix>program` (an mg_compiled: hot nests as specialised functions,
 * to be given to mg_tape_attach()) and `<prefix>emitter_version` (an `int`,
 * mg_tape_emitter_version()). Inference-only code exports
 * `<prefix>infer(const double *x, double *y, double *work)`, with `work` NULL or room for
 * `<prefix>WORK` doubles (macros `<prefix>WORK`, `<prefix>NINPUTS`, `<prefix>NOUTPUTS`), and needs
 * nothing else. The same tape gives byte-identical source: names derive from nest and slot
 * numbers only.
 * @param t the tape
 * @param opt options; NULL for the defaults
 * @param[out] len length of the source (may be NULL)
 * @return a NUL-terminated string, freed with mg_tape_free_source(); NULL for a NULL tape, when
 *         the prefix is not a C identifier of at most 64 characters (MG_EINVAL) or when out of
 *         memory (MG_ENOMEM): see mg_tape_last_error() and mg_tape_last_status().
 */
MG_API char *mg_tape_emit_c(mg_tape *t, const mg_emit_options *opt, size_t *len);

/**
 * @brief Frees a string returned by mg_tape_emit_c() or mg_tape_describe().
 * @param t the tape that returned it (its allocator frees the string); NULL is a no-op
 * @param src the string; NULL is a no-op
 */
MG_API void mg_tape_free_source(const mg_tape *t, char *src);

/**
 * @brief Version of the code generator; part of compiled-code cache keys, and exported by
 * training code as `<prefix>emitter_version`. (No tape argument: named for its header's noun.)
 * @return a positive integer, raised whenever generated code changes.
 */
MG_API int mg_tape_emitter_version(void);

/**
 * @brief Which build of the interpreter's loop-nest kernels this process runs: libmg carries one
 * for the baseline target and, on x86-64 built with gcc or clang, one for AVX2 and one for
 * AVX-512, and picks the widest the CPU supports on first use. The environment variable `MG_ISA`
 * (`baseline`, `avx2` or `avx512`), read at that first use, caps the pick. Every build computes
 * the same bits; the choice changes only speed. (Process-wide, so no tape argument: named for its
 * header's noun.)
 * @return "avx512", "avx2" or "baseline", a static string.
 */
MG_API const char *mg_tape_kernel_isa(void);

/**
 * @brief A hash of the tape's programs and layout: generated code carries the one it was
 * emitted from, and mg_tape_attach() refuses code for another program.
 * @param t the tape
 * @return the fingerprint (0 for NULL).
 */
MG_API unsigned long long mg_tape_fingerprint(const mg_tape *t);

/**
 * @brief Runs the tape's hot nests with compiled kernels from generated code.
 *
 * With float32 code (mg_emit_options.float32), every later mg_tape_forward(), mg_tape_backward(),
 * mg_tape_step(), mg_tape_predict() and mg_tape_fit() runs the same driver over float32 copies
 * of the slots: it rounds the arrays it reads (mg_tape_data(), and mg_tape_grad() for backward
 * and step) to float32 on entry and writes the ones it changes back on success, so those arrays
 * keep holding the (float32) values.
 * @param t the tape
 * @param c the `<prefix>program` of code mg_tape_emit_c() wrote for this tape (double slots, or
 *          float32 slots with every nest specialised); it must stay loaded until
 *          mg_tape_detach() or mg_tape_free()
 * @return MG_OK; MG_EINVAL for a NULL tape, or when @p c is NULL, was written for another
 *         program, another ABI or a slot type other than 8 or 4 bytes, or is float32 code
 *         missing a nest's kernel; MG_ENOMEM when the float32 copies cannot be allocated (the
 *         tape keeps its current kernels in every error case).
 */
MG_API int mg_tape_attach(mg_tape *t, const mg_compiled *c);

/** @brief Goes back to the interpreter's kernels. @param t the tape; NULL is a no-op */
MG_API void mg_tape_detach(mg_tape *t);

#ifdef __cplusplus
}
#endif

/** @} */
#endif /* MG_TAPE_H */
