/* Freezing graphs into tapes, and the tape interpreter. */
#include "tape_impl.h"

#include <string.h>

/* ---- value -> slot map, for freezing (open addressing, pointer keys) ---------------------- */

typedef struct slot_map {
    mg_value **keys;
    uint32_t *vals;
    size_t cap; /* power of two */
} slot_map;

static size_t map_index(const slot_map *m, const mg_value *v) {
    uint64_t h = (uint64_t)(uintptr_t)v * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (m->cap - 1);
}

static int map_init(mg_graph *g, slot_map *m, size_t n) {
    m->cap = 16;
    while (m->cap < 2 * n + 2) m->cap *= 2;
    m->keys = mg_graph__malloc(g, m->cap * sizeof(mg_value *));
    m->vals = mg_graph__malloc(g, m->cap * sizeof(uint32_t));
    if (!m->keys || !m->vals) return 0;
    memset(m->keys, 0, m->cap * sizeof(mg_value *));
    return 1;
}

static void map_free(mg_graph *g, slot_map *m) {
    mg_graph__free(g, m->keys);
    mg_graph__free(g, m->vals);
}

/* Returns the slot of v, or UINT32_MAX when absent. */
static uint32_t map_get(const slot_map *m, const mg_value *v) {
    for (size_t i = map_index(m, v);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == v) return m->vals[i];
        if (!m->keys[i]) return UINT32_MAX;
    }
}

/* Inserts; returns 0 when v was already present. */
static int map_put(slot_map *m, mg_value *v, uint32_t slot) {
    for (size_t i = map_index(m, v);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == v) return 0;
        if (!m->keys[i]) {
            m->keys[i] = v;
            m->vals[i] = slot;
            return 1;
        }
    }
}

/* ---- interpreter --------------------------------------------------------------------------- */

static void interp_forward(void *ctx, double *d) {
    const mg_tape *t = ctx;
    const mg_instr *ins = t->instr;
    for (size_t i = 0; i < t->ninstr; i++) {
        const mg_instr *p = &ins[i];
        const mgk_idx *ix = t->idx + p->a;
        size_t n = (size_t)p->k;
        switch ((mg_op)p->op) {
#define MG__IF_S(id, name, sym, ar, f, da, db)                                                  \
    case MG_OP_##id:                                                                          \
        d[p->out] = (ar) == 2 ? mg_op__forward(p->op, d[p->a], d[p->b], 0.0)                  \
                              : mg_op__forward(p->op, d[p->a], 0.0, p->k);                     \
        break;
#define MG__IF_N(id, name, sym)
            MG_OP_LIST(MG__IF_S, MG__IF_N)
#undef MG__IF_S
#undef MG__IF_N
        case MG_OP_SUM: d[p->out] = mgk_sum_fwd(d, ix, p->b); break;
        case MG_OP_DOT: d[p->out] = mgk_dot_fwd(d, ix, n, p->flags & MG_FLAG_BIAS); break;
        case MG_OP_MSE: d[p->out] = mgk_mse_fwd(d, ix, n); break;
        case MG_OP_HINGE: d[p->out] = mgk_hinge_fwd(d, ix, n); break;
        case MG_OP_XENT: d[p->out] = mgk_xent_fwd(d, ix, n); break;
        case MG_OP_LEAF:
        case MG_OP_COUNT: break;
        }
    }
}

static void interp_backward(void *ctx, const double *d, double *g) {
    const mg_tape *t = ctx;
    memset(g + t->nparams, 0, (t->nslots - t->nparams) * sizeof(double));
    g[t->loss] += 1.0;
    for (size_t i = t->nloss_instr; i-- > 0;) {
        const mg_instr *p = &t->instr[i];
        const mgk_idx *ix = t->idx + p->a;
        size_t n = (size_t)p->k;
        double gy = g[p->out], dA, dB;
        switch ((mg_op)p->op) {
#define MG__IB_S(id, name, sym, ar, f, da, db)                                                  \
    case MG_OP_##id:                                                                          \
        if ((ar) == 2) {                                                                      \
            mg_op__derivs(p->op, d[p->a], d[p->b], 0.0, d[p->out], &dA, &dB);                 \
            g[p->a] += dA * gy;                                                               \
            g[p->b] += dB * gy;                                                               \
        } else {                                                                              \
            mg_op__derivs(p->op, d[p->a], 0.0, p->k, d[p->out], &dA, &dB);                    \
            g[p->a] += dA * gy;                                                               \
        }                                                                                     \
        break;
#define MG__IB_N(id, name, sym)
            MG_OP_LIST(MG__IB_S, MG__IB_N)
#undef MG__IB_S
#undef MG__IB_N
        case MG_OP_SUM: mgk_sum_bwd(g, ix, p->b, gy); break;
        case MG_OP_DOT: mgk_dot_bwd(d, g, ix, n, p->flags & MG_FLAG_BIAS, gy); break;
        case MG_OP_MSE: mgk_mse_bwd(d, g, ix, n, gy); break;
        case MG_OP_HINGE: mgk_hinge_bwd(d, g, ix, n, gy); break;
        case MG_OP_XENT: mgk_xent_bwd(d, g, ix, n, gy); break;
        case MG_OP_LEAF:
        case MG_OP_COUNT: break;
        }
    }
}

