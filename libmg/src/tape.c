/* pthread barriers are POSIX, outside strict ISO C11 */
#define _POSIX_C_SOURCE 200809L
/* Freezing graphs into tapes, and the tape interpreter. */
#include "tape_impl.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
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


static void interp_forward(void *vctx, double *d) {
    const mgk_ctx *ctx = vctx;
    const mg_tape *t = ctx->prog;
    for (size_t i = 0; i < t->ninstr; i++) {
        const mg_instr *p = &t->instr[i];
        if (p->kind == MG_K_MAP) {
            for (uint32_t j = 0; j < p->b; j++) d[p->out + j] = mg_op__forward(p->op, d[p->a + j], 0.0, p->k);
        } else if (p->kind == MG_K_MATVEC) {
            const mgk_mv *v = &t->mvs[p->a];
            mgk_mv_fwd(d, ctx->pw, v->m, v->n, v->b0, v->ldb, v->x0, v->out0, v->p0);
        } else if (mg_op__arity[p->op] < 0) { /* k is the term count only for variadic ops */
            d[p->out] = mg_op__nary_fwd(p->op, p->flags & MG_FLAG_BIAS, d, t->idx + p->a, p->b, (size_t)p->k);
        } else if (mg_op__arity[p->op] == 2) {
            d[p->out] = mg_op__forward(p->op, d[p->a], d[p->b], 0.0);
        } else {
            d[p->out] = mg_op__forward(p->op, d[p->a], 0.0, p->k);
        }
    }
}

