/* Autodiff on the IR: the backward program, derived from the forward one nest by nest.
 *
 * For a forward nest F and an operand X that needs a gradient (a parameter or a computed
 * value), the gradient nest accumulates into grad[X] the product of grad[out] and the local
 * derivative (the other factor of a product, 1 for a plain term, the op table's dA/dB for an
 * elementwise op). Its outer dims are the dims along which X moves, in F's order; the dims
 * along which X is broadcast (stride 0: a weight shared across positions, a bias across a
 * row) become its reduction dims. So the gradient of a shared weight is one reduction per
 * weight with a fixed order, whatever the thread count or the backend. Where X's elements may
 * repeat across outer points (a convolution's input, read by overlapping windows) the nest is
 * marked `alias` and runs one point after another, reading each sum's start fresh. A max over a
 * window (MGK_T_MAXR) has one gradient nest with its own dims (MGK_T_DMAXR), writing every
 * element of the window from its point; where windows overlap, one such nest per residue class
 * of disjoint windows (window_classes). */
#include "ir.h"

#include <string.h>

/* Whether the k dims of strides s (absolute) and sizes m, over a block of span `span` below them,
 * fix their indices from the element: sorted by stride, each stride larger than the span of the
 * block and of all smaller ones (mixed radix; a sufficient condition). Sorts s and m. */
static int radix_separate(mgk_i64 *s, mgk_i64 *m, int k, mgk_i64 span) {
    for (int i = 1; i < k; i++) /* insertion sort by stride */
        for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
            const mgk_i64 a = s[j], b = m[j];
            s[j] = s[j - 1];
            m[j] = m[j - 1];
            s[j - 1] = a;
            m[j - 1] = b;
        }
    for (int i = 0; i < k; i++) {
        if (s[i] <= span) return 0;
        span += s[i] * (m[i] - 1);
    }
    return 1;
}

/* Whether a ref names distinct elements at distinct points of the dims it moves along (a
 * sufficient condition, radix_separate). */
int mg_ref__injective(const mgk_ref *X, const mgk_i64 *n, const mgk_idx *ix) {
    (void)ix;
    if (X->gather) return 0;
    mgk_i64 s[MGK_MAXD], m[MGK_MAXD];
    int k = 0;
    for (int d = 0; d < MGK_MAXD; d++) {
        if (n[d] <= 1 || X->s[d] == 0) continue; /* dims it does not move along */
        s[k] = X->s[d] < 0 ? -X->s[d] : X->s[d];
        m[k++] = n[d];
    }
    return radix_separate(s, m, k, 0);
}

int mg_ref__each(const mg_tape *t, size_t nest, const mgk_ref *X,
                 int (*visit)(void *ctx, mgk_i64 pos), void *ctx) {
    const mgk_nest *N = &t->nests[nest];
    int dims[MGK_MAXD], nd = 0;
    for (int d = 0; d < MGK_MAXD; d++)
        if (N->n[d] > 1 && X->s[d] != 0) dims[nd++] = d;
    mgk_i64 iters = X->ts != 0 && t->info[nest].seq > 1 ? (mgk_i64)t->info[nest].seq : 1;
    for (mgk_i64 it = 0; it < iters; it++) {
        mgk_i64 idx[MGK_MAXD] = {0};
        for (;;) {
            mgk_i64 pos = X->base + it * X->ts;
            for (int q = 0; q < nd; q++) pos += idx[q] * X->s[dims[q]];
            int r = visit(ctx, pos);
            if (r) return r;
            int q = nd - 1; /* odometer over the dims X moves along */
            while (q >= 0 && ++idx[q] == N->n[dims[q]]) idx[q--] = 0;
            if (q < 0) break;
        }
    }
    return 0;
}

typedef struct class_probe {
    const mg_tape *t;
    int param;
} class_probe;

/* A slot that is a parameter or (with `param` 0) a computed value: it needs a gradient. */
static int in_class(const mg_tape *t, mgk_i64 slot, int param) {
    return slot < (mgk_i64)t->nparams || (!param && mg_tape__is_value(t, slot));
}

