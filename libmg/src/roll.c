/* Rolling: repeated runs of nests become sequential loops.
 *
 * A recurrent model applies the same nests at every time step, each step's operands shifted by
 * a constant number of slots (its input row, the previous step's state). Where the forward
 * program holds a block of p nests repeated T times, each repetition equal to the first but for
 * operand bases that grow by the same amount per repetition, the block becomes one sequential
 * loop `for t < T` over its first repetition, every operand's base growing by `ts` per
 * iteration. The loop runs exactly the instructions it replaces, in the same order, so no
 * dependence needs checking: this is a compression of the program, not a transformation. */
#include "ir.h"

#include <string.h>

#define MAXP 64 /* longest block tried */

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0xBF58476D1CE4E5B9ull;
}

static uint64_t ref_shape(uint64_t h, const mgk_ref *X) {
    h = mix(h, (uint64_t)X->arr | (uint64_t)X->gather << 8);
    for (int d = 0; d < MGK_MAXD; d++) h = mix(h, (uint64_t)X->s[d]);
    return h;
}

/* Everything but the operand bases. */
static uint64_t shape_of(const mg_tape *t, const mg_instr *in) {
    if (in->kind != MG_I_NEST) return 0; /* never repeated */
    const mgk_nest *N = &t->nests[in->a];
    uint64_t kb;
    memcpy(&kb, &N->k, sizeof kb);
    uint64_t h = mix(0x9E37ull, (uint64_t)N->mode | (uint64_t)N->term << 8 | (uint64_t)N->op << 16 |
                                    (uint64_t)N->flags << 24 | (uint64_t)in->cone << 32);
    h = mix(h, kb ^ (uint64_t)N->pre);
    for (int d = 0; d < MGK_MAXD; d++) h = mix(h, (uint64_t)N->n[d]);
    h = ref_shape(h, &N->out);
    h = ref_shape(h, &N->init);
    for (int j = 0; j < 4; j++) h = ref_shape(h, &N->x[j]);
    return h | 1; /* nonzero */
}

/* The region a ref's first element lies in: parameters, constants, shared values, inputs and
 * targets, values. A loop may only roll nests whose every operand stays in one region: the
 * backward program decides per operand whether it needs a gradient, and the driver runs the
 * shared values' nests once per batch. */
static int region(const mg_tape *t, const mgk_ref *X) {
    mgk_i64 slot = X->gather ? (mgk_i64)t->ix[X->base] : X->base;
    return slot < (mgk_i64)t->nparams    ? 0
           : slot < (mgk_i64)t->shared0  ? 1
           : slot < (mgk_i64)t->input0   ? 4
           : slot < (mgk_i64)t->first_op ? 2
                                         : 3;
}

static int same_regions(const mg_tape *t, const mgk_nest *a, const mgk_nest *b) {
    const mgk_ref *ra[6] = {&a->out, &a->init, &a->x[0], &a->x[1], &a->x[2], &a->x[3]};
    const mgk_ref *rb[6] = {&b->out, &b->init, &b->x[0], &b->x[1], &b->x[2], &b->x[3]};
    for (int j = 0; j < 6; j++)
        if (region(t, ra[j]) != region(t, rb[j])) return 0;
    return 1;
}

static int same_shape(const mg_tape *t, const mg_instr *a, const mg_instr *b, uint64_t ha,
                      uint64_t hb) {
    if (!ha || ha != hb) return 0;
    const mgk_nest *x = &t->nests[a->a], *y = &t->nests[b->a];
    mgk_nest u = *x, v = *y;
    mgk_ref *ru[6] = {&u.out, &u.init, &u.x[0], &u.x[1], &u.x[2], &u.x[3]};
    mgk_ref *rv[6] = {&v.out, &v.init, &v.x[0], &v.x[1], &v.x[2], &v.x[3]};
    for (int j = 0; j < 6; j++) ru[j]->base = rv[j]->base = 0;
    return a->cone == b->cone && memcmp(&u, &v, sizeof u) == 0 && same_regions(t, x, y);
}

