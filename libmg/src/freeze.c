/* Freezing: the graph reachable from the roots becomes a frozen graph (flat arrays the stages
 * read without touching the graph again), the stages turn it into programs, and the tape gets
 * its slot arrays. The graph is never modified. */
#include "ir.h"
#include "ptrmap.h"

#include <string.h>

/* ---- pointer -> index maps: libmg's pointer map (ptrmap.h), sized in advance --------------- */

typedef mg_ptrmap pmap;

static int pmap_init(mg_tape *t, pmap *m, size_t n) {
    if (mg_ptrmap_reserve(m, n, &t->alloc)) return 1;
    mg_tape__fail(t, MG_ENOMEM, "out of memory for a map of %zu values", n);
    return 0;
}

static void pmap_free(mg_tape *t, pmap *m) { mg_ptrmap_free(m, &t->alloc); }

static uint32_t pmap_get(const pmap *m, const mg_value *v) {
    size_t i = mg_ptrmap_find(m, v);
    return i == MG_PTRMAP_NONE ? UINT32_MAX : (uint32_t)m->slots[i].val;
}

/* Inserts; returns 0 when v is present already. Never grows (pmap_init() made room for every
 * key at a load of one half), so no allocator is needed. */
static int pmap_put(pmap *m, const mg_value *v, uint32_t x) {
    int added = 0;
    uintptr_t *val = mg_ptrmap_put(m, v, NULL, &added);
    if (val && added) *val = x;
    return added;
}

/* ---- value -> topological position, through the graph's blocks ------------------------------
 * A value lives at index `slot` of one of its graph's blocks (graph_impl.h), so a position can be
 * kept per block, in an array indexed by the slot, allocated when the block first holds a frozen
 * value: no hashing of a million pointers into a table larger than the cache (that was half of
 * freezing a 1M-value graph), and memory only for the blocks the frozen graph touches. The table
 * from block to array is small (a graph has a few blocks per 16k values). */

typedef struct vmap {
    const mg_block **key; /* open addressing; NULL: empty */
    uint32_t **pos;       /* per block: cap entries, UINT32_MAX where no position */
    size_t cap;
} vmap;

static size_t vmap_home(const vmap *m, const mg_block *b) {
    size_t i = (size_t)(((uint64_t)(uintptr_t)b >> 5) * 0x9E3779B97F4A7C15ull >> 32) & (m->cap - 1);
    while (m->key[i] && m->key[i] != b) i = (i + 1) & (m->cap - 1);
    return i;
}

/* Every block of g, without position arrays yet. */
static int vmap_init(mg_tape *t, vmap *m, const mg_graph *g) {
    size_t nb = 0;
    for (const mg_block *b = g->blocks; b; b = b->next) nb++;
    m->cap = 16;
    while (m->cap < 2 * nb) m->cap *= 2;
    m->key = mg_tape__alloc(t, m->cap, sizeof *m->key);
    if (m->key) memset(m->key, 0, m->cap * sizeof *m->key);
    m->pos = mg_tape__alloc(t, m->cap, sizeof *m->pos);
    if (m->pos) memset(m->pos, 0, m->cap * sizeof *m->pos); /* vmap_free reads it */
    if (!m->key || !m->pos) return mg_tape__fail(t, MG_ENOMEM, "out of memory for a block map");
    for (const mg_block *b = g->blocks; b; b = b->next) m->key[vmap_home(m, b)] = b;
    return MG_OK;
}

static void vmap_free(mg_tape *t, vmap *m) {
    if (m->pos)
        for (size_t i = 0; i < m->cap; i++)
            if (m->pos[i]) t->alloc.free_fn(m->pos[i], t->alloc.ctx);
    if (m->key) t->alloc.free_fn((void *)m->key, t->alloc.ctx);
    if (m->pos) t->alloc.free_fn(m->pos, t->alloc.ctx);
    memset(m, 0, sizeof *m);
}

/* `v` (a value of the graph) at position k. */
static int vmap_put(mg_tape *t, vmap *m, const mg_value *v, uint32_t k) {
    const mg_block *b = mg_value__block(v);
    size_t i = vmap_home(m, b);
    if (!m->key[i])
        return mg_tape__fail(t, MG_EINVAL, "freeze: a value outside its graph's blocks");
    if (!m->pos[i]) {
        m->pos[i] = mg_tape__alloc(t, b->cap, sizeof(uint32_t));
        if (!m->pos[i]) return mg_tape__fail(t, MG_ENOMEM, "out of memory for a block map");
        memset(m->pos[i], 0xff, b->cap * sizeof(uint32_t));
    }
    m->pos[i][v->slot] = k;
    return MG_OK;
}

