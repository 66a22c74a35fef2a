/* Hoisting: nests that do not depend on their sequential loop leave it.
 *
 * Rolling (roll.c) turns a recurrent model's time steps into a sequential loop that runs every
 * nest of the step once per iteration. Some of those nests do not depend on the recurrence: an
 * RNN's input projection `b + Wx x_t` reads only the input row of step t and the weights, and the
 * backward program's weight gradient `dWh += g_t h_{t-1}^T` only adds into an array no other nest
 * of the loop touches. Run inside the loop, each is a small nest per step (a matrix-vector
 * product, an outer product into memory); taken out, the iterations become a dim of one nest: an
 * outer dim (the input projections of every step, one matrix product before the loop) or, for a
 * gradient that every step adds into, the outermost reduction dim (one product after the loop,
 * each sum kept in a register instead of loaded and stored per step).
 *
 * Forward programs hoist nests to just before their loop, backward programs sink gradient nests
 * to just after theirs. Whether a nest may move is decided element by element over the loop's
 * accesses, with times `e * p + q` (iteration e in execution order, body position q of p):
 *   hoisting N: every element N reads at time T is written in the loop at T or later only, and
 *     every element N writes at time T is touched in the loop at T or later only (so no other
 *     nest's access, and no other iteration of N, comes between the old and the new order);
 *   sinking N: every element N reads through its operands is last written in the loop before the
 *     time N reads it (its value then is its value after the loop), and not by N itself (whose
 *     iterations become a dim: they may not read each other's results), and no other nest of the
 *     loop touches the elements N writes.
 * Each moved nest's iterations then run in the loop's order along the new dim; a reduction over
 * it adds each iteration's terms in the order the loop did, so at batch size 1 the results are
 * bitwise those of the loop. (In a batch, a shared gradient now sums iteration by iteration
 * inside each sample rather than sample by sample inside each iteration: the order of the
 * unbatched definition. The gradients of a nest hoisted in the forward program come from
 * autodiff as a reduction over its new dim, in forward order rather than the reversed loop's:
 * the same to rounding.) Loops reading through index tables are left as they are. */
#include "ir.h"

#include <string.h>

#define NONE UINT32_MAX
#define MANY (UINT32_MAX - 1)

/* Per slot of the array the program writes (data in forward programs, gradients in backward
 * ones; the other array is only read, so it constrains nothing): first write, first access,
 * last write + 1 (0: none), and the body position of the only nest touching it (or MANY).
 * Allocated once per program, over every slot, and reset after each loop by visiting what the
 * loop touched, so the work is linear in the loops' accesses. */
typedef struct loop_map {
    int arr; /* MGK_D or MGK_G */
    size_t n;
    uint32_t *first_w, *first_a, *last_w1, *owner;
} loop_map;

/* The refs nest N reads besides its output (which an MGK_ACC nest also reads): init, x used. */
static int read_refs(const mgk_nest *N, const mgk_ref **refs) {
    int k = 0;
    if (N->mode == MGK_SUMI) refs[k++] = &N->init;
    for (int j = 0; j < 4; j++)
        if (mg_nest__x_used(N, j)) refs[k++] = &N->x[j];
    return k;
}

/* The smallest and largest position ref X reaches over the nest's dims and T iterations. */
static void ref_bounds(const mgk_nest *N, const mgk_ref *X, mgk_i64 T, mgk_i64 *lo, mgk_i64 *hi) {
    mgk_i64 a = X->base, b = X->base;
    for (int d = 0; d < MGK_MAXD; d++) {
        mgk_i64 span = X->s[d] * (N->n[d] - 1);
        if (span < 0) a += span;
        else b += span;
    }
    mgk_i64 span = X->ts * (T - 1);
    if (span < 0) a += span;
    else b += span;
    *lo = a;
    *hi = b;
}

enum { V_MARK_R, V_MARK_W, V_HOIST_R, V_HOIST_W, V_SINK_R, V_SINK_W, V_RESET };