static void bases(const mgk_nest *N, mgk_i64 *b) {
    b[0] = N->out.base;
    b[1] = N->init.base;
    for (int j = 0; j < 4; j++) b[2 + j] = N->x[j].base;
}

/* The forward program's nests as the search compares them: a class per shape (same_shape(), an
 * equivalence: equal classes, equal shapes; 0 for an instruction that is not a nest), each
 * nest's six bases and which of its refs lie among the parameters (bit j: ref j of bases()). */
typedef struct shapes {
    uint32_t *cls;
    mgk_i64 *bas;
    uint8_t *param;
    uint64_t *memo; /* best_block() from each position: p << 32 | T, 0 not yet known */
} shapes;

/* Whether a repetition reads other parameters than the one before it (delta: its bases' growth).
 * Such a block is not rolled: layers of one shape with their own weights (an MLP's equal hidden
 * layers, a stacked RNN's first steps) would read their weights at a base that moves with t,
 * which no packed copy of a weight block describes, and rolling saves only code, not work. */
static int moves_params(const shapes *S, size_t i, const mgk_i64 *delta) {
    for (int j = 0; j < 6; j++)
        if (delta[j] != 0 && (S->param[i] >> j & 1)) return 1;
    return 0;
}

/* The block that covers the most nests from position i: p nests repeated T times (p = 0: none).
 * `delta` is scratch for one repetition's base differences. */
static void search_block(const shapes *S, mgk_i64 *delta, size_t i, size_t K, size_t *bp,
                         size_t *bT) {
    const uint32_t *cls = S->cls;
    const mgk_i64 *bas = S->bas;
    size_t best_p = 0, best_T = 1;
    for (size_t p = 1; p <= MAXP && i + 2 * p <= K; p++) {
        size_t q;
        for (q = 0; q < p; q++)
            if (!cls[i + q] || cls[i + q] != cls[i + p + q]) break;
        if (q < p) continue;
        for (q = 0; q < p; q++) {
            for (int j = 0; j < 6; j++)
                delta[q * 6 + j] = bas[(i + p + q) * 6 + j] - bas[(i + q) * 6 + j];
            if (moves_params(S, i + q, delta + q * 6)) break;
        }
        if (q < p) continue;
        size_t T = 2;
        for (; i + (T + 1) * p <= K; T++) {
            int ok = 1;
            for (q = 0; q < p && ok; q++) {
                size_t a = i + q, b = i + T * p + q;
                ok = cls[a] == cls[b];
                for (int j = 0; j < 6 && ok; j++)
                    ok = bas[b * 6 + j] - bas[a * 6 + j] == (mgk_i64)T * delta[q * 6 + j];
            }
            if (!ok) break;
        }
        if (p * T > best_p * best_T || best_p == 0) {
            best_p = p;
            best_T = T;
        }
    }
    *bp = best_p;
    *bT = best_T;
}

/* search_block() from i, each position searched once. */
static void best_block(shapes *S, mgk_i64 *delta, size_t i, size_t K, size_t *bp, size_t *bT) {
    if (!S->memo[i]) {
        search_block(S, delta, i, K, bp, bT);
        S->memo[i] = (uint64_t)*bp << 32 | (uint64_t)*bT;
    }
    *bp = (size_t)(S->memo[i] >> 32);
    *bT = (size_t)(S->memo[i] & 0xffffffffu);
}

/* Rolls greedily (the best block from each position) from *pos until *pos >= target; returns the
 * nests that makes (a block's body, or a single nest). */
static size_t greedy(shapes *S, mgk_i64 *delta, size_t *pos, size_t target, size_t K) {
    size_t made = 0;
    while (*pos < target && *pos < K) {
        size_t p, T;
        best_block(S, delta, *pos, K, &p, &T);
        made += p ? p : 1;
        *pos += p ? p * T : 1;
    }
    return made;
}

/* Whether rolling from j (the nests i .. j-1 single, then pj nests repeated Tj times) makes fewer
 * nests than rolling from i (pi nests repeated Ti times), each continued greedily until both
 * reach the same position (up to 64 rounds; else no). */
