/* Scheduling: how each nest runs, decided once in the IR, so that the interpreter and the
 * generated code follow one plan and compute the same bits. What a nest computes is fixed by
 * the earlier stages; this stage only chooses:
 *  1. the vector dim: among a nest's outer dims (independent outputs), the cheapest per output
 *     (dim_cost: operands read consecutive or broadcast elements along it) goes innermost (dim 3);
 *  2. packed parameters: a weight read with a non-unit stride along a hot nest's vector dim (a
 *     layer's W[j][i] vectorised over outputs j) lives, during a call, in a packed copy whose
 *     order makes that stride 1; every nest reading or writing those parameters reads the copy;
 *  3. merged dims: adjacent dims that are contiguous for every operand become one;
 *  4. MGK_F_BLOCK (vector blocks) and MGK_F_SPLIT (split gradient sums), see nest_kernels.h;
 *  5. fused SGD: a parameter's only gradient nest can apply the step itself when nothing after
 *     it in the backward program reads the parameter (MGK_F_STEP): at batch size 1, and on one
 *     thread for a batch's last samples (drive.h);
 *  8. pre-steps: ... and where one forward nest alone reads those weights, each once, that step
 *     can wait for the next sample's forward, which applies it as it reads them (MGK_F_PRESTEP);
 *  9. bands: a fused step's nest that reads per-sample operands alone, with rows enough along
 *     dim 2 for two bands of whole register tiles, can run a band of those rows per thread
 *     (MGK_F_BAND): a batch in flight at once runs it after its chunks, a band per thread
 * (drive.h). */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

/* ---- refs -------------------------------------------------------------------------------------
 */

/* The refs a nest reads or writes; returns their count. */
static int active_refs(mgk_nest *N, mgk_ref **refs) {
    int k = 0;
    refs[k++] = &N->out;
    if (N->mode == MGK_SUMI || (N->flags & MGK_F_STEP)) refs[k++] = &N->init;
    for (int j = 0; j < 4; j++)
        if (mg_nest__x_used(N, j)) refs[k++] = &N->x[j];
    return k;
}

static int is_param_ref(const mg_tape *t, const mgk_ref *X) {
    return !X->gather && X->ts == 0 && (X->arr == MGK_D || X->arr == MGK_G) && X->base >= 0 &&
           X->base < (mgk_i64)t->nparams;
}

static void swap_dims(mgk_nest *N, int a, int b) {
    if (a == b) return;
    mgk_i64 tmp = N->n[a];
    N->n[a] = N->n[b];
    N->n[b] = tmp;
    mgk_ref *refs[6] = {&N->out, &N->init, &N->x[0], &N->x[1], &N->x[2], &N->x[3]};
    for (int j = 0; j < 6; j++) {
        tmp = refs[j]->s[a];
        refs[j]->s[a] = refs[j]->s[b];
        refs[j]->s[b] = tmp;
    }
}

/* ---- 1. vector dims
 * ------------------------------------------------------------------------------ */

/* What running dim d as the vector dim costs per output, in loads of a block: an operand read
 * consecutive or broadcast along it costs one vector load per term, any other stride a gather
 * (MGK_LANES loads), and so does storing (and, accumulating, loading) an output that is strided;
 * the operand loads count once per reduction term, the output's once per output. Before packing
 * (`packed` 0), a parameter read with any stride counts as consecutive: packing can make it so
 * (step 2). The sum is divided by the share of the lanes the dim's blocks fill (a dim of 5 fills 5
 * of 8; its one partial block per row costs as much as a full one). So a 5x5 stride-2
 * convolution runs along its 8 channels (the weights packed consecutive, the input broadcast, the
 * output stored 196 apart once per 25 terms), not along output columns whose input is 2 apart;
 * and its weight gradient runs along the kernel row (consecutive outputs and inputs), not along 8
 * channels whose gradients are 196 elements apart. */
static long ref_cost(const mg_tape *t, const mgk_ref *X, int d, int packed) {
    mgk_i64 s = X->s[d];
    if (X->gather) return MGK_LANES;
    if (s == 0 || s == 1) return 1;
    return !packed && X->arr == MGK_D && is_param_ref(t, X) ? 1 : MGK_LANES;
}

static long dim_cost(const mg_tape *t, mgk_nest *N, int d, int packed) {
    mgk_ref *refs[6];
    int nr = active_refs(N, refs);
    long terms = 1, per_term = 0, per_out = 0, n = (long)N->n[d];
    for (int r = MGK_MAXO; r < MGK_MAXD; r++) terms *= (long)N->n[r];
    for (int j = 0; j < nr; j++) {
        long c = ref_cost(t, refs[j], d, packed);
        if (j == 0) per_out += N->mode == MGK_ACC ? 2 * c : c;
        else if (refs[j] == &N->init) per_out += c;
        else per_term += c;
    }
    return (terms * per_term + per_out) * 64 * ((n + MGK_LANES - 1) / MGK_LANES * MGK_LANES) / n;
}

static void choose_vector_dim(const mg_tape *t, mgk_nest *N, const mg_nest_info *I, int packed) {
    if (I->alias || I->has_gather || (N->flags & MGK_F_SCATTER)) return; /* order matters there */
    int best = -1;
    long bc = 0;
    for (int d = 0; d < MGK_MAXO; d++) {
        if (N->n[d] <= 1) continue;
        long c = dim_cost(t, N, d, packed);
        if (best < 0 || c < bc || (c == bc && N->n[d] > N->n[best])) {
            best = d;
            bc = c;
        }
    }
    if (best >= 0) swap_dims(N, best, MGK_MAXO - 1);
}

/* ---- 2. packed parameters
 * ------------------------------------------------------------------------ */

/* Whether a ref reaches a marked parameter (mg_ref__each over its elements). */
typedef struct walker {
    const mg_tape *t;
    const uint8_t *mark;
    int gather;
} walker;

static int marked_param(void *ctx, mgk_i64 pos) {
    const walker *w = ctx;
    mgk_i64 slot = w->gather ? (mgk_i64)w->t->ix[pos] : pos;
    return slot >= 0 && slot < (mgk_i64)w->t->nparams && w->mark[slot];
}

/* Whether ref X of nest N (every point, every iteration of its loop) reads a marked parameter. */
static int walk(const mg_tape *t, const mgk_nest *N, const mgk_ref *X, const uint8_t *mark) {
    walker w = {t, mark, X->gather};
    return mg_ref__each(t, (size_t)(N - t->nests), X, marked_param, &w);
}

/* The positions ref X of nest N can reach, over every point and every iteration of its loop
 * (what walk visits): [*lo, *hi]. 0 for a gathered ref, which may reach any. */