/* ---- freezing ------------------------------------------------------------------------------ */

void mg_tape_free(mg_tape *t) {
    if (!t) return;
    mg_allocator a = t->alloc;
    a.free_fn(t->instr, a.ctx);
    a.free_fn(t->idx, a.ctx);
    a.free_fn(t->outputs, a.ctx);
    a.free_fn(t->data, a.ctx);
    a.free_fn(t->grad, a.ctx);
    a.free_fn(t->param_values, a.ctx);
    a.free_fn(t->param_serials, a.ctx);
    a.free_fn(t, a.ctx);
}

static int check_role(mg_graph *g, slot_map *m, mg_value *const *v, size_t n, const char *role,
                      uint32_t *next) {
    if (n && !v) return mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: NULL %s array", role);
    for (size_t i = 0; i < n; i++) {
        if (!v[i] || v[i]->serial == 0 || v[i]->tag != g->tag)
            return mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: %s %zu is NULL, released or of another graph",
                                  role, i);
        if (v[i]->op != MG_OP_LEAF)
            return mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: %s %zu is not a leaf (made by %s)", role, i,
                                  mg_op_name(v[i]->op));
        if (!map_put(m, v[i], (*next)++))
            return mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: %s %zu is listed twice", role, i);
    }
    return MG_OK;
}