static int later_is_better(shapes *S, mgk_i64 *delta, size_t K, size_t i, size_t pi, size_t Ti,
                           size_t j, size_t pj, size_t Tj) {
    size_t a = i + pi * Ti, b = j + pj * Tj, ca = pi, cb = (j - i) + pj;
    for (int round = 0; a != b && round < 64; round++) {
        if (a < b) ca += greedy(S, delta, &a, b, K);
        else cb += greedy(S, delta, &b, a, K);
    }
    return a == b && cb < ca;
}

/* Fills S for the forward program; h[i] is shape_of() instruction i. Returns 0 out of memory. */
static int classify(mg_tape *t, const uint64_t *h, size_t K, shapes *S) {
    size_t cap = 16;
    while (cap < 2 * K) cap *= 2;
    uint32_t *table = mg_tape__alloc(t, cap, sizeof(uint32_t)), ncls = 0;
    if (!table) return 0;
    memset(table, 0, cap * sizeof(uint32_t));
    for (size_t i = 0; i < K; i++) {
        S->cls[i] = 0;
        S->param[i] = 0;
        memset(S->bas + i * 6, 0, 6 * sizeof(mgk_i64));
        if (!h[i]) continue;
        const mgk_nest *N = &t->nests[t->fwd[i].a];
        const mgk_ref *r[6] = {&N->out, &N->init, &N->x[0], &N->x[1], &N->x[2], &N->x[3]};
        bases(N, S->bas + i * 6);
        for (int j = 0; j < 6; j++) S->param[i] |= (uint8_t)((region(t, r[j]) == 0) << j);
        size_t slot = (size_t)h[i] & (cap - 1);
        for (; table[slot]; slot = (slot + 1) & (cap - 1)) {
            size_t rep = table[slot] - 1;
            if (h[rep] == h[i] && same_shape(t, &t->fwd[rep], &t->fwd[i], h[rep], h[i])) break;
        }
        if (table[slot]) {
            S->cls[i] = S->cls[table[slot] - 1];
        } else {
            table[slot] = (uint32_t)i + 1;
            S->cls[i] = ++ncls;
        }
    }
    t->alloc.free_fn(table, t->alloc.ctx);
    return 1;
}