static int ref_extent(const mg_tape *t, const mgk_nest *N, const mgk_ref *X, mgk_i64 *lo,
                      mgk_i64 *hi) {
    if (X->gather) return 0;
    const size_t k = (size_t)(N - t->nests);
    mgk_i64 ext[MGK_MAXD + 1];
    for (int d = 0; d < MGK_MAXD; d++) ext[d] = N->n[d] > 1 ? X->s[d] * (N->n[d] - 1) : 0;
    ext[MGK_MAXD] = X->ts != 0 && t->info[k].seq > 1 ? X->ts * ((mgk_i64)t->info[k].seq - 1) : 0;
    *lo = *hi = X->base;
    for (int d = 0; d <= MGK_MAXD; d++) {
        if (ext[d] < 0) *lo += ext[d];
        else *hi += ext[d];
    }
    return 1;
}

/* The refs of the program that can reach a parameter, by extent. Packing asks, for each candidate
 * pack, which refs touch it: walking every ref's points for each pack took 88% of a freeze with
 * 18k packable parameters (30 s for 250k values), and comparing every ref's extent with each
 * pack still grew with packs x refs (1,600 packs: 1 s). Refs spanning up to RI_WIDE slots are
 * sorted by their first slot and found by binary search; wider and gathered ones are tried for
 * every pack. */
enum { RI_WIDE = 4096 };
typedef struct ri_ref {
    mgk_i64 lo, hi;
    uint32_t nest, q; /* q: the ref's place in active_refs */
} ri_ref;
typedef struct ref_index {
    ri_ref *narrow, *wide;
    size_t nnarrow, nwide;
} ref_index;

static int ri_less(const void *a, const void *b) {
    const ri_ref *x = a, *y = b;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    if (x->nest != y->nest) return x->nest < y->nest ? -1 : 1;
    return x->q < y->q ? -1 : x->q > y->q;
}

static int ri_build(mg_tape *t, ref_index *R) {
    size_t total = 0;
    memset(R, 0, sizeof *R);
    for (size_t m = 0; m < t->nnests; m++) {
        mgk_ref *rs[6];
        total += (size_t)active_refs(&t->nests[m], rs);
    }
    R->narrow = mg_tape__alloc(t, total ? total : 1, sizeof(ri_ref));
    R->wide = mg_tape__alloc(t, total ? total : 1, sizeof(ri_ref));
    if (!R->narrow || !R->wide) return 0;
    for (size_t m = 0; m < t->nnests; m++) {
        mgk_nest *M = &t->nests[m];
        mgk_ref *rs[6];
        const int nrs = active_refs(M, rs);
        for (int q = 0; q < nrs; q++) {
            ri_ref r = {0, (mgk_i64)t->nparams - 1, (uint32_t)m, (uint32_t)q};
            const int bounded = ref_extent(t, M, rs[q], &r.lo, &r.hi);
            if (r.hi < 0 || r.lo >= (mgk_i64)t->nparams) continue; /* no parameter in reach */
            if (bounded && r.hi - r.lo <= RI_WIDE) R->narrow[R->nnarrow++] = r;
            else R->wide[R->nwide++] = r;
        }
    }
    qsort(R->narrow, R->nnarrow, sizeof(ri_ref), ri_less);
    return 1;
}

static void ri_free(mg_tape *t, ref_index *R) {
    if (R->narrow) t->alloc.free_fn(R->narrow, t->alloc.ctx);
    if (R->wide) t->alloc.free_fn(R->wide, t->alloc.ctx);
}

/* Calls fn(t, nest, ref, ctx) for each ref whose extent meets [lo, hi] until fn returns 0; returns
 * 0 when it did. */
static int ri_each(mg_tape *t, const ref_index *R, mgk_i64 lo, mgk_i64 hi,
                   int (*fn)(mg_tape *t, mgk_nest *M, mgk_ref *X, void *ctx), void *ctx) {
    for (size_t i = 0; i < R->nwide; i++)
        if (R->wide[i].lo <= hi && R->wide[i].hi >= lo) {
            mgk_nest *M = &t->nests[R->wide[i].nest];
            mgk_ref *rs[6];
            active_refs(M, rs);
            if (!fn(t, M, rs[R->wide[i].q], ctx)) return 0;
        }
    /* the narrow refs starting from lo - RI_WIDE on: the first whose start is not below it */
    size_t a = 0, b = R->nnarrow;
    while (a < b) {
        const size_t mid = a + (b - a) / 2;
        if (R->narrow[mid].lo < lo - RI_WIDE) a = mid + 1;
        else b = mid;
    }
    for (size_t i = a; i < R->nnarrow && R->narrow[i].lo <= hi; i++)
        if (R->narrow[i].hi >= lo) {
            mgk_nest *M = &t->nests[R->narrow[i].nest];
            mgk_ref *rs[6];
            active_refs(M, rs);
            if (!fn(t, M, rs[R->narrow[i].q], ctx)) return 0;
        }
    return 1;
}

/* The first and last slots of pack P. */
static void pack_range(const mg_pack *P, mgk_i64 *lo, mgk_i64 *hi) {
    *lo = *hi = P->base;
    for (int d = 0; d < P->nd; d++) {
        const mgk_i64 e = P->s[d] * (P->n[d] - 1);
        if (e < 0) *lo += e;
        else *hi += e;
    }
}

typedef struct pack_dims {
    int nd;
    mgk_i64 n[MGK_MAXD], s[MGK_MAXD]; /* packed order, the last dim innermost */
} pack_dims;

/* The moving dims of X in nest N as (n, s) pairs, `last` moved to the end. */
static void dims_of(const mgk_nest *N, const mgk_ref *X, int last, pack_dims *p) {
    p->nd = 0;
    for (int d = 0; d < MGK_MAXD; d++)
        if (d != last && N->n[d] > 1 && X->s[d] != 0) {
            p->n[p->nd] = N->n[d];
            p->s[p->nd++] = X->s[d];
        }
    if (last >= 0 && N->n[last] > 1 && X->s[last] != 0) {
        p->n[p->nd] = N->n[last];
        p->s[p->nd++] = X->s[last];
    }
}

/* Whether ref X of nest N reads a block of pack P: each dim X moves along is one of P's dims (the
 * same stride), and X's first element is P's element at multi-index o, with o plus X's extent
 * within P along every dim (a convolution's border nest reads a window of the weights that the
 * interior nest packs whole). Gives X's base and strides in the packed copy. */
