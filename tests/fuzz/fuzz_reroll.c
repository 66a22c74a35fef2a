/* libFuzzer harness for the rerolling pass (issue #12): random graphs in, equivalence out.
 *
 * The input bytes decode into a scalar graph written op by op as a micrograd user writes it,
 * from every op of the op table (picked by index through MG_OP_LIST, never from a list of ours)
 * and from the structures freezing must recover: isomorphic nodes over positions read through
 * affine, scrambled (gathers) and wrapped index maps; windows whose weights are shared across
 * positions (convolutions, with channels and padding); dense layers; reduction chains
 * (`a + b + c ...`, and chains of any binary op) whose partial sums sometimes have a second use;
 * variadic sums, dots, affines and losses over windows; skip connections; recurrent cells applied
 * T times to their previous output; blocks repeated with tied or fresh weights; duplicated
 * operands and constants. The graph is at most a few thousand nodes.
 *
 * The graph is frozen twice, rerolled (mg_tape_spec::no_raise = 0) and scalar (no_raise = 1).
 * Either both freeze, or both fail, or one fails on a resource limit (MG_ENOMEM, MG_ERANGE);
 * a failure is a status code with a message. Then, on samples derived from the bytes:
 * - forward: loss and outputs bitwise equal (two NaNs are equal whatever their payload);
 * - backward (accumulated over two samples): parameter gradients within 1e-12 relative, with an
 *   absolute floor of 1e-12 times the gradient's condition: the sum over the graph's paths of
 *   |product of local derivatives| (the harness's own backward of absolute values over the eager
 *   graph, from the op table's formulas), which bounds what reordering a sum can change. Both
 *   non-finite is fine; one non-finite is fine only where that bound is not finite;
 * - predict: outputs bitwise equal;
 * - fit at batch 1 in order: bitwise what forward, backward and step per sample give (fused and
 *   deferred steps included), on each tape;
 * - fit (1 epoch, batch 1 and 3, each tape): parameters and mean loss bitwise equal on 1 and 2
 *   threads.
 * A broken property prints what differed and aborts, so libFuzzer keeps the input.
 *
 * MG_FUZZ_REROLL_DUMP=1 prints the decoded graph as a C program (libmg calls) on stderr, before
 * freezing: the reproducer of an input. MG_FUZZ_REROLL_STATS=1 prints what freezing made of it.
 *
 * Built by meson with -Dfuzz=true, clang and ASan+UBSan: ./dev fuzz [SECONDS] reroll explores
 * open-ended, ./dev test fuzz replays tests/fuzz/corpus/reroll and explores a bounded number of
 * runs. */
#include <mg/mg.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* a new row of the op table that the switches below forget is a compile error */
#pragma clang diagnostic error "-Wswitch-enum"
#pragma GCC diagnostic error "-Wswitch-enum"

enum {
    MAXL = 24,       /* longest vector */
    NVEC = 12,       /* vectors kept */
    MAXX = 24,       /* inputs */
    MAXP = 1024,     /* parameters */
    MAXNODES = 3000, /* no new command once the graph has this many values */
    MAXCMDS = 48,    /* commands per input */
    NS = 4,          /* samples (fit); the first two are compared by forward and backward */
    MAXOUT = 8,      /* outputs */
    MAXEXTRA = 8,    /* values kept for the outputs (partial sums given a second use) */
    MAXK = 6,        /* window (kernel) length */
};

/* ---- the op table, through its X-macro ---------------------------------------------------- */

#define ARITY_S(id, name, sym, ar, f, da, db) ar,
#define ARITY_N(id, name, sym) 0,
static const int op_arity[MG_OP_COUNT] = {MG_OP_LIST(ARITY_S, ARITY_N)};
#undef ARITY_S
#undef ARITY_N

/* `case MG_OP_X:` for every elementwise row of the table */
#define CASE_S(id, name, sym, ar, f, da, db) case MG_OP_##id:
#define CASE_N(id, name, sym)
#define ELEMENTWISE_CASES MG_OP_LIST(CASE_S, CASE_N)

/* the k-th elementwise op of arity `ar` (mod their count) */
static int op_of_arity(int ar, unsigned k) {
    int n = 0;
    for (int op = 0; op < MG_OP_COUNT; op++) n += op_arity[op] == ar;
    k %= (unsigned)n;
    for (int op = 0; op < MG_OP_COUNT; op++)
        if (op_arity[op] == ar && k-- == 0) return op;
    return MG_OP_ADD;
}

/* local derivatives of an elementwise op, from the table's formulas */
static void local_d(int op, double A, double B, double K, double Y, double *da, double *db) {
    *da = *db = 0.0;
    switch ((mg_op)op) {
#define D_S(id, name, sym, ar, f, dA, dB)                                                          \
    case MG_OP_##id:                                                                               \
        *da = (dA);                                                                                \
        *db = (dB);                                                                                \
        break;
#define D_N(id, name, sym)                                                                         \
    case MG_OP_##id: break;
        MG_OP_LIST(D_S, D_N)
#undef D_S
#undef D_N
    case MG_OP_COUNT: break;
    }
    (void)A, (void)B, (void)K, (void)Y;
}

/* ---- decoding ------------------------------------------------------------------------------- */

typedef struct {
    mg_value *e[MAXL];
    size_t n;
} vec;

typedef struct builder {
    mg_graph *g;
    const uint8_t *data;
    size_t size, pos;
    const double *xrow, *yrow; /* the sample the leaves hold */
    vec v[NVEC];
    size_t nv;
    mg_value *x[MAXX];
    size_t nx;
    mg_value *y[MAXL];
    size_t ny;
    mg_value *p[MAXP];
    size_t np;
    double pscale;
    size_t tied_from, tied_to, tied_next; /* tied repetition: parameters [from, to) again */
    int tied;
    mg_value *extra[MAXEXTRA];
    size_t nextra;
    /* the result */
    mg_value *loss, *outputs[MAXOUT];
    size_t noutputs;
    int loss_kind;
} builder;

static unsigned byte(builder *B) { return B->pos < B->size ? B->data[B->pos++] : 0; }

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void fail_op(builder *B, const char *what) {
    fprintf(stderr, "fuzz_reroll: %s failed: %s\n", what, mg_graph_last_error(B->g));
    abort();
}

static mg_value *chk(builder *B, mg_value *v, const char *what) {
    if (!v) fail_op(B, what);
    return v;
}

static mg_value *leaf(builder *B, double x) { return chk(B, mg_scalar(B->g, x), "mg_scalar"); }

