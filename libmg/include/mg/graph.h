/**
 * @file graph.h
 * @brief Computation graphs, values, ops, checkpoints and the backward pass.
 *
 * @defgroup graph Graph and values
 * @brief A graph owns its values; values are created by mg_scalar() and by ops.
 *
 * Ownership: every ::mg_value belongs to the ::mg_graph it was created in and is freed by
 * mg_graph_free(), by mg_graph_restore() (values created after the checkpoint) or, on a graph
 * with autofree on, when its reference count drops to zero. Callers never free values.
 *
 * Errors: an op given a NULL operand returns NULL, so a chain of ops needs one check at the end.
 * An op that fails for another reason (out of memory, operands from another graph) returns NULL
 * and records a message readable with mg_graph_last_error(); the graph is left as it was.
 *
 * Identity: every graph gets an identity no other graph of the process ever had, and every value
 * can be traced to its graph's identity in constant time; an operand of another graph, or one a
 * restore released, is always refused (MG_EINVAL), never dereferenced as if it were ours.
 *
 * Threads: a graph is not thread-safe; calls on one graph must not run concurrently. Checkpoint
 * domains (mg_graph_set_domain()) let several callers that take turns on one graph (threads under
 * one lock) each save and restore checkpoints without releasing the others' values.
 * @{
 */
#ifndef MG_GRAPH_H
#define MG_GRAPH_H

#include "common.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A computation graph: owns values, allocated from blocks, linked in creation order. */
typedef struct mg_graph mg_graph;

/** A scalar value: data, gradient, the op that produced it and its operands. 64 bytes. */
typedef struct mg_value mg_value;

/** A point in a graph's history, returned by mg_graph_save() and consumed by mg_graph_restore(). */
typedef struct mg_graph_checkpoint {
    uint64_t serial; /**< The graph's next generation and current domain, as a serial (see
                          mg_value_serial()); UINT64_MAX for a NULL graph. */
} mg_graph_checkpoint;

/* ------------------------------------------------------------------------------------------ */
/* Graphs                                                                                      */

/**
 * @brief Creates an empty graph using the default allocator.
 * @return a new graph, freed with mg_graph_free(); NULL when out of memory.
 */
MG_API mg_graph *mg_graph_new(void);

/**
 * @brief Creates an empty graph that allocates through @p allocator.
 * @param allocator the memory functions (copied); NULL selects the default allocator
 * @return a new graph, freed with mg_graph_free(); NULL when out of memory.
 */
MG_API mg_graph *mg_graph_new_with(const mg_allocator *allocator);

/**
 * @brief Frees a graph and every value it owns. Pointers to its values become invalid.
 * @param g the graph; NULL is a no-op
 */
MG_API void mg_graph_free(mg_graph *g);

/**
 * @brief Number of live values in the graph.
 * @param g the graph
 * @return the count; 0 for NULL.
 */
MG_API size_t mg_graph_len(const mg_graph *g);

/**
 * @brief Bytes the graph uses: the graph itself, value blocks with their headers, operand arrays,
 * backward working memory and the variadic ops' scratch. The untouched tail of the newest block
 * (under 1 MiB) is reserved but not counted.
 * @param g the graph
 * @return the byte count; 0 for NULL.
 */
MG_API size_t mg_graph_bytes(const mg_graph *g);

/**
 * @brief Records the current point in the graph's history.
 * @param g the graph
 * @return a checkpoint to pass to mg_graph_restore(); a checkpoint of a NULL graph restores
 * nothing.
 */
MG_API mg_graph_checkpoint mg_graph_save(const mg_graph *g);