static void interp_backward(void *vctx, const double *d, double *g) {
    const mgk_ctx *ctx = vctx;
    const mg_tape *t = ctx->prog;
    memset(g + t->nparams, 0, (t->nslots - t->nparams) * sizeof(double));
    g[t->loss] += 1.0;
    for (size_t i = t->nloss_instr; i-- > 0;) {
        const mg_instr *p = &t->instr[i];
        double dA, dB;
        if (p->kind == MG_K_MAP) {
            for (uint32_t j = p->b; j-- > 0;) {
                mg_op__derivs(p->op, d[p->a + j], 0.0, p->k, d[p->out + j], &dA, &dB);
                g[p->a + j] += dA * g[p->out + j];
            }
        } else if (p->kind == MG_K_MATVEC) {
            const mgk_mv *v = &t->mvs[p->a];
            mgk_mv_bwd(d, g, ctx->pw, ctx->pg, v->m, v->n, v->b0, v->ldb, v->x0, v->out0, v->p0,
                       (int)v->need_gx, ctx->lr, ctx->rec, v->roff);
        } else if (mg_op__arity[p->op] < 0) {
            mg_op__nary_bwd(p->op, p->flags & MG_FLAG_BIAS, d, g, t->idx + p->a, p->b, (size_t)p->k, g[p->out]);
        } else if (mg_op__arity[p->op] == 2) {
            mg_op__derivs(p->op, d[p->a], d[p->b], 0.0, d[p->out], &dA, &dB);
            g[p->a] += dA * g[p->out];
            g[p->b] += dB * g[p->out];
        } else {
            mg_op__derivs(p->op, d[p->a], 0.0, p->k, d[p->out], &dA, &dB);
            g[p->a] += dA * g[p->out];
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
    a.free_fn(t->mvs, a.ctx);
    a.free_fn(t->free_params, a.ctx);
    a.free_fn(t->pw, a.ctx);
    a.free_fn(t->pg, a.ctx);
    a.free_fn(t, a.ctx);
}

static int check_role(mg_graph *g, slot_map *m, mg_value *const *v, size_t n, const char *role,
                      uint32_t *next) {
    if (n && !v) return mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: NULL %s array", role);
    for (size_t i = 0; i < n; i++) {
        if (!mg_graph__owns(g, v[i]))
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

/* ---- the raising pass ------------------------------------------------------------------------
 * Works on the graph in topological order, before slots are assigned:
 *  1. a left-leaning chain of additions whose right operands are products, `((b + w0*x0) + w1*x1)
 *     + ...`, with every inner node used once, becomes one dot product with a bias (the order of
 *     additions is the chain's, so the value is bit for bit the same); libmg's own DOT nodes with
 *     a bias are taken as they are;
 *  2. dot products over the same input vector whose weights are parameters laid out as rows
 *     (w[j][i] at slot w0 + j*ldw + i, bias at b0 + j*ldb) form one matrix-vector product, and a
 *     unary op applied to each of them (the activation) one elementwise loop;
 *  3. whatever is not recognised stays as it was. */

enum { R_PLAIN = 0, R_ABSORBED, R_DOT, R_ROW, R_ACT };

typedef struct rdot {    /* a dot product with a bias: bias + sum_i w[i] * x[i] */
    uint32_t node;       /* order index of the node that computes it */
    uint32_t off, n;     /* its pairs: pw[off .. off+n), px[off .. off+n) */
    mg_value *bias;
    uint32_t group;      /* UINT32_MAX when not in a matvec group */
    uint32_t act;        /* order index of its activation, UINT32_MAX when none */
} rdot;

typedef struct rgroup {
    uint32_t first, rows, n;     /* first rdot index; rows are consecutive rdots in `members` */
    uint32_t w0, ldw, b0, ldb;   /* parameter slots */
    int act_op;                  /* -1: none */
    double act_k;
    uint32_t emitted;
} rgroup;

typedef struct raise_plan {
    uint8_t *role;       /* role[n] */
    uint32_t *dot_of;    /* dot_of[n]: rdot index of an R_DOT/R_ROW node */
    rdot *dots;
    size_t ndots;
    mg_value **pw, **px; /* pairs of all dots */
    size_t npairs;
    rgroup *groups;
    size_t ngroups;
    uint32_t *members;   /* rdot indices, grouped */
} raise_plan;

static void plan_free(mg_graph *g, raise_plan *r) {
    mg_graph__free(g, r->role);
    mg_graph__free(g, r->dot_of);
    mg_graph__free(g, r->dots);
    mg_graph__free(g, r->pw);
    mg_graph__free(g, r->px);
    mg_graph__free(g, r->groups);
    mg_graph__free(g, r->members);
}

static int is_param_slot(uint32_t s, size_t nparams) { return s < nparams; }

/* Builds the plan. `om` maps node -> order index; `sm` maps leaves with roles -> slot. Returns 0
 * on ENOMEM. */
static int plan_raise(mg_graph *g, mg_value **order, size_t n, const slot_map *om, const slot_map *sm,
                      size_t nparams, size_t ninputs, mg_value *const *roots, size_t nroots, raise_plan *r) {
    uint32_t *uses = mg_graph__malloc(g, (n ? n : 1) * sizeof(uint32_t));
    uint32_t *user = mg_graph__malloc(g, (n ? n : 1) * sizeof(uint32_t));
    r->role = mg_graph__malloc(g, (n ? n : 1));
    r->dot_of = mg_graph__malloc(g, (n ? n : 1) * sizeof(uint32_t));
    size_t cap_pairs = 0;
    for (size_t k = 0; k < n; k++)
        if (order[k]->op == MG_OP_MUL || order[k]->op == MG_OP_DOT)
            cap_pairs += order[k]->op == MG_OP_DOT ? order[k]->a.args->n : 1;
    r->pw = mg_graph__malloc(g, (cap_pairs ? cap_pairs : 1) * sizeof(mg_value *));
    r->px = mg_graph__malloc(g, (cap_pairs ? cap_pairs : 1) * sizeof(mg_value *));
    r->dots = mg_graph__malloc(g, (n ? n : 1) * sizeof(rdot));
    if (!uses || !user || !r->role || !r->dot_of || !r->pw || !r->px || !r->dots) {
        mg_graph__free(g, uses);
        mg_graph__free(g, user);
        return 0;
    }
    memset(uses, 0, n * sizeof(uint32_t));
    memset(r->role, R_PLAIN, n);
    for (size_t k = 0; k < n; k++) {
        mg_value *v = order[k];
        size_t no = mg_value__nops(v);
        for (size_t i = 0; i < no; i++) {
            uint32_t o = map_get(om, mg_value__op(v, i));
            uses[o]++;
            user[o] = (uint32_t)k;
        }
    }
    for (size_t i = 0; i < nroots; i++) uses[map_get(om, roots[i])] += 2; /* roots stay visible */

    /* 1. chains and DOT nodes -> dots, from the top of each chain down */
    r->ndots = 0;
    r->npairs = 0;
    for (size_t k = n; k-- > 0;) {
        mg_value *v = order[k];
        if (r->role[k] != R_PLAIN) continue;
        if (v->op == MG_OP_DOT && (v->flags & MG_FLAG_BIAS)) {
            const mg_args *a = v->a.args;
            rdot *d = &r->dots[r->ndots];
            d->node = (uint32_t)k;
            d->off = (uint32_t)r->npairs;
            d->n = a->n;
            d->bias = a->v[2 * a->n];
            for (uint32_t i = 0; i < a->n; i++) {
                r->pw[r->npairs] = a->v[i];
                r->px[r->npairs++] = a->v[a->n + i];
            }
            r->role[k] = R_DOT;
            r->dot_of[k] = (uint32_t)r->ndots++;
            continue;
        }
        if (v->op != MG_OP_ADD) continue;
        /* walk the left spine: every node below the top must be an ADD used once, every right
         * operand a MUL used once */
        size_t terms = 0;
        mg_value *cur = v;
        while (cur->op == MG_OP_ADD) {
            uint32_t ci = map_get(om, cur);
            uint32_t ri = map_get(om, cur->b.v);
            if ((cur != v && uses[ci] != 1) || cur->b.v->op != MG_OP_MUL || uses[ri] != 1 ||
                r->role[ri] != R_PLAIN)
                break;
            terms++;
            cur = cur->a.v;
        }
        /* where the walk stopped (a leaf, a product, or an ADD it could not take) is the bias:
         * acc = bias + w*x + ... in the chain's order is exact either way */
        if (terms < 2) continue;
        /* collect pairs left to right: the walk went right to left */
        rdot *d = &r->dots[r->ndots];
        d->node = (uint32_t)k;
        d->off = (uint32_t)r->npairs;
        d->n = (uint32_t)terms;
        d->bias = cur;
        r->npairs += terms;
        mg_value *c = v;
        for (size_t t = terms; t-- > 0;) {
            mg_value *mul = c->b.v;
            mg_value *w = mul->a.v, *x = mul->b.v;
            uint32_t ws = map_get(sm, w), xs = map_get(sm, x);
            /* weights first: a parameter times anything else */
            if (!(ws != UINT32_MAX && is_param_slot(ws, nparams)) && xs != UINT32_MAX && is_param_slot(xs, nparams)) {
                mg_value *tmp = w;
                w = x;
                x = tmp;
            }
            r->pw[d->off + t] = w;
            r->px[d->off + t] = x;
            r->role[map_get(om, mul)] = R_ABSORBED;
            if (c != v) r->role[map_get(om, c)] = R_ABSORBED;
            c = c->a.v;
        }
        r->role[k] = R_DOT;
        r->dot_of[k] = (uint32_t)r->ndots++;
    }
    /* dots were found top-down from the end; put them in topological order */
    for (size_t i = 0, j = r->ndots; i < j / 2; i++) {
        rdot tmp = r->dots[i];
        r->dots[i] = r->dots[j - 1 - i];
        r->dots[j - 1 - i] = tmp;
    }
    for (size_t i = 0; i < r->ndots; i++) {
        r->dot_of[r->dots[i].node] = (uint32_t)i;
        r->dots[i].group = UINT32_MAX;
        r->dots[i].act = UINT32_MAX;
    }

    /* 2. groups: consecutive rows over the same inputs with affine parameter slots */
    r->groups = mg_graph__malloc(g, (r->ndots ? r->ndots : 1) * sizeof(rgroup));
    r->members = mg_graph__malloc(g, (r->ndots ? r->ndots : 1) * sizeof(uint32_t));
    if (!r->groups || !r->members) {
        mg_graph__free(g, uses);
        mg_graph__free(g, user);
        return 0;
    }
    r->ngroups = 0;
    size_t nmem = 0;
    for (size_t di = 0; di < r->ndots; di++) {
        rdot *d = &r->dots[di];
        /* weights must be consecutive parameter slots, the bias a parameter */
        uint32_t ws = map_get(sm, r->pw[d->off]), bs = map_get(sm, d->bias);
        int ok = d->n > 0 && ws != UINT32_MAX && is_param_slot(ws, nparams) && bs != UINT32_MAX &&
                 is_param_slot(bs, nparams);
        for (uint32_t i = 1; ok && i < d->n; i++) ok = map_get(sm, r->pw[d->off + i]) == ws + i;
        if (!ok) continue;
        /* weights used by this row only: their gradients live packed during a run */
        for (uint32_t i = 0; ok && i < d->n; i++) ok = uses[map_get(om, r->pw[d->off + i])] == 1;
        if (!ok) continue;
        /* rows of a layer are consecutive dots over the same inputs: extend the latest group */
        rgroup *gr = NULL;
        if (r->ngroups) {
            rgroup *c = &r->groups[r->ngroups - 1];
            rdot *f = &r->dots[r->members[c->first]];
            int same_x = c->n == d->n && c->first + c->rows == nmem &&
                         memcmp(r->px + f->off, r->px + d->off, d->n * sizeof(mg_value *)) == 0;
            if (same_x && c->rows == 1 && ws >= c->w0 + c->n && bs > c->b0) {
                c->ldw = ws - c->w0;
                c->ldb = bs - c->b0;
            }
            if (same_x && c->ldw && ws == c->w0 + c->rows * c->ldw && bs == c->b0 + c->rows * c->ldb)
                gr = c;
        }
        if (gr) {
            r->members[nmem++] = (uint32_t)di;
            gr->rows++;
        } else {
            rgroup *c = &r->groups[r->ngroups++];
            c->first = (uint32_t)nmem;
            c->rows = 1;
            c->n = d->n;
            c->w0 = ws;
            c->b0 = bs;
            c->ldw = 0;
            c->ldb = 0;
            c->act_op = -1;
            c->act_k = 0.0;
            c->emitted = 0;
            r->members[nmem++] = (uint32_t)di;
        }
    }
    /* keep groups of two or more rows whose inputs will be consecutive slots */
    size_t kept = 0;
    for (size_t q = 0; q < r->ngroups; q++) {
        rgroup *c = &r->groups[q];
        if (c->rows < 2) continue;
        rdot *f = &r->dots[r->members[c->first]];
        /* inputs: consecutive input leaves in order, or the outputs of an earlier kept group */
        int ok = 1;
        uint32_t s0 = map_get(sm, r->px[f->off]);
        if (s0 != UINT32_MAX && s0 >= nparams && s0 < nparams + ninputs) {
            for (uint32_t i = 0; ok && i < c->n; i++) ok = map_get(sm, r->px[f->off + i]) == s0 + i;
        } else {
            ok = 0;
            for (size_t p = 0; p < kept && !ok; p++) {
                rgroup *e = &r->groups[p];
                if (e->rows != c->n) continue;
                ok = 1;
                for (uint32_t i = 0; ok && i < c->n; i++) {
                    rdot *row = &r->dots[r->members[e->first + i]];
                    uint32_t src = row->act != UINT32_MAX ? row->act : row->node;
                    ok = order[src] == r->px[f->off + i];
                }
            }
        }
        if (!ok) continue;
        /* the activation: each row used once, by the same unary op */
        int act_op = -2;
        double act_k = 0.0;
        for (uint32_t j = 0; j < c->rows && act_op != -1; j++) {
            rdot *row = &r->dots[r->members[c->first + j]];
            mg_value *u = uses[row->node] == 1 ? order[user[row->node]] : NULL;
            int op = u && mg_op__arity[u->op] == 1 ? u->op : -1;
            double kk = op >= 0 ? u->b.k : 0.0;
            if (op >= 0 && uses[user[row->node]] == 0) op = -1;
            if (act_op == -2) {
                act_op = op;
                act_k = kk;
            } else if (op != act_op || (op >= 0 && kk != act_k)) {
                act_op = -1;
            }
        }
        c->act_op = act_op < 0 ? -1 : act_op;
        c->act_k = act_k;
        for (uint32_t j = 0; j < c->rows; j++) {
            rdot *row = &r->dots[r->members[c->first + j]];
            row->group = (uint32_t)kept;
            row->act = c->act_op >= 0 ? user[row->node] : UINT32_MAX;
            r->role[row->node] = R_ROW;
            if (c->act_op >= 0) r->role[user[row->node]] = R_ACT;
        }
        r->groups[kept++] = *c;
    }
    r->ngroups = kept;
    mg_graph__free(g, uses);
    mg_graph__free(g, user);
    return 1;
}

/* ---- freezing ------------------------------------------------------------------------------ */

static int grow_idx(mg_graph *g, mg_tape *t, size_t *cap, size_t need) {
    return mg_graph__grow(g, (void **)&t->idx, cap, sizeof(mgk_idx), need);
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
    if (spec->noutputs && !spec->outputs) {
        mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: NULL outputs array");
        return NULL;
    }
    for (size_t i = 0; i < spec->noutputs; i++)
        if (!mg_graph__owns(g, spec->outputs[i])) {
            mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: output %zu is NULL, released or of another graph", i);
            return NULL;
        }
    if (spec->loss && !mg_graph__owns(g, spec->loss)) {
        mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: the loss is released or of another graph");
        return NULL;
    }
    size_t nroots = (spec->loss ? 1 : 0) + spec->noutputs;

    mg_tape *t = NULL;
    slot_map m = {0}, om = {0};
    raise_plan rp;
    memset(&rp, 0, sizeof rp);
    size_t idx_cap = 0;
    mg_value **roots = mg_graph__malloc(g, nroots * sizeof(mg_value *));
    if (!roots) return NULL;
    size_t r = 0;
    if (spec->loss) roots[r++] = spec->loss;
    for (size_t i = 0; i < spec->noutputs; i++) roots[r++] = spec->outputs[i];

    /* the loss's cone first: a DFS from the loss alone gives exactly its reachable set, and in
     * the multi-root order it also comes first (the loss is the first root) */
    size_t ncone = 0;
    if (spec->loss) {
        ncone = mg_graph__topo(g, roots, 1);
        if (ncone == (size_t)-1) goto fail;
        mg_graph__clear_marks(g, ncone);
    }
    size_t n = mg_graph__topo(g, roots, nroots);
    if (n == (size_t)-1) goto fail;
    mg_graph__clear_marks(g, n);
    /* g->order may move if a later call grows it; nothing below calls into the graph's sort */
    mg_value **order = g->order;

    size_t nlisted = spec->nparams + spec->ninputs + spec->ntargets;
    if (n + nlisted > UINT32_MAX / 4) {
        mg_graph__fail(g, MG_ERANGE, "mg_tape_freeze: graph too large (%zu values)", n);
        goto fail;
    }
    if (!map_init(g, &m, n + nlisted) || !map_init(g, &om, n)) goto fail;
    for (size_t k = 0; k < n; k++) map_put(&om, order[k], (uint32_t)k);
    uint32_t next = 0;
    if (check_role(g, &m, spec->params, spec->nparams, "parameter", &next) ||
        check_role(g, &m, spec->inputs, spec->ninputs, "input", &next) ||
        check_role(g, &m, spec->targets, spec->ntargets, "target", &next))
        goto fail;
    int raising = !spec->no_raise;
    if (raising && !plan_raise(g, order, n, &om, &m, spec->nparams, spec->ninputs, roots, nroots, &rp))
        goto fail;

    t = mg_graph__malloc(g, sizeof *t);
    if (!t) goto fail;
    memset(t, 0, sizeof *t);
    t->alloc = g->alloc;
    t->nparams = spec->nparams;
    t->ninputs = spec->ninputs;
    t->ntargets = spec->ntargets;
    t->noutputs = spec->noutputs;
    t->graph_id = mg_graph__id(g);

    /* constants: every other leaf */
    for (size_t k = 0; k < n; k++)
        if (order[k]->op == MG_OP_LEAF && map_put(&m, order[k], next)) {
            next++;
            t->nconsts++;
        }
    t->first_op = next;

    t->instr = mg_graph__malloc(g, (n ? n : 1) * sizeof(mg_instr));
    t->mvs = mg_graph__malloc(g, (rp.ngroups ? rp.ngroups : 1) * sizeof(mgk_mv));
    if (!t->instr || !t->mvs || !grow_idx(g, t, &idx_cap, 64)) goto fail;

    /* instructions and op-result slots, in order; a raised layer is emitted where its first row
     * was, its outputs (and its activations') in consecutive slots */
    size_t k_instr = 0, ki = 0;
    for (size_t k = 0; k < n; k++) {
        mg_value *v = order[k];
        if (v->op == MG_OP_LEAF) continue;
        uint8_t role = raising ? rp.role[k] : R_PLAIN;
        if (role == R_ABSORBED || role == R_ACT) continue;
        if (role == R_ROW) {
            rdot *d = &rp.dots[rp.dot_of[k]];
            rgroup *gr = &rp.groups[d->group];
            if (gr->emitted) continue;
            gr->emitted = 1;
            mgk_mv *mv = &t->mvs[t->nmv];
            mv->m = gr->rows;
            mv->n = gr->n;
            mv->w0 = gr->w0;
            mv->ldw = gr->ldw;
            mv->b0 = gr->b0;
            mv->ldb = gr->ldb;
            mv->x0 = map_get(&m, rp.px[d->off]);
            mv->p0 = (mgk_idx)t->npacked;
            mv->need_gx = mv->x0 >= t->first_op;
            mv->roff = (mgk_idx)t->layout.nrec;
            t->layout.nrec += (size_t)gr->n + gr->rows;
            mv->out0 = next;
            for (uint32_t j = 0; j < gr->rows; j++) map_put(&m, order[rp.dots[rp.members[gr->first + j]].node], next++);
            mg_instr *p = &t->instr[k_instr++];
            memset(p, 0, sizeof *p);
            p->kind = MG_K_MATVEC;
            p->a = (uint32_t)t->nmv++;
            p->out = mv->out0;
            t->npacked += (size_t)gr->rows * gr->n;
            if (gr->act_op >= 0) {
                uint32_t act0 = next;
                for (uint32_t j = 0; j < gr->rows; j++)
                    map_put(&m, order[rp.dots[rp.members[gr->first + j]].act], next++);
                p = &t->instr[k_instr++];
                memset(p, 0, sizeof *p);
                p->kind = MG_K_MAP;
                p->op = (uint8_t)gr->act_op;
                p->out = act0;
                p->a = mv->out0;
                p->b = gr->rows;
                p->k = gr->act_k;
            }
            if (k < ncone) t->nloss_instr = k_instr;
            continue;
        }
        uint32_t s = next++;
        map_put(&m, v, s);
        mg_instr *p = &t->instr[k_instr++];
        memset(p, 0, sizeof *p);
        p->kind = MG_K_OP;
        p->op = v->op;
        p->out = s;
        if (role == R_DOT) {
            rdot *d = &rp.dots[rp.dot_of[k]];
            if (!grow_idx(g, t, &idx_cap, ki + 2 * (size_t)d->n + 1)) goto fail;
            p->op = MG_OP_DOT;
            p->flags = MG_FLAG_BIAS;
            p->a = (uint32_t)ki;
            p->b = 2 * d->n + 1;
            p->k = (double)d->n;
            for (uint32_t i = 0; i < d->n; i++) t->idx[ki++] = map_get(&m, rp.pw[d->off + i]);
            for (uint32_t i = 0; i < d->n; i++) t->idx[ki++] = map_get(&m, rp.px[d->off + i]);
            t->idx[ki++] = map_get(&m, d->bias);
        } else if (mg_op__arity[v->op] < 0) {
            const mg_args *args = v->a.args;
            if (!grow_idx(g, t, &idx_cap, ki + args->len)) goto fail;
            p->flags = v->flags & MG_FLAG_BIAS;
            p->a = (uint32_t)ki;
            p->b = args->len;
            p->k = (double)args->n;
            for (uint32_t j = 0; j < args->len; j++) t->idx[ki++] = map_get(&m, args->v[j]);
        } else {
            p->a = map_get(&m, v->a.v);
            p->b = mg_op__arity[v->op] == 2 ? map_get(&m, v->b.v) : 0;
            p->k = mg_op__arity[v->op] == 2 ? 0.0 : v->b.k;
        }
        if (k < ncone) t->nloss_instr = k_instr;
    }
    t->nslots = next;
    t->ninstr = k_instr;
    t->nidx = ki;

    t->outputs = mg_graph__malloc(g, (spec->noutputs ? spec->noutputs : 1) * sizeof(mgk_idx));
    t->data = mg_graph__malloc(g, (t->nslots ? t->nslots : 1) * sizeof(double));
    t->grad = mg_graph__malloc(g, (t->nslots ? t->nslots : 1) * sizeof(double));
    t->param_values = mg_graph__malloc(g, (spec->nparams ? spec->nparams : 1) * sizeof(mg_value *));
    t->param_serials = mg_graph__malloc(g, (spec->nparams ? spec->nparams : 1) * sizeof(uint64_t));
    t->pw = mg_graph__malloc(g, (t->npacked ? t->npacked : 1) * sizeof(double));
    t->pg = mg_graph__malloc(g, (t->npacked ? t->npacked : 1) * sizeof(double));
    t->free_params = mg_graph__malloc(g, (spec->nparams ? spec->nparams : 1) * sizeof(mgk_idx));
    if (!t->outputs || !t->data || !t->grad || !t->param_values || !t->param_serials || !t->pw ||
        !t->pg || !t->free_params)
        goto fail;
    memset(t->grad, 0, t->nslots * sizeof(double));
    memset(t->pg, 0, (t->npacked ? t->npacked : 1) * sizeof(double));
    for (size_t k = 0; k < n; k++) {
        uint32_t s = map_get(&m, order[k]);
        if (s != UINT32_MAX) t->data[s] = order[k]->data;
    }
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
    /* parameters outside the packed blocks */
    {
        uint8_t *covered = mg_graph__malloc(g, spec->nparams ? spec->nparams : 1);
        if (!covered) goto fail;
        memset(covered, 0, spec->nparams);
        for (size_t q = 0; q < t->nmv; q++) {
            const mgk_mv *v = &t->mvs[q];
            for (size_t j = 0; j < v->m; j++)
                for (size_t i = 0; i < v->n; i++) covered[v->w0 + j * v->ldw + i] = 1;
        }
        for (size_t i = 0; i < spec->nparams; i++)
            if (!covered[i]) t->free_params[t->nfree++] = (mgk_idx)i;
        mg_graph__free(g, covered);
    }

    t->layout.nslots = t->nslots;
    t->layout.nparams = t->nparams;
    t->layout.ninputs = t->ninputs;
    t->layout.ntargets = t->ntargets;
    t->layout.noutputs = t->noutputs;
    t->layout.input0 = t->nparams;
    t->layout.target0 = t->nparams + t->ninputs;
    t->layout.loss = t->loss;
    t->layout.outputs = t->outputs;
    t->layout.mvs = t->mvs;
    t->layout.nmv = t->nmv;
    t->layout.npacked = t->npacked;
    t->layout.free_params = t->free_params;
    t->layout.nfree = t->nfree;
    t->fwd = interp_forward;
    t->bwd = interp_backward;
    t->kctx.pw = t->pw;
    t->kctx.pg = t->pg;
    t->kctx.prog = t;
    plan_free(g, &rp);
    map_free(g, &m);
    map_free(g, &om);
    mg_graph__free(g, roots);
    return t;

fail:
    if (g->status == MG_OK) mg_graph__fail(g, MG_ENOMEM, "mg_tape_freeze: out of memory");
    mg_tape_free(t);
    plan_free(g, &rp);
    map_free(g, &m);
    map_free(g, &om);
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
size_t mg_tape_nraised(const mg_tape *t) { return t ? t->nmv : 0; }
int mg_tape_has_loss(const mg_tape *t) { return t && t->has_loss; }
double *mg_tape_data(mg_tape *t) { return t ? t->data : NULL; }
double *mg_tape_grad(mg_tape *t) { return t ? t->grad : NULL; }

/* Every public call packs the weights from the parameter slots (the caller may have written
 * them) and leaves everything visible in the slots when it returns. */
int mg_tape_forward(mg_tape *t, const double *x, const double *y) {
    if (!t) return MG_EINVAL;
    mgk_load(&t->layout, t->data, x, y);
    mgk_pack(&t->layout, t->data, t->pw);
    t->fwd(&t->kctx, t->data);
    return MG_OK;
}

double mg_tape_loss(const mg_tape *t) { return t && t->has_loss ? t->data[t->loss] : NAN; }
size_t mg_tape_loss_slot(const mg_tape *t) { return t && t->has_loss ? t->loss : 0; }

void mg_tape_outputs(const mg_tape *t, double *out) {
    if (!t || !out) return;
    for (size_t i = 0; i < t->noutputs; i++) out[i] = t->data[t->outputs[i]];
}

int mg_tape_backward(mg_tape *t) {
    if (!t || !t->has_loss) return MG_EINVAL;
    mgk_pack(&t->layout, t->data, t->pw);
    t->bwd(&t->kctx, t->data, t->grad);
    mgk_unpack_grad(&t->layout, t->grad, t->pg);
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
    if (batch_size > 1) /* the chunked path: the same result for any thread count */
        return mg_tape_fit_threads(t, X, Y, n, batch_size, lr, shuffle, seed, epoch, 1, mean_loss);
    size_t *perm = t->alloc.malloc_fn((n ? n : 1) * sizeof(size_t), t->alloc.ctx);
    if (!perm) return MG_ENOMEM;
    /* gradients accumulated by earlier backward() calls stay in the slots; the packed ones start at zero */
    double l = mgk_fit_epoch(&t->layout, t->fwd, t->bwd, &t->kctx, t->data, t->grad, X, Y, n,
                             batch_size, lr, perm, shuffle, seed, epoch);
    t->alloc.free_fn(perm, t->alloc.ctx);
    if (mean_loss) *mean_loss = l;
    return MG_OK;
}

int mg_tape_predict(mg_tape *t, const double *X, size_t n, double *out) {
    if (!t || (n && ((!X && t->ninputs) || (!out && t->noutputs)))) return MG_EINVAL;
    mgk_predict(&t->layout, t->fwd, &t->kctx, t->data, X, n, out);
    return MG_OK;
}

void mg_tape_set_kernels(mg_tape *t, mg_tape_forward_fn forward, mg_tape_backward_fn backward) {
    if (!t) return;
    if (forward && backward) {
        t->fwd = forward;
        t->bwd = backward;
    } else {
        t->fwd = interp_forward;
        t->bwd = interp_backward;
        t->outer = NULL;
    }
}

void mg_tape_set_outer_kernel(mg_tape *t, mg_tape_outer_fn outer) {
    if (t) t->outer = outer;
}

size_t mg_tape_write_back(const mg_tape *t, mg_graph *g) {
    if (!t || !g || mg_graph__id(g) != t->graph_id) return 0;
    size_t k = 0;
    for (size_t i = 0; i < t->nparams; i++)
        if (mg_value_is_live(t->param_values[i], t->param_serials[i])) {
            t->param_values[i]->data = t->data[i];
            k++;
        }
    return k;
}

/* ---- batch parallelism ------------------------------------------------------------------------
 * A batch of B samples is cut into C = min(B, MG_FIT_CHUNKS) chunks of consecutive samples, run
 * on up to C threads with private slots. Raised layers do not accumulate weight gradients per
 * sample: each sample records its layers' inputs x and output gradients gy (a row of `rec`),
 * and at the end of the batch the gradient sum over the batch's samples, in sample order, is
 * formed with register-blocked accumulators and applied at once, its input rows split over the
 * threads (mgk_mv_outer_step). Every element's sum runs over the samples in order whatever the
 * thread count, so raised weights come out exactly as sequential accumulation gives them. Other
 * parameters (biases, scalar-program weights) are summed per chunk in sample order and the
 * chunks added in chunk order. So the parameters are bitwise the same for every thread count. */

#define MG_FIT_CHUNKS 2 /* private slot buffers per batch; more threads than chunks wait */

typedef struct fit_chunk {
    double *d, *g; /* private slots and gradients */
    mgk_ctx ctx;
    double loss;
    size_t from, to; /* positions in the epoch's order */
} fit_chunk;

/* A sense-reversing barrier that spins, then yields: a batch is a few hundred microseconds, and
 * a futex sleep and wake-up per phase (pthread_barrier_t) cost a sizeable part of that. */
typedef struct spin_barrier {
    atomic_uint count;
    atomic_uint sense;
    unsigned n;
} spin_barrier;

static void sb_init(spin_barrier *b, unsigned n) {
    atomic_init(&b->count, 0);
    atomic_init(&b->sense, 0);
    b->n = n;
}

/* Arrives for a participant that does not exist (a thread that could not be started). */
static void sb_wait_arrive_only(spin_barrier *b, unsigned *local_sense) {
    unsigned s = !*local_sense;
    *local_sense = s;
    if (atomic_fetch_add(&b->count, 1) + 1 == b->n) {
        atomic_store(&b->count, 0);
        atomic_store(&b->sense, s);
    }
}

static void sb_wait(spin_barrier *b, unsigned *local_sense) {
    unsigned s = !*local_sense;
    *local_sense = s;
    if (atomic_fetch_add(&b->count, 1) + 1 == b->n) {
        atomic_store(&b->count, 0);
        atomic_store(&b->sense, s);
    } else {
        unsigned spins = 0;
        while (atomic_load(&b->sense) != s)
            if (++spins > 2000) sched_yield(); /* oversubscribed machine: let the others run */
    }
}

typedef struct fit_run {
    mg_tape *t;
    fit_chunk ch[MG_FIT_CHUNKS];
    size_t nch;
    const double *X, *Y;
    const size_t *perm;
    double *rec; /* batch rows of records */
    size_t b0;   /* the batch's first position */
    size_t bn;   /* its size */
    size_t threads;
    spin_barrier start, done;
    unsigned main_sense_start, main_sense_done;
    atomic_int stop;
    atomic_int phase; /* 0: samples, 1: weight gradients and step */
    double scale;
} fit_run;

static void run_chunk(fit_run *R, fit_chunk *c) {
    const mgk_layout *L = &R->t->layout;
    c->loss = 0.0;
    for (size_t k = c->from; k < c->to; k++) {
        size_t s = R->perm[k];
        mgk_load(L, c->d, R->X + s * L->ninputs, R->Y ? R->Y + s * L->ntargets : NULL);
        R->t->fwd(&c->ctx, c->d);
        c->loss += c->d[L->loss];
        c->ctx.rec = L->nmv ? R->rec + (k - R->b0) * L->nrec : NULL;
        R->t->bwd(&c->ctx, c->d, c->g);
    }
}

/* The raised layers' batch gradients and step, rows [n*w/T, n*(w+1)/T) of every layer. */
static void outer_share(fit_run *R, size_t w) {
    mg_tape *t = R->t;
    for (size_t k = 0; k < t->nmv; k++) {
        const mgk_mv *v = &t->mvs[k];
        size_t i0 = v->n * w / R->threads, i1 = v->n * (w + 1) / R->threads;
        if (t->outer)
            t->outer(t->pw, t->pg, v->m, v->n, v->p0, R->rec, t->layout.nrec, v->roff, R->bn, R->scale, i0, i1);
        else
            mgk_mv_outer_step(t->pw, t->pg, v->m, v->n, v->p0, R->rec, t->layout.nrec, v->roff, R->bn, R->scale,
                              i0, i1);
    }
}

static void run_share(fit_run *R, size_t worker) {
    if (atomic_load(&R->phase) == 0) {
        for (size_t c = worker; c < R->nch; c += R->threads) run_chunk(R, &R->ch[c]);
    } else {
        outer_share(R, worker);
    }
}

typedef struct worker_arg {
    fit_run *R;
    size_t id;
} worker_arg;

static void *fit_worker(void *p) {
    worker_arg *w = p;
    unsigned s_start = 0, s_done = 0;
    for (;;) {
        sb_wait(&w->R->start, &s_start);
        if (atomic_load(&w->R->stop)) return NULL;
        run_share(w->R, w->id);
        sb_wait(&w->R->done, &s_done);
    }
}

static void run_phase(fit_run *R, int phase) {
    atomic_store(&R->phase, phase);
    if (R->threads > 1) {
        sb_wait(&R->start, &R->main_sense_start);
        run_share(R, 0);
        sb_wait(&R->done, &R->main_sense_done);
    } else {
        run_share(R, 0);
    }
}

int mg_tape_fit_threads(mg_tape *t, const double *X, const double *Y, size_t n, size_t batch_size,
                        double lr, int shuffle, uint64_t seed, uint64_t epoch, size_t threads,
                        double *mean_loss) {
    if (!t || !t->has_loss || (n && !X && t->ninputs) || (n && !Y && t->ntargets) ||
        batch_size == 0 || threads == 0)
        return MG_EINVAL;
    if (batch_size == 1) /* one sample per step: nothing to split */
        return mg_tape_fit(t, X, Y, n, 1, lr, shuffle, seed, epoch, mean_loss);
    const mg_allocator *A = &t->alloc;
    const mgk_layout *L = &t->layout;
    fit_run R;
    memset(&R, 0, sizeof R);
    R.t = t;
    R.X = X;
    R.Y = Y;
    size_t nch = batch_size < MG_FIT_CHUNKS ? batch_size : MG_FIT_CHUNKS;
    if (threads > nch) threads = nch;
    R.threads = threads;
    size_t *perm = A->malloc_fn((n ? n : 1) * sizeof(size_t), A->ctx);
    R.rec = A->malloc_fn((L->nmv ? batch_size * L->nrec : 1) * sizeof(double), A->ctx);
    int st = perm && R.rec ? MG_OK : MG_ENOMEM;
    for (size_t c = 0; c < nch && st == MG_OK; c++) {
        fit_chunk *ch = &R.ch[c];
        ch->d = A->malloc_fn(t->nslots * sizeof(double) + 1, A->ctx);
        ch->g = A->malloc_fn(t->nslots * sizeof(double) + 1, A->ctx);
        if (!ch->d || !ch->g) {
            st = MG_ENOMEM;
            break;
        }
        memcpy(ch->d, t->data, t->nslots * sizeof(double));
        memset(ch->g, 0, t->nslots * sizeof(double));
        ch->ctx.pw = t->pw;
        ch->ctx.pg = t->pg; /* not written: raised layers record instead */
        ch->ctx.prog = t;
        ch->ctx.lr = 0.0;
        ch->ctx.rec = NULL;
    }
    pthread_t tid[MG_FIT_CHUNKS];
    worker_arg wa[MG_FIT_CHUNKS];
    size_t started = 0;
    if (st == MG_OK && threads > 1) {
        sb_init(&R.start, (unsigned)threads);
        sb_init(&R.done, (unsigned)threads);
        atomic_init(&R.stop, 0);
        atomic_init(&R.phase, 0);
        for (size_t w = 1; st == MG_OK && w < threads; w++) {
            wa[w].R = &R;
            wa[w].id = w;
            if (pthread_create(&tid[w], NULL, fit_worker, &wa[w]) != 0) break;
            started++;
        }
        if (st == MG_OK && started + 1 < threads) {
            /* fewer threads than asked: the barriers count `threads`, so stand in for the
             * missing ones to release the started workers, end them, and run on this thread
             * (same result: the work split does not change the sums) */
            atomic_store(&R.stop, 1);
            unsigned fake = R.main_sense_start;
            for (size_t w = started + 1; w < threads; w++) {
                unsigned ls = fake;
                sb_wait_arrive_only(&R.start, &ls);
            }
            sb_wait(&R.start, &R.main_sense_start);
            for (size_t w = 1; w <= started; w++) pthread_join(tid[w], NULL);
            atomic_store(&R.stop, 0);
            started = 0;
            R.threads = threads = 1;
        }
    }
    double total = 0.0;
    if (st == MG_OK) {
        mgk_order(perm, n, shuffle, seed, epoch);
        R.perm = perm;
        mgk_pack(L, t->data, t->pw);
        for (size_t b0 = 0; b0 < n; b0 += batch_size) {
            size_t bn = n - b0 < batch_size ? n - b0 : batch_size;
            R.b0 = b0;
            R.bn = bn;
            R.nch = bn < nch ? bn : nch;
            for (size_t c = 0; c < R.nch; c++) {
                fit_chunk *ch = &R.ch[c];
                ch->from = b0 + bn * c / R.nch;
                ch->to = b0 + bn * (c + 1) / R.nch;
                /* the free parameters moved at the last step; packed weights are shared */
                if (L->nmv)
                    for (size_t k = 0; k < L->nfree; k++) ch->d[L->free_params[k]] = t->data[L->free_params[k]];
                else
                    memcpy(ch->d, t->data, t->nparams * sizeof(double));
            }
            run_phase(&R, 0);
            /* other parameters: chunks added in chunk order, into the tape's gradients */
            for (size_t c = 0; c < R.nch; c++) {
                fit_chunk *ch = &R.ch[c];
                total += ch->loss;
                size_t nf = L->nmv ? L->nfree : t->nparams;
                for (size_t k = 0; k < nf; k++) {
                    size_t p = L->nmv ? L->free_params[k] : k;
                    t->grad[p] += ch->g[p];
                    ch->g[p] = 0.0;
                }
            }
            R.scale = lr / (double)bn;
            mgk_step_all(L, t->data, t->grad, t->pw, t->pg, R.scale, 1); /* the free parameters */
            if (L->nmv) run_phase(&R, 1);                               /* the raised weights */
        }
        mgk_unpack(L, t->data, t->pw);
    }
    if (threads > 1 && started) {
        atomic_store(&R.stop, 1);
        sb_wait(&R.start, &R.main_sense_start);
        for (size_t w = 1; w <= started; w++) pthread_join(tid[w], NULL);
    }
    for (size_t c = 0; c < nch; c++) {
        A->free_fn(R.ch[c].d, A->ctx);
        A->free_fn(R.ch[c].g, A->ctx);
    }
    A->free_fn(R.rec, A->ctx);
    A->free_fn(perm, A->ctx);
    if (st == MG_OK && mean_loss) *mean_loss = n ? total / (double)n : 0.0;
    return st;
}