static int sub_view(const mgk_nest *N, const mgk_ref *X, const mg_pack *P, mgk_i64 *base,
                    mgk_i64 s[MGK_MAXD]) {
    if (X->gather || X->ts != 0) return 0;
    mgk_i64 ps[MGK_MAXD], o[MGK_MAXD] = {0}, acc = 1, off = X->base - P->base;
    int order[MGK_MAXD], used[MGK_MAXD] = {0};
    for (int j = P->nd; j-- > 0;) {
        ps[j] = acc;
        acc *= P->n[j];
        if (P->s[j] <= 0) return 0;
    }
    /* the offset in P's dims, largest stride first (exact for a dense block's nested strides;
     * anything else is refused, never misread: the reconstruction is checked) */
    for (int j = 0; j < P->nd; j++) order[j] = j;
    for (int j = 1; j < P->nd; j++)
        for (int q = j; q > 0 && P->s[order[q]] > P->s[order[q - 1]]; q--) {
            int tmp = order[q];
            order[q] = order[q - 1];
            order[q - 1] = tmp;
        }
    if (off < 0) return 0;
    for (int q = 0; q < P->nd; q++) {
        int j = order[q];
        o[j] = off / P->s[j];
        if (o[j] >= P->n[j]) return 0;
        off -= o[j] * P->s[j];
    }
    if (off != 0) return 0;
    *base = (mgk_i64)P->p0;
    for (int j = 0; j < P->nd; j++) *base += o[j] * ps[j];
    for (int d = 0; d < MGK_MAXD; d++) {
        s[d] = X->s[d];
        if (N->n[d] <= 1 || X->s[d] == 0) continue;
        int found = -1;
        for (int j = 0; j < P->nd && found < 0; j++)
            if (!used[j] && P->s[j] == X->s[d] && o[j] + N->n[d] <= P->n[j]) found = j;
        if (found < 0) return 0;
        used[found] = 1;
        s[d] = ps[found];
    }
    return 1;
}

static void mark_pack(const mg_pack *P, uint8_t *mark, uint8_t v) {
    mgk_i64 idx[MGK_MAXD] = {0};
    for (size_t i = 0; i < P->len; i++, mg_pack__next(P, idx)) mark[mg_pack__slot(P, idx)] = v;
}

/* Points ref X (a sub_view of P) at the packed copy. */
static void rewrite(mgk_nest *N, mgk_ref *X, const mg_pack *P) {
    mgk_i64 base, s[MGK_MAXD];
    if (!sub_view(N, X, P, &base, s)) return; /* checked before: not reached */
    memcpy(X->s, s, sizeof s);
    X->arr = X->arr == MGK_G ? MGK_PG : MGK_PW;
    X->base = base;
}

typedef struct pack_visit {
    const mg_pack *P;
    const uint8_t *cand;
} pack_visit;

/* ri_each's callbacks: a ref reaching the pack must read a block of it (0 stops: it does not);
 * then every such ref is pointed at the packed copy. */
static int reads_block(mg_tape *t, mgk_nest *M, mgk_ref *X, void *ctx) {
    const pack_visit *v = ctx;
    mgk_i64 base, strides[MGK_MAXD];
    if (X->arr == MGK_PW || X->arr == MGK_PG) return 1;
    return !walk(t, M, X, v->cand) || sub_view(M, X, v->P, &base, strides);
}

static int point_at_pack(mg_tape *t, mgk_nest *M, mgk_ref *X, void *ctx) {
    const pack_visit *v = ctx;
    if (X->arr != MGK_PW && X->arr != MGK_PG && walk(t, M, X, v->cand)) rewrite(M, X, v->P);
    return 1;
}

static int plan_packs(mg_tape *t) {
    if (!t->nparams || !t->rerolled) return MG_OK;
    uint8_t *owned = mg_tape__alloc(t, t->nparams, 1), *cand = mg_tape__alloc(t, t->nparams, 1);
    uint8_t *by_loss = mg_tape__alloc(t, t->nparams, 1); /* parameters the losses read */
    ref_index RI = {0};
    size_t cap = 0;
    int st = MG_ENOMEM;
    if (!owned || !cand || !by_loss || !ri_build(t, &RI)) goto done;
    memset(owned, 0, t->nparams);
    memset(cand, 0, t->nparams);
    memset(by_loss, 0, t->nparams);
    for (size_t i = 0; i < t->nfwd; i++)
        if (t->fwd[i].kind == MG_I_NARY)
            for (uint32_t q = 0; q < t->fwd[i].b; q++)
                if (t->ix[t->fwd[i].a + q] < t->nparams) by_loss[t->ix[t->fwd[i].a + q]] = 1;
    for (size_t k = 0; k < t->nfwd_nests; k++) {
        mgk_nest *N = &t->nests[k];
        const mg_nest_info *I = &t->info[k];
        if (I->alias || I->has_gather || N->n[3] < MGK_LANES || (N->flags & MGK_F_SCATTER))
            continue;
        mgk_ref *refs[6];
        int nr = active_refs(N, refs);
        for (int j = 1; j < nr; j++) {
            mgk_ref *X = refs[j];
            if (X->arr != MGK_D || X->ts != 0 || !is_param_ref(t, X) || X->s[3] == 0 ||
                X->s[3] == 1)
                continue;
            if (!mg_ref__injective(X, N->n, t->ix)) continue;
            pack_dims pd;
            dims_of(N, X, 3, &pd);
            /* A matrix whose rows lie S slots apart with other parameters between them (each of
             * micrograd's Neurons is its weights, then its bias): the pack first spans whole
             * rows, S wide, so that a ref reading the rows and what lies between them in the
             * caller's order (an L2 term over every parameter, cut into its blocks by split.c)
             * reads a block of it too; where that fails, the rows alone. */
            int hull = -1;
            if (pd.nd == 2)
                for (int d = 0; d < 2; d++)
                    if (pd.s[d] == 1 && pd.s[1 - d] > pd.n[d]) hull = d;
            for (int attempt = hull >= 0 ? 0 : 1; attempt < 2; attempt++) {
                mg_pack P;
                memset(&P, 0, sizeof P);
                P.base = X->base;
                P.nd = pd.nd;
                P.len = 1;
                for (int d = 0; d < pd.nd; d++) {
                    P.n[d] = attempt == 0 && d == hull ? pd.s[1 - d] : pd.n[d];
                    P.s[d] = pd.s[d];
                    P.len *= (size_t)P.n[d];
                }
                /* the pack's elements are parameters nobody packed yet */
                int ok = 1;
                {
                    mgk_i64 idx[MGK_MAXD] = {0};
                    for (size_t i = 0; i < P.len && ok; i++, mg_pack__next(&P, idx)) {
                        const mgk_i64 slot = mg_pack__slot(&P, idx);
                        ok = slot >= 0 && slot < (mgk_i64)t->nparams && !owned[slot];
                    }
                }
                if (!ok) continue;
                mark_pack(&P, cand, 1);
                mgk_i64 lo, hi;
                pack_range(&P, &lo, &hi);
                pack_visit pv = {&P, cand};
                /* every ref touching them must read a block of the pack */
                ok = ri_each(t, &RI, lo, hi, reads_block, &pv);
                /* the losses read their operands directly */
                {
                    mgk_i64 idx[MGK_MAXD] = {0};
                    for (size_t i = 0; i < P.len && ok; i++, mg_pack__next(&P, idx))
                        ok = !by_loss[mg_pack__slot(&P, idx)];
                }
                if (ok) {
                    P.p0 = t->npacked;
                    t->npacked += P.len;
                    if (!mg_tape__grow(t, (void **)&t->packs, &cap, sizeof(mg_pack), t->npacks + 1))
                        goto done;
                    t->packs[t->npacks++] = P;
                    mark_pack(&P, owned, 1);
                    ri_each(t, &RI, lo, hi, point_at_pack, &pv);
                }
                mark_pack(&P, cand, 0);
                if (ok) break;
            }
        }
    }
    t->packed = owned;
    owned = NULL;
    if (t->npacked) {
        t->pw = mg_tape__alloc(t, t->npacked + MGK_PAD, sizeof(double));
        t->pg = mg_tape__alloc(t, t->npacked + MGK_PAD, sizeof(double));
        if (!t->pw || !t->pg) goto done;
        memset(t->pw, 0, (t->npacked + MGK_PAD) * sizeof(double));
        memset(t->pg, 0, (t->npacked + MGK_PAD) * sizeof(double));
    }
    st = MG_OK;
done:
    if (owned) t->alloc.free_fn(owned, t->alloc.ctx);
    if (cand) t->alloc.free_fn(cand, t->alloc.ctx);
    if (by_loss) t->alloc.free_fn(by_loss, t->alloc.ctx);
    ri_free(t, &RI);
    return st;
}