/* a parameter: new, or in a tied repetition the one the first repetition made at this point */
static mg_value *param(builder *B) {
    if (B->tied && B->tied_next < B->tied_to) return B->p[B->tied_next++];
    if (B->np >= MAXP) return B->p[B->np - 1 - (B->pos % 7 < B->np ? B->pos % 7 : 0)];
    double u = fmod((double)B->np * 0.6180339887498949, 1.0) * 2.0 - 1.0;
    return B->p[B->np++] = leaf(B, u * B->pscale);
}

/* a constant: a few values, so that equal constants share a slot; 0.0 pads windows */
static mg_value *konst(builder *B, unsigned b) {
    static const double k[] = {0.0, 1.0, -1.0, 0.5, 2.0, -0.25, 3.0, 1e-3, 10.0, -0.0, 0.75, -2.5};
    return leaf(B, k[b % (sizeof k / sizeof k[0])]);
}

static double exponent(unsigned b) {
    static const double k[] = {2.0, 3.0, 0.5, -1.0, 0.0, 1.5, -2.0, 1.0, 4.0, -0.5};
    return k[b % (sizeof k / sizeof k[0])];
}

static vec *pick(builder *B) {
    unsigned b = byte(B);
    size_t back = (b & 1) ? 0 : (b >> 1) % B->nv;
    return &B->v[B->nv - 1 - back];
}

static void push_vec(builder *B, const vec *o) {
    if (!o->n) return;
    if (B->nv == NVEC) { /* v[0], the inputs, stays */
        memmove(&B->v[1], &B->v[2], (NVEC - 2) * sizeof(vec));
        B->nv--;
    }
    B->v[B->nv++] = *o;
}

static void keep_extra(builder *B, mg_value *v) {
    if (B->nextra < MAXEXTRA) B->extra[B->nextra++] = v;
}

/* An index map of n positions into [0, m): affine, wrapped, broadcast or scrambled. */
static void index_map(builder *B, size_t n, size_t m, size_t *map) {
    unsigned kind = byte(B) % 7, arg = byte(B);
    uint64_t s = arg;
    for (size_t i = 0; i < n; i++) map[i] = i;
    for (size_t i = 0; i < n; i++) switch (kind) {
        case 0:
        case 1: map[i] = i % m; break;
        case 2: map[i] = (m - 1 - i % m); break;
        case 3: map[i] = (i * (1 + arg % 3) + arg / 3) % m; break;
        case 4: map[i] = (arg % m); break;
        case 5: map[i] = (i + arg) % m; break;
        case 6: /* a permutation (wrapped when n > m) */
            if (i) {
                size_t j = (size_t)(splitmix(&s) % (i + 1)), t = map[i];
                map[i] = map[j];
                map[j] = t;
            }
            break;
        }
    if (kind == 6)
        for (size_t i = 0; i < n; i++) map[i] %= m;
}

/* the second operand of an elementwise op at each position */
static void operand_b(builder *B, const vec *a, size_t n, mg_value **out) {
    unsigned kind = byte(B) % 6;
    switch (kind) {
    case 0: { /* another vector, through an index map */
        vec *o = pick(B);
        size_t map[MAXL];
        index_map(B, n, o->n, map);
        for (size_t i = 0; i < n; i++) out[i] = o->e[map[i]];
        break;
    }
    case 1: { /* one parameter shared by every position */
        mg_value *w = param(B);
        for (size_t i = 0; i < n; i++) out[i] = w;
        break;
    }
    case 2: /* a parameter per position */
        for (size_t i = 0; i < n; i++) out[i] = param(B);
        break;
    case 3: { /* one constant */
        mg_value *c = konst(B, byte(B));
        for (size_t i = 0; i < n; i++) out[i] = c;
        break;
    }
    case 4: { /* constants per position, some equal */
        unsigned b = byte(B);
        for (size_t i = 0; i < n; i++) out[i] = konst(B, b + (unsigned)(i % (1 + b % 4)));
        break;
    }
    default: /* the operand itself (duplicated operands) */
        for (size_t i = 0; i < n; i++) out[i] = a->e[i];
        break;
    }
}

/* windows of a vector: position i reads a[i*stride + j - pad], j < k (NULL outside) */
typedef struct {
    size_t k, stride, pad, npos;
} window;

static window make_window(builder *B, size_t n) {
    window w;
    w.k = 1 + byte(B) % MAXK;
    w.stride = 1 + byte(B) % 2;
    w.pad = byte(B) % 3 == 0 ? w.k / 2 : 0;
    if (w.k > n + 2 * w.pad) w.k = n + 2 * w.pad;
    w.npos = (n + 2 * w.pad - w.k) / w.stride + 1;
    if (w.npos > MAXL) w.npos = MAXL;
    return w;
}

static mg_value *win_at(const vec *a, const window *w, size_t i, size_t j) {
    long idx = (long)(i * w->stride + j) - (long)w->pad;
    return idx < 0 || idx >= (long)a->n ? NULL : a->e[idx];
}

/* ---- commands ------------------------------------------------------------------------------- */

