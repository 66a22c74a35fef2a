/* Graphs: block allocation of values, the live list, checkpoints, reclamation and backward. */
#include "graph_impl.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- allocator --------------------------------------------------------------------------- */

static void *std_malloc(size_t n, void *ctx) {
    (void)ctx;
    return malloc(n);
}
static void *std_realloc(void *p, size_t n, void *ctx) {
    (void)ctx;
    return realloc(p, n);
}
static void std_free(void *p, void *ctx) {
    (void)ctx;
    free(p);
}

static const mg_allocator default_allocator = {std_malloc, std_realloc, std_free, NULL};

const mg_allocator *mg_default_allocator(void) { return &default_allocator; }

void *mg_graph__malloc(mg_graph *g, size_t n) {
    void *p = g->alloc.malloc_fn(n ? n : 1, g->alloc.ctx);
    if (!p) mg_graph__fail(g, MG_ENOMEM, "out of memory allocating %zu bytes", n);
    return p;
}

void *mg_graph__realloc(mg_graph *g, void *p, size_t n) {
    void *q = g->alloc.realloc_fn(p, n ? n : 1, g->alloc.ctx);
    if (!q) mg_graph__fail(g, MG_ENOMEM, "out of memory growing a buffer to %zu bytes", n);
    return q;
}

void mg_graph__free(mg_graph *g, void *p) {
    if (p) g->alloc.free_fn(p, g->alloc.ctx);
}

int mg_graph__fail(mg_graph *g, int status, const char *fmt, ...) {
    if (!g) return status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->err, sizeof g->err, fmt, ap);
    va_end(ap);
    g->status = status;
    return status;
}

/* ---- graphs ------------------------------------------------------------------------------ */

mg_graph *mg_graph_new(void) { return mg_graph_new_with(NULL); }

/* Graph identities: a process-wide counter, so no two graphs ever share one (an identity derived
 * from the address could repeat, and once did among a few hundred live graphs). */
static _Atomic uint64_t next_graph_id = 1;

mg_graph *mg_graph_new_with(const mg_allocator *allocator) {
    const mg_allocator *a = allocator ? allocator : &default_allocator;
    if (!a->malloc_fn || !a->realloc_fn || !a->free_fn) return NULL;
    mg_graph *g = a->malloc_fn(sizeof *g, a->ctx);
    if (!g) return NULL;
    memset(g, 0, sizeof *g);
    g->alloc = *a;
    g->next_gen = 1;
    g->id = atomic_fetch_add_explicit(&next_graph_id, 1, memory_order_relaxed);
    return g;
}

static void free_args(mg_graph *g, mg_value *v) {
    if (mg_op__arity[v->op] < 0) {
        g->args_bytes -= sizeof(mg_args) + v->a.args->len * sizeof(mg_value *);
        mg_graph__free(g, v->a.args);
        v->a.args = NULL;
    }
}

void mg_graph_free(mg_graph *g) {
    if (!g) return;
    for (mg_value *v = g->head; v; v = v->next) free_args(g, v);
    mg_block *b = g->blocks;
    while (b) {
        mg_block *next = b->next;
        mg_graph__free(g, b);
        b = next;
    }
    mg_graph__free(g, g->stack);
    mg_graph__free(g, g->order);
    mg_graph__free(g, g->sd);
    mg_graph__free(g, g->sg);
    mg_graph__free(g, g->six);
    g->alloc.free_fn(g, g->alloc.ctx);
}

size_t mg_graph_len(const mg_graph *g) { return g ? g->len : 0; }

size_t mg_graph_bytes(const mg_graph *g) {
    if (!g) return 0;
    /* the newest block's unused tail is reserved address space the graph has not touched */
    size_t untouched = g->blocks ? (g->blocks->cap - g->blocks->used) * sizeof(mg_value) : 0;
    return sizeof *g + g->block_bytes - untouched + g->args_bytes +
           g->stack_cap * sizeof(mg_frame) + g->order_cap * sizeof(mg_value *) +
           g->scratch_cap * (2 * sizeof(double) + sizeof(mgk_idx));
}