/* Visits every element ref X of the nest at body position q reaches, in the iterations that
 * matter: all of them when X moves with the loop; else, where the elements are the same every
 * iteration, the first and last in execution order (marking), the last (hoisting checks, which
 * fail more easily the later the access) or the first (sinking checks). Returns 0 when a check
 * fails. */
static int visit(loop_map *M, const mgk_nest *N, const mgk_ref *X, uint32_t T, int rev, uint32_t q,
                 uint32_t p, int what) {
    int dims[MGK_MAXD], nd = 0;
    if (X->arr != M->arr) return 1; /* never written in this program */
    for (int d = 0; d < MGK_MAXD; d++)
        if (N->n[d] > 1 && X->s[d] != 0) dims[nd++] = d;
    for (uint32_t e = 0; e < T; e++) {
        if (X->ts == 0) { /* the same elements every iteration: only the binding ones */
            const int want = what == V_MARK_R || what == V_MARK_W || what == V_RESET
                                 ? e == 0 || e + 1 == T
                             : what == V_HOIST_R || what == V_HOIST_W ? e + 1 == T
                                                                      : e == 0;
            if (!want) continue;
        }
        const mgk_i64 it = rev ? (mgk_i64)(T - 1 - e) : (mgk_i64)e;
        const uint32_t tau = e * p + q;
        mgk_i64 idx[MGK_MAXD] = {0};
        for (;;) {
            mgk_i64 pos = X->base + it * X->ts;
            for (int k = 0; k < nd; k++) pos += idx[k] * X->s[dims[k]];
            const size_t i = (size_t)pos; /* within [0, M->n): plain_body checked the bounds */
            switch (what) {
            case V_MARK_W:
                /* nests are marked one after another, not in time order: min and max */
                if (M->first_w[i] == NONE || tau < M->first_w[i]) M->first_w[i] = tau;
                if (tau + 1 > M->last_w1[i]) M->last_w1[i] = tau + 1;
                /* fall through */
            case V_MARK_R:
                if (M->first_a[i] == NONE || tau < M->first_a[i]) M->first_a[i] = tau;
                M->owner[i] = M->owner[i] == NONE || M->owner[i] == q ? q : MANY;
                break;
            case V_HOIST_R:
                if (M->first_w[i] != NONE && M->first_w[i] < tau) return 0;
                break;
            case V_HOIST_W:
                if (M->first_a[i] < tau) return 0;
                break;
            case V_SINK_R:
                if (M->last_w1[i] > tau) return 0; /* written at or after the read */
                /* written by N itself (the only nest touching what N writes, once sunk): its
                 * iterations would read each other's results, which a dim cannot order */
                if (M->last_w1[i] && M->owner[i] == q) return 0;
                break;
            case V_RESET:
                M->first_w[i] = M->first_a[i] = M->owner[i] = NONE;
                M->last_w1[i] = 0;
                break;
            default: /* V_SINK_W */
                if (M->owner[i] != q) return 0;
            }
            int k = nd - 1; /* odometer */
            while (k >= 0 && ++idx[k] == N->n[dims[k]]) idx[k--] = 0;
            if (k < 0) break;
        }
    }
    return 1;
}

/* Whether the loop's body may be analysed: nests only, no index tables, every element within
 * the slots, outputs in the array the map follows. */
static int plain_body(const mg_tape *t, const mg_instr *body, uint32_t p, uint32_t T,
                      const loop_map *M) {
    for (uint32_t q = 0; q < p; q++) {
        if (body[q].kind != MG_I_NEST) return 0;
        const mgk_nest *N = &t->nests[body[q].a];
        if (N->out.arr != M->arr) return 0;
        const mgk_ref *refs[6] = {&N->out, &N->init, &N->x[0], &N->x[1], &N->x[2], &N->x[3]};
        for (int j = 0; j < 6; j++) {
            if (refs[j]->gather || (refs[j]->arr != MGK_D && refs[j]->arr != MGK_G)) return 0;
            mgk_i64 lo, hi;
            ref_bounds(N, refs[j], T, &lo, &hi);
            if (refs[j]->arr == M->arr && (lo < 0 || hi >= (mgk_i64)M->n)) return 0;
        }
    }
    return 1;
}

