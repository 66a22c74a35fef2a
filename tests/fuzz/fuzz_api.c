/* libFuzzer harness: random programs against libmg's C API.
 *
 * The input is a little program: each command byte picks an action (make a value, apply any op
 * of the table, a variadic op, checkpoint, restore, backward, autofree handles, freeze a tape and
 * run it: forward, backward, fit, predict, emit), the following bytes its arguments. Allocation
 * failure can be armed at any point. Whatever the bytes, the library must not crash, leak or
 * touch memory it does not own (ASan/UBSan/LeakSanitizer watch), and must keep its invariants,
 * which the harness checks (__builtin_trap on a broken one).
 *
 * Built by meson with -Dfuzz=true, clang and ASan+UBSan: ./dev fuzz explores open-ended, ./dev
 * test fuzz replays tests/fuzz/corpus/api and explores a bounded number of runs. */
#include <mg/mg.h>

#include "../c/failing_alloc.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *p;
    size_t n;
} input;

static unsigned byte(input *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

static double number(input *in) {
    static const double special[] = {0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-300, 1e300, 710.0, -745.0};
    unsigned b = byte(in);
    if (b < 200) return ((double)b - 100.0) / 16.0;
    if (b < 210) return special[b - 200];
    if (b == 210) return NAN;
    if (b == 211) return INFINITY;
    if (b == 212) return -INFINITY;
    double x;
    uint8_t raw[8] = {0};
    for (int i = 0; i < 8; i++) raw[i] = (uint8_t)byte(in);
    memcpy(&x, raw, sizeof x);
    return x;
}

#define POOL 48

/* the harness's handles: a value, its serial, whether the harness holds a reference */
typedef struct {
    mg_value *v[POOL];
    uint64_t serial[POOL];
    int held[POOL];
    size_t n;
} pool_t;

static void push(pool_t *P, mg_value *v, int autofree) {
    if (!v || P->n >= POOL) return;
    P->v[P->n] = v;
    P->serial[P->n] = mg_value_serial(v);
    P->held[P->n] = autofree;
    if (autofree) mg_value_retain(v);
    P->n++;
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) __builtin_trap();                                                             \
    } while (0)

/* A tape call's status is what the tape then reports: mg_tape_last_status() equal to it, and a
 * message exactly when it failed (the bindings raise with that message). */
#define CHECK_TAPE_STATUS(t, st)                                                                   \
    CHECK(mg_tape_last_status(t) == (st) && ((st) == MG_OK) == (mg_tape_last_error(t)[0] == '\0'))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    input in = {data, size};
    failing_alloc fa = {0};
    mg_allocator al = failing_allocator(&fa); /* disarmed until command 8 */
    mg_graph *g = mg_graph_new_with(&al);
    if (!g) return 0;
    pool_t P;
    P.n = 0;
    mg_value **pool = P.v;
    uint64_t *serial = P.serial;
    int *held = P.held;