/* Any op of the table at every position of a vector. */
static void cmd_map(builder *B) {
    int op = (int)(byte(B) % MG_OP_COUNT);
    vec *a = pick(B), o = {{0}, 0};
    size_t n = a->n, map[MAXL];
    mg_value *A[MAXL];
    switch ((mg_op)op) {
        ELEMENTWISE_CASES { /* elementwise */
            index_map(B, n, n, map);
            for (size_t i = 0; i < n; i++) A[i] = a->e[map[i]];
            mg_value *Bv[MAXL] = {0};
            double K = exponent(byte(B));
            if (op_arity[op] == 2) operand_b(B, a, n, Bv);
            unsigned irregular = byte(B);
            for (size_t i = 0; i < n; i++) {
                mg_value *x = A[i], *y = Bv[i];
                if (op_arity[op] == 2 && irregular % 5 == 0 && i == n - 1) { /* a boundary swaps */
                    x = Bv[i];
                    y = A[i];
                }
                o.e[o.n++] = chk(B, mg_apply(B->g, op, x, y, K), "mg_apply");
            }
            break;
        }
    case MG_OP_LEAF: { /* a vector of new leaves: parameters or constants */
        size_t m = 1 + byte(B) % MAXL;
        unsigned b = byte(B);
        for (size_t i = 0; i < m; i++)
            o.e[o.n++] = b & 1 ? param(B) : konst(B, b / 2 + (unsigned)i);
        break;
    }
    case MG_OP_SUM:
    case MG_OP_DOT:
    case MG_OP_MSE:
    case MG_OP_HINGE:
    case MG_OP_XENT: {
        /* the variadic op over windows; its other operands shared or per position */
        window w = make_window(B, n);
        unsigned share = byte(B), form = byte(B);
        size_t cls = byte(B);
        mg_value *W[MAXK], *bias = NULL, *cl = NULL;
        for (size_t j = 0; j < w.k; j++)
            W[j] = share & 1 ? param(B) : konst(B, share / 2 + (unsigned)j);
        if (form & 2) bias = param(B);
        cl = konst(B, 0); /* class 0, always valid; another class per position below */
        for (size_t i = 0; i < w.npos; i++) {
            mg_value *X[MAXK], *Wv[MAXK];
            size_t k = 0;
            for (size_t j = 0; j < w.k; j++) {
                mg_value *x = win_at(a, &w, i, j);
                if (!x) continue; /* padding: the term is skipped */
                X[k] = x;
                Wv[k++] = share & 4 ? param(B) : W[j];
            }
            if (!k) {
                X[0] = a->e[0];
                Wv[0] = W[0];
                k = 1;
            }
            if (form & 1) /* operand order swapped */
                for (size_t j = 0; j < k; j++) {
                    mg_value *t = X[j];
                    X[j] = Wv[j];
                    Wv[j] = t;
                }
            mg_value *v = NULL;
            switch ((mg_op)op) {
            case MG_OP_SUM: v = mg_sum(B->g, X, k); break;
            case MG_OP_DOT:
                v = bias ? mg_affine(B->g, Wv, X, k, bias) : mg_dot(B->g, Wv, X, k);
                break;
            case MG_OP_MSE: v = mg_mse(B->g, X, Wv, k); break;
            case MG_OP_HINGE: v = mg_hinge(B->g, X, Wv, k); break;
            case MG_OP_XENT:
                if (cls & 1) cl = leaf(B, (double)((i + cls / 2) % k)); /* a class per position */
                v = mg_cross_entropy(B->g, X, k, cl);
                break;
                ELEMENTWISE_CASES
            case MG_OP_LEAF:
            case MG_OP_COUNT: break;
            }
            o.e[o.n++] = chk(B, v, mg_op_name(op));
        }
        break;
    }
    case MG_OP_COUNT: break;
    }
    push_vec(B, &o);
}

/* Chains: out[c][i] = start + t(w, x_0) + t(w, x_1) + ... over windows (convolutions, dense
 * layers, pooling), the chain's op and term from the table, then an activation. */
static void cmd_chain(builder *B) {
    vec *a = pick(B), o = {{0}, 0};
    unsigned f1 = byte(B), f2 = byte(B), f3 = byte(B);
    int dense = f1 % 4 == 0;
    window w = dense ? (window){a->n < MAXK * 2 ? a->n : MAXK * 2, 1, 0, 1 + byte(B) % 8}
                     : make_window(B, a->n);
    size_t C = 1 + (f1 >> 2) % 3;
    int chain_op = (f2 & 3) ? MG_OP_ADD : op_of_arity(2, f2 >> 2);
    int term_op = (f3 & 1) ? MG_OP_MUL : op_of_arity(2, f3 >> 1);
    unsigned wmode = (f1 >> 4) % 3; /* 0 shared (conv), 1 per position, 2 shared, padding by 0.0 */
    unsigned start = (f2 >> 4) % 3; /* 0 a bias per channel, 1 none, 2 a constant */
    unsigned order = (f3 >> 4) % 4; /* 0, 1 forward, 2 reversed, 3 scrambled */
    int plain = (f3 >> 6) == 3;     /* terms are the inputs themselves (a + b + c ...) */
    int act = (f2 >> 6) ? op_of_arity(1, byte(B)) : -1;
    int swap = (f1 >> 6) & 1;
    int reuse = f1 >> 7; /* a partial sum gets a second use */
    size_t k = w.k, perm[MAXK * 2];
    for (size_t j = 0; j < k; j++) perm[j] = order == 2 ? k - 1 - j : j;
    if (order == 3) {
        uint64_t s = f3;
        for (size_t j = k; j > 1; j--) {
            size_t r = (size_t)(splitmix(&s) % j), t = perm[j - 1];
            perm[j - 1] = perm[r];
            perm[r] = t;
        }
    }
    if (C * w.npos > MAXL) w.npos = MAXL / C;
    for (size_t c = 0; c < C; c++) {
        mg_value *Wc[MAXK * 2], *bias = start == 0 ? param(B) : start == 2 ? konst(B, f2) : NULL;
        for (size_t j = 0; j < k; j++) Wc[j] = param(B);
        for (size_t i = 0; i < w.npos; i++) {
            mg_value *s = bias;
            for (size_t jj = 0; jj < k; jj++) {
                size_t j = perm[jj];
                mg_value *x = dense ? a->e[j % a->n] : win_at(a, &w, i, j);
                if (!x) {
                    if (wmode != 2) continue;
                    x = konst(B, 0); /* padding by a constant 0.0 */
                }
                mg_value *wt = wmode == 1 ? param(B) : Wc[j], *t;
                if (dense) wt = param(B);
                if (plain) t = x;
                else
                    t = chk(B,
                            swap ? mg_apply(B->g, term_op, x, wt, 0)
                                 : mg_apply(B->g, term_op, wt, x, 0),
                            "term");
                s = s ? chk(B, mg_apply(B->g, chain_op, s, t, 0), "chain") : t;
                if (reuse && i == 0 && jj == 1) keep_extra(B, s);
            }
            if (!s) s = a->e[0];
            if (act >= 0) s = chk(B, mg_apply(B->g, act, s, NULL, exponent(f3)), "activation");
            o.e[o.n++] = s;
        }
    }
    push_vec(B, &o);
}

/* A skip connection: out[i] = op(a[i], earlier[map(i)]). */
static void cmd_skip(builder *B) {
    vec *a = &B->v[B->nv - 1], *e = pick(B), o = {{0}, 0};
    unsigned b = byte(B);
    int op = b & 1 ? MG_OP_ADD : op_of_arity(2, b >> 1);
    size_t map[MAXL];
    index_map(B, a->n, e->n, map);
    for (size_t i = 0; i < a->n; i++)
        o.e[o.n++] = chk(B, mg_apply(B->g, op, a->e[i], e->e[map[i]], 0), "skip");
    push_vec(B, &o);
}

/* A recurrent cell over T steps: h_t = act(b + Wx x_t + Wh h_{t-1}), weights shared by the
 * steps, optionally gated with the previous state; chains or affines. */