/**
 * @brief Frees every value of the checkpoint's domain created after @p cp was saved.
 *
 * Pointers to those values become invalid (their memory stays owned by the graph, so a holder of
 * a pointer and its serial can detect the release with mg_value_is_live()); structs that hold
 * values (mg_mlp and the rest, tapes) detect it too and refuse to run. Values created before the
 * save are kept, with their data and gradients. With one domain (the default) the cost is
 * proportional to what is freed. Values created after the save in another domain are kept, and
 * so is every value they use (see mg_graph_set_domain()); the walk then costs the number of values
 * created since the save.
 * @param g the graph; NULL frees nothing
 * @param cp a checkpoint from mg_graph_save() on the same graph
 * @return the number of values freed.
 */
MG_API size_t mg_graph_restore(mg_graph *g, mg_graph_checkpoint cp);

/**
 * @brief Sets the graph's checkpoint domain: values created from now on belong to it.
 *
 * A checkpoint records the domain current when it is saved, and mg_graph_restore() releases only
 * values of that domain (and not those used by values of other domains). Two callers that
 * interleave on one graph, each with its own domain, can so each restore its own checkpoints
 * without releasing the other's values. Python gives each thread its own domain. Domain 0 is the
 * default; with a single domain, checkpoints behave as a plain stack.
 * @param g the graph
 * @param domain a domain in [0, 255]
 * @return MG_OK, or MG_EINVAL for a NULL graph or a domain out of range (nothing changes then).
 */
MG_API int mg_graph_set_domain(mg_graph *g, int domain);

/**
 * @brief The graph's current checkpoint domain (see mg_graph_set_domain()).
 * @param g the graph
 * @return the domain; 0 for NULL.
 */
MG_API int mg_graph_domain(const mg_graph *g);

/**
 * @brief Sets every gradient in the graph to zero.
 * @param g the graph; NULL is a no-op
 */
MG_API void mg_graph_zero_grad(mg_graph *g);

/**
 * @brief Reverse-mode backward pass from @p out.
 *
 * Recomputes the gradient of every intermediate value reachable from @p out (a value made by an
 * op) from zero, adds 1 to @p out's gradient, and adds each contribution into the leaves (values
 * made by mg_scalar()). Called twice, leaves receive their gradient twice. The traversal is
 * iterative and its working memory is kept by the graph and reused by the next call.
 * @param g the graph owning @p out
 * @param out the value to differentiate
 * @return MG_OK, MG_EINVAL for a NULL argument, a released value or a value of another graph,
 *         MG_ENOMEM when the working memory cannot grow (no gradient is changed then).
 */
MG_API int mg_backward(mg_graph *g, mg_value *out);

/**
 * @brief One step of the chain rule at @p v, as micrograd's `v._backward()`.
 *
 * Adds @p v's gradient times each local derivative (the op table's) into the gradients of
 * @p v's operands, once; nothing else changes, and a leaf has no operands. mg_backward() is this
 * step for every value reachable from its output, in reverse topological order, after seeding.
 * @param g the graph owning @p v
 * @param v the value
 * @return MG_OK, MG_EINVAL for a NULL argument, a released value or a value of another graph,
 *         MG_ENOMEM when the working memory cannot grow (no gradient is changed then).
 */
MG_API int mg_value_backward_step(mg_graph *g, mg_value *v);

/**
 * @brief Message describing the last error recorded on the graph.
 * @param g the graph
 * @return a string owned by the graph, valid until the next failing call; `""` when none,
 *         `"no graph"` for NULL.
 */
MG_API const char *mg_graph_last_error(const mg_graph *g);

/**
 * @brief Status code of the last error recorded on the graph.
 * @param g the graph
 * @return the status (MG_OK when none); MG_EINVAL for NULL.
 */
MG_API int mg_graph_last_status(const mg_graph *g);

/**
 * @brief Clears the recorded error.
 * @param g the graph; NULL is a no-op
 */
MG_API void mg_graph_clear_error(mg_graph *g);

/**
 * @brief Turns reference-counted reclamation on or off.
 *
 * With autofree on, a value whose reference count drops to zero through mg_value_release() is
 * freed at once, and the values it used are released in turn (iteratively, so a chain of any
 * depth is safe). Each op adds one reference to each operand. Off (the default), values live
 * until restore or mg_graph_free(), as C users expect.
 * @param g the graph; NULL is a no-op
 * @param on nonzero to turn autofree on
 */