/* Whether every operand reads consecutive or broadcast elements along dim d. */
static int lanes_contiguous(mgk_nest *N, int d) {
    mgk_ref *refs[6];
    int nr = active_refs(N, refs);
    for (int j = 1; j < nr; j++)
        if (refs[j]->s[d] != 0 && refs[j]->s[d] != 1) return 0;
    return refs[0]->s[d] == 0 || refs[0]->s[d] == 1 || d >= MGK_MAXO;
}

/* ---- 3. merged dims -------------------------------------------------------------------------- */

static void merge_range(mgk_nest *N, int lo, int hi) {
    mgk_ref *refs[6];
    int nr = active_refs(N, refs);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int d = hi - 1; d > lo; d--) {
            int a = d - 1, b = d; /* merge a (outer) into b (inner) */
            if (N->n[a] <= 1 || N->n[b] <= 1) continue;
            int ok = 1;
            for (int j = 0; j < nr && ok; j++) ok = refs[j]->s[a] == refs[j]->s[b] * N->n[b];
            if (!ok) continue;
            N->n[b] *= N->n[a];
            N->n[a] = 1;
            for (int j = 0; j < 6; j++) {
                mgk_ref *all[6] = {&N->out, &N->init, &N->x[0], &N->x[1], &N->x[2], &N->x[3]};
                all[j]->s[a] = 0;
            }
            changed = 1;
        }
        /* keep dims right-aligned: sizes of 1 to the left */
        for (int d = hi - 1; d > lo; d--)
            if (N->n[d] == 1 && N->n[d - 1] > 1) {
                swap_dims(N, d, d - 1);
                changed = 1;
            }
    }
}

/* ---- 5. fused SGD ------------------------------------------------------------------------------
 */

static int touches(const mg_tape *t, const mgk_nest *N, const mgk_ref *X, const uint8_t *mark) {
    if (X->arr == MGK_PW || X->arr == MGK_PG) return 0; /* packed refs are compared by pack below */
    return walk(t, N, X, mark);
}

static int marked(void *mark, mgk_i64 pos) { return ((const uint8_t *)mark)[pos]; }

/* Whether a ref touches an element marked in `pmark`, a mark over [0, npacked). */
static int touches_packed(const mg_tape *t, const mgk_nest *N, const mgk_ref *X,
                          const uint8_t *pmark) {
    if (X->arr != MGK_PW && X->arr != MGK_PG) return 0;
    return mg_ref__each(t, (size_t)(N - t->nests), X, marked, (void *)pmark);
}

typedef struct marker {
    uint8_t *mark;
    uint8_t v;
} marker;

static int set_mark(void *ctx, mgk_i64 pos) {
    marker *m = ctx;
    m->mark[pos] = m->v;
    return 0;
}

/* Sets mark[pos] = v at every position ref X of nest N reaches. */
static void mark_ref(const mg_tape *t, const mgk_nest *N, const mgk_ref *X, uint8_t *mark,
                     uint8_t v) {
    marker m = {mark, v};
    mg_ref__each(t, (size_t)(N - t->nests), X, set_mark, &m);
}

/* ---- the shared values' programs ---------------------------------------------------------------
 * Reroll lays the shared values (MG_C_SHARED) out as the first levels, so their nests open the
 * forward program and their gradients' nests close the backward one: t->nsh_fwd and t->nsh_bwd
 * count those instructions. Each touches shared slots alone; every other instruction touches a
 * sample's slots. Where that does not hold (no pass is known to break it), nsh_fwd and nsh_bwd stay
 * 0 and every run computes them, as a single sample does (drive.h). */

static int below_input0(void *ctx, mgk_i64 pos) {
    const mg_tape *t = ctx;
    return t->ix[pos] >= t->input0; /* stops the walk at a per-sample element */
}

/* Whether instruction `in` (not a SEQ) reads and writes shared slots alone. */
static int instr_shared(mg_tape *t, const mg_instr *in) {
    if (in->kind != MG_I_NEST) {
        if (in->out >= t->input0) return 0;
        for (uint32_t q = 0; q < in->b; q++)
            if (t->ix[in->a + q] >= t->input0) return 0;
        return 1;
    }
    mgk_nest *N = &t->nests[in->a];
    mgk_ref *refs[6];
    const int nr = active_refs(N, refs);
    for (int j = 0; j < nr; j++) {
        if (refs[j]->gather ? mg_ref__each(t, in->a, refs[j], below_input0, t) != 0
                            : refs[j]->base >= (mgk_i64)t->input0)
            return 0;
    }
    return 1;
}

/* How many instructions of `prog` lead it (from its end: close it) that are shared, a SEQ with its
 * whole body; `*stray`: whether any shared instruction is elsewhere. SIZE_MAX: out of memory. */
static size_t shared_run(mg_tape *t, const mg_instr *prog, size_t len, int from_end, int *stray) {
    size_t lead = 0, np = 0;
    int leading = 1;
    *stray = 0;
    size_t *pos = mg_tape__alloc(t, len ? len : 1, sizeof(size_t)); /* top-level instructions */
    if (!pos) return SIZE_MAX;
    for (size_t i = 0; i < len; i += prog[i].kind == MG_I_SEQ ? prog[i].a + 1 : 1) pos[np++] = i;
    for (size_t k = 0; k < np; k++) {
        const size_t at = pos[from_end ? np - 1 - k : k];
        const size_t width = prog[at].kind == MG_I_SEQ ? prog[at].a + 1 : 1;
        int sh = 1, some = 0;
        for (size_t q = prog[at].kind == MG_I_SEQ; q < width; q++) {
            const int one = instr_shared(t, &prog[at + q]);
            if (one && prog[at + q].kind == MG_I_NEST) t->info[prog[at + q].a].shared = 1;
            sh &= one;
            some |= one;
        }
        if (sh && leading) lead += width;
        else {
            leading = 0;
            *stray |= some;
        }
    }
    t->alloc.free_fn(pos, t->alloc.ctx);
    return lead;
}