static void cmd_recurrent(builder *B) {
    vec *xs = pick(B), o = {{0}, 0};
    unsigned f1 = byte(B), f2 = byte(B);
    size_t T = 2 + f1 % 7, H = 1 + (f1 >> 3) % 4, d = xs->n / T;
    if (d < 1) d = 1;
    if (d > 4) d = 4;
    int act = op_of_arity(1, byte(B));
    int gate = (f2 & 3) == 0 ? op_of_arity(2, f2 >> 2) : -1;
    int variadic = (f2 >> 2) & 1;
    unsigned h0 = (f2 >> 3) % 3; /* 0: first step has no recurrent term, 1: zeros, 2: parameters */
    int all = (f2 >> 5) & 1;     /* output every step's state, or the last */
    mg_value *Wx[4][4], *Wh[4][4], *bh[4], *h[4] = {0}, *nh[4];
    for (size_t j = 0; j < H; j++) {
        bh[j] = param(B);
        for (size_t i = 0; i < d; i++) Wx[j][i] = param(B);
        for (size_t k = 0; k < H; k++) Wh[j][k] = param(B);
        h[j] = h0 == 1 ? konst(B, 0) : h0 == 2 ? param(B) : NULL;
    }
    for (size_t t = 0; t < T; t++) {
        mg_value *xt[4];
        for (size_t i = 0; i < d; i++) xt[i] = xs->e[(t * d + i) % xs->n];
        for (size_t j = 0; j < H; j++) {
            mg_value *s;
            if (variadic) {
                mg_value *w[8], *u[8];
                size_t n = 0;
                for (size_t i = 0; i < d; i++) w[n] = Wx[j][i], u[n++] = xt[i];
                if (h[0])
                    for (size_t k = 0; k < H; k++) w[n] = Wh[j][k], u[n++] = h[k];
                s = chk(B, mg_affine(B->g, w, u, n, bh[j]), "mg_affine");
            } else {
                s = bh[j];
                for (size_t i = 0; i < d; i++)
                    s = chk(B, mg_add(B->g, s, chk(B, mg_mul(B->g, Wx[j][i], xt[i]), "mul")),
                            "add");
                if (h[0])
                    for (size_t k = 0; k < H; k++)
                        s = chk(B, mg_add(B->g, s, chk(B, mg_mul(B->g, Wh[j][k], h[k]), "mul")),
                                "add");
            }
            nh[j] = chk(B, mg_apply(B->g, act, s, NULL, 2.0), "activation");
            if (gate >= 0 && h[j]) nh[j] = chk(B, mg_apply(B->g, gate, nh[j], h[j], 0), "gate");
        }
        memcpy(h, nh, H * sizeof h[0]);
        if (all)
            for (size_t j = 0; j < H && o.n < MAXL; j++) o.e[o.n++] = h[j];
    }
    if (!all)
        for (size_t j = 0; j < H; j++) o.e[o.n++] = h[j];
    push_vec(B, &o);
}

/* A new arrangement of existing values (no node): slice, concatenation, permutation. */
static void cmd_view(builder *B) {
    vec *a = pick(B), *b = pick(B), o = {{0}, 0};
    unsigned f = byte(B);
    switch (f % 3) {
    case 0: {
        size_t s = (f >> 2) % a->n, len = 1 + byte(B) % a->n;
        for (size_t i = 0; i < len; i++) o.e[o.n++] = a->e[(s + i) % a->n];
        break;
    }
    case 1:
        for (size_t i = 0; i < a->n && o.n < MAXL; i++) o.e[o.n++] = a->e[i];
        for (size_t i = 0; i < b->n && o.n < MAXL; i++) o.e[o.n++] = b->e[i];
        break;
    default: {
        size_t map[MAXL];
        index_map(B, a->n, a->n, map);
        for (size_t i = 0; i < a->n; i++) o.e[o.n++] = a->e[map[i]];
        break;
    }
    }
    push_vec(B, &o);
}

enum { C_MAP, C_CHAIN, C_SKIP, C_RECURRENT, C_VIEW, C_REPEAT, NCMD };

static void run_cmd(builder *B, unsigned cmd) {
    switch (cmd) {
    case C_MAP: cmd_map(B); break;
    case C_CHAIN: cmd_chain(B); break;
    case C_SKIP: cmd_skip(B); break;
    case C_RECURRENT: cmd_recurrent(B); break;
    default: cmd_view(B); break;
    }
}

/* Builds the graph the bytes describe over leaves holding sample (x, y). */
static void build(builder *B, const uint8_t *data, size_t size, const double *x, const double *y) {
    B->data = data;
    B->size = size;
    B->pos = 0;
    B->xrow = x;
    B->yrow = y;
    B->nv = B->np = B->ny = B->nextra = B->noutputs = 0;
    B->tied = 0;
    unsigned h0 = byte(B), h1 = byte(B);
    B->nx = 1 + h0 % MAXX;
    static const double scales[] = {0.5, 1.0, 0.1, 2.0};
    B->pscale = scales[h1 % 4];
    vec in = {{0}, 0};
    for (size_t i = 0; i < B->nx; i++) in.e[in.n++] = B->x[i] = leaf(B, x[i]);
    push_vec(B, &in);
    for (int steps = 0; B->pos < B->size && steps < MAXCMDS && mg_graph_len(B->g) < MAXNODES;
         steps++) {
        unsigned cmd = byte(B) % NCMD;
        if (cmd != C_REPEAT) {
            run_cmd(B, cmd);
            continue;
        }
        /* a block of commands repeated on its own output, with tied or fresh parameters */
        unsigned f = byte(B);
        size_t reps = 2 + f % 3, len = 1 + (f >> 2) % 3, start = B->pos, end = start;
        size_t p0 = B->np;
        for (size_t r = 0; r < reps && mg_graph_len(B->g) < MAXNODES; r++) {
            B->pos = start;
            if (r > 0 && (f & 0x80)) {
                B->tied = 1;
                B->tied_from = B->tied_next = p0;
            }
            for (size_t c = 0; c < len; c++) {
                unsigned sub = byte(B) % NCMD;
                run_cmd(B, sub == C_REPEAT ? C_VIEW : sub);
            }
            if (r == 0) B->tied_to = B->np;
            B->tied = 0;
            if (B->pos > end) end = B->pos;
        }
        B->pos = end;
    }
    /* the loss over the last vector (or one picked), and the outputs */
    vec *o = pick(B);
    unsigned lk = byte(B);
    B->loss_kind = (int)(lk % 5);
    mg_value *L = NULL;
    switch (B->loss_kind) {
    case 0: /* mse against targets */
    case 1: /* hinge against +-1 labels */
        for (size_t i = 0; i < o->n; i++) B->y[B->ny++] = leaf(B, y[i]);
        L = B->loss_kind == 0 ? mg_mse(B->g, o->e, B->y, o->n) : mg_hinge(B->g, o->e, B->y, o->n);
        break;
    case 2: /* cross-entropy, the target a class index */
        B->y[B->ny++] = leaf(B, y[0]);
        L = mg_cross_entropy(B->g, o->e, o->n, B->y[0]);
        break;
    case 3: /* a chain of additions, or a sum */
        if (lk & 8) L = mg_sum(B->g, o->e, o->n);
        else {
            L = o->e[0];
            for (size_t i = 1; i < o->n; i++) L = chk(B, mg_add(B->g, L, o->e[i]), "add");
        }
        break;
    default: /* a value as it is */ L = o->e[(lk >> 3) % o->n]; break;
    }
    B->loss = chk(B, L, "loss");
    for (size_t i = 0; i < o->n && B->noutputs < MAXOUT / 2; i++)
        B->outputs[B->noutputs++] = o->e[i];
    for (size_t i = 0; i < B->nextra && B->noutputs < MAXOUT; i++)
        B->outputs[B->noutputs++] = B->extra[i];
    if (B->noutputs < MAXOUT && (lk & 16) && B->np) B->outputs[B->noutputs++] = B->p[0];
    if (B->noutputs < MAXOUT && (lk & 32)) B->outputs[B->noutputs++] = B->x[B->nx - 1];
}