/* The position of `v`, UINT32_MAX when it has none. */
static uint32_t vmap_get(const vmap *m, const mg_value *v) {
    size_t i = vmap_home(m, mg_value__block(v));
    return m->key[i] && m->pos[i] ? m->pos[i][v->slot] : UINT32_MAX;
}

/* ---- constants: equal bit patterns share a slot
 * -------------------------------------------------- */

typedef struct cmap {
    uint64_t *bits;
    uint32_t *idx; /* UINT32_MAX: empty */
    size_t cap;
} cmap;

static uint64_t bits_of(double x) {
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static uint32_t cmap_get_or_put(cmap *m, uint64_t b, uint32_t next) {
    for (size_t i = (size_t)((b * 0x9E3779B97F4A7C15ull) >> 32) & (m->cap - 1);;
         i = (i + 1) & (m->cap - 1)) {
        if (m->idx[i] == UINT32_MAX) {
            m->bits[i] = b;
            m->idx[i] = next;
            return next;
        }
        if (m->bits[i] == b) return m->idx[i];
    }
}

/* ---- freezing ----------------------------------------------------------------------------------
 */

static void fz_free(mg_tape *t, mg_fz *f) {
    void *bufs[] = {f->op,     f->bias, f->cone, f->cls,  f->k,   f->data,
                    f->serial, f->off,  f->opnd, f->uses, f->slot};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) t->alloc.free_fn(bufs[i], t->alloc.ctx);
}

static int check_roots(mg_graph *g, const mg_tape_spec *spec) {
    if (!spec) return mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: NULL spec");
    if (!spec->loss && spec->noutputs == 0)
        return mg_graph__fail(g, MG_EINVAL,
                              "mg_tape_freeze: nothing to freeze (no loss and no outputs)");
    if (spec->noutputs && !spec->outputs)
        return mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: NULL outputs array");
    for (size_t i = 0; i < spec->noutputs; i++)
        if (!mg_ir__owns(g, spec->outputs[i]))
            return mg_graph__fail(
                g, MG_EINVAL, "mg_tape_freeze: output %zu is NULL, released or of another graph",
                i);
    if (spec->loss && !mg_ir__owns(g, spec->loss))
        return mg_graph__fail(g, MG_EINVAL,
                              "mg_tape_freeze: the loss is released or of another graph");
    size_t listed = spec->nparams + spec->ninputs + spec->ntargets;
    if (listed < spec->nparams || listed > UINT32_MAX / 4)
        return mg_graph__fail(g, MG_ERANGE,
                              "mg_tape_freeze: too many parameters, inputs and targets");
    return MG_OK;
}

static int check_role(mg_graph *g, pmap *roles, mg_value *const *v, size_t n, const char *role,
                      uint32_t *next) {
    if (n && !v) return mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: NULL %s array", role);
    for (size_t i = 0; i < n; i++) {
        if (!mg_ir__owns(g, v[i]))
            return mg_graph__fail(g, MG_EINVAL,
                                  "mg_tape_freeze: %s %zu is NULL, released or of another graph",
                                  role, i);
        if (v[i]->op != MG_OP_LEAF)
            return mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: %s %zu is not a leaf (made by %s)",
                                  role, i, mg_op_name(v[i]->op));
        if (!pmap_put(roles, v[i], (*next)++))
            return mg_graph__fail(g, MG_EINVAL, "mg_tape_freeze: %s %zu is listed twice", role, i);
    }
    return MG_OK;
}

/* Builds the frozen graph from g->order[0..n). Leaves get their slots (roles from `roles`,
 * constants deduplicated by value). */
