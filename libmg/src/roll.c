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
    h = mix(h, kb);
    for (int d = 0; d < MGK_MAXD; d++) h = mix(h, (uint64_t)N->n[d]);
    h = ref_shape(h, &N->out);
    h = ref_shape(h, &N->init);
    for (int j = 0; j < 4; j++) h = ref_shape(h, &N->x[j]);
    return h | 1; /* nonzero */
}

/* The region a ref's first element lies in: parameters, constants, inputs and targets, values.
 * A loop may only roll nests whose every operand stays in one region: the backward program
 * decides per operand whether it needs a gradient. */
static int region(const mg_tape *t, const mgk_ref *X) {
    mgk_i64 slot = X->gather ? (mgk_i64)t->ix[X->base] : X->base;
    return slot < (mgk_i64)t->nparams    ? 0
           : slot < (mgk_i64)t->input0   ? 1
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

int mg_roll(mg_tape *t) {
    size_t K = t->nfwd;
    if (K < 2) return MG_OK;
    uint64_t *h = mg_tape__alloc(t, K, sizeof(uint64_t));
    mg_instr *prog = mg_tape__alloc(t, K, sizeof(mg_instr));
    mgk_nest *nests = mg_tape__alloc(t, t->nnests ? t->nnests : 1, sizeof(mgk_nest));
    mg_nest_info *info = mg_tape__alloc(t, t->nnests ? t->nnests : 1, sizeof(mg_nest_info));
    mgk_i64 *delta = mg_tape__alloc(t, (size_t)MAXP * 6, sizeof(mgk_i64));
    int st = MG_ENOMEM;
    if (!h || !prog || !nests || !info || !delta) goto done;
    for (size_t i = 0; i < K; i++) h[i] = shape_of(t, &t->fwd[i]);
    size_t np = 0, nn = 0;
    for (size_t i = 0; i < K;) {
        size_t best_p = 0, best_T = 1;
        for (size_t p = 1; p <= MAXP && i + 2 * p <= K; p++) {
            size_t q;
            for (q = 0; q < p; q++)
                if (!same_shape(t, &t->fwd[i + q], &t->fwd[i + p + q], h[i + q], h[i + p + q]))
                    break;
            if (q < p) continue;
            for (q = 0; q < p; q++) {
                mgk_i64 b0[6], b1[6];
                bases(&t->nests[t->fwd[i + q].a], b0);
                bases(&t->nests[t->fwd[i + p + q].a], b1);
                for (int j = 0; j < 6; j++) delta[q * 6 + j] = b1[j] - b0[j];
            }
            size_t T = 2;
            for (; i + (T + 1) * p <= K; T++) {
                int ok = 1;
                for (q = 0; q < p && ok; q++) {
                    const mg_instr *a = &t->fwd[i + q], *b = &t->fwd[i + T * p + q];
                    if (!same_shape(t, a, b, h[i + q], h[i + T * p + q])) {
                        ok = 0;
                        break;
                    }
                    mgk_i64 b0[6], b1[6];
                    bases(&t->nests[a->a], b0);
                    bases(&t->nests[b->a], b1);
                    for (int j = 0; j < 6 && ok; j++)
                        ok = b1[j] - b0[j] == (mgk_i64)T * delta[q * 6 + j];
                }
                if (!ok) break;
            }
            if (p * T > best_p * best_T || best_p == 0) {
                best_p = p;
                best_T = T;
                /* keep the deltas of the best block at the front */
            }
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
    return st;
}