/* Gives nest k the loop's iterations as dim d (in execution order) and leaves the loop. */
static void add_dim(mg_tape *t, size_t k, int d, uint32_t T, int rev) {
    mgk_nest *N = &t->nests[k];
    mgk_ref *refs[6] = {&N->out, &N->init, &N->x[0], &N->x[1], &N->x[2], &N->x[3]};
    N->n[d] = T;
    for (int j = 0; j < 6; j++) {
        refs[j]->s[d] = rev ? -refs[j]->ts : refs[j]->ts;
        if (rev) refs[j]->base += (mgk_i64)(T - 1) * refs[j]->ts;
        refs[j]->ts = 0;
    }
    t->info[k].seq = 1;
}

/* Moves the iterations of nest k out of the loop, if its shape has room: an outer dim where its
 * output moves with the loop (each element written once), the outermost reduction dim where it
 * adds into the same elements every iteration. Returns 0 when it does not fit. */
static int reshape(mg_tape *t, size_t k, uint32_t T, int rev) {
    mgk_nest *N = &t->nests[k];
    if (N->flags & MGK_F_SCATTER) return 0;
    if (N->out.ts == 0) {
        if (N->mode != MGK_ACC) return 0;
        int f = MGK_MAXO;
        while (f < MGK_MAXD && N->n[f] > 1) f++;
        if (f == MGK_MAXD) return 0;
        mgk_ref *refs[6] = {&N->out, &N->init, &N->x[0], &N->x[1], &N->x[2], &N->x[3]};
        for (int d = f; d > MGK_MAXO; d--) { /* the reduction dims before f move in by one */
            N->n[d] = N->n[d - 1];
            for (int j = 0; j < 6; j++) refs[j]->s[d] = refs[j]->s[d - 1];
        }
        N->n[MGK_MAXO] = 1;
        add_dim(t, k, MGK_MAXO, T, rev);
        return 1;
    }
    int d = MGK_MAXO - 1;
    while (d >= 0 && N->n[d] > 1) d--;
    if (d < 0) return 0;
    mgk_nest save = *N;
    mg_nest_info isave = t->info[k];
    add_dim(t, k, d, T, rev);
    if (!mg_ref__injective(&N->out, N->n, t->ix)) {
        *N = save;
        t->info[k] = isave;
        return 0;
    }
    return 1;
}

/* One loop of `prog` at `at`: moves what may leave it, rewriting prog[at .. at + p] in place.
 * `sink`: the backward program (nests move after the loop), else before it. */