static int build_fz(mg_tape *t, mg_value **order, size_t n, const vmap *index, const pmap *roles,
                    const mg_tape_spec *spec, mg_fz *f, double **const_values) {
    size_t nopnd = 0;
    for (size_t k = 0; k < n; k++) {
        nopnd += mg_value__nops(order[k]);
        if (nopnd > UINT32_MAX) return mg_tape__fail(t, MG_ERANGE, "freeze: too many operands");
    }
    f->n = n;
    f->op = mg_tape__alloc(t, n, 1);
    f->bias = mg_tape__alloc(t, n, 1);
    f->cone = mg_tape__alloc(t, n, 1);
    f->cls = mg_tape__alloc(t, n, 1);
    f->k = mg_tape__alloc(t, n, sizeof(double));
    f->data = mg_tape__alloc(t, n, sizeof(double));
    f->serial = mg_tape__alloc(t, n, sizeof(uint64_t));
    f->off = mg_tape__alloc(t, n + 1, sizeof(uint32_t));
    f->opnd = mg_tape__alloc(t, nopnd, sizeof(uint32_t));
    f->uses = mg_tape__alloc(t, n, sizeof(uint32_t));
    f->slot = mg_tape__alloc(t, n, sizeof(uint32_t));
    if (!f->op || !f->bias || !f->cone || !f->cls || !f->k || !f->data || !f->serial || !f->off ||
        !f->opnd || !f->uses || !f->slot)
        return MG_ENOMEM;
    memset(f->uses, 0, n * sizeof(uint32_t));
    memset(f->cone, 0, n);
    size_t p = 0;
    for (size_t k = 0; k < n; k++) {
        const mg_value *v = order[k];
        f->op[k] = v->op;
        f->bias[k] = (v->flags & MG_FLAG_BIAS) != 0;
        f->data[k] = v->data;
        f->serial[k] = v->serial;
        int ar = mg_op__arity[v->op];
        f->k[k] = ar < 0 ? (double)v->a.args->n : ar == 1 ? v->b.k : 0.0;
        f->off[k] = (uint32_t)p;
        size_t no = mg_value__nops(v);
        for (size_t i = 0; i < no; i++) {
            uint32_t o = vmap_get(index, mg_value__op(v, i));
            f->opnd[p++] = o;
            f->uses[o]++;
        }
        f->slot[k] = UINT32_MAX;
        f->cls[k] = MG_C_VALUE;
    }
    f->off[n] = (uint32_t)p;
    /* roots stay visible: never folded into a chain */
    if (spec->loss) f->uses[vmap_get(index, spec->loss)] += 2;
    for (size_t i = 0; i < spec->noutputs; i++) f->uses[vmap_get(index, spec->outputs[i])] += 2;
    /* cones: a reverse sweep of the topological order */
    if (spec->loss) f->cone[vmap_get(index, spec->loss)] |= MG_FZ_LOSS_CONE | MG_FZ_ROOT;
    for (size_t i = 0; i < spec->noutputs; i++)
        f->cone[vmap_get(index, spec->outputs[i])] |= MG_FZ_OUT_CONE | MG_FZ_ROOT;
    for (size_t k = n; k-- > 0;) {
        uint8_t c = f->cone[k] & (MG_FZ_LOSS_CONE | MG_FZ_OUT_CONE);
        if (!c) continue;
        for (uint32_t j = f->off[k]; j < f->off[k + 1]; j++) f->cone[f->opnd[j]] |= c;
    }

    /* leaves: roles, then constants by value */
    size_t nconst = 0, nleaf = 0;
    for (size_t k = 0; k < n; k++)
        if (f->op[k] == MG_OP_LEAF && pmap_get(roles, order[k]) == UINT32_MAX) nleaf++;
    cmap cm = {NULL, NULL, 16};
    while (cm.cap < 2 * nleaf + 2) cm.cap *= 2;
    cm.bits = mg_tape__alloc(t, cm.cap, sizeof(uint64_t));
    cm.idx = mg_tape__alloc(t, cm.cap, sizeof(uint32_t));
    *const_values = mg_tape__alloc(t, nleaf, sizeof(double));
    if (!cm.bits || !cm.idx || !*const_values) {
        if (cm.bits) t->alloc.free_fn(cm.bits, t->alloc.ctx);
        if (cm.idx) t->alloc.free_fn(cm.idx, t->alloc.ctx);
        return MG_ENOMEM;
    }
    memset(cm.idx, 0xff, cm.cap * sizeof(uint32_t));
    size_t P = spec->nparams, I = spec->ninputs;
    for (size_t k = 0; k < n; k++) {
        if (f->op[k] != MG_OP_LEAF) continue;
        uint32_t r = pmap_get(roles, order[k]);
        if (r != UINT32_MAX) {
            f->slot[k] = r; /* provisional: role order, rebased below */
            f->cls[k] = r < P ? MG_C_PARAM : r < P + I ? MG_C_INPUT : MG_C_TARGET;
            continue;
        }
        uint32_t c = cmap_get_or_put(&cm, bits_of(f->data[k]), (uint32_t)nconst);
        if (c == nconst) (*const_values)[nconst++] = f->data[k];
        f->slot[k] = c;
        f->cls[k] = MG_C_CONST;
    }
    t->alloc.free_fn(cm.bits, t->alloc.ctx);
    t->alloc.free_fn(cm.idx, t->alloc.ctx);
    /* the layout: parameters, constants, inputs, targets, then values */
    t->nconsts = nconst;
    t->const0 = P;
    t->shared0 = P + nconst; /* reroll.c puts the shared values here, moving what follows */
    t->input0 = P + nconst;
    t->target0 = t->input0 + I;
    t->first_op = t->target0 + spec->ntargets;
    for (size_t k = 0; k < n; k++) {
        if (f->op[k] != MG_OP_LEAF) continue;
        if (f->cls[k] == MG_C_CONST) f->slot[k] += (uint32_t)t->const0;
        else if (f->cls[k] != MG_C_PARAM) f->slot[k] += (uint32_t)nconst;
    }
    /* shared values: computed from parameters and constants alone, for the loss alone (not an
     * output, which predict computes per row, nor a root, whose slot the driver seeds) */
    for (size_t k = 0; k < n && !spec->no_raise; k++) {
        if (f->op[k] == MG_OP_LEAF || f->cone[k] != MG_FZ_LOSS_CONE) continue;
        int shared = 1;
        for (uint32_t j = f->off[k]; j < f->off[k + 1] && shared; j++) {
            const uint8_t c = f->cls[f->opnd[j]];
            shared = c == MG_C_PARAM || c == MG_C_CONST || c == MG_C_SHARED;
        }
        if (shared) f->cls[k] = MG_C_SHARED;
    }
    return MG_OK;
}