#define np (P.n)
    mg_graph_checkpoint cps[8];
    size_t ncp = 0;
    int autofree = 0;

    for (int steps = 0; in.n && steps < 400; steps++) {
        unsigned cmd = byte(&in) % 12;
        size_t len_before = mg_graph_len(g);
        switch (cmd) {
        case 0: /* a leaf */
            if (np < POOL) {
                mg_value *v = mg_scalar(g, number(&in));
                if (!v) CHECK(mg_graph_len(g) == len_before);
                push(&P, v, autofree);
            }
            break;
        case 1: { /* any op of the table, by index, on any pool entries (stale ones included) */
            if (!np || np >= POOL) break;
            int op = (int)(byte(&in) % (MG_OP_COUNT + 2)) - 1;
            mg_value *a = pool[byte(&in) % np], *b = pool[byte(&in) % np];
            mg_value *v = mg_apply(g, op, a, b, number(&in));
            if (v) CHECK(mg_value_op(v) == op);
            else CHECK(mg_graph_len(g) == len_before); /* a failed op leaves the graph as it was */
            push(&P, v, autofree);
            break;
        }
        case 2: { /* variadic ops */
            if (!np || np >= POOL) break;
            size_t n = 1 + byte(&in) % 6;
            mg_value *a[6], *b[6];
            for (size_t i = 0; i < n; i++) {
                a[i] = pool[byte(&in) % np];
                b[i] = pool[byte(&in) % np];
            }
            mg_value *v = NULL;
            switch (byte(&in) % 6) {
            case 0: v = mg_sum(g, a, n); break;
            case 1: v = mg_dot(g, a, b, n); break;
            case 2: v = mg_affine(g, a, b, n, b[0]); break;
            case 3: v = mg_mse(g, a, b, n); break;
            case 4: v = mg_hinge(g, a, b, n); break;
            case 5: v = mg_cross_entropy(g, a, n, b[0]); break;
            }
            if (!v) CHECK(mg_graph_len(g) == len_before);
            push(&P, v, autofree);
            break;
        }
        case 3: /* checkpoint */
            if (ncp < 8) cps[ncp++] = mg_graph_save(g);
            break;
        case 4: /* restore: later values die; their handles go stale */
            if (ncp) {
                mg_graph_restore(g, cps[--ncp]);
                for (size_t i = 0; i < np; i++)
                    if (!mg_value_is_live(pool[i], serial[i])) held[i] = 0;
            }
            break;
        case 5: /* backward from anything (and one chain-rule step) */
            if (np) {
                unsigned k = byte(&in); /* bit 7: then one more chain-rule step from there */
                size_t i = k % np;
                int st = mg_backward(g, pool[i]);
                CHECK(st == MG_OK || st == MG_EINVAL || st == MG_ENOMEM);
                if (st == MG_EINVAL) CHECK(!mg_value_is_live(pool[i], serial[i]));
                if (k & 0x80) {
                    st = mg_value_backward_step(g, pool[i]);
                    CHECK(st == MG_OK || st == MG_EINVAL || st == MG_ENOMEM);
                    /* (a released pool entry's slot may hold a newer value: stepped, as
                     * mg_backward does) */
                    if (st == MG_EINVAL) CHECK(!mg_value_is_live(pool[i], serial[i]));
                }
            }
            break;
        case 6: /* autofree on: handles from now on are retained */
            if (!autofree) {
                mg_graph_set_autofree(g, 1);
                autofree = 1;
            }
            break;
        case 7: /* drop a handle */
            if (np) {
                size_t i = byte(&in) % np;
                if (held[i] && mg_value_is_live(pool[i], serial[i])) mg_value_release(g, pool[i]);
                held[i] = 0;
            }
            break;
        case 8: { /* arm allocation failure: the k-th allocation from now (0: disarm) */
            long k = byte(&in) % 24;
            fa.fail_at = k ? fa.count + k : 0;
            break;
        }
        case 9: /* freeze a tape over random roles and run it */
            if (np >= 2) {
                mg_value *loss = pool[byte(&in) % np];
                mg_value *cand[POOL];
                size_t nl = 0;
                for (size_t i = 0; i < np; i++)
                    if (mg_value_is_live(pool[i], serial[i]) &&
                        mg_value_op(pool[i]) == MG_OP_LEAF) {
                        int dup = 0;
                        for (size_t j = 0; j < nl; j++) dup |= cand[j] == pool[i];
                        if (!dup) cand[nl++] = pool[i];
                    }
                size_t nin = nl ? byte(&in) % (nl + 1) : 0;
                mg_tape_spec spec = {loss,       cand,     nin,   NULL, 0,
                                     cand + nin, nl - nin, &loss, 1,    (int)(byte(&in) & 1)};
                mg_tape *t = mg_tape_freeze(g, &spec);
                if (!t) {
                    CHECK(mg_graph_len(g) == len_before);
                    break;
                }
                double X[16 * 8] = {0}, out[16];
                for (size_t i = 0; i < 16 * 8 && i < 16 * nin; i++) X[i] = number(&in);
                int st = mg_tape_forward(t, X, NULL);
                CHECK_TAPE_STATUS(t, st);
                st = mg_tape_backward(t);
                CHECK_TAPE_STATUS(t, st);
                st = mg_tape_step(t, 0.01, 1);
                CHECK_TAPE_STATUS(t, st);
                size_t bs = 1 + byte(&in) % 5, th = 1 + byte(&in) % 2;
                mg_fit_options fo = {bs, 0.01, 1, 7, 0, th};
                st = mg_tape_fit(t, X, NULL, nin <= 8 ? 16 : 0, &fo, NULL);
                /* MG_EINVAL only for data a loss gives a meaning: an input used as a class */
                CHECK(st == MG_OK || st == MG_ENOMEM ||
                      (st == MG_EINVAL && strstr(mg_tape_last_error(t), "not a class index")));
                CHECK_TAPE_STATUS(t, st);
                if (nin <= 8) {
                    st = mg_tape_predict(t, X, 16, out);
                    CHECK_TAPE_STATUS(t, st);
                }
                char *src = mg_tape_emit_c(t, NULL, NULL);
                CHECK_TAPE_STATUS(t, src ? MG_OK : MG_ENOMEM); /* the default prefix is valid */
                mg_tape_free_source(t, src);
                mg_emit_options o = {"fz_", 1, (int)(byte(&in) & 1), 0};
                src = mg_tape_emit_c(t, &o, NULL);
                CHECK_TAPE_STATUS(t, src ? MG_OK : MG_ENOMEM);
                mg_tape_free_source(t, src);
                mg_tape_write_back(t, g);
                mg_tape_free(t);
            }
            break;
        case 10: mg_graph_zero_grad(g); break;
        case 11: /* an MLP over pool values */
            if (np >= 2 && np < POOL - 4) {
                mg_rng r;
                mg_rng_seed(&r, byte(&in));
                size_t sizes[2] = {1 + byte(&in) % 3, 1 + byte(&in) % 2};
                mg_mlp *m = mg_mlp_new(g, 2, sizes, 2, (mg_activation)(byte(&in) % MG_ACT_COUNT),
                                       MG_INIT_SCALED, &r);
                if (m) {
                    mg_value *x[2] = {pool[byte(&in) % np], pool[byte(&in) % np]}, *o[2];
                    if (mg_mlp_call(g, m, x, o) == MG_OK) push(&P, o[0], autofree);
                    mg_mlp_free(m);
                }
            }
            break;
        }
    }
#undef np
    fa.fail_at = 0;
    mg_graph_free(g);
    CHECK(fa.live == 0); /* every block the graph allocated was returned */
    return 0;
}
