/* Splitting: a nest that reads parameters as one run across blocks that other nests read as
 * blocks is cut at the blocks' edges.
 *
 * micrograd's demo adds an L2 term to its loss, `alpha * sum(p*p for p in model.parameters())`:
 * one reduction over every parameter in the caller's order, W1's rows, then b1, W2, b2. Its nest
 * reads them as a single run of slots, which no layer's block of weights is a view of, so no
 * weight could be packed (schedule.c: every ref touching a pack must read a block of it): an
 * MLP 784-32-10 trained 16x slower at batch size 1 with the term than without. Here, before the
 * backward program is derived, such a nest becomes one nest per piece of the run between block
 * edges, a piece that is a block reading it in the block's dims (W1's 25,088 slots as 32 rows of
 * 784): its gradient nests then read the same pieces, and the layers' weights are packed again.
 * The pieces of a reduction add their terms in the run's order (the first piece keeps the mode,
 * the others continue the sum, MGK_ACC), so every value is bitwise what the whole nest computes.
 *
 * A block is a parameter ref of a forward nest, in two dims or more, over a dense row-major
 * rectangle of slots (each stride the product of the extents inside it, the innermost 1), or over
 * rows of a matrix with other parameters between them (micrograd's Neuron: its weights, then its
 * bias), then spanning whole rows, of MIN_BLOCK elements at least. A run is a parameter ref moving
 * along one dim only, with stride 1, in a nest outside sequential loops that reads no index table,
 * along an outer dim or the outermost reduction dim of more than one point (see run_dim); it is cut
 * where it contains a block whole, into at most MAXPIECES pieces. */
#include "ir.h"

#include <string.h>

/* Blocks smaller than this are left alone: each piece is a nest more in both programs, which
 * cost the moons demo's MLP(2,[16,16,1]) (blocks of 48 and 272) more per sample than packing
 * gained it: 0.8x at batch size 1. */
#define MIN_BLOCK 1024

typedef struct blk {
    mgk_i64 lo, hi;
    int nd;
    mgk_i64 n[MGK_MAXD], s[MGK_MAXD]; /* largest stride first */
} blk;

/* The refs a nest reads or writes that carry slots: out, init where used, the operands used. */
static int nest_refs(mgk_nest *N, mgk_ref **refs) {
    int k = 0;
    refs[k++] = &N->out;
    if (N->mode == MGK_SUMI) refs[k++] = &N->init;
    for (int j = 0; j < 4; j++)
        if (mg_nest__x_used(N, j)) refs[k++] = &N->x[j];
    return k;
}

static int param_ref(const mg_tape *t, const mgk_ref *X) {
    return X->arr == MGK_D && !X->gather && X->base >= 0 && X->base < (mgk_i64)t->nparams;
}

/* The block ref X of nest N reads, if it is one (dense, row-major, at least 2 elements). */
static int block_of(const mg_tape *t, const mgk_nest *N, const mgk_ref *X, blk *B) {
    if (!param_ref(t, X) || X->ts != 0) return 0;
    B->nd = 0;
    for (int d = 0; d < MGK_MAXD; d++) {
        if (N->n[d] <= 1 || X->s[d] == 0) continue;
        if (X->s[d] < 0) return 0;
        int q = B->nd++;
        for (; q > 0 && B->s[q - 1] < X->s[d]; q--) B->n[q] = B->n[q - 1], B->s[q] = B->s[q - 1];
        B->n[q] = N->n[d];
        B->s[q] = X->s[d];
    }
    if (B->nd < 2) return 0; /* one dim of stride 1 is never packed (schedule.c) */
    mgk_i64 elems = 1;
    for (int q = 0; q < B->nd; q++) elems *= B->n[q];
    if (elems < MIN_BLOCK) return 0;
    /* rows S apart with other parameters between them: the block spans whole rows, as
     * schedule.c packs such a matrix where it can */
    if (B->nd == 2 && B->s[1] == 1 && B->s[0] > B->n[1]) B->n[1] = B->s[0];
    mgk_i64 size = 1;
    for (int q = B->nd; q-- > 0;) {
        if (B->s[q] != size) return 0;
        size *= B->n[q];
    }
    B->lo = X->base;
    B->hi = X->base + size;
    return B->hi <= (mgk_i64)t->nparams;
}

/* The dim along which nest N reads a run of parameters to cut (see above), or -1; `run` gets the
 * ref. */