static int entry_in_class(void *ctx, mgk_i64 pos) {
    const class_probe *c = ctx;
    return in_class(c->t, (mgk_i64)c->t->ix[pos], c->param);
}

/* Whether any element operand X of nest f reads satisfies `param` (a parameter) or, with
 * `param` 0, needs a gradient (a parameter or a computed value). A direct ref reads one slot
 * class (grouping keeps classes apart); a gathered one reads whatever its table names, so every
 * position it reaches is checked: each point of the nest's dims in each iteration of its loop. */
static int reads_class(const mg_tape *t, size_t f, const mgk_ref *X, int param) {
    if (!X->gather) return in_class(t, X->base, param);
    class_probe c = {t, param};
    return mg_ref__each(t, f, X, entry_in_class, &c);
}

static int needs_grad(const mg_tape *t, size_t f, const mgk_ref *X) {
    return reads_class(t, f, X, 0);
}

static int is_param(const mg_tape *t, size_t f, const mgk_ref *X) {
    return reads_class(t, f, X, 1);
}

static mgk_ref as_grad(mgk_ref X) {
    X.arr = MGK_G;
    return X;
}

/* Reorders dims: new position of old dim d is pos[d] (dims of size 1 dropped). */
static void remap(mgk_ref *X, const int *pos) {
    mgk_i64 s[MGK_MAXD] = {0};
    for (int d = 0; d < MGK_MAXD; d++)
        if (pos[d] >= 0) s[pos[d]] = X->s[d];
    memcpy(X->s, s, sizeof s);
}

typedef struct ad {
    mg_tape *t;
    size_t nest_cap, bwd_cap;
} ad;

/* An alias nest runs one point after another. Where its outputs repeat only across the values
 * of one short outer dim d (a padded convolution's kernel gradient along the two edge columns:
 * each side writes the kernel's middle column), and the outer dims before d fix the element
 * (radix_separate, the dims from d on as the block below them), it
 * runs as n[d] nests, i_d = 0, 1, ... in turn: every element then gets its terms in the order
 * the one nest gave them, and each part is alias-free, so it may run in vector blocks (its sums
 * then in a block's order: the same on every backend and thread count). d, or -1. */
#define MG_UNALIAS_MAX 4
static int unalias_dim(const mgk_nest *G) {
    for (int d = 0; d < MGK_MAXO; d++) {
        if (G->n[d] < 2 || G->n[d] > MG_UNALIAS_MAX) continue;
        mgk_nest P = *G;
        P.n[d] = 1;
        if (!mg_ref__injective(&P.out, P.n, NULL)) continue;
        mgk_i64 span = 0, s[MGK_MAXO], m[MGK_MAXO];
        int k = 0, ok = 1;
        for (int j = 0; j < MGK_MAXO; j++) {
            const mgk_i64 sj = G->out.s[j] < 0 ? -G->out.s[j] : G->out.s[j];
            if (G->n[j] < 2) continue;
            if (j >= d) span += sj * (G->n[j] - 1);
            else if (sj == 0) ok = 0; /* its points interleave with d's on one element */
            else {
                s[k] = sj;
                m[k++] = G->n[j];
            }
        }
        if (ok && radix_separate(s, m, k, span)) return d;
    }
    return -1;
}

/* A window gradient whose windows overlap (a 3x3 max-pool of stride 2, a 2x2 of stride 1) is an
 * alias nest: neighbouring points write shared elements, so it ran point by point, each
 * window's chain replayed in scalars (a 4-channel CNN pooled 3x3 / 2 trained 3.6x slower than
 * the same windows averaged). Points whose indices are congruent modulo m[d] along each outer
 * dim d are windows m[d] strides apart, which overlap no more where m[d] times the stride
 * passes the window's extent: the nest then runs as one alias-free nest per residue class
 * (classes in row-major order of their residues; each may run in vector blocks). Every element
 * gets each window's share once, as before, in the order of its windows' classes instead of
 * their points' (the same on every backend and thread count; the order of eager's backward is
 * neither). The moduli with the fewest classes, at most MG_WINDOW_CLASSES, are written to m;
 * returns the class count, or 0 where none (a window naming one element twice). */