mg_tape *mg_tape_freeze(mg_graph *g, const mg_tape_spec *spec) {
    if (!g) return NULL;
    if (!spec) {
        mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: NULL spec");
        return NULL;
    }
    if (!spec->loss && spec->noutputs == 0) {
        mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: nothing to freeze (no loss and no outputs)");
        return NULL;
    }
    size_t nroots = (spec->loss ? 1 : 0) + spec->noutputs;
    if (spec->noutputs && !spec->outputs) {
        mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: NULL outputs array");
        return NULL;
    }
    for (size_t i = 0; i < spec->noutputs; i++)
        if (!spec->outputs[i] || spec->outputs[i]->serial == 0 || spec->outputs[i]->tag != g->tag) {
            mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: output %zu is NULL, released or of another graph", i);
            return NULL;
        }
    if (spec->loss && (spec->loss->serial == 0 || spec->loss->tag != g->tag)) {
        mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: the loss is released or of another graph");
        return NULL;
    }

    mg_tape *t = NULL;
    slot_map m = {0};
    mg_value **roots = mg_graph__malloc(g, nroots * sizeof(mg_value *));
    if (!roots) return NULL;
    size_t r = 0;
    if (spec->loss) roots[r++] = spec->loss;
    for (size_t i = 0; i < spec->noutputs; i++) roots[r++] = spec->outputs[i];

    /* the loss's cone first: a DFS from the loss alone gives exactly its reachable set */
    size_t ncone = 0;
    if (spec->loss) {
        ncone = mg_graph__topo(g, roots, 1);
        if (ncone == (size_t)-1) goto fail_roots;
        mg_graph__clear_marks(g, ncone);
    }
    size_t n = mg_graph__topo(g, roots, nroots);
    if (n == (size_t)-1) goto fail_roots;
    mg_graph__clear_marks(g, n);
    /* The cone comes first in the multi-root order too: the loss is the first root, and a DFS
     * from the first root visits exactly its reachable set before any other root is started. */
    mg_value **order = g->order;

    size_t nlisted = spec->nparams + spec->ninputs + spec->ntargets;
    if (n + nlisted > UINT32_MAX / 2) {
        mg_graph__fail(g, MG_ERANGE, "mg_tape_freeze: graph too large (%zu values)", n);
        goto fail_roots;
    }
    if (!map_init(g, &m, n + nlisted)) goto fail;
    uint32_t next = 0;
    if (check_role(g, &m, spec->params, spec->nparams, "parameter", &next) ||
        check_role(g, &m, spec->inputs, spec->ninputs, "input", &next) ||
        check_role(g, &m, spec->targets, spec->ntargets, "target", &next))
        goto fail;

    t = mg_graph__malloc(g, sizeof *t);
    if (!t) goto fail;
    memset(t, 0, sizeof *t);
    t->alloc = g->alloc;
    t->nparams = spec->nparams;
    t->ninputs = spec->ninputs;
    t->ntargets = spec->ntargets;
    t->noutputs = spec->noutputs;
    t->graph_tag = g->tag;

    /* constants: every other leaf; then one slot per op node, in order */
    size_t nops = 0, nidx = 0;
    for (size_t i = 0; i < n; i++) {
        mg_value *v = order[i];
        if (v->op == MG_OP_LEAF) {
            if (map_put(&m, v, next)) {
                next++;
                t->nconsts++;
            }
        } else {
            nops++;
            if (mg_op__arity[v->op] < 0) nidx += v->a.args->len;
        }
    }
    t->first_op = next;
    for (size_t i = 0; i < n; i++)
        if (order[i]->op != MG_OP_LEAF) map_put(&m, order[i], next++);
    t->nslots = next;
    t->ninstr = nops;
    t->nidx = nidx;

    t->instr = mg_graph__malloc(g, (nops ? nops : 1) * sizeof(mg_instr));
    t->idx = mg_graph__malloc(g, (nidx ? nidx : 1) * sizeof(mgk_idx));
    t->outputs = mg_graph__malloc(g, (spec->noutputs ? spec->noutputs : 1) * sizeof(mgk_idx));
    t->data = mg_graph__malloc(g, (t->nslots ? t->nslots : 1) * sizeof(double));
    t->grad = mg_graph__malloc(g, (t->nslots ? t->nslots : 1) * sizeof(double));
    t->param_values = mg_graph__malloc(g, (spec->nparams ? spec->nparams : 1) * sizeof(mg_value *));
    t->param_serials = mg_graph__malloc(g, (spec->nparams ? spec->nparams : 1) * sizeof(uint64_t));
    if (!t->instr || !t->idx || !t->outputs || !t->data || !t->grad || !t->param_values ||
        !t->param_serials)
        goto fail;
    memset(t->grad, 0, t->nslots * sizeof(double));

    size_t k = 0, ki = 0;
    for (size_t i = 0; i < n; i++) {
        mg_value *v = order[i];
        uint32_t s = map_get(&m, v);
        t->data[s] = v->data;
        if (v->op == MG_OP_LEAF) continue;
        mg_instr *p = &t->instr[k++];
        p->op = v->op;
        p->flags = v->flags & MG_FLAG_BIAS;
        p->pad = 0;
        p->out = s;
        if (mg_op__arity[v->op] < 0) {
            const mg_args *args = v->a.args;
            p->a = (uint32_t)ki;
            p->b = args->len;
            p->k = (double)args->n;
            for (uint32_t j = 0; j < args->len; j++) t->idx[ki++] = map_get(&m, args->v[j]);
        } else {
            p->a = map_get(&m, v->a.v);
            p->b = mg_op__arity[v->op] == 2 ? map_get(&m, v->b.v) : 0;
            p->k = mg_op__arity[v->op] == 2 ? 0.0 : v->b.k;
        }
        if (i < ncone) t->nloss_instr = k;
    }
    /* listed leaves that the roots do not reach still get their slots' data */
    for (size_t i = 0; i < spec->nparams; i++) {
        t->data[i] = spec->params[i]->data;
        t->param_values[i] = spec->params[i];
        t->param_serials[i] = spec->params[i]->serial;
    }
    for (size_t i = 0; i < spec->ninputs; i++) t->data[spec->nparams + i] = spec->inputs[i]->data;
    for (size_t i = 0; i < spec->ntargets; i++)
        t->data[spec->nparams + spec->ninputs + i] = spec->targets[i]->data;
    for (size_t i = 0; i < spec->noutputs; i++) t->outputs[i] = map_get(&m, spec->outputs[i]);
    t->has_loss = spec->loss != NULL;
    t->loss = spec->loss ? map_get(&m, spec->loss) : 0;
    if (!spec->loss) t->nloss_instr = 0;

    t->layout.nslots = t->nslots;
    t->layout.nparams = t->nparams;
    t->layout.ninputs = t->ninputs;
    t->layout.ntargets = t->ntargets;
    t->layout.noutputs = t->noutputs;
    t->layout.input0 = t->nparams;
    t->layout.target0 = t->nparams + t->ninputs;
    t->layout.loss = t->loss;
    t->layout.outputs = t->outputs;
    t->fwd = interp_forward;
    t->bwd = interp_backward;
    t->ctx = t;
    map_free(g, &m);
    mg_graph__free(g, roots);
    return t;

fail:
    mg_tape_free(t);
    map_free(g, &m);
fail_roots:
    mg_graph__free(g, roots);
    return NULL;
}