static int run_dim(const mg_tape *t, mgk_nest *N, mgk_ref **run) {
    mgk_ref *refs[6];
    const int nr = nest_refs(N, refs);
    for (int j = 0; j < nr; j++) {
        const mgk_ref *X = refs[j];
        if (!param_ref(t, X) || X->ts != 0) continue;
        int dim = -1, moves = 0;
        for (int d = 0; d < MGK_MAXD; d++)
            if (N->n[d] > 1 && X->s[d] != 0) moves++, dim = d;
        if (moves != 1 || X->s[dim] != 1 || X->base + N->n[dim] > (mgk_i64)t->nparams) continue;
        /* a sum's pieces run one after the other: only its outermost reduction dim keeps the
         * order of its terms when cut (a run inside a repetition, sum(p*p for p in ps + ps),
         * would add the repetitions piece by piece) */
        int outer = 0;
        for (int e = MGK_MAXO; e < dim && dim >= MGK_MAXO; e++) outer |= N->n[e] > 1;
        if (outer) continue;
        *run = refs[j];
        return dim;
    }
    return -1;
}

/* The dims of one side of nest N (outer: 0..MGK_MAXO, reduction: MGK_MAXO..MGK_MAXD) with dim d
 * replaced by the dims of a piece of length len at offset off along it (`B` its block's dims, or
 * NULL for one dim of stride 1), right-aligned on that side; every ref's base advanced by the
 * offset times its stride along d. Returns 0 when the side has no room for the dims. */
static int reshape_piece(mgk_nest *P, int d, mgk_i64 off, mgk_i64 len, const blk *B) {
    const int lo = d < MGK_MAXO ? 0 : MGK_MAXO, hi = lo + MGK_MAXO;
    mgk_ref *refs[6] = {&P->out, &P->init, &P->x[0], &P->x[1], &P->x[2], &P->x[3]};
    mgk_i64 n[2 * MGK_MAXD], s[6][2 * MGK_MAXD];
    int k = 0;
    for (int e = lo; e < hi; e++) {
        if (e != d && P->n[e] <= 1) continue;
        const int parts = e == d && B ? B->nd : 1;
        for (int q = 0; q < parts; q++, k++) {
            n[k] = e != d ? P->n[e] : B ? B->n[q] : len;
            for (int j = 0; j < 6; j++) s[j][k] = refs[j]->s[e] * (e != d ? 1 : B ? B->s[q] : 1);
        }
    }
    if (k > MGK_MAXO) return 0;
    for (int j = 0; j < 6; j++) refs[j]->base += refs[j]->s[d] * off;
    for (int e = lo; e < hi; e++) {
        const int q = e - (hi - k); /* right-aligned */
        P->n[e] = q >= 0 ? n[q] : 1;
        for (int j = 0; j < 6; j++) refs[j]->s[e] = q >= 0 ? s[j][q] : 0;
    }
    return 1;
}

/* The pieces of nest N's run along dim d (ref X), cut at the edges of the blocks it contains
 * whole, into `P` (at most `cap`). Returns how many, or 0 when it is not cut. */
static size_t cut_run(const mgk_nest *N, int d, const mgk_ref *X, const blk *blocks, size_t nb,
                      mgk_nest *P, size_t cap) {
    const mgk_i64 lo = X->base, hi = X->base + N->n[d];
    size_t count = 0, inside = 0;
    mgk_i64 at = lo;
    while (at < hi) {
        /* the longest block starting at `at` within the run, else the next edge of a block
         * after `at` */
        const blk *B = NULL;
        mgk_i64 next = hi;
        for (size_t b = 0; b < nb; b++) {
            const blk *C = &blocks[b];
            if (C->lo < lo || C->hi > hi) continue;
            if (C->lo == at && (!B || C->hi > B->hi)) B = C;
            if (C->lo > at && C->lo < next) next = C->lo;
            if (C->lo < at && C->hi > at && C->hi < next) next = C->hi;
        }
        if (B) next = B->hi, inside++;
        if (count == cap) return 0;
        mgk_nest *Q = &P[count++];
        *Q = *N;
        if (!reshape_piece(Q, d, at - lo, next - at, B)) return 0;
        if (d >= MGK_MAXO && at > lo) { /* a later piece of a sum continues it */
            Q->mode = MGK_ACC;
            memset(&Q->init, 0, sizeof Q->init);
        }
        at = next;
    }
    return inside ? count : 0;
}

#define MAXPIECES 48