const char *mg_graph_last_error(const mg_graph *g) { return g ? g->err : "no graph"; }
int mg_graph_last_status(const mg_graph *g) { return g ? g->status : MG_EINVAL; }

void mg_graph_clear_error(mg_graph *g) {
    if (!g) return;
    g->err[0] = '\0';
    g->status = MG_OK;
}

void mg_graph_set_autofree(mg_graph *g, int on) {
    if (g) g->autofree = on != 0;
}

int mg_graph_set_domain(mg_graph *g, int domain) {
    if (!g) return MG_EINVAL;
    if (domain < 0 || domain > (int)MG_DOMAIN_MASK)
        return mg_graph__fail(g, MG_EINVAL, "mg_graph_set_domain: domain %d is not in [0, %u]",
                              domain, MG_DOMAIN_MASK);
    g->domain = (uint8_t)domain;
    return MG_OK;
}

int mg_graph_domain(const mg_graph *g) { return g ? (int)g->domain : 0; }

/* ---- value slots ------------------------------------------------------------------------- */

_Static_assert(MG_BLOCK_MAX - 1 <= UINT16_MAX, "a slot index must fit mg_value.slot");

/* A fresh slot, linked at the tail of the live list. Blocks grow geometrically, so the
 * per-block malloc overhead is amortised to well under a byte per value. */
static mg_value *new_slot(mg_graph *g) {
    if (g->next_gen > (UINT64_MAX >> MG_DOMAIN_BITS) - 1) {
        mg_graph__fail(g, MG_ERANGE, "the graph has used up its serial numbers");
        return NULL;
    }
    mg_value *v = g->free_list;
    if (v) {
        g->free_list = v->next;
    } else {
        mg_block *b = g->blocks;
        if (!b || b->used == b->cap) {
            size_t cap = b ? b->cap * 2 : MG_BLOCK_MIN;
            if (cap > MG_BLOCK_MAX) cap = MG_BLOCK_MAX;
            size_t bytes = sizeof(mg_block) + cap * sizeof(mg_value);
            mg_block *nb = mg_graph__malloc(g, bytes);
            if (!nb) return NULL;
            nb->next = b;
            nb->cap = cap;
            nb->used = 0;
            nb->graph_id = g->id;
            g->blocks = nb;
            g->block_bytes += bytes;
            b = nb;
        }
        v = &b->values[b->used];
        v->slot = (uint16_t)b->used++; /* kept while the slot goes through the free list */
    }
    v->grad = 0.0;
    v->next = NULL;
    v->prev = g->tail;
    if (g->tail) g->tail->next = v;
    else g->head = v;
    g->tail = v;
    v->serial = (g->next_gen++ << MG_DOMAIN_BITS) | g->domain;
    v->refs = 0;
    v->flags = 0;
    g->len++;
    return v;
}

static void unlink_value(mg_graph *g, mg_value *v) {
    if (v->prev) v->prev->next = v->next;
    else g->head = v->next;
    if (v->next) v->next->prev = v->prev;
    else g->tail = v->prev;
    g->len--;
}

/* Drops the references `v` holds on its operands, queueing operands that die (autofree) on the
 * intrusive worklist `*pending` (linked through `next`), then returns `v`'s slot to the free list.
 * iterative: releasing the head of a 10,000,000-deep chain must not recurse. */
static void drop_slot(mg_graph *g, mg_value *v, mg_value **pending) {
    size_t n = mg_value__nops(v);
    for (size_t i = 0; i < n; i++) {
        mg_value *o = mg_value__op(v, i);
        if (o->refs != UINT32_MAX && o->refs > 0 && --o->refs == 0 && g->autofree &&
            o->serial != 0) {
            unlink_value(g, o);
            o->serial = 0;
            o->next = *pending;
            *pending = o;
        }
    }
    free_args(g, v);
    v->serial = 0;
    v->next = g->free_list;
    g->free_list = v;
}

static void drain(mg_graph *g, mg_value *pending) {
    while (pending) {
        mg_value *v = pending;
        pending = v->next;
        drop_slot(g, v, &pending);
    }
}

void mg_value_retain(mg_value *v) {
    if (v && v->refs != UINT32_MAX) v->refs++;
}

