/* Internal layouts of graphs and values. Not installed; users go through graph.h. */
#ifndef MG_GRAPH_IMPL_H
#define MG_GRAPH_IMPL_H

#include "mg/graph.h"
#include "kernels.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

/* Operands of a variadic node, allocated with the node and freed with it.
 * v[(len)] holds, per op: SUM terms; DOT a[n], b[n], [bias]; MSE/HINGE pred[n], target[n];
 * XENT logits[n], target. */
typedef struct mg_args {
    uint32_t len;  /* number of operand pointers in v */
    uint32_t n;    /* the op's term count (see mg_value_const) */
    mg_value *v[]; /* len operands */
} mg_args;

enum {
    MG_FLAG_VISITED = 1u << 0, /* set during backward's traversal only */
    MG_FLAG_BIAS = 1u << 1,    /* DOT node whose last operand is a bias */
    MG_FLAG_KEEP = 1u << 2     /* set during a restore only: used by a value the restore keeps */
};

/* Serials: (generation << MG_DOMAIN_BITS) | domain. The generation counts every value the graph
 * ever created, so serials are unique, increase in creation order and are never 0; the domain is
 * the graph's checkpoint domain when the value was created (mg_graph_set_domain). */
#define MG_DOMAIN_BITS 8
#define MG_DOMAIN_MASK ((1u << MG_DOMAIN_BITS) - 1u)

/* 64 bytes, one cache line (checked below): a million-node graph costs 64 MB. Values live in blocks
 * owned by the graph; `next`/`prev` link the live values in creation order (so restore pops from
 * the tail), `next` also links free slots. */
struct mg_value {
    double data;
    double grad;
    mg_value *next;
    mg_value *prev;
    union {
        mg_value *v;   /* elementwise: first operand */
        mg_args *args; /* variadic */
    } a;
    union {
        mg_value *v; /* binary: second operand */
        double k;    /* unary: the op's constant (POW's exponent) */
    } b;
    uint64_t serial; /* see MG_DOMAIN_BITS; 0 while the slot is free */
    uint32_t refs;   /* handles + parents; saturates (then the value is pinned) */
    uint8_t op;
    uint8_t flags;
    uint16_t slot; /* index in its block, fixed for the slot's life: finds the block header,
                      which holds the owning graph's identity */
};

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(struct mg_value) == 64, "mg_value must stay 64 bytes");
#endif

/* Values per block: the first block holds MG_BLOCK_MIN, each next one twice as many, up to
 * MG_BLOCK_MAX (1 MiB of values), which must fit mg_value.slot. */
#define MG_BLOCK_MIN 64
#define MG_BLOCK_MAX 16384

typedef struct mg_block {
    struct mg_block *next;
    size_t cap;
    size_t used;
    uint64_t graph_id; /* the owner's identity (mg_graph__id); the header stays 32 bytes */
    mg_value values[];
} mg_block;

typedef struct mg_frame {
    mg_value *v;
    size_t i; /* next operand to visit */
} mg_frame;

struct mg_graph {
    mg_allocator alloc;
    mg_value *head, *tail; /* live values, creation order */
    mg_value *free_list;
    mg_block *blocks;
    size_t len;
    size_t block_bytes;
    size_t args_bytes;
    uint64_t id;       /* unique in the process, never reused: from a global atomic counter */
    uint64_t next_gen; /* generation of the next value (see MG_DOMAIN_BITS) */
    bool autofree;
    uint8_t domain; /* stamped into the serial of every value created */
    /* backward working memory, reused across calls */
    mg_frame *stack;
    size_t stack_cap;
    mg_value **order;
    size_t order_cap;
    /* variadic-op scratch: data, gradients, identity index (scratch_cap entries each) */
    double *sd, *sg;
    mgk_idx *six;
    size_t scratch_cap;
    int status;
    char err[256];
};

/* The graph's identity: unique among every graph the process ever created. */
static inline uint64_t mg_graph__id(const mg_graph *g) { return g->id; }

/* The block a value's slot lives in: O(1), from the slot index the value carries. */
static inline const mg_block *mg_value__block(const mg_value *v) {
    return (const mg_block *)(const void *)((const char *)(v - v->slot) -
                                            offsetof(mg_block, values));
}

/* Whether `v` is a live value of `g`: not released, and in one of g's blocks. O(1) (two loads)
 * and never confused by another graph, whatever the addresses. `v` must point to a value of a
 * live graph (any live graph). */
static inline int mg_graph__owns(const mg_graph *g, const mg_value *v) {
    return v && v->serial != 0 && mg_value__block(v)->graph_id == g->id;
}

/* Allocation through the graph's allocator. */
void *mg_graph__malloc(mg_graph *g, size_t n);
void *mg_graph__realloc(mg_graph *g, void *p, size_t n);
void mg_graph__free(mg_graph *g, void *p);

/* `n * size` into *out; 0 (and nothing written) when the product does not fit a size_t. */
static inline int mg__mul_size(size_t n, size_t size, size_t *out) {
    if (size && n > SIZE_MAX / size) return 0;
    *out = n * size;
    return 1;
}