int mg_split(mg_tape *t) {
    if (!t->rerolled || !t->nparams || !t->nnests || t->nnests != t->nfwd_nests) return MG_OK;
    const size_t K = t->nnests;
    int st = MG_ENOMEM;
    blk *blocks = mg_tape__alloc(t, 6 * K, sizeof(blk));
    uint8_t *in_loop = mg_tape__alloc(t, K, 1);
    mgk_nest *pieces = mg_tape__alloc(t, MAXPIECES, sizeof(mgk_nest));
    uint32_t *npieces = mg_tape__alloc(t, K, sizeof(uint32_t));
    mgk_nest *nests = NULL;
    mg_nest_info *info = NULL;
    if (!blocks || !in_loop || !pieces || !npieces) goto done;
    size_t nb = 0;
    for (size_t k = 0; k < K; k++) {
        mgk_ref *refs[6];
        const int nr = nest_refs(&t->nests[k], refs);
        for (int j = 1; j < nr; j++)
            if (block_of(t, &t->nests[k], refs[j], &blocks[nb])) nb++;
    }
    memset(in_loop, 0, K);
    for (size_t i = 0; i < t->nfwd; i++)
        if (t->fwd[i].kind == MG_I_SEQ)
            for (uint32_t q = 1; q <= t->fwd[i].a && i + q < t->nfwd; q++)
                if (t->fwd[i + q].kind == MG_I_NEST) in_loop[t->fwd[i + q].a] = 1;
    size_t total = 0, cut = 0;
    for (size_t k = 0; k < K; k++) {
        mgk_ref *X;
        const int d = in_loop[k] || t->info[k].has_gather ? -1 : run_dim(t, &t->nests[k], &X);
        npieces[k] =
            d < 0 ? 0 : (uint32_t)cut_run(&t->nests[k], d, X, blocks, nb, pieces, MAXPIECES);
        total += npieces[k] ? npieces[k] : 1;
        cut += npieces[k] != 0;
    }
    if (!cut) {
        st = MG_OK;
        goto done;
    }
    nests = mg_tape__alloc(t, total, sizeof(mgk_nest));
    info = mg_tape__alloc(t, total, sizeof(mg_nest_info));
    if (!nests || !info) goto done;
    /* the nests, nest k's pieces in its place; npieces[k] becomes the index of its first */
    size_t m = 0;
    for (size_t k = 0; k < K; k++) {
        mgk_ref *X;
        const uint32_t np = npieces[k];
        if (np) {
            const int d = run_dim(t, &t->nests[k], &X);
            cut_run(&t->nests[k], d, X, blocks, nb, pieces, MAXPIECES);
            for (uint32_t q = 0; q < np; q++) {
                nests[m + q] = pieces[q];
                info[m + q] = t->info[k];
                double w = 1.0;
                for (int e = 0; e < MGK_MAXD; e++) w *= (double)pieces[q].n[e];
                info[m + q].work = w;
            }
        } else {
            nests[m] = t->nests[k];
            info[m] = t->info[k];
        }
        npieces[k] = (uint32_t)m; /* now: nest k's first piece */
        m += np ? np : 1;
    }
    /* the program: a nest's instruction becomes one per piece (nests in loops are never cut) */
    mg_instr *prog = mg_tape__alloc(t, t->nfwd + (total - K), sizeof(mg_instr));
    if (!prog) goto done;
    size_t len = 0;
    for (size_t i = 0; i < t->nfwd; i++) {
        const mg_instr *in = &t->fwd[i];
        if (in->kind != MG_I_NEST) {
            prog[len++] = *in;
            continue;
        }
        const uint32_t k = in->a, to = k + 1 < K ? npieces[k + 1] : (uint32_t)total;
        for (uint32_t q = npieces[k]; q < to; q++) {
            prog[len] = *in;
            prog[len++].a = q;
        }
    }
    t->alloc.free_fn(t->fwd, t->alloc.ctx);
    t->fwd = prog;
    t->nfwd = len;
    t->alloc.free_fn(t->nests, t->alloc.ctx);
    t->alloc.free_fn(t->info, t->alloc.ctx);
    t->nests = nests;
    t->info = info;
    nests = NULL;
    info = NULL;
    t->nnests = t->nfwd_nests = total;
    st = MG_OK;
done:;
    void *bufs[] = {blocks, in_loop, pieces, npieces, nests, info};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) t->alloc.free_fn(bufs[i], t->alloc.ctx);
    if (st != MG_OK && t->status == MG_OK) mg_tape__fail(t, st, "freeze: out of memory");
    return st;
}