/* ---- running ------------------------------------------------------------------------------- */

size_t mg_tape_nslots(const mg_tape *t) { return t ? t->nslots : 0; }
size_t mg_tape_ninstr(const mg_tape *t) { return t ? t->ninstr : 0; }
size_t mg_tape_nparams(const mg_tape *t) { return t ? t->nparams : 0; }
size_t mg_tape_ninputs(const mg_tape *t) { return t ? t->ninputs : 0; }
size_t mg_tape_ntargets(const mg_tape *t) { return t ? t->ntargets : 0; }
size_t mg_tape_noutputs(const mg_tape *t) { return t ? t->noutputs : 0; }
int mg_tape_has_loss(const mg_tape *t) { return t && t->has_loss; }
double *mg_tape_data(mg_tape *t) { return t ? t->data : NULL; }
double *mg_tape_grad(mg_tape *t) { return t ? t->grad : NULL; }

int mg_tape_forward(mg_tape *t, const double *x, const double *y) {
    if (!t) return MG_EINVAL;
    mgk_load(&t->layout, t->data, x, y);
    t->fwd(t->ctx, t->data);
    return MG_OK;
}

double mg_tape_loss(const mg_tape *t) { return t && t->has_loss ? t->data[t->loss] : NAN; }

void mg_tape_outputs(const mg_tape *t, double *out) {
    if (!t || !out) return;
    for (size_t i = 0; i < t->noutputs; i++) out[i] = t->data[t->outputs[i]];
}

int mg_tape_backward(mg_tape *t) {
    if (!t || !t->has_loss) return MG_EINVAL;
    t->bwd(t->ctx, t->data, t->grad);
    return MG_OK;
}

void mg_tape_step(mg_tape *t, double lr, size_t count) {
    if (!t) return;
    mgk_step(t->data, t->grad, t->nparams, lr / (double)(count ? count : 1));
}

int mg_tape_fit(mg_tape *t, const double *X, const double *Y, size_t n, size_t batch_size,
                double lr, int shuffle, uint64_t seed, uint64_t epoch, double *mean_loss) {
    if (!t || !t->has_loss || (n && !X && t->ninputs) || (n && !Y && t->ntargets) || batch_size == 0)
        return MG_EINVAL;
    size_t *perm = t->alloc.malloc_fn((n ? n : 1) * sizeof(size_t), t->alloc.ctx);
    if (!perm) return MG_ENOMEM;
    double l = mgk_fit_epoch(&t->layout, t->fwd, t->bwd, t->ctx, t->data, t->grad, X, Y, n,
                             batch_size, lr, perm, shuffle, seed, epoch);
    t->alloc.free_fn(perm, t->alloc.ctx);
    if (mean_loss) *mean_loss = l;
    return MG_OK;
}

int mg_tape_predict(mg_tape *t, const double *X, size_t n, double *out) {
    if (!t || (n && ((!X && t->ninputs) || (!out && t->noutputs)))) return MG_EINVAL;
    mgk_predict(&t->layout, t->fwd, t->ctx, t->data, X, n, out);
    return MG_OK;
}

void mg_tape_set_kernels(mg_tape *t, mg_tape_forward_fn forward, mg_tape_backward_fn backward,
                         void *ctx) {
    if (!t) return;
    if (forward && backward) {
        t->fwd = forward;
        t->bwd = backward;
        t->ctx = ctx;
    } else {
        t->fwd = interp_forward;
        t->bwd = interp_backward;
        t->ctx = t;
    }
}

size_t mg_tape_write_back(const mg_tape *t, mg_graph *g) {
    if (!t || !g || g->tag != t->graph_tag) return 0;
    size_t k = 0;
    for (size_t i = 0; i < t->nparams; i++)
        if (mg_value_is_live(t->param_values[i], t->param_serials[i])) {
            t->param_values[i]->data = t->data[i];
            k++;
        }
    return k;
}