MG_API void mg_graph_set_autofree(mg_graph *g, int on);

/* ------------------------------------------------------------------------------------------ */
/* Values                                                                                      */

/**
 * @brief Creates a leaf value (a parameter, an input or a constant).
 * @param g the graph that owns the new value
 * @param x its data
 * @return the value, owned by @p g; NULL on failure (see mg_graph_last_error()).
 */
MG_API mg_value *mg_scalar(mg_graph *g, double x);

/**
 * @brief Data of a value.
 * @param v the value
 * @return its data; NaN for NULL.
 */
MG_API double mg_value_data(const mg_value *v);

/**
 * @brief Gradient of a value.
 * @param v the value
 * @return its gradient; NaN for NULL.
 */
MG_API double mg_value_grad(const mg_value *v);

/**
 * @brief Sets the data of a value (typically a parameter update or a new input).
 * @param v the value; NULL is a no-op
 * @param x the new data
 */
MG_API void mg_value_set_data(mg_value *v, double x);

/**
 * @brief Sets the gradient of a value.
 * @param v the value; NULL is a no-op
 * @param x the new gradient
 */
MG_API void mg_value_set_grad(mg_value *v, double x);

/**
 * @brief The op that produced a value.
 * @param v the value
 * @return an ::mg_op; MG_OP_LEAF for leaves, -1 for NULL.
 */
MG_API int mg_value_op(const mg_value *v);

/**
 * @brief Number of operands of a value.
 * @param v the value
 * @return 0 for leaves and NULL.
 */
MG_API size_t mg_value_noperands(const mg_value *v);

/**
 * @brief The i-th operand of a value.
 *
 * Operand order per op: elementwise ops `A`, `B`; MG_OP_SUM its terms; MG_OP_DOT `a[0..n)`,
 * `b[0..n)`, then the bias when it has one; MG_OP_MSE and MG_OP_HINGE `pred[0..n)`,
 * `target[0..n)`; MG_OP_XENT `logits[0..n)`, then the target.
 * @param v the value
 * @param i operand index
 * @return the operand (owned by the graph); NULL when @p i is out of range.
 */
MG_API mg_value *mg_value_operand(const mg_value *v, size_t i);

/**
 * @brief The constant of a value's op: the exponent of MG_OP_POW, the term count n of MG_OP_DOT,
 * MG_OP_MSE, MG_OP_HINGE and MG_OP_XENT.
 * @param v the value
 * @return the constant; 0 for ops without one; NaN for NULL.
 */
MG_API double mg_value_const(const mg_value *v);

/**
 * @brief Whether a MG_OP_DOT value has a bias operand (see mg_affine()).
 * @param v the value
 * @return 1 or 0.
 */
MG_API int mg_value_has_bias(const mg_value *v);

/**
 * @brief Serial number of a value: unique within its graph (never reused, also when the value's
 * memory is), increasing in creation order, never 0. Its low 8 bits are the value's checkpoint
 * domain (mg_graph_set_domain()).
 * @param v the value
 * @return the serial; 0 for NULL.
 */
MG_API uint64_t mg_value_serial(const mg_value *v);

/**
 * @brief Whether a pointer obtained with serial @p serial still denotes that value.
 *
 * Safe to call on a pointer whose value was released, as long as its graph is alive: the graph
 * returns memory only in mg_graph_free().
 * @param v the value pointer
 * @param serial the serial read with mg_value_serial() when the pointer was obtained
 * @return 1 when live, 0 otherwise.
 */
MG_API int mg_value_is_live(const mg_value *v, uint64_t serial);

/**
 * @brief Adds a reference to a value (a handle or a container holding it); the count saturates.
 * @param v the value; NULL is a no-op
 */
MG_API void mg_value_retain(mg_value *v);