void mg_value_release(mg_graph *g, mg_value *v) {
    if (!g || !mg_graph__owns(g, v) || v->refs == UINT32_MAX || v->refs == 0) return;
    if (--v->refs > 0 || !g->autofree) return;
    unlink_value(g, v);
    v->serial = 0;
    v->next = NULL;
    drain(g, v);
}

mg_graph_checkpoint mg_graph_save(const mg_graph *g) {
    mg_graph_checkpoint cp = {g ? (g->next_gen << MG_DOMAIN_BITS) | g->domain : UINT64_MAX};
    return cp;
}

size_t mg_graph_restore(mg_graph *g, mg_graph_checkpoint cp) {
    if (!g) return 0;
    size_t before = g->len;
    uint64_t gen = cp.serial >> MG_DOMAIN_BITS, dom = cp.serial & MG_DOMAIN_MASK;
    /* The live list is in creation order, so everything newer than the checkpoint is a suffix.
     * Walk it newest first: values of the checkpoint's domain are released; values of another
     * domain are kept, and so is every value a kept value uses (marked KEEP when the walk meets
     * the user, which is newer). With one domain this pops the tail: it costs what it frees.
     * Releasing a value frees only older values (its operands), never `kept` or anything newer,
     * so the walk can always continue from `kept`. */
    mg_value *kept = NULL;
    for (;;) {
        mg_value *v = kept ? kept->prev : g->tail;
        if (!v || (v->serial >> MG_DOMAIN_BITS) < gen) break;
        if ((v->serial & MG_DOMAIN_MASK) == dom && !(v->flags & MG_FLAG_KEEP)) {
            unlink_value(g, v);
            mg_value *pending = NULL;
            drop_slot(g, v, &pending);
            drain(g, pending);
        } else {
            v->flags &= (uint8_t)~MG_FLAG_KEEP;
            size_t n = mg_value__nops(v);
            for (size_t i = 0; i < n; i++) {
                mg_value *o = mg_value__op(v, i);
                if ((o->serial >> MG_DOMAIN_BITS) >= gen) o->flags |= MG_FLAG_KEEP;
            }
            kept = v;
        }
    }
    return before - g->len;
}

void mg_graph_zero_grad(mg_graph *g) {
    if (!g) return;
    for (mg_value *v = g->head; v; v = v->next) v->grad = 0.0;
}

/* ---- value accessors --------------------------------------------------------------------- */

double mg_value_data(const mg_value *v) { return v ? v->data : NAN; }
double mg_value_grad(const mg_value *v) { return v ? v->grad : NAN; }
void mg_value_set_data(mg_value *v, double x) {
    if (v) v->data = x;
}
void mg_value_set_grad(mg_value *v, double x) {
    if (v) v->grad = x;
}
int mg_value_op(const mg_value *v) { return v ? (int)v->op : -1; }
size_t mg_value_noperands(const mg_value *v) { return v ? mg_value__nops(v) : 0; }

mg_value *mg_value_operand(const mg_value *v, size_t i) {
    if (!v || i >= mg_value__nops(v)) return NULL;
    return mg_value__op(v, i);
}

double mg_value_const(const mg_value *v) {
    if (!v) return NAN;
    if (v->op == MG_OP_POW) return v->b.k;
    if (mg_op__arity[v->op] < 0) return v->op == MG_OP_SUM ? 0.0 : (double)v->a.args->n;
    return 0.0;
}

int mg_value_has_bias(const mg_value *v) {
    return v && v->op == MG_OP_DOT && (v->flags & MG_FLAG_BIAS);
}
uint64_t mg_value_serial(const mg_value *v) { return v ? v->serial : 0; }
int mg_value_is_live(const mg_value *v, uint64_t serial) {
    return v && serial && v->serial == serial;
}

int mg_value_in_graph(const mg_graph *g, const mg_value *v) { return g && mg_graph__owns(g, v); }

/* ---- creating values --------------------------------------------------------------------- */

mg_value *mg_scalar(mg_graph *g, double x) {
    if (!g) return NULL;
    mg_value *v = new_slot(g);
    if (!v) return NULL;
    v->data = x;
    v->op = MG_OP_LEAF;
    v->a.v = NULL;
    v->b.v = NULL;
    return v;
}