/* The first output computed from a target (t->target_output, SIZE_MAX for none): predict, which
 * takes no targets, refuses such outputs rather than compute them from whatever targets the
 * slots last held. */
static int find_target_output(mg_tape *t, const mg_fz *f, const vmap *index,
                              const mg_tape_spec *spec) {
    t->target_output = SIZE_MAX;
    if (!spec->ntargets || !spec->noutputs) return MG_OK;
    uint8_t *reads = mg_tape__alloc(t, f->n ? f->n : 1, 1);
    if (!reads) return MG_ENOMEM;
    for (size_t k = 0; k < f->n; k++) { /* topological order: operands first */
        uint8_t r = f->cls[k] == MG_C_TARGET;
        for (uint32_t j = f->off[k]; j < f->off[k + 1] && !r; j++) r = reads[f->opnd[j]];
        reads[k] = r;
    }
    for (size_t i = 0; i < spec->noutputs && t->target_output == SIZE_MAX; i++)
        if (reads[vmap_get(index, spec->outputs[i])]) t->target_output = i;
    t->alloc.free_fn(reads, t->alloc.ctx);
    return MG_OK;
}

/* ---- common subexpressions ---------------------------------------------------------------------
 * A value that the graph computes again from the same operands by the same op is the same value:
 * micrograd code makes many, such as a normalisation's `(var + eps) ** 0.5` written inside a
 * comprehension, once per element (784 additions and 1,568 calls of pow per sample for an image
 * standardised that way, each in a nest and in its gradient). Before rerolling, each such value
 * is replaced by its first occurrence in topological order: the values are bitwise the same, and
 * the gradients that reached the copies now sum into the one (the same to rounding, like every
 * reordered gradient sum). Constants are the same operand when their bits are; the scalar
 * program (no_raise) keeps every value. */

/* One probe reads one 8-byte slot (a million-value graph's table, 16 MB, is read at random: the
 * first probe of each value missed the caches in a sixth of a 1M-value CNN's freeze), and the
 * loop fetches the slots of values 16 ahead (cse): that freeze 0.87x, a 500-step RNN's 0.85x. */
typedef struct cse_slot {
    uint32_t node; /* UINT32_MAX: empty */
    uint32_t tag;  /* the key's high half */
} cse_slot;

/* The operand identity of order[k]: its first occurrence (rep), a constant's first leaf of its
 * bits. */
typedef struct cse_map {
    cse_slot *slot;
    size_t cap;
} cse_map;

static uint64_t cse_key(const mg_value *v, const uint32_t *rep, const vmap *index, double *kb) {
    const int ar = mg_op__arity[v->op];
    const double k = ar < 0 ? (double)v->a.args->n : ar == 1 ? v->b.k : 0.0;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)v->op ^ (uint64_t)(v->flags & MG_FLAG_BIAS) << 8;
    h = (h ^ bits_of(k)) * 0xBF58476D1CE4E5B9ull;
    const size_t no = mg_value__nops(v);
    for (size_t i = 0; i < no; i++) {
        h ^= rep[vmap_get(index, mg_value__op(v, i))] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
        h *= 0xBF58476D1CE4E5B9ull;
    }
    *kb = k;
    return h ^ (h >> 31);
}