static int plan_shared(mg_tape *t) {
    t->nsh_fwd = t->nsh_bwd = 0;
    if (t->shared0 == t->input0) return MG_OK;
    int stray_f, stray_b;
    const size_t pre = shared_run(t, t->fwd, t->nfwd, 0, &stray_f);
    const size_t post = shared_run(t, t->bwd, t->nbwd, 1, &stray_b);
    if (pre == SIZE_MAX || post == SIZE_MAX) return MG_ENOMEM;
    if (!stray_f && !stray_b) t->nsh_fwd = pre, t->nsh_bwd = post;
    return MG_OK;
}

static int fuse_steps(mg_tape *t) {
    if (!t->has_loss || !t->rerolled || t->nnests > 4096) return MG_OK;
    uint8_t *pm = mg_tape__alloc(t, t->nparams ? t->nparams : 1, 1);
    uint8_t *qm = mg_tape__alloc(t, t->npacked ? t->npacked : 1, 1);
    uint8_t *fused = mg_tape__alloc(t, t->nparams ? t->nparams : 1, 1);
    uint8_t *fused_p = mg_tape__alloc(t, t->npacked ? t->npacked : 1, 1);
    int st = MG_ENOMEM;
    if (!pm || !qm || !fused || !fused_p) goto done;
    memset(fused, 0, t->nparams ? t->nparams : 1);
    memset(fused_p, 0, t->npacked ? t->npacked : 1);
    for (size_t i = 0; i < t->nbwd; i++) {
        const mg_instr *in = &t->bwd[i];
        if (in->kind == MG_I_SEQ) {
            i += in->a;
            continue;
        }
        if (in->kind != MG_I_NEST) continue;
        mgk_nest *N = &t->nests[in->a];
        const mg_nest_info *I = &t->info[in->a];
        mgk_ref *O = &N->out;
        int packed = O->arr == MGK_PG;
        if (N->mode != MGK_ACC || I->alias || I->has_gather || (N->flags & MGK_F_SCATTER) ||
            O->gather || O->ts || I->shared) /* a batch runs those once, apart */
            continue;
        if (!packed && !(O->arr == MGK_G && O->base >= 0 && O->base < (mgk_i64)t->nparams))
            continue;
        /* the elements it writes */
        memset(pm, 0, t->nparams ? t->nparams : 1);
        memset(qm, 0, t->npacked ? t->npacked : 1);
        mark_ref(t, N, O, packed ? qm : pm, 1);
        int ok = 1;
        /* no other nest writes them; nothing after this one reads them */
        for (size_t j = 0; j < t->nbwd && ok; j++) {
            const mg_instr *b = &t->bwd[j];
            if (b->kind == MG_I_SEQ || j == i) continue;
            if (b->kind == MG_I_NARY_BWD) {
                for (uint32_t q = 0; q < b->b && ok; q++) {
                    mgk_idx s = t->ix[b->a + q];
                    ok = !(s < t->nparams && pm[s]);
                }
                continue;
            }
            if (b->kind != MG_I_NEST) continue;
            mgk_nest *M = &t->nests[b->a];
            mgk_ref *rs[6];
            int nrs = active_refs(M, rs);
            for (int q = 0; q < nrs && ok; q++) {
                int writes = q == 0 && (rs[q]->arr == MGK_G || rs[q]->arr == MGK_PG);
                int reads_param = rs[q]->arr == MGK_D || rs[q]->arr == MGK_PW;
                if (!writes && !(reads_param && j > i)) continue;
                ok = !(packed ? touches_packed(t, M, rs[q], qm) : touches(t, M, rs[q], pm));
            }
        }
        if (!ok) continue;
        N->flags |= MGK_F_STEP;
        N->init = *O;
        N->init.arr = packed ? MGK_PW : MGK_D;
        mark_ref(t, N, O, packed ? fused_p : fused, 1);
    }
    t->fused = fused;
    t->fused_p = fused_p;
    fused = fused_p = NULL;
    st = MG_OK;
done:;
    void *bufs[] = {pm, qm, fused, fused_p};
    for (size_t i = 0; i < 4; i++)
        if (bufs[i]) t->alloc.free_fn(bufs[i], t->alloc.ctx);
    return st;
}

/* ---- 6. gradient sums that start from zero ------------------------------------------------------
 * Backward used to zero every computed value's gradient, then accumulate. A gradient nest that
 * writes each of its outputs first (nothing earlier in the backward program touched them) starts
 * its sums from zero instead (MGK_SUM0: the same bits as accumulating into +0.0); only the
 * gradients written otherwise are zeroed, as ranges. Parameters' gradients accumulate across
 * samples and are never reset here. */

typedef struct elem_marker {
    const mg_tape *t;
    int gather;
    uint8_t *mark, *zero;
} elem_marker;

static int mark_elem(void *ctx, mgk_i64 pos) {
    elem_marker *m = ctx;
    mgk_i64 slot = m->gather ? (mgk_i64)m->t->ix[pos] : pos;
    if (slot < (mgk_i64)m->t->nslots && mg_tape__is_value(m->t, slot)) {
        if (!m->mark[slot] && m->zero) m->zero[slot] = 1;
        m->mark[slot] = 1;
    }
    return 0;
}

/* Marks the computed-value gradients a ref touches as written; those not written before get
 * zeroed (when `zero` is given). */
static void mark_elems(const mg_tape *t, const mgk_nest *N, const mgk_ref *X, uint8_t *mark,
                       uint8_t *zero) {
    elem_marker m = {t, X->gather, mark, zero};
    mg_ref__each(t, (size_t)(N - t->nests), X, mark_elem, &m);
}