#define MG_WINDOW_CLASSES 16
static mgk_i64 window_classes(const mgk_nest *G, mgk_i64 *m) {
    int dims[MGK_MAXO], nd = 0;
    for (int d = 0; d < MGK_MAXO; d++) {
        m[d] = 1;
        if (G->n[d] > 1) dims[nd++] = d;
    }
    /* an element named at two points of one class (a window naming it twice, the pool's repeated
     * edge; mg_ref__injective passes over dims the ref does not move along) stays an alias */
    for (int d = 0; d < MGK_MAXD; d++)
        if (G->n[d] > 1 && G->out.s[d] == 0) return 0;
    mgk_i64 best = 0, c[MGK_MAXO] = {1, 1, 1, 1};
    for (int code = 0; code < 1 << (2 * nd); code++) { /* m = 1..4 along each moving dim */
        mgk_i64 classes = 1;
        mgk_nest P = *G;
        for (int q = 0; q < nd; q++) {
            const int d = dims[q];
            c[q] = 1 + (code >> (2 * q) & 3);
            classes *= c[q];
            P.n[d] = (G->n[d] + c[q] - 1) / c[q]; /* the largest class, residue 0 */
            P.out.s[d] *= c[q];
        }
        if (classes > MG_WINDOW_CLASSES || (best && classes >= best)) continue;
        if (!mg_ref__injective(&P.out, P.n, NULL)) continue;
        best = classes;
        for (int q = 0; q < nd; q++) m[dims[q]] = c[q];
    }
    if (best <= 1) /* one class: the nest was alias-free (not asked), or none works */
        for (int d = 0; d < MGK_MAXO; d++) m[d] = 1;
    return best > 1 ? best : 0;
}

/* The gradient nest for operand X of F; `term` and the refs x0..x3 are in F's dims. With
 * `outer_only` (the initial value of a sum, added once per output) F's reduction dims are not
 * part of it. */