/**
 * @brief Drops a reference; with autofree on, a value left with none is freed (see
 * mg_graph_set_autofree()). A value whose count saturated (2^32 - 1 references) is never freed
 * this way. Never fails, never allocates.
 * @param g the graph owning @p v
 * @param v the value; NULL, a released value and a value of another graph are no-ops
 */
MG_API void mg_value_release(mg_graph *g, mg_value *v);

/**
 * @brief Whether a value belongs to a graph, in constant time.
 * @param g the graph
 * @param v a value of any live graph (NULL allowed)
 * @return 1 when @p v is a live value of @p g; 0 for a value of another graph, a released value
 *         and NULL.
 */
MG_API int mg_value_in_graph(const mg_graph *g, const mg_value *v);

/* ------------------------------------------------------------------------------------------ */
/* Ops                                                                                         */

/**
 * @brief Applies an elementwise op by table index (the generic form of mg_add() and the rest).
 * @param g the graph
 * @param op an elementwise op (#mg_op_arity() 1 or 2)
 * @param a first operand
 * @param b second operand (ignored by unary ops, may be NULL there)
 * @param k the op's constant (the exponent of MG_OP_POW; ignored by the others)
 * @return the new value, owned by @p g; NULL on failure.
 */
MG_API mg_value *mg_apply(mg_graph *g, int op, mg_value *a, mg_value *b, double k);

/** @brief `a + b`. @param g graph @param a operand @param b operand @return new value or NULL. */
MG_API mg_value *mg_add(mg_graph *g, mg_value *a, mg_value *b);
/** @brief `a - b`. @param g graph @param a operand @param b operand @return new value or NULL. */
MG_API mg_value *mg_sub(mg_graph *g, mg_value *a, mg_value *b);
/** @brief `a * b`. @param g graph @param a operand @param b operand @return new value or NULL. */
MG_API mg_value *mg_mul(mg_graph *g, mg_value *a, mg_value *b);
/** @brief `a / b`, one IEEE division (correctly rounded; division by zero gives an infinity or
 *  NaN). micrograd computes `a / b` as `a * b**-1`, two nodes and two roundings, which can differ
 *  in the last bit: `mg_mul(g, a, mg_pow(g, b, -1))` is that graph, and the one the Python `/`
 *  builds. @param g graph @param a operand @param b operand @return new value or NULL. */
MG_API mg_value *mg_div(mg_graph *g, mg_value *a, mg_value *b);
/** @brief `-a`. @param g graph @param a operand @return new value or NULL. */
MG_API mg_value *mg_neg(mg_graph *g, mg_value *a);
/** @brief `a ** k` for a constant exponent, as micrograd's `__pow__` (d/da is `k * a**(k-1)`,
 *  and 0 when k is 0, also at a = 0, as PyTorch). @param g graph
 *  @param a base @param k exponent @return new value or NULL. */
MG_API mg_value *mg_pow(mg_graph *g, mg_value *a, double k);
/** @brief `a ** b` with a value as exponent: d/da is `b * a**(b-1)` (0 when b is 0), d/db is
 *  `a**b * log(a)` (0 when a is 0 and b >= 0), PyTorch's conventions. @param g graph
 *  @param a base @param b exponent @return new value or NULL. */
MG_API mg_value *mg_powv(mg_graph *g, mg_value *a, mg_value *b);
/** @brief `a * a`. @param g graph @param a operand @return new value or NULL. */
MG_API mg_value *mg_square(mg_graph *g, mg_value *a);
/** @brief `max(a, 0)`; gradient 0 at 0, as micrograd. @param g graph @param a operand
 *  @return new value or NULL. */
MG_API mg_value *mg_relu(mg_graph *g, mg_value *a);
/** @brief `tanh(a)`. @param g graph @param a operand @return new value or NULL. */
MG_API mg_value *mg_tanh(mg_graph *g, mg_value *a);
/** @brief `exp(a)`. @param g graph @param a operand @return new value or NULL. */
MG_API mg_value *mg_exp(mg_graph *g, mg_value *a);
/** @brief Natural logarithm (IEEE: -inf at 0, NaN below). @param g graph @param a operand
 *  @return new value or NULL. */