/* ---- the condition of each parameter's gradient ------------------------------------------ */

typedef struct {
    mg_value **keys;
    size_t *vals;
    size_t cap;
} pmap;

static size_t pm_slot(const pmap *m, const mg_value *v) {
    return (size_t)(((uint64_t)(uintptr_t)v * 0x9E3779B97F4A7C15ull) >> 20) & (m->cap - 1);
}

static size_t pm_get(const pmap *m, const mg_value *v) {
    for (size_t i = pm_slot(m, v);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == v) return m->vals[i];
        if (!m->keys[i]) return SIZE_MAX;
    }
}

static int pm_put(pmap *m, mg_value *v, size_t x) {
    for (size_t i = pm_slot(m, v);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == v) return 0;
        if (!m->keys[i]) {
            m->keys[i] = v;
            m->vals[i] = x;
            return 1;
        }
    }
}

static int by_serial(const void *a, const void *b) {
    uint64_t x = mg_value_serial(*(mg_value *const *)a), y = mg_value_serial(*(mg_value *const *)b);
    return x < y ? -1 : x > y;
}

/* The values reachable from the roots, in creation order (a topological order), and their map. */
static size_t collect(mg_value *const *roots, size_t nroots, mg_value ***out, pmap *m) {
    size_t cap = 64, n = 0;
    mg_value **nodes = malloc(cap * sizeof *nodes);
    m->cap = 1u << 15; /* far above 2 * MAXNODES plus a command */
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->vals = malloc(m->cap * sizeof *m->vals);
    if (!nodes || !m->keys || !m->vals) abort();
    for (size_t r = 0; r < nroots; r++)
        if (pm_put(m, roots[r], 0)) nodes[n++] = roots[r];
    for (size_t i = 0; i < n; i++) { /* breadth first; nodes grows as it goes */
        size_t k = mg_value_noperands(nodes[i]);
        for (size_t j = 0; j < k; j++) {
            mg_value *o = mg_value_operand(nodes[i], j);
            if (!pm_put(m, o, 0)) continue;
            if (n == cap) {
                nodes = realloc(nodes, (cap *= 2) * sizeof *nodes);
                if (!nodes) abort();
            }
            nodes[n++] = o;
        }
    }
    qsort(nodes, n, sizeof *nodes, by_serial);
    memset(m->keys, 0, m->cap * sizeof *m->keys);
    for (size_t i = 0; i < n; i++) pm_put(m, nodes[i], i);
    *out = nodes;
    return n;
}

/* Adds to mag[j] the sum over the paths from the loss to parameter j of the absolute product of
 * local derivatives, at the values the graph holds. */
static void condition(const builder *B, double *mag) {
    mg_value **nodes;
    pmap m;
    size_t n = collect(&B->loss, 1, &nodes, &m);
    double *g = calloc(n, sizeof *g);
    if (!g) abort();
    g[n - 1] = 1.0; /* the loss was created last of what it reaches */
    for (size_t i = n; i-- > 0;) {
        mg_value *v = nodes[i];
        int op = mg_value_op(v);
        size_t k = mg_value_noperands(v);
        double gi = g[i];
#define OPND(j) pm_get(&m, mg_value_operand(v, (j)))
#define VAL(j) mg_value_data(mg_value_operand(v, (j)))
        switch ((mg_op)op) {
        case MG_OP_LEAF: break;
        case MG_OP_SUM:
            for (size_t j = 0; j < k; j++) g[OPND(j)] += gi;
            break;
        case MG_OP_DOT: {
            size_t len = (size_t)mg_value_const(v);
            for (size_t j = 0; j < len; j++) {
                g[OPND(j)] += fabs(VAL(len + j)) * gi;
                g[OPND(len + j)] += fabs(VAL(j)) * gi;
            }
            if (mg_value_has_bias(v)) g[OPND(2 * len)] += gi;
            break;
        }
        case MG_OP_MSE: {
            size_t len = (size_t)mg_value_const(v);
            for (size_t j = 0; j < len; j++) {
                double d = fabs(2.0 * (VAL(j) - VAL(len + j)) / (double)len) * gi;
                g[OPND(j)] += d;
                g[OPND(len + j)] += d;
            }
            break;
        }
        case MG_OP_HINGE: {
            size_t len = (size_t)mg_value_const(v);
            for (size_t j = 0; j < len; j++) {
                g[OPND(j)] += fabs(VAL(len + j)) / (double)len * gi;
                g[OPND(len + j)] += fabs(VAL(j)) / (double)len * gi;
            }
            break;
        }
        case MG_OP_XENT: { /* |softmax - onehot| <= 1; non-finite logits make it non-finite */
            size_t len = (size_t)mg_value_const(v);
            double y = mg_value_data(v);
            for (size_t j = 0; j < len; j++) g[OPND(j)] += (1.0 + 0.0 * (y + VAL(j))) * gi;
            break;
        }
            ELEMENTWISE_CASES {
                double da, db, A = VAL(0), Bv = k > 1 ? VAL(1) : 0.0;
                local_d(op, A, Bv, mg_value_const(v), mg_value_data(v), &da, &db);
                g[OPND(0)] += fabs(da) * gi;
                if (k > 1) g[OPND(1)] += fabs(db) * gi;
                break;
            }
        case MG_OP_COUNT: break;
        }
#undef OPND
#undef VAL
    }
    for (size_t j = 0; j < B->np; j++) {
        size_t i = pm_get(&m, B->p[j]);
        if (i != SIZE_MAX) mag[j] += g[i];
    }
    free(g);
    free(nodes);
    free(m.keys);
    free(m.vals);
}