static int grad_nest(ad *A, size_t f, const mgk_ref *X, int term, const mgk_ref *x, int nx,
                     int outer_only) {
    mg_tape *t = A->t;
    mgk_nest F0 = t->nests[f];
    const mgk_nest *F = &F0;
    if (outer_only)
        for (int d = MGK_MAXO; d < MGK_MAXD; d++) F0.n[d] = 1;
    int pos[MGK_MAXD], no = 0, nr = 0;
    int vary[MGK_MAXD];
    for (int d = 0; d < MGK_MAXD; d++) {
        vary[d] = F->n[d] > 1 && (X->gather || X->s[d] != 0);
        no += vary[d];
        nr += F->n[d] > 1 && !vary[d];
    }
    mgk_nest G;
    memset(&G, 0, sizeof G);
    /* a max's gradient keeps F's dims: each point replays its window (mgk_maxr) */
    const int window = term == MGK_T_DMAXR;
    int scatter = !window && (no > MGK_MAXO || nr > MGK_MAXR);
    if (window) {
        for (int d = 0; d < MGK_MAXD; d++) {
            pos[d] = d;
            G.n[d] = F->n[d];
        }
    } else if (scatter) {
        /* more moving dims than outer dims: F's own dims, each term added into its element */
        for (int d = 0; d < MGK_MAXD; d++) {
            pos[d] = d;
            G.n[d] = F->n[d];
        }
        G.flags = MGK_F_SCATTER;
    } else {
        int io = MGK_MAXO - no, ir = MGK_MAXD - nr;
        for (int d = 0; d < MGK_MAXD; d++) G.n[d] = 1;
        for (int d = 0; d < MGK_MAXD; d++) {
            pos[d] = -1;
            if (F->n[d] <= 1) continue;
            pos[d] = vary[d] ? io++ : ir++;
            G.n[pos[d]] = F->n[d];
        }
    }
    G.mode = MGK_ACC;
    G.term = term;
    G.op = F->op;
    G.pre = F->pre;
    G.k = F->k;
    G.out = as_grad(*X);
    remap(&G.out, pos);
    for (int j = 0; j < nx; j++) {
        G.x[j] = x[j];
        remap(&G.x[j], pos);
    }
    mg_nest_info info = t->info[f];
    info.grad = 1;
    info.alias = scatter || !mg_ref__injective(&G.out, G.n, t->ix);
    /* a window's gradient writes at every point, also along dims its element stays put (a window
     * naming one element twice, a pool's edge repeated): then two points write one element */
    for (int d = 0; window && d < MGK_MAXD; d++) info.alias |= G.n[d] > 1 && G.out.s[d] == 0;
    info.has_gather = 0;
    const mgk_ref *refs[6] = {&G.out, &G.init, &G.x[0], &G.x[1], &G.x[2], &G.x[3]};
    for (int j = 0; j < 6; j++) info.has_gather |= refs[j]->gather != 0;
    const int d = info.alias && !scatter && !window && !info.has_gather ? unalias_dim(&G) : -1;
    mgk_i64 m[MGK_MAXO]; /* a window gradient's residue classes (window_classes) */
    const mgk_i64 classes = info.alias && window && !info.has_gather ? window_classes(&G, m) : 0;
    const mgk_i64 parts = d >= 0 ? G.n[d] : classes ? classes : 1;
    if (d >= 0 || classes) {
        info.alias = 0;
        info.work /= (double)parts;
    }
    for (mgk_i64 v = 0; v < parts; v++) {
        mgk_nest P = G;
        mgk_ref *prefs[6] = {&P.out, &P.init, &P.x[0], &P.x[1], &P.x[2], &P.x[3]};
        if (d >= 0) { /* the part at i_d = v */
            for (int j = 0; j < 6; j++) {
                prefs[j]->base += v * prefs[j]->s[d];
                prefs[j]->s[d] = 0;
            }
            P.n[d] = 1;
        }
        if (classes) { /* class v: residues q[e] of v in mixed radix m, the last dim fastest */
            mgk_i64 rest = v;
            for (int e = MGK_MAXO - 1; e >= 0; e--) {
                const mgk_i64 q = rest % m[e];
                rest /= m[e];
                if (m[e] == 1) continue;
                P.n[e] = (G.n[e] - q + m[e] - 1) / m[e];
                for (int j = 0; j < 6; j++) {
                    prefs[j]->base += q * prefs[j]->s[e];
                    prefs[j]->s[e] *= m[e];
                }
            }
            if (P.n[0] * P.n[1] * P.n[2] * P.n[3] == 0) continue; /* an empty class */
        }
        if (!mg_tape__push_nest(t, &A->nest_cap, &P, &info)) return -1;
        mg_instr in;
        memset(&in, 0, sizeof in);
        in.kind = MG_I_NEST;
        in.a = (uint32_t)(t->nnests - 1);
        in.cone = MG_FZ_LOSS_CONE;
        if (!mg_tape__push_instr(t, &t->bwd, &t->nbwd, &A->bwd_cap, &in)) return -1;
    }
    return 0;
}