mg_value *mg_apply(mg_graph *g, int op, mg_value *a, mg_value *b, double k) {
    if (!g) return NULL;
    if (op < 0 || op >= MG_OP_COUNT || mg_op__arity[op] < 1) {
        mg_graph__fail(g, MG_EINVAL, "mg_apply: op %d is not elementwise", op);
        return NULL;
    }
    int ar = mg_op__arity[op];
    if (!a || (ar == 2 && !b)) return NULL; /* NULL propagates silently: the cause is recorded */
    if (!mg_graph__owns(g, a) || (ar == 2 && !mg_graph__owns(g, b))) {
        mg_graph__fail(g, MG_EINVAL, "%s: operand from another graph or released", mg_op_name(op));
        return NULL;
    }
    mg_value *v = new_slot(g);
    if (!v) return NULL;
    v->op = (uint8_t)op;
    v->a.v = a;
    mg_value_retain(a);
    if (ar == 2) {
        v->b.v = b;
        mg_value_retain(b);
        v->data = mg_op__forward(op, a->data, b->data, 0.0);
    } else {
        v->b.k = k;
        v->data = mg_op__forward(op, a->data, 0.0, k);
    }
    return v;
}

mg_value *mg_add(mg_graph *g, mg_value *a, mg_value *b) { return mg_apply(g, MG_OP_ADD, a, b, 0); }
mg_value *mg_sub(mg_graph *g, mg_value *a, mg_value *b) { return mg_apply(g, MG_OP_SUB, a, b, 0); }
mg_value *mg_mul(mg_graph *g, mg_value *a, mg_value *b) { return mg_apply(g, MG_OP_MUL, a, b, 0); }
mg_value *mg_div(mg_graph *g, mg_value *a, mg_value *b) { return mg_apply(g, MG_OP_DIV, a, b, 0); }
mg_value *mg_neg(mg_graph *g, mg_value *a) { return mg_apply(g, MG_OP_NEG, a, NULL, 0); }
mg_value *mg_pow(mg_graph *g, mg_value *a, double k) { return mg_apply(g, MG_OP_POW, a, NULL, k); }
mg_value *mg_powv(mg_graph *g, mg_value *a, mg_value *b) {
    return mg_apply(g, MG_OP_POWV, a, b, 0);
}
mg_value *mg_square(mg_graph *g, mg_value *a) { return mg_apply(g, MG_OP_SQUARE, a, NULL, 0); }
mg_value *mg_relu(mg_graph *g, mg_value *a) { return mg_apply(g, MG_OP_RELU, a, NULL, 0); }
mg_value *mg_tanh(mg_graph *g, mg_value *a) { return mg_apply(g, MG_OP_TANH, a, NULL, 0); }
mg_value *mg_exp(mg_graph *g, mg_value *a) { return mg_apply(g, MG_OP_EXP, a, NULL, 0); }
mg_value *mg_log(mg_graph *g, mg_value *a) { return mg_apply(g, MG_OP_LOG, a, NULL, 0); }
mg_value *mg_sigmoid(mg_graph *g, mg_value *a) { return mg_apply(g, MG_OP_SIGMOID, a, NULL, 0); }
mg_value *mg_max(mg_graph *g, mg_value *a, mg_value *b) { return mg_apply(g, MG_OP_MAX, a, b, 0); }

