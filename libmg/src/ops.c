/* The op table's generated lookups and the status table. (Variadic ops: kernels.h.) */
#include "graph_impl.h"

#include <math.h>
#include <string.h>

/* ---- status table ------------------------------------------------------------------------ */

const char *mg_status_name(int status) {
    // clang-format off: one case per row of the status table
    switch (status) {
#define MG__STATUS_NAME(name, code, msg) case code: return #name;
        MG_STATUS_LIST(MG__STATUS_NAME)
#undef MG__STATUS_NAME
    default: return "UNKNOWN";
    }
    // clang-format on
}

const char *mg_strerror(int status) {
    // clang-format off: one case per row of the status table
    switch (status) {
#define MG__STATUS_MSG(name, code, msg) case code: return msg;
        MG_STATUS_LIST(MG__STATUS_MSG)
#undef MG__STATUS_MSG
    default: return "unknown status";
    }
    // clang-format on
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