static int plan_zeroing(mg_tape *t) {
    if (!t->has_loss) return MG_OK;
    uint8_t *written = mg_tape__alloc(t, t->nslots, 1), *zero = mg_tape__alloc(t, t->nslots, 1);
    size_t cap = 0;
    int st = MG_ENOMEM;
    if (!written || !zero) goto done;
    memset(written, 0, t->nslots);
    memset(zero, 0, t->nslots);
    written[t->loss] = 1; /* the seed assigns */
    for (size_t i = 0; i < t->nbwd; i++) {
        const mg_instr *in = &t->bwd[i];
        if (in->kind == MG_I_SEQ) {
            /* inside a loop every iteration writes other slots: zero what the body writes */
            for (size_t q = 1; q <= in->a; q++) {
                const mg_instr *b = &t->bwd[i + q];
                if (b->kind != MG_I_NEST) continue;
                mgk_nest *N = &t->nests[b->a];
                /* mark_elems walks every iteration of the loop itself */
                if (N->out.arr == MGK_G) mark_elems(t, N, &N->out, written, zero);
                for (int j = 0; j < 4; j++)
                    if (N->x[j].arr == MGK_G && mg_nest__x_used(N, j))
                        mark_elems(t, N, &N->x[j], written, zero);
            }
            i += in->a;
            continue;
        }
        if (in->kind == MG_I_NARY_BWD) {
            for (uint32_t q = 0; q < in->b; q++) {
                mgk_idx s = t->ix[in->a + q];
                if (mg_tape__is_value(t, s) && !written[s]) zero[s] = 1;
                if (mg_tape__is_value(t, s)) written[s] = 1;
            }
            continue;
        }
        if (in->kind != MG_I_NEST) continue;
        mgk_nest *N = &t->nests[in->a];
        const mg_nest_info *I = &t->info[in->a];
        int fresh = 1;
        /* gradients it reads must exist: any not written yet reads zero */
        for (int j = 0; j < 4; j++)
            if (N->x[j].arr == MGK_G && mg_nest__x_used(N, j))
                mark_elems(t, N, &N->x[j], written, zero);
        if (N->out.arr != MGK_G) continue; /* a parameter's packed gradient */
        /* a shared value's gradient only from the shared backward, which a batch runs once: the
         * others add each sample's into it */
        const int sh_out = N->out.base >= (mgk_i64)t->shared0 && N->out.base < (mgk_i64)t->input0;
        if (N->mode == MGK_ACC && !I->alias && !N->out.gather &&
            (N->out.base >= (mgk_i64)t->first_op || (sh_out && I->shared)) &&
            !(N->flags & (MGK_F_SCATTER | MGK_F_STEP))) {
            /* fresh when none of its outputs was written: then SUM0, nothing to zero (a max's
             * gradient writes along its reduction dims too) */
            int dims[MGK_MAXD], nd = 0;
            for (int d = 0; d < MGK_MAXD; d++)
                if (N->n[d] > 1 && N->out.s[d] != 0) dims[nd++] = d;
            mgk_i64 idx[MGK_MAXD] = {0};
            for (;;) {
                mgk_i64 pos = N->out.base;
                for (int k = 0; k < nd; k++) pos += idx[k] * N->out.s[dims[k]];
                if (written[pos]) fresh = 0;
                int k = nd - 1;
                while (k >= 0 && ++idx[k] == N->n[dims[k]]) idx[k--] = 0;
                if (k < 0) break;
            }
            if (fresh) {
                N->mode = MGK_SUM0;
                mark_elems(t, N, &N->out, written, NULL);
                continue;
            }
        }
        mark_elems(t, N, &N->out, written, zero);
    }
    for (size_t s = t->shared0; s < t->nslots;) { /* the shared values', then the samples' */
        if (s == t->input0) t->nzero_sh = t->nzero;
        if (!zero[s]) {
            s++;
            continue;
        }
        size_t e = s;
        const size_t end = s < t->input0 ? t->input0 : t->nslots;
        while (e < end && zero[e]) e++;
        if (!mg_tape__grow(t, (void **)&t->zero, &cap, sizeof(mgk_idx), t->nzero + 2)) goto done;
        t->zero[t->nzero++] = (mgk_idx)s;
        t->zero[t->nzero++] = (mgk_idx)e;
        s = e;
    }
    if (t->input0 == t->nslots) t->nzero_sh = t->nzero;
    st = MG_OK;
done:
    if (written) t->alloc.free_fn(written, t->alloc.ctx);
    if (zero) t->alloc.free_fn(zero, t->alloc.ctx);
    return st;
}

/* The SGD step's index lists. */
static int plan_steps(mg_tape *t) {
    size_t P = t->nparams ? t->nparams : 1, Q = t->npacked ? t->npacked : 1;
    t->step_d = mg_tape__alloc(t, P, sizeof(mgk_idx));
    t->step_d1 = mg_tape__alloc(t, P, sizeof(mgk_idx));
    t->step_p1 = mg_tape__alloc(t, Q, sizeof(mgk_idx));
    if (!t->step_d || !t->step_d1 || !t->step_p1) return MG_ENOMEM;
    for (size_t p = 0; p < t->nparams; p++) {
        if (t->packed && t->packed[p]) continue;
        t->step_d[t->nstep_d++] = (mgk_idx)p;
        if (!(t->fused && t->fused[p])) t->step_d1[t->nstep_d1++] = (mgk_idx)p;
    }
    for (size_t q = 0; q < t->npacked; q++)
        if (!(t->fused_p && t->fused_p[q])) t->step_p1[t->nstep_p1++] = (mgk_idx)q;
    return MG_OK;
}

/* ---- 7. register tiles and per-sample arrays ----------------------------------------------------
 */

/* A product whose lane-contiguous factor is second: swap (x0 * x1 == x1 * x0 exactly), so the
 * kernels' tiles and vector paths find the contiguous factor first. */
static void orient_product(mgk_nest *N) {
    if (N->term != MGK_T_MUL || N->x[0].s[3] != 0 || N->x[1].s[3] != 1) return;
    mgk_ref tmp = N->x[0];
    N->x[0] = N->x[1];
    N->x[1] = tmp;
}

/* Whether a slot is per-sample (an input, a target or a value) rather than shared. */
static int per_sample(const mg_tape *t, mgk_i64 slot) { return slot >= (mgk_i64)t->input0; }

static void tile_flag(const mg_tape *t, mgk_nest *N, const mg_nest_info *I) {
    N->flags &= ~MGK_F_TILE;
    if (N->term != MGK_T_MUL || N->mode == MGK_SET || I->alias || I->has_gather ||
        (N->flags & (MGK_F_SCATTER | MGK_F_SPLIT)))
        return;
    /* rows along dim 2 need x0 the same for every row: an outer dim where it is goes there (the
     * outputs are independent, so their order never changes a value) */
    for (int d = 0; d < 2 && N->x[0].s[2] != 0; d++)
        if (N->x[0].s[d] == 0 && N->n[d] > 1) swap_dims(N, d, 2);
    const mgk_ref *O = &N->out, *A = &N->x[0], *B = &N->x[1];
    if (O->gather || A->gather || B->gather || O->s[3] == 0 || A->s[3] != 1 || B->s[3] != 0) return;
    if (N->mode == MGK_SUMI && (N->init.s[3] > 1 || N->init.s[3] < 0)) return;
    int out_ps = O->arr == MGK_G   ? per_sample(t, O->base)
                 : O->arr == MGK_D ? per_sample(t, O->base)
                                   : 0;
    if (out_ps) {
        /* samples in tiles: a shared weight times a per-sample value */
        int a_ps = (A->arr == MGK_D && per_sample(t, A->base)) ||
                   (A->arr == MGK_G && per_sample(t, A->base));
        int b_ps = (B->arr == MGK_D || B->arr == MGK_G) && per_sample(t, B->base);
        /* or rows along dim 2 of each sample, x0 the same for every row (a convolution along
         * its channels: the packed weights times the input, broadcast, at each position) */
        if ((!a_ps && b_ps) || (A->s[2] == 0 && N->n[2] > 1)) N->flags |= MGK_F_TILE;
    } else if (A->s[2] == 0 && N->n[2] > 1) {
        /* a parameter's gradient: rows along dim 2, the per-row factor broadcast */
        N->flags |= MGK_F_TILE;
    }
}