static int cse_same(const mg_value *a, const mg_value *b, const uint32_t *rep, const vmap *index) {
    if (a->op != b->op || (a->flags & MG_FLAG_BIAS) != (b->flags & MG_FLAG_BIAS)) return 0;
    const size_t no = mg_value__nops(a);
    if (no != mg_value__nops(b)) return 0;
    const int ar = mg_op__arity[a->op];
    if (ar == 1 && bits_of(a->b.k) != bits_of(b->b.k)) return 0;
    if (ar < 0 && a->a.args->n != b->a.args->n) return 0;
    for (size_t i = 0; i < no; i++)
        if (rep[vmap_get(index, mg_value__op(a, i))] != rep[vmap_get(index, mg_value__op(b, i))])
            return 0;
    return 1;
}

/* Keeps the first occurrence in order[0..n) of each value: the kept values, in order, in `*kept`
 * (*nkept of them), with the lowest serial of their copies in `*serial`, and every value's
 * position in `index` moved to its representative's among them. */
static int cse(mg_tape *t, mg_value **order, size_t n, vmap *index, const pmap *roles,
               mg_value ***kept, uint64_t **serial, size_t *nkept) {
    int st = MG_ENOMEM;
    uint32_t *rep = mg_tape__alloc(t, n ? n : 1, sizeof(uint32_t));
    uint32_t *pos = mg_tape__alloc(t, n ? n : 1, sizeof(uint32_t));
    cse_map m = {NULL, 16};
    cmap cm = {NULL, NULL, 16};
    size_t nops = 0, nleaves;
    for (size_t k = 0; k < n; k++) nops += order[k]->op != MG_OP_LEAF;
    nleaves = n - nops;
    while (m.cap < 2 * nops + 2) m.cap *= 2; /* at most half full */
    while (cm.cap < 2 * nleaves + 2) cm.cap *= 2;
    m.slot = mg_tape__alloc(t, m.cap, sizeof(cse_slot));
    cm.bits = mg_tape__alloc(t, cm.cap, sizeof(uint64_t));
    cm.idx = mg_tape__alloc(t, cm.cap, sizeof(uint32_t));
    *kept = mg_tape__alloc(t, n ? n : 1, sizeof(mg_value *));
    *serial = mg_tape__alloc(t, n ? n : 1, sizeof(uint64_t));
    if (!rep || !pos || !m.slot || !cm.bits || !cm.idx || !*kept || !*serial) goto done;
    memset(m.slot, 0xff, m.cap * sizeof(cse_slot));
    for (size_t k = 0; k < n; k++) rep[k] = (uint32_t)k; /* the keys fetched ahead read them */
    memset(cm.idx, 0xff, cm.cap * sizeof(uint32_t));
    size_t nk = 0;
    enum { AHEAD = 16 }; /* values whose slots are fetched ahead */
    for (size_t k = 0; k < n; k++) {
        const mg_value *v = order[k];
#if defined(__GNUC__) || defined(__clang__)
        if (k + AHEAD < n && order[k + AHEAD]->op != MG_OP_LEAF) {
            /* the probe of a value AHEAD on, its key from the reps known now (a rep that
             * changes before then only misses the fetch): the table is read at random, and
             * fetching ahead keeps many misses in flight instead of one */
            double kb;
            __builtin_prefetch(&m.slot[cse_key(order[k + AHEAD], rep, index, &kb) & (m.cap - 1)]);
        }
#endif
        if (v->op == MG_OP_LEAF) {
            if (pmap_get(roles, v) == UINT32_MAX) /* a constant: the first of its bits */
                rep[k] = cmap_get_or_put(&cm, bits_of(v->data), (uint32_t)k);
        } else {
            double kb;
            const uint64_t h = cse_key(v, rep, index, &kb);
            const uint32_t tag = (uint32_t)(h >> 32);
            size_t i = (size_t)(h & (m.cap - 1));
            for (; m.slot[i].node != UINT32_MAX; i = (i + 1) & (m.cap - 1))
                if (m.slot[i].tag == tag && cse_same(order[m.slot[i].node], v, rep, index)) break;
            if (m.slot[i].node != UINT32_MAX) {
                rep[k] = m.slot[i].node;
                /* the copy made first gives the serial (it orders the level's slots as the user
                 * made them; the topological order may meet a later copy first, whose operands
                 * stay where they are: the kept value is the first met) */
                uint64_t *at = &(*serial)[pos[rep[k]]];
                if (v->serial < *at) *at = v->serial;
            } else {
                m.slot[i].tag = tag;
                m.slot[i].node = (uint32_t)k;
            }
        }
        if (rep[k] == k || v->op == MG_OP_LEAF) { /* leaves all stay: they have roles, slots */
            pos[k] = (uint32_t)nk;
            (*serial)[nk] = v->serial;
            (*kept)[nk++] = order[k];
        }
    }
    for (size_t k = 0; k < n; k++) {
        const uint32_t to = order[k]->op == MG_OP_LEAF ? pos[k] : pos[rep[k]];
        if ((st = vmap_put(t, index, order[k], to)) != MG_OK) goto done;
    }
    *nkept = nk;
    st = MG_OK;
done:;
    void *bufs[] = {rep, pos, m.slot, cm.bits, cm.idx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) t->alloc.free_fn(bufs[i], t->alloc.ctx);
    return st;
}