/* Records an error (printf-style message) and returns `status`. */
int mg_graph__fail(mg_graph *g, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Case labels for every elementwise op, from the table: switches over the variadic ops list
 * them (with MG_OP_LEAF and MG_OP_COUNT) instead of a `default:`. */
#define MG__CASE_S(id, name, sym, ar, f, da, db) case MG_OP_##id:
#define MG__CASE_N(id, name, sym)
#define MG_ELEMENTWISE_CASES MG_OP_LIST(MG__CASE_S, MG__CASE_N)

/* Arity per op, generated from the table (-1: variadic, 0: leaf). */
extern const int8_t mg_op__arity[MG_OP_COUNT];

/* Number of operands and the i-th one, for any node. */
static inline size_t mg_value__nops(const mg_value *v) {
    int ar = mg_op__arity[v->op];
    return ar >= 0 ? (size_t)ar : v->a.args->len;
}

static inline mg_value *mg_value__op(const mg_value *v, size_t i) {
    if (mg_op__arity[v->op] < 0) return v->a.args->v[i];
    return i == 0 ? v->a.v : v->b.v;
}

/* The forward value and the local derivatives (*dA, *dB) of an elementwise op, expanded from the
 * table. Variadic and leaf ops are not elementwise: they give NaN here. */
static inline double mg_op__forward(int op, double A, double B, double K) {
    (void)A;
    (void)B;
    (void)K;
    // clang-format off: one case per row of the table
    switch ((mg_op)op) {
#define MG__FWD_S(id, name, sym, ar, f, da, db) case MG_OP_##id: return (f);
#define MG__FWD_N(id, name, sym) case MG_OP_##id: break;
    MG_OP_LIST(MG__FWD_S, MG__FWD_N)
#undef MG__FWD_S
#undef MG__FWD_N
    case MG_OP_COUNT: break;
    }
    // clang-format on
    return NAN;
}

static inline void mg_op__derivs(int op, double A, double B, double K, double Y, double *dA,
                                 double *dB) {
    (void)A;
    (void)B;
    (void)K;
    (void)Y;
    // clang-format off: one case per row of the table
    switch ((mg_op)op) {
#define MG__BWD_S(id, name, sym, ar, f, da, db) \
    case MG_OP_##id: *dA = (da); *dB = (db); return;
#define MG__BWD_N(id, name, sym) case MG_OP_##id: break;
    MG_OP_LIST(MG__BWD_S, MG__BWD_N)
#undef MG__BWD_S
#undef MG__BWD_N
    case MG_OP_COUNT: break;
    }
    // clang-format on
    *dA = *dB = NAN;
}

/* Creates a variadic node over `len` operands copied from `parts` (concatenated arrays). */
mg_value *mg_graph__nary(mg_graph *g, int op, uint32_t n, uint32_t flags, size_t nparts,
                         mg_value *const *const *parts, const size_t *lens);

/* Reachable values from `roots` in post-order into g->order (count, or (size_t)-1 on ENOMEM);
 * leaves VISITED marks set: clear them with mg_graph__clear_marks(g, count). */
size_t mg_graph__topo(mg_graph *g, mg_value *const *roots, size_t nroots);
void mg_graph__clear_marks(mg_graph *g, size_t n);
/* Grows *buf to hold `need` elements of `elem` bytes (doubling); 0 on ENOMEM. */
int mg_graph__grow(mg_graph *g, void **buf, size_t *cap, size_t elem, size_t need);

/* The variadic ops over slot arrays, by op: the one implementation, from kernels.h, that the
 * eager graph, the interpreter and (as text) generated code all run. `ix` lists the operand
 * slots (`len` of them), `n` is the op's term count. Over the includer's mgk_real (float32 slots
 * in fit32.c). */
static inline double mg_op__nary_fwd(int op, int bias, const mgk_real *d, const mgk_idx *ix,
                                     size_t len, size_t n) {
    // clang-format off: the elementwise rows are case labels only
    switch ((mg_op)op) {
    case MG_OP_SUM: return mgk_sum_fwd(d, ix, len);
    case MG_OP_DOT: return mgk_dot_fwd(d, ix, n, bias);
    case MG_OP_MSE: return mgk_mse_fwd(d, ix, n);
    case MG_OP_HINGE: return mgk_hinge_fwd(d, ix, n);
    case MG_OP_XENT: return mgk_xent_fwd(d, ix, n);
    case MG_OP_LEAF:
        MG_ELEMENTWISE_CASES
    case MG_OP_COUNT:
        break;
    }
    // clang-format on
    return NAN;
}

static inline void mg_op__nary_bwd(int op, int bias, const mgk_real *d, mgk_real *g,
                                   const mgk_idx *ix, size_t len, size_t n, double gy) {
    // clang-format off: the elementwise rows are case labels only
    switch ((mg_op)op) {
    case MG_OP_SUM: mgk_sum_bwd(g, ix, len, gy); return;
    case MG_OP_DOT: mgk_dot_bwd(d, g, ix, n, bias, gy); return;
    case MG_OP_MSE: mgk_mse_bwd(d, g, ix, n, gy); return;
    case MG_OP_HINGE: mgk_hinge_bwd(d, g, ix, n, gy); return;
    case MG_OP_XENT: mgk_xent_bwd(d, g, ix, n, gy); return;
    case MG_OP_LEAF:
        MG_ELEMENTWISE_CASES
    case MG_OP_COUNT:
        return;
    }
    // clang-format on
}

/* Scratch for running variadic kernels on a node: its operands' data (and gradients) gathered
 * into slots 0..len-1 with the identity index. Grown before anything changes, so a failure to
 * grow leaves the graph as it was. */
int mg_graph__scratch(mg_graph *g, size_t len);

#endif /* MG_GRAPH_IMPL_H */