static int hoist_loop(mg_tape *t, mg_instr *prog, size_t at, int sink, loop_map *M, size_t *moved) {
    mg_instr *body = prog + at + 1;
    const uint32_t p = prog[at].a, T = prog[at].b;
    const int rev = prog[at].flags & 1;
    if (T < 2 || p == 0 || (uint64_t)T * p >= MANY || !plain_body(t, body, p, T, M)) return MG_OK;
    for (uint32_t q = 0; q < p; q++) {
        const mgk_nest *N = &t->nests[body[q].a];
        const mgk_ref *refs[6];
        int nr = read_refs(N, refs);
        for (int j = 0; j < nr; j++) visit(M, N, refs[j], T, rev, q, p, V_MARK_R);
        if (N->mode == MGK_ACC) visit(M, N, &N->out, T, rev, q, p, V_MARK_R);
        visit(M, N, &N->out, T, rev, q, p, V_MARK_W);
    }
    /* which nests move: checked against the loop as it stands, all together (a pair of nests
     * whose order would change with an access in common fails one of the checks) */
    uint8_t *go = mg_tape__alloc(t, p, 1);
    int ok = go != NULL;
    uint32_t ngo = 0;
    for (uint32_t q = 0; q < p && go; q++) {
        const mgk_nest *N = &t->nests[body[q].a];
        const mgk_ref *refs[6];
        int nr = read_refs(N, refs);
        ok = 1;
        for (int j = 0; j < nr && ok; j++)
            ok = visit(M, N, refs[j], T, rev, q, p, sink ? V_SINK_R : V_HOIST_R);
        if (ok) ok = visit(M, N, &N->out, T, rev, q, p, sink ? V_SINK_W : V_HOIST_W);
        go[q] = (uint8_t)(ok && reshape(t, body[q].a, T, rev));
        ngo += go[q];
    }
    /* the map cleared for the next loop: a moved nest's new dim covers the same elements */
    for (uint32_t q = 0; q < p; q++) {
        const mgk_nest *N = &t->nests[body[q].a];
        const mgk_ref *refs[6];
        int nr = read_refs(N, refs);
        for (int j = 0; j < nr; j++) visit(M, N, refs[j], T, rev, q, p, V_RESET);
        visit(M, N, &N->out, T, rev, q, p, V_RESET);
    }
    if (!go) return MG_ENOMEM;
    if (ngo) { /* [moved][loop][rest] or [loop][rest][moved], each in body order */
        mg_instr *tmp = mg_tape__alloc(t, p, sizeof(mg_instr));
        if (!tmp) {
            t->alloc.free_fn(go, t->alloc.ctx);
            return MG_ENOMEM;
        }
        const mg_instr head = prog[at];
        size_t w = 0;
        if (!sink)
            for (uint32_t q = 0; q < p; q++)
                if (go[q]) tmp[w++] = body[q];
        for (uint32_t q = 0; q < p; q++)
            if (!go[q]) tmp[w++] = body[q];
        if (sink)
            for (uint32_t q = 0; q < p; q++)
                if (go[q]) tmp[w++] = body[q];
        /* the loop's head goes in front of the nests that stay */
        size_t first = sink ? 0 : ngo;
        for (size_t i = 0; i < first; i++) prog[at + i] = tmp[i];
        prog[at + first] = head;
        prog[at + first].a = p - ngo;
        for (size_t i = first; i < p; i++) prog[at + 1 + i] = tmp[i];
        t->alloc.free_fn(tmp, t->alloc.ctx);
        *moved += ngo;
    }
    t->alloc.free_fn(go, t->alloc.ctx);
    return MG_OK;
}

/* Drops loops left empty (t->nseq counts the forward program's). */
static void drop_empty(mg_tape *t, mg_instr *prog, size_t *len, int backward) {
    size_t w = 0;
    for (size_t i = 0; i < *len; i++) {
        if (prog[i].kind == MG_I_SEQ && prog[i].a == 0) {
            if (!backward) t->nseq--;
            continue;
        }
        prog[w++] = prog[i];
    }
    *len = w;
}

int mg_hoist(mg_tape *t, int backward) {
    mg_instr *prog = backward ? t->bwd : t->fwd;
    size_t *len = backward ? &t->nbwd : &t->nfwd;
    loop_map M;
    memset(&M, 0, sizeof M);
    M.arr = backward ? MGK_G : MGK_D;
    M.n = t->nslots;
    int st = MG_OK;
    for (size_t i = 0; i < *len && st == MG_OK; i++) {
        if (prog[i].kind != MG_I_SEQ) continue;
        const uint32_t p = prog[i].a;
        if (!M.first_w) { /* the first loop: the map, all clear */
            M.first_w = mg_tape__alloc(t, M.n ? M.n : 1, 4 * sizeof(uint32_t));
            if (!M.first_w) return MG_ENOMEM;
            M.first_a = M.first_w + M.n;
            M.last_w1 = M.first_a + M.n;
            M.owner = M.last_w1 + M.n;
            for (size_t k = 0; k < M.n; k++) {
                M.first_w[k] = M.first_a[k] = M.owner[k] = NONE;
                M.last_w1[k] = 0;
            }
        }
        st = hoist_loop(t, prog, i, backward, &M, &t->nhoisted);
        /* past the loop, whatever moved: its p + 1 instructions stay p + 1 */
        i += p;
    }
    if (M.first_w) t->alloc.free_fn(M.first_w, t->alloc.ctx);
    if (st == MG_OK) drop_empty(t, prog, len, backward);
    return st;
}
