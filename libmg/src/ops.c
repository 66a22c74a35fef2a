/* The op table's generated lookups, the status table, and the variadic ops' formulas. */
#include "graph_impl.h"

#include <math.h>
#include <string.h>

/* ---- status table ------------------------------------------------------------------------ */

const char *mg_status_name(int status) {
    switch (status) {
#define MG__STATUS_NAME(name, code, msg) case code: return #name;
        MG_STATUS_LIST(MG__STATUS_NAME)
#undef MG__STATUS_NAME
    default: return "UNKNOWN";
    }
}

const char *mg_strerror(int status) {
    switch (status) {
#define MG__STATUS_MSG(name, code, msg) case code: return msg;
        MG_STATUS_LIST(MG__STATUS_MSG)
#undef MG__STATUS_MSG
    default: return "unknown status";
    }
}

/* ---- op table ---------------------------------------------------------------------------- */

#define MG__NAME_S(id, name, sym, ar, f, da, db) name,
#define MG__NAME_N(id, name, sym) name,
static const char *const op_names[MG_OP_COUNT] = {MG_OP_LIST(MG__NAME_S, MG__NAME_N)};

#define MG__SYM_S(id, name, sym, ar, f, da, db) sym,
#define MG__SYM_N(id, name, sym) sym,
static const char *const op_symbols[MG_OP_COUNT] = {MG_OP_LIST(MG__SYM_S, MG__SYM_N)};

#define MG__AR_S(id, name, sym, ar, f, da, db) ar,
#define MG__AR_N(id, name, sym) (MG_OP_##id == MG_OP_LEAF ? 0 : -1),
const int8_t mg_op__arity[MG_OP_COUNT] = {MG_OP_LIST(MG__AR_S, MG__AR_N)};

#define MG__TXT_S(id, name, sym, ar, f, da, db) {#f, #da, #db},
#define MG__TXT_N(id, name, sym) {NULL, NULL, NULL},
static const char *const op_formulas[MG_OP_COUNT][3] = {MG_OP_LIST(MG__TXT_S, MG__TXT_N)};

const char *mg_op_name(int op) { return op >= 0 && op < MG_OP_COUNT ? op_names[op] : NULL; }

const char *mg_op_symbol(int op) { return op >= 0 && op < MG_OP_COUNT ? op_symbols[op] : NULL; }

int mg_op_arity(int op) { return op >= 0 && op < MG_OP_COUNT ? mg_op__arity[op] : -1; }

int mg_op_from_name(const char *name) {
    if (!name) return -1;
    for (int op = 0; op < MG_OP_COUNT; op++)
        if (strcmp(op_names[op], name) == 0) return op;
    return -1;
}

const char *mg_op_formula(int op, int which) {
    if (op < 0 || op >= MG_OP_COUNT || which < 0 || which > 2) return NULL;
    return op_formulas[op][which];
}

/* ---- variadic ops ------------------------------------------------------------------------ */

/* The orders of additions below are part of the contract: DOT with a bias adds the bias first
 * and then each product, exactly micrograd's `sum((wi*xi ...), b)`; HINGE reproduces the moons
 * demo's `sum((1 + -yi*si).relu() ...) * (1.0/n)` operation for operation. */
double mg_op__nary_forward(int op, const mg_value *v) {
    const mg_args *ar = v->a.args;
    mg_value *const *x = ar->v;
    size_t n = ar->n;
    double acc = 0.0;
    switch ((mg_op)op) {
    case MG_OP_SUM:
        for (size_t i = 0; i < ar->len; i++) acc += x[i]->data;
        return acc;
    case MG_OP_DOT:
        if (v->flags & MG_FLAG_BIAS) acc = x[2 * n]->data;
        for (size_t i = 0; i < n; i++) acc += x[i]->data * x[n + i]->data;
        return acc;
    case MG_OP_MSE:
        for (size_t i = 0; i < n; i++) {
            double d = x[i]->data - x[n + i]->data;
            acc += d * d;
        }
        return acc / (double)n;
    case MG_OP_HINGE:
        for (size_t i = 0; i < n; i++) {
            double m = x[i]->data * -x[n + i]->data + 1.0;
            acc += m < 0.0 ? 0.0 : m;
        }
        return acc * (1.0 / (double)n);
    case MG_OP_XENT: {
        double t = x[n]->data;
        if (!(t >= 0.0 && t < (double)n && t == floor(t))) return NAN;
        double m = x[0]->data;
        for (size_t i = 1; i < n; i++)
            if (x[i]->data > m || x[i]->data != x[i]->data) m = x[i]->data;
        if (isinf(m)) m = 0.0; /* keep exp(z - m) defined; inf logits give inf/NaN as IEEE does */
        for (size_t i = 0; i < n; i++) acc += exp(x[i]->data - m);
        return log(acc) + m - x[(size_t)t]->data;
    }
    case MG_OP_LEAF:
        MG_ELEMENTWISE_CASES
    case MG_OP_COUNT:
        break;
    }
    return NAN;
}

void mg_op__nary_backward(const mg_value *v, double g) {
    const mg_args *ar = v->a.args;
    mg_value *const *x = ar->v;
    size_t n = ar->n;
    switch ((mg_op)v->op) {
    case MG_OP_SUM:
        for (size_t i = 0; i < ar->len; i++) x[i]->grad += g;
        return;
    case MG_OP_DOT:
        if (v->flags & MG_FLAG_BIAS) x[2 * n]->grad += g;
        for (size_t i = 0; i < n; i++) {
            x[i]->grad += x[n + i]->data * g;
            x[n + i]->grad += x[i]->data * g;
        }
        return;
    case MG_OP_MSE: {
        double s = 2.0 / (double)n;
        for (size_t i = 0; i < n; i++) {
            double d = (x[i]->data - x[n + i]->data) * s * g;
            x[i]->grad += d;
            x[n + i]->grad -= d;
        }
        return;
    }
    case MG_OP_HINGE: {
        double s = 1.0 / (double)n;
        for (size_t i = 0; i < n; i++) {
            double y = -x[n + i]->data, sc = x[i]->data;
            if (sc * y + 1.0 > 0.0) {
                x[i]->grad += y * s * g;
                x[n + i]->grad -= sc * s * g;
            }
        }
        return;
    }
    case MG_OP_XENT: {
        double t = x[n]->data;
        if (!(t >= 0.0 && t < (double)n && t == floor(t))) {
            for (size_t i = 0; i < n; i++) x[i]->grad = NAN;
            return;
        }
        double m = x[0]->data, sum = 0.0;
        for (size_t i = 1; i < n; i++)
            if (x[i]->data > m || x[i]->data != x[i]->data) m = x[i]->data;
        if (isinf(m)) m = 0.0;
        for (size_t i = 0; i < n; i++) sum += exp(x[i]->data - m);
        for (size_t i = 0; i < n; i++) {
            double p = exp(x[i]->data - m) / sum;
            x[i]->grad += (p - (i == (size_t)t ? 1.0 : 0.0)) * g;
        }
        return; /* the target is an index: no gradient */
    }
    case MG_OP_LEAF:
        MG_ELEMENTWISE_CASES
    case MG_OP_COUNT:
        return;
    }
}