/* ---- the forward program: rerolled, then rolled, under one of two input layouts ------------- */

/* What reroll.c and roll.c leave in the tape, taken out of it (the tape then holds none) so that
 * a second attempt can run, and either be put back. */
typedef struct fwd_prog {
    mgk_nest *nests;
    mg_nest_info *info;
    mg_instr *fwd;
    mgk_idx *ix, *in_perm;
    uint32_t *slot; /* the frozen graph's slots */
    size_t nnests, nfwd_nests, nfwd, nix, nslots, nstatements, ngroups, nseq, nfolded;
    int rerolled;
    size_t shared_slots[3]; /* input0, target0, first_op: where the shared values end */
} fwd_prog;

static void fwd_take(mg_tape *t, fwd_prog *p) {
    p->nests = t->nests, p->info = t->info, p->fwd = t->fwd, p->ix = t->ix;
    p->in_perm = t->in_perm;
    p->nnests = t->nnests, p->nfwd_nests = t->nfwd_nests, p->nfwd = t->nfwd, p->nix = t->nix;
    p->nslots = t->nslots, p->nstatements = t->nstatements, p->ngroups = t->ngroups;
    p->nseq = t->nseq, p->nfolded = t->nfolded, p->rerolled = t->rerolled;
    p->shared_slots[0] = t->input0, p->shared_slots[1] = t->target0;
    p->shared_slots[2] = t->first_op;
    t->nests = NULL, t->info = NULL, t->fwd = NULL, t->ix = NULL, t->in_perm = NULL;
    t->nnests = t->nfwd_nests = t->nfwd = t->nix = t->nslots = 0;
    t->nstatements = t->ngroups = t->nseq = t->nfolded = 0;
}

static void fwd_put(mg_tape *t, const fwd_prog *p) {
    t->nests = p->nests, t->info = p->info, t->fwd = p->fwd, t->ix = p->ix;
    t->in_perm = p->in_perm;
    t->nnests = p->nnests, t->nfwd_nests = p->nfwd_nests, t->nfwd = p->nfwd, t->nix = p->nix;
    t->nslots = p->nslots, t->nstatements = p->nstatements, t->ngroups = p->ngroups;
    t->nseq = p->nseq, t->nfolded = p->nfolded, t->rerolled = p->rerolled;
    t->input0 = p->shared_slots[0], t->target0 = p->shared_slots[1];
    t->first_op = p->shared_slots[2];
}

static void fwd_free(mg_tape *t, fwd_prog *p) {
    void *bufs[] = {p->nests, p->info, p->fwd, p->ix, p->in_perm, p->slot};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) t->alloc.free_fn(bufs[i], t->alloc.ctx);
    memset(p, 0, sizeof *p);
}

/* A forward program longer than this many nests after rolling is rerolled again under the other
 * input layout (below), where the two differ. The models of benchmarks/zoo.py have 5 to 14, but
 * for the GRU's 23 (read in the caller's order, so rerolled once). */
#define MG_RETRY_NESTS 16

/* Rerolls and rolls the forward program. reroll.c picks the inputs' layout by the affinity of
 * their reads alone; whether the steps of a recurrence roll into one loop depends on the layout
 * too (a bidirectional RNN reads row t forwards and row T-1-t backwards in one nest at step t:
 * in the caller's order that nest's stride changes from step to step and nothing rolls; stored
 * as it reads them, the rows interleave and the steps roll). So a long program is rerolled under
 * the other layout as well, and the one with fewer nests is kept (the first on a tie). */