mg_value *mg_graph__nary(mg_graph *g, int op, uint32_t n, uint32_t flags, size_t nparts,
                         mg_value *const *const *parts, const size_t *lens) {
    if (!g) return NULL;
    /* lengths first, before any operand is read: a length beyond the limit is refused */
    size_t len = 0;
    for (size_t p = 0; p < nparts; p++) {
        if (lens[p] > UINT32_MAX / 2 - len) {
            mg_graph__fail(g, MG_ERANGE, "%s: more than %u operands", mg_op_name(op),
                           UINT32_MAX / 2);
            return NULL;
        }
        len += lens[p];
    }
    size_t bytes;
    if (!mg__mul_size(len, sizeof(mg_value *), &bytes) || bytes > SIZE_MAX - sizeof(mg_args)) {
        mg_graph__fail(g, MG_ENOMEM, "%s: %zu operands do not fit in memory", mg_op_name(op), len);
        return NULL;
    }
    bytes += sizeof(mg_args);
    for (size_t p = 0; p < nparts; p++) {
        if (lens[p] && !parts[p]) {
            mg_graph__fail(g, MG_EINVAL, "%s: NULL operand array", mg_op_name(op));
            return NULL;
        }
        for (size_t i = 0; i < lens[p]; i++) {
            const mg_value *o = parts[p][i];
            if (!o) return NULL; /* NULL operand: propagate */
            if (!mg_graph__owns(g, o)) {
                mg_graph__fail(g, MG_EINVAL, "%s: operand from another graph or released",
                               mg_op_name(op));
                return NULL;
            }
        }
    }
    if (!mg_graph__scratch(g, len)) return NULL;
    mg_args *args = mg_graph__malloc(g, bytes);
    if (!args) return NULL;
    mg_value *v = new_slot(g);
    if (!v) {
        mg_graph__free(g, args);
        return NULL;
    }
    g->args_bytes += bytes;
    args->len = (uint32_t)len;
    args->n = n;
    size_t k = 0;
    for (size_t p = 0; p < nparts; p++)
        for (size_t i = 0; i < lens[p]; i++) {
            args->v[k++] = parts[p][i];
            mg_value_retain(parts[p][i]);
        }
    v->op = (uint8_t)op;
    v->flags = (uint8_t)flags;
    v->a.args = args;
    v->b.v = NULL;
    for (size_t i = 0; i < len; i++) g->sd[i] = args->v[i]->data;
    v->data = mg_op__nary_fwd(op, flags & MG_FLAG_BIAS, g->sd, g->six, len, n);
    return v;
}

/* Lengths of variadic ops: at most UINT32_MAX / 4 (two arrays and a bias fit the operand limit). */
static int check_n(mg_graph *g, const char *what, size_t n, size_t min) {
    if (n < min || n > UINT32_MAX / 4) {
        mg_graph__fail(g, MG_EINVAL, "%s: length %zu out of range", what, n);
        return 0;
    }
    return 1;
}

mg_value *mg_sum(mg_graph *g, mg_value *const *v, size_t n) {
    if (!g || !check_n(g, "mg_sum", n, 0)) return NULL;
    mg_value *const *parts[1] = {v};
    size_t lens[1] = {n};
    return mg_graph__nary(g, MG_OP_SUM, (uint32_t)n, 0, 1, parts, lens);
}

mg_value *mg_dot(mg_graph *g, mg_value *const *a, mg_value *const *b, size_t n) {
    if (!g || !check_n(g, "mg_dot", n, 0)) return NULL;
    mg_value *const *parts[2] = {a, b};
    size_t lens[2] = {n, n};
    return mg_graph__nary(g, MG_OP_DOT, (uint32_t)n, 0, 2, parts, lens);
}

mg_value *mg_affine(mg_graph *g, mg_value *const *w, mg_value *const *x, size_t n, mg_value *bias) {
    if (!g || !check_n(g, "mg_affine", n, 0)) return NULL;
    if (!bias) return NULL;
    mg_value *const *parts[3] = {w, x, &bias};
    size_t lens[3] = {n, n, 1};
    return mg_graph__nary(g, MG_OP_DOT, (uint32_t)n, MG_FLAG_BIAS, 3, parts, lens);
}

mg_value *mg_mse(mg_graph *g, mg_value *const *pred, mg_value *const *target, size_t n) {
    if (!g || !check_n(g, "mg_mse", n, 1)) return NULL;
    mg_value *const *parts[2] = {pred, target};
    size_t lens[2] = {n, n};
    return mg_graph__nary(g, MG_OP_MSE, (uint32_t)n, 0, 2, parts, lens);
}

mg_value *mg_hinge(mg_graph *g, mg_value *const *score, mg_value *const *y, size_t n) {
    if (!g || !check_n(g, "mg_hinge", n, 1)) return NULL;
    mg_value *const *parts[2] = {score, y};
    size_t lens[2] = {n, n};
    return mg_graph__nary(g, MG_OP_HINGE, (uint32_t)n, 0, 2, parts, lens);
}