/* ---- the reproducer ------------------------------------------------------------------------- */

static void dump_c(const builder *B, const double *X, const double *Y) {
    mg_value *roots[1 + MAXOUT];
    roots[0] = B->loss;
    memcpy(roots + 1, B->outputs, B->noutputs * sizeof roots[0]);
    mg_value **nodes;
    pmap m;
    size_t n = collect(roots, 1 + B->noutputs, &nodes, &m);
    FILE *f = stderr;
    fprintf(f,
            "/* fuzz_reroll reproducer: %zu values */\n#include <mg/mg.h>\n#include <stdio.h>\n\n"
            "int main(void) {\n    mg_graph *g = mg_graph_new();\n    mg_value *v[%zu];\n",
            n, n);
    for (size_t i = 0; i < n; i++) {
        mg_value *v = nodes[i];
        int op = mg_value_op(v);
        size_t k = mg_value_noperands(v);
        if (op == MG_OP_LEAF) {
            fprintf(f, "    v[%zu] = mg_scalar(g, %a);\n", i, mg_value_data(v));
        } else if (op_arity[op]) {
            fprintf(f, "    v[%zu] = mg_apply(g, %d /* %s */, v[%zu], %s%zu%s, %a);\n", i, op,
                    mg_op_name(op), pm_get(&m, mg_value_operand(v, 0)), k > 1 ? "v[" : "NULL /* ",
                    k > 1 ? pm_get(&m, mg_value_operand(v, 1)) : 0, k > 1 ? "]" : " */",
                    mg_value_const(v));
        } else {
            fprintf(f, "    { mg_value *o[] = {");
            for (size_t j = 0; j < k; j++)
                fprintf(f, "%sv[%zu]", j ? ", " : "", pm_get(&m, mg_value_operand(v, j)));
            size_t len = (size_t)mg_value_const(v);
            switch ((mg_op)op) {
            case MG_OP_SUM: fprintf(f, "}; v[%zu] = mg_sum(g, o, %zu); }\n", i, k); break;
            case MG_OP_DOT:
                if (mg_value_has_bias(v))
                    fprintf(f, "}; v[%zu] = mg_affine(g, o, o + %zu, %zu, o[%zu]); }\n", i, len,
                            len, 2 * len);
                else fprintf(f, "}; v[%zu] = mg_dot(g, o, o + %zu, %zu); }\n", i, len, len);
                break;
            case MG_OP_MSE:
                fprintf(f, "}; v[%zu] = mg_mse(g, o, o + %zu, %zu); }\n", i, len, len);
                break;
            case MG_OP_HINGE:
                fprintf(f, "}; v[%zu] = mg_hinge(g, o, o + %zu, %zu); }\n", i, len, len);
                break;
            case MG_OP_XENT:
                fprintf(f, "}; v[%zu] = mg_cross_entropy(g, o, %zu, o[%zu]); }\n", i, len, len);
                break;
                ELEMENTWISE_CASES
            case MG_OP_LEAF:
            case MG_OP_COUNT: break;
            }
        }
    }
    const struct {
        const char *name;
        mg_value *const *v;
        size_t n;
    } roles[] = {{"inputs", B->x, B->nx},
                 {"targets", B->y, B->ny},
                 {"params", B->p, B->np},
                 {"outputs", B->outputs, B->noutputs}};
    for (size_t r = 0; r < 4; r++) {
        fprintf(f, "    mg_value *%s[%zu] = {", roles[r].name, roles[r].n + 1);
        for (size_t j = 0; j < roles[r].n; j++) {
            size_t i = pm_get(&m, roles[r].v[j]);
            if (i == SIZE_MAX) fprintf(f, "%smg_scalar(g, 0) /* unused */", j ? ", " : "");
            else fprintf(f, "%sv[%zu]", j ? ", " : "", i);
        }
        fprintf(f, "%s};\n", roles[r].n ? "" : "NULL");
    }
    fprintf(f,
            "    mg_tape_spec spec = {v[%zu], inputs, %zu, targets, %zu, params, %zu, outputs, "
            "%zu, 0};\n",
            pm_get(&m, B->loss), B->nx, B->ny, B->np, B->noutputs);
    fprintf(f, "    double X[%d][%zu] = {", NS, B->nx + 1);
    for (int s = 0; s < NS; s++) {
        fprintf(f, "{");
        for (size_t j = 0; j < B->nx; j++) fprintf(f, "%s%a", j ? ", " : "", X[s * MAXX + j]);
        fprintf(f, "}%s", s + 1 < NS ? ", " : "");
    }
    fprintf(f, "};\n    double Y[%d][%zu] = {", NS, B->ny + 1);
    for (int s = 0; s < NS; s++) {
        fprintf(f, "{");
        for (size_t j = 0; j < B->ny; j++) fprintf(f, "%s%a", j ? ", " : "", Y[s * MAXL + j]);
        if (!B->ny) fprintf(f, "0");
        fprintf(f, "}%s", s + 1 < NS ? ", " : "");
    }
    fprintf(f, "};\n"
               "    /* freeze with spec.no_raise = 0 and 1; forward(X[s], Y[s]) and backward for s "
               "= 0, 1;\n"
               "       compare mg_tape_loss, mg_tape_outputs and mg_tape_grad "
               "(tests/fuzz/fuzz_reroll.c) */\n"
               "    for (int raise = 0; raise < 2; raise++) {\n"
               "        spec.no_raise = !raise;\n"
               "        mg_tape *t = mg_tape_freeze(g, &spec);\n"
               "        if (!t) { printf(\"freeze: %%s\\n\", mg_graph_last_error(g)); continue; }\n"
               "        for (int s = 0; s < 2; s++) {\n"
               "            mg_tape_forward(t, X[s], Y[s]);\n"
               "            mg_tape_backward(t);\n"
               "            printf(\"no_raise=%%d sample %%d loss %%a grad[0] %%a\\n\", "
               "spec.no_raise, s, mg_tape_loss(t),\n"
               "                   mg_tape_nparams(t) ? mg_tape_grad(t)[0] : 0.0);\n"
               "        }\n"
               "        mg_tape_free(t);\n"
               "    }\n"
               "    mg_graph_free(g);\n    return 0;\n}\n");
    free(nodes);
    free(m.keys);
    free(m.vals);
}