int mg_roll(mg_tape *t) {
    size_t K = t->nfwd;
    if (K < 2) return MG_OK;
    uint64_t *h = mg_tape__alloc(t, K, sizeof(uint64_t));
    mg_instr *prog = mg_tape__alloc(t, K, sizeof(mg_instr));
    mgk_nest *nests = mg_tape__alloc(t, t->nnests ? t->nnests : 1, sizeof(mgk_nest));
    mg_nest_info *info = mg_tape__alloc(t, t->nnests ? t->nnests : 1, sizeof(mg_nest_info));
    mgk_i64 *delta = mg_tape__alloc(t, (size_t)MAXP * 6, sizeof(mgk_i64));
    shapes S = {mg_tape__alloc(t, K, sizeof(uint32_t)), mg_tape__alloc(t, K, 6 * sizeof(mgk_i64)),
                mg_tape__alloc(t, K, 1), mg_tape__alloc(t, K, sizeof(uint64_t))};
    int st = MG_ENOMEM;
    if (!h || !prog || !nests || !info || !delta || !S.cls || !S.bas || !S.param || !S.memo)
        goto done;
    memset(S.memo, 0, K * sizeof(uint64_t));
    for (size_t i = 0; i < K; i++) h[i] = shape_of(t, &t->fwd[i]);
    if (!classify(t, h, K, &S)) goto done;
    size_t np = 0, nn = 0;
    size_t at = 0, at_p = 0, at_T = 1; /* a block found to start at `at`, nests before it single */
    for (size_t i = 0; i < K;) {
        size_t best_p = 0, best_T = 1;
        if (at_p && i == at) {
            best_p = at_p;
            best_T = at_T;
            at_p = 0;
        } else if (!at_p) {
            best_block(&S, delta, i, K, &best_p, &best_T);
            /* A prologue that differs from the steps (a stacked RNN's first step, which has no
             * lower layer's step beside it in its levels) can make the steps match only as
             * blocks of several steps from i. A block starting within one period after i, the
             * nests before it left single, is taken instead when it makes fewer nests: first
             * estimated up to where the farther of the two blocks ends (nests neither covers
             * counted as single), for the best such block, then counted with both continued
             * greedily to a common position (the nests after the nearer block may roll too). */
            size_t lim = i + best_p < K ? i + best_p : K, best_cost = SIZE_MAX;
            for (size_t j = i + 1; j < lim; j++) {
                size_t pj, Tj;
                best_block(&S, delta, j, K, &pj, &Tj);
                if (!pj) continue;
                size_t end_i = i + best_p * best_T, end_j = j + pj * Tj;
                size_t end = end_i > end_j ? end_i : end_j;
                size_t cost_i = best_p + (end - end_i), cost_j = (j - i) + pj + (end - end_j);
                if (cost_j < cost_i && cost_j < best_cost) {
                    best_cost = cost_j;
                    at = j;
                    at_p = pj;
                    at_T = Tj;
                }
            }
            if (at_p && !later_is_better(&S, delta, K, i, best_p, best_T, at, at_p, at_T)) at_p = 0;
            if (at_p) best_p = 0; /* i stays single */
        }
        if (best_p) {
            /* recompute the best block's deltas (the loop above overwrote them) */
            mg_instr seq;
            memset(&seq, 0, sizeof seq);
            seq.kind = MG_I_SEQ;
            seq.a = (uint32_t)best_p;
            seq.b = (uint32_t)best_T;
            for (size_t q = 0; q < best_p; q++) seq.cone |= t->fwd[i + q].cone;
            prog[np++] = seq;
            for (size_t q = 0; q < best_p; q++) {
                const mg_instr *a = &t->fwd[i + q];
                mgk_nest N = t->nests[a->a];
                mgk_i64 b0[6], b1[6];
                bases(&t->nests[a->a], b0);
                bases(&t->nests[t->fwd[i + best_p + q].a], b1);
                mgk_ref *refs[6] = {&N.out, &N.init, &N.x[0], &N.x[1], &N.x[2], &N.x[3]};
                for (int j = 0; j < 6; j++) refs[j]->ts = b1[j] - b0[j];
                nests[nn] = N;
                info[nn] = t->info[a->a];
                info[nn].seq = (uint32_t)best_T;
                info[nn].work *= (double)best_T;
                prog[np] = *a;
                prog[np++].a = (uint32_t)nn++;
            }
            t->nseq++;
            i += best_p * best_T;
        } else {
            prog[np] = t->fwd[i];
            if (t->fwd[i].kind == MG_I_NEST) {
                nests[nn] = t->nests[t->fwd[i].a];
                info[nn] = t->info[t->fwd[i].a];
                prog[np].a = (uint32_t)nn++;
            }
            np++;
            i++;
        }
    }
    memcpy(t->fwd, prog, np * sizeof(mg_instr));
    t->nfwd = np;
    if (nn) { /* a program may have no nests (its arrays are then NULL) */
        memcpy(t->nests, nests, nn * sizeof(mgk_nest));
        memcpy(t->info, info, nn * sizeof(mg_nest_info));
    }
    t->nnests = t->nfwd_nests = nn;
    st = MG_OK;
done:
    if (h) t->alloc.free_fn(h, t->alloc.ctx);
    if (prog) t->alloc.free_fn(prog, t->alloc.ctx);
    if (nests) t->alloc.free_fn(nests, t->alloc.ctx);
    if (info) t->alloc.free_fn(info, t->alloc.ctx);
    if (delta) t->alloc.free_fn(delta, t->alloc.ctx);
    void *sb[4] = {S.cls, S.bas, S.param, S.memo};
    for (int j = 0; j < 4; j++)
        if (sb[j]) t->alloc.free_fn(sb[j], t->alloc.ctx);
    return st;
}