typedef struct entry_converter {
    mg_tape *t;
    uint8_t *done; /* per index-table entry: converted already */
} entry_converter;

static int to_sample_entry(void *ctx, mgk_i64 pos) {
    entry_converter *c = ctx;
    mg_tape *t = c->t;
    if (!c->done[pos]) {
        if (per_sample(t, t->ix[pos])) t->ix[pos] = (t->ix[pos] - (mgk_idx)t->input0) | MGK_IX_PS;
        c->done[pos] = 1;
    }
    return 0;
}

/* Per-sample operands read the per-sample arrays: positions relative to the first input slot
 * (index tables' entries converted once: a table may serve a nest and its gradient nest). */
static int to_sample_arrays(mg_tape *t) {
    if (t->nslots - t->input0 >= (size_t)MGK_IX_PS)
        return mg_tape__fail(t, MG_ENOMEM, "freeze: more than 2^31 per-sample slots");
    uint8_t *done = mg_tape__alloc(t, t->nix ? t->nix : 1, 1);
    if (!done) return MG_ENOMEM;
    memset(done, 0, t->nix ? t->nix : 1);
    for (size_t k = 0; k < t->nnests; k++) {
        mgk_nest *N = &t->nests[k];
        mgk_ref *refs[6] = {&N->out, &N->init, &N->x[0], &N->x[1], &N->x[2], &N->x[3]};
        for (int j = 0; j < 6; j++) {
            mgk_ref *X = refs[j];
            if (X->arr != MGK_D && X->arr != MGK_G) continue;
            if (j == 1 && !(N->mode == MGK_SUMI || (N->flags & MGK_F_STEP))) continue;
            if (j >= 2 && !mg_nest__x_used(N, j - 2)) continue;
            if (!X->gather) {
                if (per_sample(t, X->base)) {
                    X->arr = X->arr == MGK_D ? MGK_BD : MGK_BG;
                    X->base -= (mgk_i64)t->input0;
                }
                continue;
            }
            /* a table: each entry it reaches (every point, every iteration of its loop) names its
             * own array; the ref keeps D or G (nest_kernels.h's mgk_gat) */
            entry_converter c = {t, done};
            mg_ref__each(t, k, X, to_sample_entry, &c);
        }
    }
    t->alloc.free_fn(done, t->alloc.ctx);
    return MG_OK;
}

/* Where the loss lives during a call when it is a packed parameter itself (its value, and the
 * seed of its gradient, are in pw and pg then). */
static void find_packed_loss(mg_tape *t) {
    t->loss_pw = SIZE_MAX;
    if (!t->has_loss || t->loss >= t->nparams || !t->packed || !t->packed[t->loss]) return;
    for (size_t k = 0; k < t->npacks; k++) {
        const mg_pack *P = &t->packs[k];
        mgk_i64 idx[MGK_MAXD] = {0};
        for (size_t i = 0; i < P->len; i++, mg_pack__next(P, idx))
            if (mg_pack__slot(P, idx) == (mgk_i64)t->loss) {
                t->loss_pw = P->p0 + i;
                return;
            }
    }
}

/* ---- 8. pre-steps ------------------------------------------------------------------------------
 * At batch size 1, the fused step of a layer's weights for one sample (gradient nest G: W -= lr *
 * (0 + g * x)) and the next sample's forward through the layer (nest F: out = init + sum W * x1)
 * touch the same weights back to back. Where F alone among the forward nests reads those weights,
 * each once, G can wait: the driver keeps the per-sample elements G reads, and F steps each weight
 * right before it reads it (MGK_F_PRESTEP), with G's arithmetic: the same bits, one pass over the
 * weights per sample instead of two. Checked element by element: F's point that reads W[p] has,
 * at its output and at its x1, the gradient and the value that G's point for W[p] reads. */

/* The next point of a nest's iteration space (row-major over all its dims); 0 after the last. */
static int next_point(const mgk_i64 *n, mgk_i64 *i) {
    for (int d = MGK_MAXD - 1; d >= 0; d--) {
        if (++i[d] < n[d]) return 1;
        i[d] = 0;
    }
    return 0;
}

/* The position of a direct ref at a point (no sequential loop). */
static mgk_i64 pos_at(const mgk_ref *X, const mgk_i64 *i) {
    mgk_i64 p = X->base;
    for (int d = 0; d < MGK_MAXD; d++) p += X->s[d] * i[d];
    return p;
}

/* Whether the refs a nest reads and writes are direct, outside sequential loops. */
static int plain_refs(mgk_nest *N) {
    mgk_ref *rs[6];
    int nrs = active_refs(N, rs);
    for (int q = 0; q < nrs; q++)
        if (rs[q]->gather || rs[q]->ts) return 0;
    return 1;
}

typedef struct pre_scratch {
    mgk_i64 *gpos, *xpos; /* per packed element: G's gradient and value positions */
    uint8_t *mark;        /* 1: G steps it; 2: F read it */
} pre_scratch;