/* ---- the properties ------------------------------------------------------------------------- */

static int same(double a, double b) { /* bitwise, or both NaN */
    return memcmp(&a, &b, sizeof a) == 0 || (isnan(a) && isnan(b));
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "fuzz_reroll: ");                                                          \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        report(t);                                                                                 \
        abort();                                                                                   \
    } while (0)

static void report(mg_tape *const *t) {
    if (t && t[0]) {
        mg_tape_stats st;
        if (mg_tape_get_stats(t[0], &st) == MG_OK)
            fprintf(stderr,
                    "rerolled: %zu nodes, %zu statements, %zu+%zu nests, %zu loops, %zu packed, "
                    "rerolled=%d\n",
                    st.nodes, st.statements, st.forward_nests, st.backward_nests, st.loops,
                    st.packed, st.rerolled);
        char *d = mg_tape_describe(t[0], NULL);
        if (d) fprintf(stderr, "%.6000s%s\n", d, strlen(d) > 6000 ? "\n..." : "");
        mg_tape_free_source(t[0], d);
    }
}

static int resource_limit(int st) { return st == MG_ENOMEM || st == MG_ERANGE; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    /* the samples: from a hash of the bytes; exact small values (kinks and ties) or uniform */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < size; i++) h = (h ^ data[i]) * 0x100000001b3ull;
    static double X[NS * MAXX], Y[NS * MAXL];
    int exact = (h >> 60) & 1;
    for (size_t i = 0; i < NS * MAXX; i++) {
        uint64_t r = splitmix(&h);
        X[i] = exact ? (double)((int)(r % 9) - 4) * 0.5 : (double)(r >> 11) * 0x1p-53 * 4.0 - 2.0;
    }
    static builder B0, B1;
    /* the targets depend on the loss: decode once to learn its kind and length */
    mg_graph *g = mg_graph_new();
    if (!g) return 0;
    memset(Y, 0, sizeof Y);
    for (size_t i = 0; i < NS * MAXL; i += MAXL) Y[i] = 0.0; /* class 0 is valid for any length */
    B0.g = g;
    build(&B0, data, size, X, Y);
    int kind = B0.loss_kind;
    size_t nclass = B0.loss_kind == 2 ? mg_value_noperands(B0.loss) - 1 : 0;
    for (int s = 0; s < NS; s++)
        for (size_t j = 0; j < MAXL; j++) {
            uint64_t r = splitmix(&h);
            double *yv = &Y[s * MAXL + j];
            if (kind == 1) *yv = r & 1 ? 1.0 : -1.0;
            else if (kind == 2) *yv = (double)(r % nclass);
            else *yv = (double)(r >> 11) * 0x1p-53 * 2.0 - 1.0;
        }
    mg_graph_free(g);
    /* the graph at sample 0, frozen twice */
    g = mg_graph_new();
    if (!g) return 0;
    B0.g = g;
    build(&B0, data, size, X, Y);
    if (getenv("MG_FUZZ_REROLL_DUMP")) dump_c(&B0, X, Y); /* before anything can crash */
    mg_tape *t[2] = {NULL, NULL};
    int st[2];
    for (int k = 0; k < 2; k++) {
        mg_tape_spec spec = {B0.loss, B0.x,  B0.nx,      B0.y,        B0.ny,
                             B0.p,    B0.np, B0.outputs, B0.noutputs, k};
        mg_graph_clear_error(g);
        t[k] = mg_tape_freeze(g, &spec);
        st[k] = t[k] ? MG_OK : mg_graph_last_status(g);
        if (!t[k]) {
            const char *msg = mg_graph_last_error(g);
            if (!(st[k] < 0 && st[k] > MG__STATUS_MIN) || !msg || !*msg)
                FAIL("freeze (no_raise=%d) failed without a status and message: %d \"%s\"", k,
                     st[k], msg ? msg : "(null)");
            fprintf(stderr, "fuzz_reroll: freeze (no_raise=%d): %s %s\n", k, mg_status_name(st[k]),
                    msg);
        }
    }
    if (!t[0] || !t[1]) {
        int bad = (t[0] && !resource_limit(st[1])) || (t[1] && !resource_limit(st[0]));
        if (bad)
            FAIL("one freeze failed, the other did not: rerolled %s, scalar %s",
                 mg_status_name(st[0]), mg_status_name(st[1]));
        for (int k = 0; k < 2; k++) mg_tape_free(t[k]);
        mg_graph_free(g);
        return 0;
    }
    if (getenv("MG_FUZZ_REROLL_STATS")) { /* what the corpus exercises */
        mg_tape_stats ts;
        if (mg_tape_get_stats(t[0], &ts) == MG_OK)
            fprintf(
                stderr,
                "stats: nodes %zu statements %zu nests %zu+%zu loops %zu packed %zu rerolled %d "
                "deferred %zu\n",
                ts.nodes, ts.statements, ts.forward_nests, ts.backward_nests, ts.loops, ts.packed,
                ts.rerolled, ts.deferred_steps);
    }
    size_t np = mg_tape_nparams(t[0]), no = B0.noutputs;
    if (np != B0.np || mg_tape_nparams(t[1]) != np || mg_tape_noutputs(t[0]) != no ||
        mg_tape_ninputs(t[0]) != B0.nx)
        FAIL("layout: %zu/%zu params, %zu outputs, %zu inputs", np, mg_tape_nparams(t[1]),
             mg_tape_noutputs(t[0]), mg_tape_ninputs(t[0]));
    double *mag = calloc(np + 1, sizeof *mag), *p0 = malloc((np + 1) * sizeof *p0);
    if (!mag || !p0) abort();
    memcpy(p0, mg_tape_data(t[0]), np * sizeof *p0);
    for (size_t j = 0; j < np; j++)
        if (!same(p0[j], mg_tape_data(t[1])[j])) FAIL("initial parameter %zu differs", j);

    /* forward and backward on two samples, gradients accumulating */
    for (int s = 0; s < 2; s++) {
        if (s == 0) condition(&B0, mag);
        else {
            mg_graph *g1 = mg_graph_new();
            if (!g1) abort();
            B1.g = g1;
            build(&B1, data, size, X + MAXX, Y + MAXL);
            condition(&B1, mag);
            mg_graph_free(g1);
        }
        double loss[2], out[2][MAXOUT];
        for (int k = 0; k < 2; k++) {
            if (mg_tape_forward(t[k], X + s * MAXX, Y + s * MAXL) != MG_OK) FAIL("forward failed");
            loss[k] = mg_tape_loss(t[k]);
            mg_tape_outputs(t[k], out[k]);
            if (mg_tape_backward(t[k]) != MG_OK) FAIL("backward failed");
        }
        if (!same(loss[0], loss[1]))
            FAIL("sample %d: loss %a (rerolled) vs %a (scalar)", s, loss[0], loss[1]);
        for (size_t i = 0; i < no; i++)
            if (!same(out[0][i], out[1][i]))
                FAIL("sample %d: output %zu: %a (rerolled) vs %a (scalar)", s, i, out[0][i],
                     out[1][i]);
        const double *gr = mg_tape_grad(t[0]), *gs = mg_tape_grad(t[1]);
        for (size_t j = 0; j < np; j++) {
            double a = gr[j], b = gs[j], m = mag[j];
            int fa = isfinite(a), fb = isfinite(b);
            if (!fa && !fb) continue;
            if (!isfinite(m)) continue;
            if (fa != fb || fabs(a - b) > 1e-12 * fmax(fabs(a), fabs(b)) + 1e-12 * m + 1e-300)
                FAIL("sample %d: gradient of parameter %zu: %.17g (rerolled) vs %.17g (scalar), "
                     "condition %.3g",
                     s, j, a, b, m);
        }
    }

    /* predict */
    {
        double po[2][NS * MAXOUT], xr[NS * MAXX];
        size_t nx = B0.nx;
        for (int s = 0; s < NS; s++) memcpy(xr + s * nx, X + s * MAXX, nx * sizeof *xr);
        for (int k = 0; k < 2; k++)
            if (mg_tape_predict(t[k], xr, NS, po[k]) != MG_OK)
                FAIL("predict failed: %s", mg_tape_last_error(t[k]));
        for (size_t i = 0; i < NS * no; i++)
            if (!same(po[0][i], po[1][i]))
                FAIL("predict: value %zu: %a (rerolled) vs %a (scalar)", i, po[0][i], po[1][i]);
    }

    /* fit: one epoch, batch 1 and 3, on 1 and 2 threads: bitwise the same parameters */
    {
        size_t nx = B0.nx, ny = B0.ny;
        double xr[NS * MAXX], yr[NS * MAXL + 1];
        for (int s = 0; s < NS; s++) {
            memcpy(xr + s * nx, X + s * MAXX, nx * sizeof *xr);
            memcpy(yr + s * ny, Y + s * MAXL, ny * sizeof *yr);
        }
        double *after = malloc((np + 1) * sizeof *after);
        if (!after) abort();
        for (int k = 0; k < 2; k++)
            for (size_t batch = 1; batch <= 3; batch += 2) {
                double ml[2];
                int fs[2];
                for (size_t th = 1; th <= 2; th++) {
                    memcpy(mg_tape_data(t[k]), p0, np * sizeof *p0);
                    mg_fit_options fo = {batch, 0.05, 1, h & 0xffff, 0, th};
                    fs[th - 1] = mg_tape_fit(t[k], xr, ny ? yr : NULL, NS, &fo, &ml[th - 1]);
                    if (fs[th - 1] != MG_OK)
                        FAIL("fit (no_raise=%d, batch %zu, %zu threads): %s", k, batch, th,
                             mg_tape_last_error(t[k]));
                    if (th == 1) memcpy(after, mg_tape_data(t[k]), np * sizeof *after);
                }
                if (!same(ml[0], ml[1]))
                    FAIL("fit (no_raise=%d, batch %zu): mean loss %a (1 thread) vs %a (2 threads)",
                         k, batch, ml[0], ml[1]);
                for (size_t j = 0; j < np; j++)
                    if (!same(after[j], mg_tape_data(t[k])[j]))
                        FAIL("fit (no_raise=%d, batch %zu): parameter %zu: %a (1 thread) vs %a (2 "
                             "threads)",
                             k, batch, j, after[j], mg_tape_data(t[k])[j]);
            }
        /* batch 1 in order is the per-sample definition, forward, backward and step, bitwise
         * (fused steps, and steps deferred to the next sample's forward, included) */
        for (int k = 0; k < 2; k++) {
            double ml, sum = 0.0;
            memcpy(mg_tape_data(t[k]), p0, np * sizeof *p0);
            mg_fit_options fo = {1, 0.05, 0, 0, 0, 1};
            if (mg_tape_fit(t[k], xr, ny ? yr : NULL, NS, &fo, &ml) != MG_OK)
                FAIL("fit (no_raise=%d, batch 1): %s", k, mg_tape_last_error(t[k]));
            memcpy(after, mg_tape_data(t[k]), np * sizeof *after);
            memcpy(mg_tape_data(t[k]), p0, np * sizeof *p0);
            for (int s = 0; s < NS; s++) {
                /* the loss as forward computed it: read before the step (a loss that is itself
                 * a parameter changes with it) */
                if (mg_tape_forward(t[k], xr + s * nx, ny ? yr + s * ny : NULL) != MG_OK)
                    FAIL("sample %d by hand (no_raise=%d): %s", s, k, mg_tape_last_error(t[k]));
                sum += mg_tape_loss(t[k]);
                if (mg_tape_backward(t[k]) != MG_OK || mg_tape_step(t[k], 0.05, 1) != MG_OK)
                    FAIL("sample %d by hand (no_raise=%d): %s", s, k, mg_tape_last_error(t[k]));
            }
            if (!same(ml, sum / NS))
                FAIL("fit (no_raise=%d, batch 1): mean loss %a vs %a by hand", k, ml, sum / NS);
            for (size_t j = 0; j < np; j++)
                if (!same(after[j], mg_tape_data(t[k])[j]))
                    FAIL("fit (no_raise=%d, batch 1): parameter %zu: %a vs %a by hand", k, j,
                         after[j], mg_tape_data(t[k])[j]);
        }
        free(after);
    }
    free(mag);
    free(p0);
    for (int k = 0; k < 2; k++) mg_tape_free(t[k]);
    mg_graph_free(g);
    return 0;
}
