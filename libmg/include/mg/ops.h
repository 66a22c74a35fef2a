/**
 * @file ops.h
 * @brief The op table: every operation libmg knows, in one X-macro list.
 *
 * @defgroup ops Op table
 * @brief One row per op; the enum, the names, the eager forward and backward, the tape
 * interpreter, the C emitter and the Python bindings are all generated from it.
 *
 * Elementwise ops are rows of `XS(ID, name, symbol, arity, forward, dA, dB)`:
 * - `forward` is a C expression over `A`, `B` (the operands' data) and `K` (the op's constant,
 *   the exponent of MG_OP_POW);
 * - `dA`, `dB` are the local partial derivatives over `A`, `B`, `K` and `Y` (the op's output).
 *   The backward pass adds `dA * g` into the first operand's gradient and `dB * g` into the
 *   second's, where `g` is the output's gradient.
 *
 * The expressions are expanded as code in libmg and as text (`#forward`) by the C emitter, so the
 * generated C computes exactly what the eager path computes. Variadic and leaf ops are rows of
 * `XN(ID, name, symbol)`; each consumer implements them by hand in a `switch` without `default:`,
 * so a new row that a consumer forgets is a compile error under `-Werror`.
 * @{
 */
#ifndef MG_OPS_H
#define MG_OPS_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* clang-format off */
/**
 * The op table. `XS` rows are elementwise ops with formulas; `XN` rows are leaves and variadic
 * ops. Derivative conventions at kinks: relu'(0) = 0 (micrograd and PyTorch); max with equal
 * operands sends half the gradient to each (PyTorch's `maximum`, and the central difference);
 * powers follow PyTorch where `0 * inf` would give NaN: d/da a**k is 0 when k is 0 (also at
 * a = 0), and d/db a**b is 0 at a = 0 when b >= 0.
 */
#define MG_OP_LIST(XS, XN)                                                                     \
    XN(LEAF,    "leaf",          "")                                                           \
    XS(ADD,     "add",     "+",       2, A + B,                   1.0,                 1.0)     \
    XS(SUB,     "sub",     "-",       2, A - B,                   1.0,                 -1.0)    \
    XS(MUL,     "mul",     "*",       2, A * B,                   B,                   A)       \
    XS(DIV,     "div",     "/",       2, A / B,                   1.0 / B,             -A / (B * B)) \
    XS(NEG,     "neg",     "neg",     1, -A,                      -1.0,                0.0)     \
    XS(POW,     "pow",     "**",      1, pow(A, K),                                              \
                                         K == 0.0 ? 0.0 : K * pow(A, K - 1.0),  0.0)             \
    XS(POWV,    "powv",    "**",      2, pow(A, B),                                              \
                                         B == 0.0 ? 0.0 : B * pow(A, B - 1.0),                   \
                                         A == 0.0 && B >= 0.0 ? 0.0 : Y * log(A))                \
    XS(SQUARE,  "square",  "square",  1, A * A,                   2.0 * A,             0.0)     \
    XS(RELU,    "relu",    "ReLU",    1, A < 0.0 ? 0.0 : A,       Y > 0.0 ? 1.0 : 0.0, 0.0)     \
    XS(TANH,    "tanh",    "tanh",    1, tanh(A),                 1.0 - Y * Y,         0.0)     \
    XS(EXP,     "exp",     "exp",     1, exp(A),                  Y,                   0.0)     \
    XS(LOG,     "log",     "log",     1, log(A),                  1.0 / A,             0.0)     \
    XS(SIGMOID, "sigmoid", "sigmoid", 1, 1.0 / (1.0 + exp(-A)),   Y * (1.0 - Y),       0.0)     \
    XS(MAX,     "max",     "max",     2, (A > B || A != A) ? A : B,                              \
                                         A > B ? 1.0 : (A == B ? 0.5 : 0.0),                    \
                                         B > A ? 1.0 : (A == B ? 0.5 : 0.0))                    \
    XN(SUM,     "sum",           "sum")                                                        \
    XN(DOT,     "dot",           "dot")                                                        \
    XN(MSE,     "mse",           "mse")                                                        \
    XN(HINGE,   "hinge",         "hinge")                                                      \
    XN(XENT,    "cross_entropy", "xent")
/* clang-format on */

#define MG__OP_ENUM_S(id, name, sym, ar, f, da, db) MG_OP_##id,
#define MG__OP_ENUM_N(id, name, sym) MG_OP_##id,

/** Operation that produced a value; generated from MG_OP_LIST. */
typedef enum mg_op {
    /* clang-format off */
    MG_OP_LIST(MG__OP_ENUM_S, MG__OP_ENUM_N)
    MG_OP_COUNT /**< Number of ops; not an op. */
    /* clang-format on */
} mg_op;
#undef MG__OP_ENUM_S
#undef MG__OP_ENUM_N

/**
 * @brief Name of an op, such as `"mul"`.
 * @param op an op
 * @return a static string; `NULL` when @p op is not below MG_OP_COUNT.
 */
MG_API const char *mg_op_name(int op);

/**
 * @brief Printable symbol of an op, as micrograd's `_op` shows it (`"+"`, `"*"`, `"ReLU"`).
 * @param op an op
 * @return a static string (empty for leaves); `NULL` when @p op is out of range.
 */
MG_API const char *mg_op_symbol(int op);

/**
 * @brief Number of operands of an elementwise op.
 * @param op an op
 * @return 1 or 2 for elementwise ops, 0 for leaves, -1 for variadic ops and out-of-range ops.
 */
MG_API int mg_op_arity(int op);

/**
 * @brief Looks an op up by name.
 * @param name an op name as returned by mg_op_name()
 * @return the op, or -1 when no op has that name (or @p name is NULL).
 */
MG_API int mg_op_from_name(const char *name);

/**
 * @brief Source text of an elementwise op's formulas, for code generators.
 * @param op an elementwise op
 * @param which 0 for the forward expression, 1 for dA, 2 for dB
 * @return a static string over `A`, `B`, `K`, `Y`; `NULL` for variadic ops, leaves or bad input.
 */
MG_API const char *mg_op_formula(int op, int which);

#ifdef __cplusplus
}
#endif

/** @} */
#endif /* MG_OPS_H */