static int forward_program(mg_tape *t, mg_fz *f, const mg_tape_spec *spec) {
    int alt = 0, st = mg_reroll(t, f, spec->no_raise != 0, MG_IN_AUTO, &alt);
    if (st != MG_OK || spec->no_raise) return st;
    if ((st = mg_roll(t)) != MG_OK) return st;
    if (!alt || t->nnests <= MG_RETRY_NESTS) return MG_OK;
    fwd_prog first;
    memset(&first, 0, sizeof first);
    const int other = t->in_perm ? MG_IN_GIVEN : MG_IN_READ;
    first.slot = mg_tape__alloc(t, f->n ? f->n : 1, sizeof(uint32_t));
    if (!first.slot) return MG_ENOMEM;
    memcpy(first.slot, f->slot, f->n * sizeof(uint32_t));
    fwd_take(t, &first);
    /* the input leaves back in the caller's order (the values' slots are all reassigned) */
    for (size_t k = 0; k < f->n; k++)
        if (f->op[k] == MG_OP_LEAF && f->cls[k] == MG_C_INPUT && first.in_perm)
            f->slot[k] = (uint32_t)t->input0 + first.in_perm[f->slot[k] - t->input0];
    if ((st = mg_reroll(t, f, 0, other, &alt)) == MG_OK) st = mg_roll(t);
    if (st == MG_OK && t->nnests < first.nnests) {
        fwd_free(t, &first);
        return MG_OK;
    }
    fwd_prog second;
    memset(&second, 0, sizeof second);
    fwd_take(t, &second);
    fwd_free(t, &second);
    memcpy(f->slot, first.slot, f->n * sizeof(uint32_t));
    fwd_put(t, &first);
    t->alloc.free_fn(first.slot, t->alloc.ctx);
    /* a second attempt that failed (out of memory) leaves the first, which stands */
    t->err[0] = '\0';
    t->status = MG_OK;
    return MG_OK;
}