mg_value *mg_cross_entropy(mg_graph *g, mg_value *const *logits, size_t n, mg_value *target) {
    if (!g || !check_n(g, "mg_cross_entropy", n, 1)) return NULL;
    if (!target) return NULL;
    double t = target->data;
    if (!(t >= 0.0 && t < (double)n && t == floor(t))) {
        mg_graph__fail(g, MG_EINVAL,
                       "mg_cross_entropy: target %.17g is not a class index in [0, %zu)", t, n);
        return NULL;
    }
    mg_value *const *parts[2] = {logits, &target};
    size_t lens[2] = {n, 1};
    return mg_graph__nary(g, MG_OP_XENT, (uint32_t)n, 0, 2, parts, lens);
}

/* ---- backward ---------------------------------------------------------------------------- */

/* Doubles *cap (from `first`) until it holds `need`; 0 when the count or its bytes overflow. */
static int grown_cap(size_t cap, size_t first, size_t need, size_t elem, size_t *out) {
    size_t nc = cap ? cap : first, bytes;
    while (nc < need) {
        if (nc > SIZE_MAX / 2) return 0;
        nc *= 2;
    }
    if (!mg__mul_size(nc, elem, &bytes)) return 0;
    *out = nc;
    return 1;
}

int mg_graph__scratch(mg_graph *g, size_t len) {
    if (len <= g->scratch_cap) return 1;
    size_t cap;
    if (!grown_cap(g->scratch_cap, 64, len, sizeof(double), &cap) || len > (size_t)(mgk_idx)-1) {
        mg_graph__fail(g, MG_ENOMEM, "working memory for %zu operands does not fit", len);
        return 0;
    }
    double *sd = mg_graph__realloc(g, g->sd, cap * sizeof(double));
    if (!sd) return 0;
    g->sd = sd;
    double *sg = mg_graph__realloc(g, g->sg, cap * sizeof(double));
    if (!sg) return 0;
    g->sg = sg;
    mgk_idx *six = mg_graph__realloc(g, g->six, cap * sizeof(mgk_idx));
    if (!six) return 0;
    g->six = six;
    for (size_t i = g->scratch_cap; i < cap; i++) six[i] = (mgk_idx)i;
    g->scratch_cap = cap;
    return 1;
}

int mg_graph__grow(mg_graph *g, void **buf, size_t *cap, size_t elem, size_t need) {
    if (need <= *cap) return 1;
    size_t nc;
    if (!grown_cap(*cap, 1024, need, elem, &nc)) {
        mg_graph__fail(g, MG_ENOMEM, "working memory for %zu entries does not fit", need);
        return 0;
    }
    void *nb = mg_graph__realloc(g, *buf, nc * elem);
    if (!nb) return 0;
    *buf = nb;
    *cap = nc;
    return 1;
}

/* Values reachable from `roots`, in post-order (operands before users), into g->order; returns
 * the count, or (size_t)-1 when working memory cannot grow (every mark is cleared then).
 * iterative: a 10,000,000-deep chain is a 10,000,000-deep DFS. Marks stay set on success: the
 * caller clears them (mg_graph__clear_marks) once it has read the order. */
size_t mg_graph__topo(mg_graph *g, mg_value *const *roots, size_t nroots) {
    size_t n = 0, sp = 0;
    for (size_t r = 0; r < nroots; r++) {
        mg_value *root = roots[r];
        if (root->flags & MG_FLAG_VISITED) continue;
        if (!mg_graph__grow(g, (void **)&g->stack, &g->stack_cap, sizeof(mg_frame), 1)) goto fail;
        root->flags |= MG_FLAG_VISITED;
        g->stack[sp++] = (mg_frame){root, 0};
        while (sp) {
            mg_frame *f = &g->stack[sp - 1];
            mg_value *v = f->v;
            if (f->i < mg_value__nops(v)) {
                mg_value *c = mg_value__op(v, f->i++);
                if (!(c->flags & MG_FLAG_VISITED)) {
                    if (!mg_graph__grow(g, (void **)&g->stack, &g->stack_cap, sizeof(mg_frame),
                                        sp + 1))
                        goto fail;
                    c->flags |= MG_FLAG_VISITED;
                    g->stack[sp++] = (mg_frame){c, 0};
                }
            } else {
                if (!mg_graph__grow(g, (void **)&g->order, &g->order_cap, sizeof(mg_value *),
                                    n + 1))
                    goto fail;
                g->order[n++] = v;
                sp--;
            }
        }
    }
    return n;
fail:
    /* a value is marked exactly when pushed, and leaves the stack only into the order */
    for (size_t i = 0; i < sp; i++) g->stack[i].v->flags &= (uint8_t)~MG_FLAG_VISITED;
    mg_graph__clear_marks(g, n);
    return (size_t)-1;
}