/* The forward nest that gradient nest G's step can wait for, or -1; fills its entry. */
static long pair_prestep(mg_tape *t, size_t gk, pre_scratch *S, mg_prestep *ps) {
    mgk_nest *G = &t->nests[gk];
    const mg_nest_info *GI = &t->info[gk];
    if (!GI->grad || GI->seq != 1 || GI->alias || GI->has_gather || !(G->flags & MGK_F_STEP) ||
        (G->flags & (MGK_F_SPLIT | MGK_F_SCATTER)) || G->term != MGK_T_MUL || G->mode != MGK_ACC ||
        G->out.arr != MGK_PG || G->init.arr != MGK_PW || !plain_refs(G))
        return -1;
    for (int d = MGK_MAXO; d < MGK_MAXD; d++)
        if (G->n[d] != 1) return -1;
    int gi = G->x[0].arr == MGK_BG ? 0 : 1;
    if (G->x[gi].arr != MGK_BG || G->x[1 - gi].arr != MGK_BD) return -1;
    /* G's elements: each once, with the positions it reads */
    mgk_i64 i[MGK_MAXD] = {0}, count = 0;
    long f = -1;
    int ok = 1;
    ps->glo = ps->xlo = INT64_MAX;
    ps->ghi = ps->xhi = INT64_MIN;
    do {
        mgk_i64 w = pos_at(&G->init, i), g = pos_at(&G->x[gi], i), x = pos_at(&G->x[1 - gi], i);
        if (w < 0 || w >= (mgk_i64)t->npacked || S->mark[w]) {
            ok = 0;
            break;
        }
        S->mark[w] = 1;
        S->gpos[w] = g;
        S->xpos[w] = x;
        count++;
        if (g < ps->glo) ps->glo = g;
        if (g >= ps->ghi) ps->ghi = g + 1;
        if (x < ps->xlo) ps->xlo = x;
        if (x >= ps->xhi) ps->xhi = x + 1;
    } while (next_point(G->n, i));
    /* exactly one forward nest reads them, through its x0 */
    for (size_t k = 0; k < t->nfwd_nests && ok; k++) {
        mgk_nest *M = &t->nests[k];
        mgk_ref *rs[6];
        int nrs = active_refs(M, rs);
        for (int q = 0; q < nrs && ok; q++) {
            if (!touches_packed(t, M, rs[q], S->mark)) continue;
            if (f >= 0 || rs[q] != &M->x[0]) ok = 0;
            else f = (long)k;
        }
    }
    mgk_nest *F = f >= 0 ? &t->nests[f] : NULL;
    const mg_nest_info *FI = f >= 0 ? &t->info[f] : NULL;
    if (!ok || !F || F->term != MGK_T_MUL || (F->mode != MGK_SUMI && F->mode != MGK_SUM0) ||
        !(F->flags & MGK_F_BLOCK) || (F->flags & (MGK_F_SPLIT | MGK_F_SCATTER | MGK_F_STEP)) ||
        FI->seq != 1 || !FI->loss_cone || FI->has_gather || FI->alias || !plain_refs(F) ||
        F->out.arr != MGK_BD || F->x[0].arr != MGK_PW || F->x[1].arr != MGK_BD ||
        F->out.s[3] != 1 || F->x[0].s[3] != 1 || F->x[1].s[3] != 0)
        ok = 0;
    /* ... each element once, where F's output and x1 are G's gradient and value */
    if (ok) {
        memset(i, 0, sizeof i);
        mgk_i64 seen = 0;
        do {
            mgk_i64 w = pos_at(&F->x[0], i);
            if (w < 0 || w >= (mgk_i64)t->npacked || S->mark[w] != 1 ||
                S->gpos[w] != pos_at(&F->out, i) || S->xpos[w] != pos_at(&F->x[1], i)) {
                ok = 0;
                break;
            }
            S->mark[w] = 2;
            seen++;
        } while (next_point(F->n, i));
        ok = ok && seen == count;
    }
    /* the scratch cleared for the next candidate */
    memset(i, 0, sizeof i);
    do {
        mgk_i64 w = pos_at(&G->init, i);
        if (w >= 0 && w < (mgk_i64)t->npacked) S->mark[w] = 0;
    } while (next_point(G->n, i));
    if (!ok) return -1;
    ps->fwd = (uint32_t)f;
    ps->bwd = (uint32_t)gk;
    return f;
}

static int plan_presteps(mg_tape *t) {
    if (!t->has_loss || !t->rerolled || !t->npacked || t->nnests > 4096) return MG_OK;
    size_t cand = 0;
    for (size_t k = t->nfwd_nests; k < t->nnests; k++)
        cand += (t->nests[k].flags & MGK_F_STEP) && t->nests[k].out.arr == MGK_PG;
    if (!cand) return MG_OK;
    pre_scratch S;
    S.gpos = mg_tape__alloc(t, t->npacked, sizeof(mgk_i64));
    S.xpos = mg_tape__alloc(t, t->npacked, sizeof(mgk_i64));
    S.mark = mg_tape__alloc(t, t->npacked, 1);
    t->pre = mg_tape__alloc(t, cand, sizeof(mg_prestep));
    int st = MG_ENOMEM;
    if (!S.gpos || !S.xpos || !S.mark || !t->pre) goto done;
    memset(S.mark, 0, t->npacked);
    for (size_t k = t->nfwd_nests; k < t->nnests; k++) {
        mg_prestep ps;
        long f = pair_prestep(t, k, &S, &ps);
        if (f < 0) continue;
        t->nests[f].flags |= MGK_F_PRESTEP;
        t->pre[t->npre++] = ps;
        t->info[k].pre = (uint32_t)t->npre;
    }
    st = MG_OK;
done:;
    void *bufs[] = {S.gpos, S.xpos, S.mark};
    for (size_t q = 0; q < 3; q++)
        if (bufs[q]) t->alloc.free_fn(bufs[q], t->alloc.ctx);
    return st;
}

/* ---- 9. bands ---------------------------------------------------------------------------------
 */

static void band_flag(mgk_nest *N) {
    N->flags &= ~MGK_F_BAND;
    if ((N->flags & MGK_F_STEP) && !MGK_PS(&N->out) && !N->out.gather &&
        N->n[2] >= 2 * MGK_TS_MAX && mg_nest__reads_samples(N))
        N->flags |= MGK_F_BAND;
}

int mg_schedule(mg_tape *t) {
    int sst = plan_shared(t);
    if (sst != MG_OK) return sst;
    for (size_t k = 0; k < t->nnests; k++) choose_vector_dim(t, &t->nests[k], &t->info[k], 0);
    int st = plan_packs(t);
    if (st != MG_OK) return st;
    find_packed_loss(t);
    for (size_t k = 0; k < t->nnests; k++) {
        mgk_nest *N = &t->nests[k];
        const mg_nest_info *I = &t->info[k];
        choose_vector_dim(t, N, I, 1); /* packing changed strides */
        merge_range(N, 0, MGK_MAXO);
        merge_range(N, MGK_MAXO, MGK_MAXD);
        orient_product(N);
        N->flags &= ~(MGK_F_BLOCK | MGK_F_SPLIT);
        if (N->flags & MGK_F_SCATTER) continue;
        if (N->term >= MGK_T_MAXR) { /* in blocks where no two points write one element */
            if (!I->alias && !I->has_gather && N->n[3] >= 2) N->flags |= MGK_F_BLOCK;
            continue;
        }
        int can_split = I->grad && !I->has_gather && N->mode != MGK_SET && N->n[7] >= MGK_LANES;
        /* a vector dim narrower than a block: one partial block per row, worth it where every
         * operand is consecutive or broadcast along it and split sums are not the better plan */
        int can_block =
            !I->has_gather && !I->alias &&
            (N->n[3] >= MGK_LANES || (N->n[3] >= 2 && lanes_contiguous(N, 3) && N->out.s[3] == 1 &&
                                      !(can_split && lanes_contiguous(N, 7))));
        /* a gradient sum whose lanes would be strided (a packed weight read transposed) but
         * whose innermost reduction dim is contiguous: split sums along it instead */
        if (can_block && can_split && !lanes_contiguous(N, 3) && lanes_contiguous(N, 7))
            can_block = 0;
        if (can_block) N->flags |= MGK_F_BLOCK;
        else if (can_split && (N->n[7] >= 2 * MGK_LANES || lanes_contiguous(N, 7)))
            N->flags |= MGK_F_SPLIT;
    }
    if ((st = fuse_steps(t)) != MG_OK || (st = plan_steps(t)) != MG_OK) return st;
    if (t->rerolled && (st = plan_zeroing(t)) != MG_OK) return st;
    for (size_t k = 0; k < t->nnests; k++) tile_flag(t, &t->nests[k], &t->info[k]);
    if ((st = to_sample_arrays(t)) != MG_OK) return st;
    for (size_t k = 0; k < t->nnests; k++) band_flag(&t->nests[k]);
    return plan_presteps(t);
}