mg_tape *mg_tape_freeze(mg_graph *g, const mg_tape_spec *spec) {
    if (!g) return NULL;
    if (check_roots(g, spec) != MG_OK) return NULL;
    size_t nroots = (spec->loss ? 1 : 0) + spec->noutputs;
    mg_value **roots = mg_graph__malloc(g, nroots * sizeof(mg_value *));
    if (!roots) return NULL;
    size_t r = 0;
    if (spec->loss) roots[r++] = spec->loss;
    for (size_t i = 0; i < spec->noutputs; i++) roots[r++] = spec->outputs[i];

    mg_tape *t = mg_graph__malloc(g, sizeof *t);
    if (!t) {
        mg_graph__free(g, roots);
        return NULL;
    }
    memset(t, 0, sizeof *t);
    t->alloc = g->alloc;
    t->graph_id = mg_ir__graph_id(g);
    mg_fz f;
    memset(&f, 0, sizeof f);
    pmap roles = MG_PTRMAP_INIT;
    vmap index = {NULL, NULL, 0};
    double *const_values = NULL;
    mg_value **kept = NULL;
    uint64_t *kept_serial = NULL;
    int st = MG_OK, g_set = 0; /* g_set: the graph's error already says what failed */

    size_t n = mg_graph__topo(g, roots, nroots);
    if (n == (size_t)-1) {
        st = MG_ENOMEM;
        g_set = 1;
        goto done;
    }
    mg_graph__clear_marks(g, n);
    mg_value **order = g->order; /* nothing below sorts the graph again */
    if (n > UINT32_MAX / 4) {
        st = mg_graph__fail(g, MG_ERANGE, "mg_tape_freeze: graph too large (%zu values)", n);
        g_set = 1;
        goto done;
    }
    t->nodes = n;
    t->nparams = spec->nparams;
    t->ninputs = spec->ninputs;
    t->ntargets = spec->ntargets;
    t->noutputs = spec->noutputs;
    t->has_loss = spec->loss != NULL;
    if ((st = vmap_init(t, &index, g)) != MG_OK) goto done;
    if (!pmap_init(t, &roles, spec->nparams + spec->ninputs + spec->ntargets)) {
        st = MG_ENOMEM;
        goto done;
    }
    for (size_t k = 0; k < n; k++)
        if ((st = vmap_put(t, &index, order[k], (uint32_t)k)) != MG_OK) goto done;
    uint32_t next = 0;
    if ((st = check_role(g, &roles, spec->params, spec->nparams, "parameter", &next)) != MG_OK ||
        (st = check_role(g, &roles, spec->inputs, spec->ninputs, "input", &next)) != MG_OK ||
        (st = check_role(g, &roles, spec->targets, spec->ntargets, "target", &next)) != MG_OK) {
        g_set = 1;
        goto done;
    }
    if (!spec->no_raise) { /* common subexpressions once: order becomes the values kept */
        if ((st = cse(t, order, n, &index, &roles, &kept, &kept_serial, &n)) != MG_OK) goto done;
        order = kept;
    }
    if ((st = build_fz(t, order, n, &index, &roles, spec, &f, &const_values)) != MG_OK) goto done;
    if (kept_serial) memcpy(f.serial, kept_serial, n * sizeof(uint64_t));
    if ((st = find_target_output(t, &f, &index, spec)) != MG_OK) goto done;

    /* the stages */
    if ((st = forward_program(t, &f, spec)) != MG_OK) goto done;
    /* the loss's slot (rerolling assigned the values' slots): the schedule plans its seed */
    t->loss = spec->loss ? f.slot[vmap_get(&index, spec->loss)] : 0;
    if (!spec->no_raise && (st = mg_hoist(t, 0)) != MG_OK) goto done;
    if (!spec->no_raise && (st = mg_split(t)) != MG_OK) goto done;
    if ((st = mg_autodiff(t)) != MG_OK) goto done;
    if (!spec->no_raise && (st = mg_hoist(t, 1)) != MG_OK) goto done;
    if ((st = mg_schedule(t)) != MG_OK) goto done;

    /* the slot arrays */
    /* padded: the last vector block of a row may read past it (nest_kernels.h) */
    t->data = mg_tape__alloc(t, t->nslots + MGK_PAD, sizeof(double));
    t->grad = mg_tape__alloc(t, t->nslots + MGK_PAD, sizeof(double));
    t->outputs = mg_tape__alloc(t, spec->noutputs, sizeof(mgk_idx));
    t->param_values = mg_tape__alloc(t, spec->nparams, sizeof(mg_value *));
    t->param_serials = mg_tape__alloc(t, spec->nparams, sizeof(uint64_t));
    if (!t->data || !t->grad || !t->outputs || !t->param_values || !t->param_serials) {
        st = MG_ENOMEM;
        goto done;
    }
    memset(t->data, 0, (t->nslots + MGK_PAD) * sizeof(double));
    memset(t->grad, 0, (t->nslots + MGK_PAD) * sizeof(double));
    for (size_t k = 0; k < n; k++)
        if (f.slot[k] != UINT32_MAX) t->data[f.slot[k]] = f.data[k];
    for (size_t i = 0; i < spec->nparams; i++) {
        t->data[i] = spec->params[i]->data;
        t->param_values[i] = spec->params[i];
        t->param_serials[i] = spec->params[i]->serial;
    }
    for (size_t i = 0; i < t->nconsts; i++) t->data[t->const0 + i] = const_values[i];
    for (size_t i = 0; i < spec->ninputs; i++) /* in the layout reroll.c chose */
        t->data[t->input0 + i] = spec->inputs[t->in_perm ? t->in_perm[i] : i]->data;
    for (size_t i = 0; i < spec->ntargets; i++) t->data[t->target0 + i] = spec->targets[i]->data;
    for (size_t i = 0; i < spec->noutputs; i++)
        t->outputs[i] = f.slot[vmap_get(&index, spec->outputs[i])];
    t->has_loss = spec->loss != NULL;
    for (size_t i = 0; i < t->nfwd; i++)
        if (t->fwd[i].kind == MG_I_NARY && t->fwd[i].b > t->nary_max) t->nary_max = t->fwd[i].b;
    t->identity = mg_tape__alloc(t, t->nary_max ? t->nary_max : 1, sizeof(mgk_idx));
    if (!t->identity) {
        st = MG_ENOMEM;
        goto done;
    }
    for (size_t i = 0; i < t->nary_max; i++) t->identity[i] = (mgk_idx)i;
    t->fingerprint = mg_ir__fingerprint(t);
    t->err[0] = '\0';
    t->status = MG_OK;

done:
    if (st != MG_OK && !g_set)
        mg_graph__fail(g, st, "mg_tape_freeze: %s", t->err[0] ? t->err : mg_strerror(st));
    if (const_values) t->alloc.free_fn(const_values, t->alloc.ctx);
    if (kept) t->alloc.free_fn(kept, t->alloc.ctx);
    if (kept_serial) t->alloc.free_fn(kept_serial, t->alloc.ctx);
    fz_free(t, &f);
    vmap_free(t, &index);
    pmap_free(t, &roles);
    mg_graph__free(g, roots);
    if (st != MG_OK) {
        mg_tape_free(t);
        return NULL;
    }
    return t;
}