MG_API mg_value *mg_log(mg_graph *g, mg_value *a);
/** @brief `1 / (1 + exp(-a))`. @param g graph @param a operand @return new value or NULL. */
MG_API mg_value *mg_sigmoid(mg_graph *g, mg_value *a);
/** @brief Larger of `a` and `b` (NaN propagates; a tie splits the gradient evenly).
 *  @param g graph @param a operand @param b operand @return new value or NULL. */
MG_API mg_value *mg_max(mg_graph *g, mg_value *a, mg_value *b);

/**
 * @brief `v[0] + v[1] + ... + v[n-1]`, added left to right, as one node.
 * @param g the graph
 * @param v the terms (the array is copied)
 * @param n number of terms (0 gives a node with data 0), at most `UINT32_MAX / 4`: a longer
 *        length is refused (MG_EINVAL) before the array is read
 * @return new value or NULL (also when any term is NULL).
 */
MG_API mg_value *mg_sum(mg_graph *g, mg_value *const *v, size_t n);

/**
 * @brief Dot product `a[0]*b[0] + ... + a[n-1]*b[n-1]`, added left to right, as one node.
 * @param g the graph
 * @param a first vector (copied)
 * @param b second vector (copied)
 * @param n length, at most `UINT32_MAX / 4` (checked before the arrays are read)
 * @return new value or NULL.
 */
MG_API mg_value *mg_dot(mg_graph *g, mg_value *const *a, mg_value *const *b, size_t n);

/**
 * @brief `bias + w[0]*x[0] + ... + w[n-1]*x[n-1]`, added in exactly that order (micrograd's
 * `sum((wi*xi for ...), b)`), as one MG_OP_DOT node with a bias operand.
 * @param g the graph
 * @param w weights (copied)
 * @param x inputs (copied)
 * @param n length, at most `UINT32_MAX / 4`
 * @param bias the bias
 * @return new value or NULL.
 */
MG_API mg_value *mg_affine(mg_graph *g, mg_value *const *w, mg_value *const *x, size_t n,
                           mg_value *bias);

/**
 * @brief Mean squared error `sum((pred[i] - target[i])**2) / n`.
 * @param g the graph
 * @param pred predictions (copied)
 * @param target targets (copied)
 * @param n length, at least 1 and at most `UINT32_MAX / 4`
 * @return new value or NULL.
 */
MG_API mg_value *mg_mse(mg_graph *g, mg_value *const *pred, mg_value *const *target, size_t n);

/**
 * @brief Max-margin loss of micrograd's moons demo: `sum(relu(1 + (-y[i]) * score[i])) * (1/n)`,
 * computed in the same order as the demo's Python.
 * @param g the graph
 * @param score scores (copied)
 * @param y labels, -1 or +1 (copied)
 * @param n length, at least 1 and at most `UINT32_MAX / 4`
 * @return new value or NULL.
 */
MG_API mg_value *mg_hinge(mg_graph *g, mg_value *const *score, mg_value *const *y, size_t n);

/**
 * @brief Softmax cross-entropy from logits, computed stably (the max is subtracted before exp):
 * `log(sum(exp(z[i] - m))) + m - z[t]`.
 * @param g the graph
 * @param logits the logits (copied)
 * @param n number of classes, at least 1 and at most `UINT32_MAX / 4`
 * @param target a value whose data is the class index t; it receives no gradient. A data that is
 *        not an integer in [0, n) makes the op fail with MG_EINVAL (frozen programs give NaN).
 * @return new value or NULL.
 */
MG_API mg_value *mg_cross_entropy(mg_graph *g, mg_value *const *logits, size_t n, mg_value *target);

#ifdef __cplusplus
}
#endif

/** @} */
#endif /* MG_GRAPH_H */