/* The gradient nests of forward nest f. */
static int backward_of_nest(ad *A, size_t f) {
    mg_tape *t = A->t;
    const mgk_nest F = t->nests[f]; /* a copy: pushing nests may move the array */
    mgk_ref gout = as_grad(F.out);
    if (F.mode == MGK_SUMI && needs_grad(t, f, &F.init)) {
        mgk_ref x[1] = {gout};
        if (grad_nest(A, f, &F.init, MGK_T_ONE, x, 1, 1) < 0) return 0;
    }
    if (F.term == MGK_T_ONE) {
        if (needs_grad(t, f, &F.x[0])) {
            mgk_ref x[1] = {gout};
            if (grad_nest(A, f, &F.x[0], MGK_T_ONE, x, 1, 0) < 0) return 0;
        }
    } else if (F.term == MGK_T_MUL) {
        /* the operand that is not a parameter first: its gradient reads the parameter, whose own
         * gradient nest may then apply SGD to it (schedule.c's fused step) */
        int first = is_param(t, f, &F.x[0]) && !is_param(t, f, &F.x[1]) ? 1 : 0;
        for (int jj = 0; jj < 2; jj++) {
            int j = jj ? 1 - first : first;
            if (needs_grad(t, f, &F.x[j])) {
                mgk_ref x[2] = {gout, F.x[1 - j]};
                if (grad_nest(A, f, &F.x[j], MGK_T_MUL, x, 2, 0) < 0) return 0;
            }
        }
    } else if (F.term == MGK_T_MAXR) {
        if (needs_grad(t, f, &F.x[0])) {
            mgk_ref x[2] = {F.x[0], gout};
            if (grad_nest(A, f, &F.x[0], MGK_T_DMAXR, x, 2, 0) < 0) return 0;
        }
    } else { /* MGK_T_OP: dA and dB from the op table */
        int ar = mg_op__arity[F.op];
        for (int j = 0; j < ar; j++)
            if (needs_grad(t, f, &F.x[j])) {
                mgk_ref x[4] = {F.x[0], F.x[1], F.out, gout};
                if (grad_nest(A, f, &F.x[j], j == 0 ? MGK_T_DA : MGK_T_DB, x, 4, 0) < 0) return 0;
            }
    }
    return 1;
}

static int backward_of(ad *A, const mg_instr *in) {
    mg_tape *t = A->t;
    if (!(in->cone & MG_FZ_LOSS_CONE)) return 1;
    if (in->kind == MG_I_NEST) return backward_of_nest(A, in->a);
    mg_instr b = *in; /* MG_I_NARY: its backward runs the op's gradient over the same operands */
    b.kind = MG_I_NARY_BWD;
    return mg_tape__push_instr(t, &t->bwd, &t->nbwd, &A->bwd_cap, &b);
}

int mg_autodiff(mg_tape *t) {
    ad A;
    memset(&A, 0, sizeof A);
    A.t = t;
    A.nest_cap = t->nnests;
    t->nfwd_nests = t->nnests;
    if (!t->has_loss) return MG_OK;
    /* items of the forward program (an instruction, or a loop with its body), last first */
    size_t *items = mg_tape__alloc(t, t->nfwd ? t->nfwd : 1, sizeof(size_t)), nitems = 0;
    if (!items) return MG_ENOMEM;
    for (size_t j = 0; j < t->nfwd; j++) {
        items[nitems++] = j;
        if (t->fwd[j].kind == MG_I_SEQ) j += t->fwd[j].a;
    }
    int st = MG_OK;
    for (size_t it = nitems; it-- > 0 && st == MG_OK;) {
        size_t start = items[it];
        const mg_instr *head = &t->fwd[start];
        if (head->kind != MG_I_SEQ) {
            if (!backward_of(&A, head)) st = t->status ? t->status : MG_ENOMEM;
            continue;
        }
        if (!(head->cone & MG_FZ_LOSS_CONE)) continue;
        size_t at = t->nbwd;
        mg_instr seq = *head;
        seq.flags = 1; /* reversed */
        if (!mg_tape__push_instr(t, &t->bwd, &t->nbwd, &A.bwd_cap, &seq)) {
            st = t->status;
            break;
        }
        for (size_t q = start + 1 + head->a; q-- > start + 1;)
            if (!backward_of(&A, &t->fwd[q])) {
                st = t->status ? t->status : MG_ENOMEM;
                break;
            }
        t->bwd[at].a = (uint32_t)(t->nbwd - at - 1);
        t->bwd[at].cone = MG_FZ_LOSS_CONE;
        if (t->bwd[at].a == 0) t->nbwd = at; /* nothing to differentiate in the body */
    }
    t->alloc.free_fn(items, t->alloc.ctx);
    return st;
}