void mg_graph__clear_marks(mg_graph *g, size_t n) {
    for (size_t i = 0; i < n; i++) g->order[i]->flags &= (uint8_t)~MG_FLAG_VISITED;
}

/* One step of the chain rule at v: adds v's gradient times each local derivative (the op
 * table's) into its operands' gradients. Leaves have none. g's scratch holds v's operands. */
static void propagate(mg_graph *g, mg_value *v) {
    double gr = v->grad;
    int ar = mg_op__arity[v->op];
    if (ar > 0) {
        double dA, dB;
        mg_value *a = v->a.v, *b = ar == 2 ? v->b.v : NULL;
        mg_op__derivs(v->op, a->data, b ? b->data : 0.0, b ? 0.0 : v->b.k, v->data, &dA, &dB);
        a->grad += dA * gr;
        if (b) b->grad += dB * gr;
    } else if (ar < 0) {
        /* gather, run the shared kernel on slots 0..len-1, add back in operand order */
        const mg_args *args = v->a.args;
        for (uint32_t j = 0; j < args->len; j++) {
            g->sd[j] = args->v[j]->data;
            g->sg[j] = 0.0;
        }
        mg_op__nary_bwd(v->op, v->flags & MG_FLAG_BIAS, g->sd, g->sg, g->six, args->len, args->n,
                        gr);
        for (uint32_t j = 0; j < args->len; j++) args->v[j]->grad += g->sg[j];
    }
}

/* MG_OK where g is a graph and v a live value of it; else MG_EINVAL, with `who`'s message. */
static int check_value(mg_graph *g, const mg_value *v, const char *who) {
    if (!g) return MG_EINVAL;
    if (mg_graph__owns(g, v)) return MG_OK;
    return mg_graph__fail(g, MG_EINVAL, "%s: %s", who,
                          !v          ? "NULL value"
                          : v->serial ? "value of another graph"
                                      : "released value");
}

int mg_backward(mg_graph *g, mg_value *out) {
    int st = check_value(g, out, "mg_backward");
    if (st != MG_OK) return st;
    size_t n = mg_graph__topo(g, &out, 1);
    if (n == (size_t)-1) return MG_ENOMEM;
    mg_value **order = g->order;
    /* scratch for the largest variadic node, before any gradient changes */
    size_t widest = 0;
    for (size_t i = 0; i < n; i++)
        if (mg_op__arity[order[i]->op] < 0 && order[i]->a.args->len > widest)
            widest = order[i]->a.args->len;
    if (!mg_graph__scratch(g, widest)) {
        mg_graph__clear_marks(g, n);
        return MG_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        mg_value *v = order[i];
        v->flags &= (uint8_t)~MG_FLAG_VISITED;
        if (v->op != MG_OP_LEAF) v->grad = 0.0; /* intermediates: afresh; leaves accumulate */
    }
    out->grad += 1.0;
    for (size_t i = n; i-- > 0;) propagate(g, order[i]);
    return MG_OK;
}

int mg_value_backward_step(mg_graph *g, mg_value *v) {
    int st = check_value(g, v, "mg_value_backward_step");
    if (st != MG_OK) return st;
    if (mg_op__arity[v->op] < 0 && !mg_graph__scratch(g, v->a.args->len)) return MG_ENOMEM;
    propagate(g, v);
    return MG_OK;
}
