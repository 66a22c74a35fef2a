/* Rerolling: the loops a scalar graph was written with, recovered as loop nests.
 *
 * 1. Statements. A left-leaning chain of additions whose inner nodes have one use,
 *    `((b + w0*x0) + w1*x1) + ...`, becomes one reduction `b + sum_r term_r` (a single-use
 *    product is absorbed into its term; where the values it adds are additions, they are of one
 *    tree depth, so a tree of additions folds level by level); libmg's DOT and SUM nodes are
 *    reductions already (a SUM absorbs its single-use products too). A
 *    chain of max over per-sample values, `a.max(b).max(c).max(d)`, becomes a max over its
 *    elements (MGK_T_MAXR: a max-pool's window, one nest and one gradient nest), of their
 *    ReLUs' operands when each element is a ReLU it alone reads (the nest's `pre`); its
 *    elements are of one op (a balanced tree of max stays elementwise, as written). Every
 *    other op node is an elementwise statement; the losses (variadic ops) stay as they are.
 * 2. Levels. A statement's level is one more than its operands' highest, so statements of one
 *    level never depend on each other.
 * 3. Segments and signatures. A reduction's terms split into runs of one shape (term kind and
 *    operand classes); each run's operand slots are fitted as an affine function of a row-major
 *    multi-index (a 3x3 convolution's input is (i+a)*W + (j+b): dims (3, 3), strides (W, 1)).
 *    The signature is everything but the slots' bases.
 * 4. Layout. A level's statements get consecutive slots in creation order (so the next level
 *    reads them in the order the user's loops wrote them), except a level that cycles through
 *    2-4 kinds unit by unit (a GRU's gates: z r n z r n ...), or through more when its readers
 *    are better off (a maxout unit's pieces: kinds_for_readers): it is stored kind-major
 *    (level_layout), so that loops over the units read and write consecutive slots.
 * 5. Groups. Statements of one level and one signature form a group, in slot order, whose
 *    operand bases are fitted as an affine function of the group's own multi-index. Operands
 *    that are not affine are read through an index table (gather), never one instruction per
 *    scalar.
 * Forward values are unchanged: every reduction adds its terms in the chain's order. */
#include "ir.h"

#include <string.h>

enum { S_ELEM = 0, S_RED = 1, S_NARY = 2 };
#define MAXSEG 8  /* segments per statement before the rest of a run is read through tables */
#define MAXRUNS 4 /* runs of one term shape per chain; a longer chain is cut in two */

typedef struct term {
    uint8_t kind; /* MGK_T_ONE or MGK_T_MUL */
    uint32_t a, b;
} term;

typedef struct seg {
    uint32_t r0, len;
    int nd; /* reduction dims */
    int gather_a, gather_b;
    int mixed; /* operand classes vary within the segment (all read through tables) */
    int64_t n[MGK_MAXR], sa[MGK_MAXR], sb[MGK_MAXR];
} seg;

typedef struct stmt {
    uint32_t node; /* the node it computes */
    uint32_t level;
    uint8_t kind, op, mode, cone;
    uint8_t pre;   /* a window: the op its elements are of (MG_OP_RELU), folded in; 0 none */
    uint32_t init; /* SUMI: the initial value's node */
    uint32_t t0, nt;
    uint32_t s0, ns; /* segments */
    uint32_t sig, siglen;
    uint64_t hash;
} stmt;

/* Whether statement s is a max over a window (a folded chain of max, make_statements). */
static int is_window(const stmt *s) { return s->kind == S_RED && s->op == MG_OP_MAX; }

typedef struct rr {
    mg_tape *t;
    const mg_fz *f;
    stmt *st;
    size_t nst, capst;
    term *terms;
    size_t nterms, capterms;
    seg *segs;
    size_t nsegs, capsegs;
    uint64_t *sigbuf;
    size_t nsig, capsig;
    uint32_t *stmt_of; /* node -> statement, UINT32_MAX */
    uint8_t *absorbed;
    uint32_t *level; /* node -> level */
    size_t next_slot;
    size_t nest_cap;
    size_t fwd_cap;
    size_t ix_cap;
    /* per-group scratch */
    int64_t *seqbuf;
    size_t capseq;
    /* readers (level_layout's reader cost; built on first use): the statements reading node k
     * are rd[rd_off[k] .. rd_off[k + 1]), `stamp` marks a statement collected once */
    uint32_t *rd_off, *rd, *stamp, *rdbuf;
    uint32_t nstamp;
    size_t caprd;
} rr;

static void rr_free(rr *R) {
    mg_tape *t = R->t;
    void *bufs[] = {R->st,    R->terms,  R->segs,   R->sigbuf, R->stmt_of, R->absorbed,
                    R->level, R->seqbuf, R->rd_off, R->rd,     R->stamp,   R->rdbuf};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) t->alloc.free_fn(bufs[i], t->alloc.ctx);
}

#define GROW(R, buf, cap, n)                                                                       \
    mg_tape__grow((R)->t, (void **)&(R)->buf, &(R)->cap, sizeof *(R)->buf, (n))

static uint32_t slot_of(const rr *R, uint32_t node) { return R->f->slot[node]; }
static int cls_of(const rr *R, uint32_t node) { return R->f->cls[node]; }

/* ---- affine fitting
 * ------------------------------------------------------------------------------ Row-major dims
 * (outermost first) and per-sequence strides such that element i of every sequence is base + sum_k
 * s[k] * idx_k(i). Element i of sequence j is seqs[j][i * step]. */

typedef struct fitres {
    int nd;
    int64_t n[MGK_MAXD];
} fitres;

static int fit_rec(int64_t *const *seqs, const int *use, int ns, size_t len, size_t step, int maxd,
                   fitres *fr, int64_t *strides /* [ns][MGK_MAXD] */) {
    if (len == 1) {
        fr->nd = 0;
        return 1;
    }
    if (maxd == 0) return 0;
    size_t L = 1;
    for (; L < len; L++) {
        int same = 1;
        for (int j = 0; j < ns && same; j++)
            if (use[j])
                same = seqs[j][L * step] - seqs[j][(L - 1) * step] == seqs[j][step] - seqs[j][0];
        if (!same) break;
    }
    int tries = 0;
    for (size_t Lc = L; Lc >= 2 && tries < 8; Lc--) {
        if (len % Lc) continue;
        tries++;
        int ok = 1;
        for (size_t b = 1; b < len / Lc && ok; b++)
            for (int j = 0; j < ns && ok; j++) {
                if (!use[j]) continue;
                const int64_t d = seqs[j][step] - seqs[j][0];
                for (size_t i = 1; i < Lc && ok; i++)
                    ok = seqs[j][(b * Lc + i) * step] - seqs[j][(b * Lc + i - 1) * step] == d;
            }
        if (!ok) continue;
        if (Lc == len) {
            fr->nd = 1;
            fr->n[0] = (int64_t)len;
            for (int j = 0; j < ns; j++)
                strides[j * MGK_MAXD] = use[j] ? seqs[j][step] - seqs[j][0] : 0;
            return 1;
        }
        if (!fit_rec(seqs, use, ns, len / Lc, step * Lc, maxd - 1, fr, strides)) continue;
        int k = fr->nd;
        fr->n[k] = (int64_t)Lc;
        for (int j = 0; j < ns; j++)
            strides[j * MGK_MAXD + k] = use[j] ? seqs[j][step] - seqs[j][0] : 0;
        fr->nd = k + 1;
        return 1;
    }
    return 0;
}

/* Fits the sequences flagged in `use`; with `greedy`, the first sequence that fits on its own
 * anchors the dims and each other one is kept only if the fit still holds (use[j] = 0 for
 * those dropped). Returns 1 on success (with `greedy`, when any sequence fits; with greedy == 2,
 * only when the first wanted sequence fits: the outputs of a group must be affine). */
static int fit(int64_t *const *seqs, int *use, int ns, size_t len, int maxd, int greedy, fitres *fr,
               int64_t *strides) {
    if (!greedy) return fit_rec(seqs, use, ns, len, 1, maxd, fr, strides);
    int first = -1;
    for (int j = 0; j < ns && first < 0; j++)
        if (use[j]) first = j;
    int want[4 + 2 * MAXSEG];
    for (int j = 0; j < ns; j++) {
        want[j] = use[j];
        use[j] = 0;
    }
    int any = 0;
    for (int j = 0; j < ns; j++) {
        if (!want[j]) continue;
        use[j] = 1;
        if (!fit_rec(seqs, use, ns, len, 1, maxd, fr, strides)) {
            use[j] = 0;
            if (greedy == 2 && j == first) return 0;
        } else {
            any = 1;
        }
    }
    return any && fit_rec(seqs, use, ns, len, 1, maxd, fr, strides);
}

/* ---- statements -------------------------------------------------------------------------------
 */

static int add_term(rr *R, int kind, uint32_t a, uint32_t b) {
    if (!GROW(R, terms, capterms, R->nterms + 1)) return 0;
    /* weights first: a parameter times anything else (products commute exactly) */
    if (kind == MGK_T_MUL && cls_of(R, b) == MG_C_PARAM && cls_of(R, a) != MG_C_PARAM) {
        uint32_t tmp = a;
        a = b;
        b = tmp;
    }
    R->terms[R->nterms].kind = (uint8_t)kind;
    R->terms[R->nterms].a = a;
    R->terms[R->nterms].b = b;
    R->nterms++;
    return 1;
}

static stmt *new_stmt(rr *R, uint32_t node, int kind) {
    if (!GROW(R, st, capst, R->nst + 1)) return NULL;
    stmt *s = &R->st[R->nst];
    memset(s, 0, sizeof *s);
    s->node = node;
    s->kind = (uint8_t)kind;
    s->op = R->f->op[node];
    s->cone = R->f->cone[node] & (MG_FZ_LOSS_CONE | MG_FZ_OUT_CONE);
    s->init = UINT32_MAX;
    s->t0 = (uint32_t)R->nterms;
    R->stmt_of[node] = (uint32_t)R->nst++;
    return s;
}

/* The shape of the term a chain's right operand makes: kind and operand classes (weights first). */
static int term_shape_of(const rr *R, uint32_t rgt) {
    const mg_fz *f = R->f;
    if (f->op[rgt] != MG_OP_MUL || f->uses[rgt] != 1) return MGK_T_ONE | cls_of(R, rgt) << 4;
    int a = cls_of(R, f->opnd[f->off[rgt]]), b = cls_of(R, f->opnd[f->off[rgt] + 1]);
    if (b == MG_C_PARAM && a != MG_C_PARAM) {
        int tmp = a;
        a = b;
        b = tmp;
    }
    return MGK_T_MUL | a << 4 | b << 8;
}

/* Runs of one operand-class pattern in a DOT or SUM node (a SUM's terms: term_shape_of): more
 * than MAXSEG and the node stays a variadic op (a loop over it would read through a table mixing
 * shared and per-sample slots). */
static size_t class_runs(const rr *R, uint32_t k) {
    const mg_fz *f = R->f;
    const uint32_t *o = f->opnd + f->off[k];
    uint32_t no = f->off[k + 1] - f->off[k];
    size_t runs = 0;
    int prev = -1;
    if (f->op[k] == MG_OP_DOT) {
        uint32_t m = (uint32_t)f->k[k];
        for (uint32_t i = 0; i < m; i++) {
            int a = cls_of(R, o[i]), b = cls_of(R, o[m + i]);
            if (b == MG_C_PARAM && a != MG_C_PARAM) a = b, b = cls_of(R, o[i]);
            int shape = a << 4 | b;
            runs += shape != prev;
            prev = shape;
        }
    } else {
        for (uint32_t i = 0; i < no; i++) {
            int shape = term_shape_of(R, o[i]);
            runs += shape != prev;
            prev = shape;
        }
    }
    return runs;
}

/* Top-down over the nodes: chains fold into the reduction at their top. */
static int make_statements(rr *R, int scalar) {
    const mg_fz *f = R->f;
    for (size_t kk = f->n; kk-- > 0;) {
        uint32_t k = (uint32_t)kk;
        int op = f->op[k];
        if (op == MG_OP_LEAF || R->absorbed[k]) continue;
        const uint32_t *o = f->opnd + f->off[k];
        uint32_t no = f->off[k + 1] - f->off[k];
        if (!scalar && op == MG_OP_ADD) {
            /* the chain: the left spine while its nodes are additions used once. Where the first
             * computed value it adds as it is (not a product it absorbs, not a leaf: a bias) is
             * itself an addition, the walk also stops at the first such value of another op or
             * tree depth (R->level, see mg_reroll): in a tree of additions, `(a + b) + (c + d)`
             * (a 2x2 average pool summed pairwise, a neuron's products summed pairwise), it stops
             * at a + b, which becomes the init, so each level of the tree is a group of its own.
             * (Terms of two ops or depths are statements of two groups, whose slots no stride
             * joins: every pool window was a nest of its own, 6x slower, and the pairwise MLP
             * 55,041 statements, 250x.) Other chains of values of several ops (x.tanh() +
             * y.relu() + ...) keep their runs of terms, each fitted on its own (make_segments). */
            size_t nt = 0, nmul = 0, runs = 0;
            int prev = -1, op1 = -1;
            uint32_t cur = k, depth1 = 0;
            while (f->op[cur] == MG_OP_ADD &&
                   (cur == k || (f->uses[cur] == 1 && !R->absorbed[cur]))) {
                uint32_t rgt = f->opnd[f->off[cur] + 1];
                if (!(f->op[rgt] == MG_OP_MUL && f->uses[rgt] == 1) &&
                    cls_of(R, rgt) == MG_C_VALUE) {
                    if (op1 < 0) {
                        op1 = f->op[rgt];
                        depth1 = R->level[rgt];
                    } else if (op1 == MG_OP_ADD && (f->op[rgt] != op1 || R->level[rgt] != depth1)) {
                        break; /* the rest is this one's init */
                    }
                }
                int shape = term_shape_of(R, rgt);
                if (shape != prev) {
                    if (runs == MAXRUNS)
                        break; /* the rest is a chain of its own, this one's init */
                    runs++;
                    prev = shape;
                }
                nmul += f->op[rgt] == MG_OP_MUL && f->uses[rgt] == 1;
                nt++;
                cur = f->opnd[f->off[cur]];
            }
            if (nt >= 2 || nmul) {
                stmt *s = new_stmt(R, k, S_RED);
                if (!s) return 0;
                s->mode = MGK_SUMI;
                s->init = cur;
                /* terms in chain order: the walk went from the top down */
                size_t t0 = R->nterms;
                if (!GROW(R, terms, capterms, R->nterms + nt)) return 0;
                uint32_t c = k;
                for (size_t i = 0; i < nt; i++) {
                    uint32_t rgt = f->opnd[f->off[c] + 1];
                    if (c != k) R->absorbed[c] = 1;
                    if (f->op[rgt] == MG_OP_MUL && f->uses[rgt] == 1) {
                        R->absorbed[rgt] = 1;
                        if (!add_term(R, MGK_T_MUL, f->opnd[f->off[rgt]], f->opnd[f->off[rgt] + 1]))
                            return 0;
                    } else if (!add_term(R, MGK_T_ONE, rgt, UINT32_MAX)) {
                        return 0;
                    }
                    c = f->opnd[f->off[c]];
                }
                for (size_t i = 0, j = nt - 1; i < j; i++, j--) {
                    term tmp = R->terms[t0 + i];
                    R->terms[t0 + i] = R->terms[t0 + j];
                    R->terms[t0 + j] = tmp;
                }
                s = &R->st[R->stmt_of[k]];
                s->nt = (uint32_t)nt;
                continue;
            }
        }
        if (!scalar && op == MG_OP_MAX) {
            /* a chain of max, `a.max(b).max(c).max(d)` (a max-pool's window): the left spine
             * while its nodes are max used once, every element a per-sample value; one
             * reduction over all of them, the leftmost first (a window, however it is laid out,
             * is one run of terms). Its elements are all of the top's right operand's op: the
             * walk stops at a node whose right operand is of another op, which is then the
             * leftmost element (a chain of rows' maxima, each row a chain: a window of windows).
             * Elements of different ops are statements of different groups, whose slots no
             * window's strides join: a balanced `a.max(b).max(c.max(d))` was a window of a, b
             * and the max of c and d, read through an index table point by point, 4.6x slower
             * than the two levels of elementwise maxima it now stays as. */
            size_t nt = 1;
            uint32_t cur = k;
            const int eop = f->op[f->opnd[f->off[k] + 1]];
            int ok = cls_of(R, f->opnd[f->off[k] + 1]) == MG_C_VALUE;
            while (ok && f->op[cur] == MG_OP_MAX &&
                   (cur == k || (f->uses[cur] == 1 && !R->absorbed[cur]))) {
                const uint32_t e = f->opnd[f->off[cur] + 1];
                if (f->op[e] != eop) break; /* cur is the leftmost element */
                ok = cls_of(R, e) == MG_C_VALUE && nt < MGK_MAXWIN;
                nt++;
                cur = f->opnd[f->off[cur]];
            }
            if (ok && nt >= 3 && cls_of(R, cur) == MG_C_VALUE && f->op[cur] == eop) {
                /* every element a ReLU that this window alone reads, of a per-sample value that
                 * the ReLU alone reads (a CNN's conv -> relu -> pool): the window applies it, and
                 * the ReLUs' values and gradients are never stored. (An operand with other
                 * readers would get the window's gradient at another point of its sum than the
                 * ReLU's: other bits.) */
                int relu = 1;
                for (uint32_t c = k, i = 0; relu && i < nt; i++) {
                    const uint32_t e = i + 1 < nt ? f->opnd[f->off[c] + 1] : c;
                    relu = f->op[e] == MG_OP_RELU && f->uses[e] == 1 && !R->absorbed[e] &&
                           cls_of(R, f->opnd[f->off[e]]) == MG_C_VALUE &&
                           f->uses[f->opnd[f->off[e]]] == 1;
                    if (i + 1 < nt) c = f->opnd[f->off[c]];
                }
                stmt *s = new_stmt(R, k, S_RED);
                if (!s) return 0;
                s->mode = MGK_SET;
                s->pre = relu ? MG_OP_RELU : 0;
                if (!GROW(R, terms, capterms, R->nterms + nt)) return 0;
                const size_t t0 = R->nterms;
                R->nterms += nt;
                uint32_t c = k;
                for (size_t i = nt; i-- > 0;) { /* right operands from the top down, then c */
                    if (c != k && i) R->absorbed[c] = 1;
                    uint32_t e = i ? f->opnd[f->off[c] + 1] : c;
                    if (relu) {
                        R->absorbed[e] = 1;
                        e = f->opnd[f->off[e]];
                    }
                    R->terms[t0 + i] = (term){MGK_T_ONE, e, UINT32_MAX};
                    if (i) c = f->opnd[f->off[c]];
                }
                s = &R->st[R->stmt_of[k]];
                s->nt = (uint32_t)nt;
                continue;
            }
        }
        if (!scalar && (op == MG_OP_DOT || op == MG_OP_SUM) && f->k[k] > 0 && no > 0 &&
            class_runs(R, k) <= MAXSEG) {
            stmt *s = new_stmt(R, k, S_RED);
            if (!s) return 0;
            if (op == MG_OP_DOT) {
                uint32_t m = (uint32_t)f->k[k];
                s->mode = f->bias[k] ? MGK_SUMI : MGK_SUM0;
                if (f->bias[k]) s->init = o[2 * m];
                for (uint32_t i = 0; i < m; i++)
                    if (!add_term(R, MGK_T_MUL, o[i], o[m + i])) return 0;
                s = &R->st[R->stmt_of[k]];
                s->nt = m;
            } else { /* a product it alone reads is a term, as in a chain of additions */
                s->mode = MGK_SUM0;
                for (uint32_t i = 0; i < no; i++) {
                    const uint32_t e = o[i];
                    if (f->op[e] == MG_OP_MUL && f->uses[e] == 1 && !R->absorbed[e]) {
                        R->absorbed[e] = 1;
                        if (!add_term(R, MGK_T_MUL, f->opnd[f->off[e]], f->opnd[f->off[e] + 1]))
                            return 0;
                    } else if (!add_term(R, MGK_T_ONE, e, UINT32_MAX)) {
                        return 0;
                    }
                }
                s = &R->st[R->stmt_of[k]];
                s->nt = no;
            }
            continue;
        }
        if (!new_stmt(R, k, mg_op__arity[op] < 0 ? S_NARY : S_ELEM)) return 0;
    }
    /* creation order == topological order of the statements */
    for (size_t i = 0, j = R->nst ? R->nst - 1 : 0; i < j; i++, j--) {
        stmt tmp = R->st[i];
        R->st[i] = R->st[j];
        R->st[j] = tmp;
    }
    for (size_t i = 0; i < R->nst; i++) R->stmt_of[R->st[i].node] = (uint32_t)i;
    return 1;
}

/* Runs DO(node) for every node statement s reads (a reduction's init and term operands, an
 * elementwise statement's operands), repeats included. */
#define EACH_READ(R, s, DO)                                                                        \
    do {                                                                                           \
        if ((s)->kind == S_RED) {                                                                  \
            if ((s)->init != UINT32_MAX) DO((s)->init);                                            \
            for (uint32_t q_ = 0; q_ < (s)->nt; q_++) {                                            \
                const term *tm_ = &(R)->terms[(s)->t0 + q_];                                       \
                DO(tm_->a);                                                                        \
                if (tm_->kind == MGK_T_MUL) DO(tm_->b);                                            \
            }                                                                                      \
        } else {                                                                                   \
            for (uint32_t j_ = (R)->f->off[(s)->node]; j_ < (R)->f->off[(s)->node + 1]; j_++)      \
                DO((R)->f->opnd[j_]);                                                              \
        }                                                                                          \
    } while (0)

/* A statement's level: one more than the highest of the statements it reads (leaves: 0). */
static uint32_t stmt_level(const rr *R, const stmt *s) {
    uint32_t lv = 0;
    /* a per-sample statement's levels count from the shared values' (all before them): a shared
     * operand is as ready as a parameter */
    const int own = cls_of(R, s->node) == MG_C_SHARED;
#define SEE(node)                                                                                  \
    do {                                                                                           \
        uint32_t l_ = own || cls_of(R, node) != MG_C_SHARED ? R->level[node] : 0;                  \
        if (l_ > lv) lv = l_;                                                                      \
    } while (0)
    EACH_READ(R, s, SEE);
#undef SEE
    return lv + 1;
}

/* ---- segments and signatures --------------------------------------------------------------------
 */

static int term_shape_eq(const rr *R, const term *x, const term *y) {
    if (x->kind != y->kind || cls_of(R, x->a) != cls_of(R, y->a)) return 0;
    return x->kind != MGK_T_MUL || cls_of(R, x->b) == cls_of(R, y->b);
}

static int push_seg(rr *R, stmt *s, const seg *g) {
    if (!GROW(R, segs, capsegs, R->nsegs + 1)) return 0;
    R->segs[R->nsegs++] = *g;
    s->ns++;
    return 1;
}

/* The longest prefix of two sequences with constant differences. */
static uint32_t prefix_len(const int64_t *sa, const int64_t *sb, uint32_t len) {
    uint32_t L = 1;
    while (L < len && sa[L] - sa[L - 1] == sa[1] - sa[0] && sb[L] - sb[L - 1] == sb[1] - sb[0]) L++;
    return L;
}

/* How many such prefixes cover the sequences (counting stops past `cap`). */
static uint32_t prefix_pieces(const int64_t *sa, const int64_t *sb, uint32_t len, uint32_t cap) {
    uint32_t pieces = 0;
    while (len && pieces <= cap) {
        uint32_t L = prefix_len(sa, sb, len);
        sa += L;
        sb += L;
        len -= L;
        pieces++;
    }
    return pieces;
}

/* Splits a statement's terms into segments with fitted reduction dims: one per run of one term
 * shape, split further where the slots are not affine, at most MAXSEG in all (the last piece of
 * a run reads what is not affine through tables). */
static int make_segments(rr *R, stmt *s) {
    s->s0 = (uint32_t)R->nsegs;
    s->ns = 0;
    if (s->kind != S_RED) return 1;
    uint32_t runs[MAXSEG + 1][2];
    uint32_t nruns = 0, r = 0;
    while (r < s->nt && nruns <= MAXSEG) {
        uint32_t e = r + 1;
        while (e < s->nt && term_shape_eq(R, &R->terms[s->t0 + r], &R->terms[s->t0 + e])) e++;
        runs[nruns][0] = r;
        runs[nruns][1] = e;
        nruns++;
        r = e;
    }
    int mixed = 0;
    if (r < s->nt ||
        nruns > MAXSEG) { /* a variadic node mixing many classes: one table-read segment */
        nruns = 1;
        runs[0][0] = 0;
        runs[0][1] = s->nt;
        mixed = 1;
    }
    for (uint32_t q = 0; q < nruns; q++) {
        const term *tr = &R->terms[s->t0 + runs[q][0]];
        uint32_t e = runs[q][1];
        r = runs[q][0];
        while (r < e) {
            uint32_t len = e - r;
            if (!GROW(R, seqbuf, capseq, 2 * (size_t)len)) return 0;
            int64_t *sa = R->seqbuf, *sb = R->seqbuf + len;
            int mul = tr->kind == MGK_T_MUL;
            for (uint32_t i = 0; i < len; i++) {
                sa[i] = slot_of(R, R->terms[s->t0 + r + i].a);
                sb[i] = mul ? slot_of(R, R->terms[s->t0 + r + i].b) : 0;
            }
            int64_t *seqs[2] = {sa, sb};
            int use[2] = {1, mul};
            int64_t str[2 * MGK_MAXD];
            memset(str, 0, sizeof str);
            fitres fr;
            seg g;
            memset(&g, 0, sizeof g);
            g.r0 = r;
            g.mixed = mixed;
            int budget = MAXSEG - (int)s->ns - (int)(nruns - 1 - q);
            if (!mixed && fit(seqs, use, 2, len, MGK_MAXR, 0, &fr, str)) {
                g.len = len;
            } else if (!mixed && !is_window(s) && budget > 1 &&
                       prefix_pieces(sa, sb, len, 3) <= 3) {
                /* a few runs of constant differences (a 2x2 window written as a + b + c + d):
                 * the first as its own segment */
                uint32_t L = prefix_len(sa, sb, len);
                g.len = L;
                fit(seqs, use, 2, L, MGK_MAXR, 0, &fr, str);
            } else {
                /* out of pieces: one segment, what is not affine read through tables */
                g.len = len;
                if (mixed || !fit(seqs, use, 2, len, MGK_MAXR, 1, &fr, str)) {
                    use[0] = use[1] = 0;
                    fr.nd = 1;
                    fr.n[0] = len;
                }
                g.gather_a = !use[0];
                g.gather_b = mul && !use[1];
            }
            g.nd = fr.nd;
            for (int d = 0; d < fr.nd; d++) {
                g.n[d] = fr.n[d];
                g.sa[d] = g.gather_a ? 0 : str[d];
                g.sb[d] = g.gather_b ? 0 : str[MGK_MAXD + d];
            }
            if (!push_seg(R, s, &g)) return 0;
            r += g.len;
        }
    }
    return 1;
}

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0xBF58476D1CE4E5B9ull;
}

static uint64_t dbits(double x) {
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

/* The signature: everything that must be equal for statements to share one loop nest. */
static int make_signature(rr *R, stmt *s) {
    const mg_fz *f = R->f;
    size_t cap0 = R->nsig;
    uint64_t w[16];
    size_t nw = 0;
    w[nw++] = s->kind | (uint64_t)s->op << 8 | (uint64_t)s->mode << 16 | (uint64_t)s->cone << 24 |
              (uint64_t)s->pre << 32;
    if (s->kind == S_NARY) {
        w[nw++] = s->node; /* never grouped */
    } else if (s->kind == S_ELEM) {
        w[nw++] = dbits(f->k[s->node]);
        for (uint32_t j = f->off[s->node]; j < f->off[s->node + 1]; j++)
            w[nw++] = (uint64_t)cls_of(R, f->opnd[j]);
    } else {
        w[nw++] = s->init != UINT32_MAX ? (uint64_t)cls_of(R, s->init) : 99;
        w[nw++] = s->ns;
    }
    if (!GROW(R, sigbuf, capsig, R->nsig + nw)) return 0;
    memcpy(R->sigbuf + R->nsig, w, nw * sizeof(uint64_t));
    R->nsig += nw;
    for (uint32_t q = 0; q < s->ns && s->kind == S_RED; q++) {
        const seg *g = &R->segs[s->s0 + q];
        const term *tm = &R->terms[s->t0 + g->r0];
        if (!GROW(R, sigbuf, capsig, R->nsig + 4 + 3 * MGK_MAXR)) return 0;
        uint64_t *p = R->sigbuf + R->nsig;
        size_t k = 0;
        p[k++] = tm->kind | (uint64_t)(g->mixed ? 7 : cls_of(R, tm->a)) << 8 |
                 (uint64_t)(tm->kind == MGK_T_MUL && !g->mixed ? cls_of(R, tm->b) : 7) << 16 |
                 (uint64_t)g->nd << 24 | (uint64_t)g->gather_a << 32 | (uint64_t)g->gather_b << 33;
        p[k++] = g->len;
        for (int d = 0; d < g->nd; d++) {
            p[k++] = (uint64_t)g->n[d];
            p[k++] = (uint64_t)g->sa[d];
            p[k++] = (uint64_t)g->sb[d];
        }
        R->nsig += k;
    }
    s->sig = (uint32_t)cap0;
    s->siglen = (uint32_t)(R->nsig - cap0);
    uint64_t h = 0x51ED270B27Aull;
    for (size_t i = cap0; i < R->nsig; i++) h = mix(h, R->sigbuf[i]);
    s->hash = h;
    return 1;
}

static int same_signature(const rr *R, const stmt *x, const stmt *y) {
    return x->hash == y->hash && x->siglen == y->siglen &&
           memcmp(R->sigbuf + x->sig, R->sigbuf + y->sig, x->siglen * sizeof(uint64_t)) == 0;
}

/* ---- nests ------------------------------------------------------------------------------------
 */

void mg_nest__canon(mgk_nest *N, int no, int nr) {
    /* callers fill dims 0..no-1 and MGK_MAXO..MGK_MAXO+nr-1; move them to the right ends */
    mgk_ref *refs[6] = {&N->out, &N->init, &N->x[0], &N->x[1], &N->x[2], &N->x[3]};
    int64_t n[MGK_MAXD];
    for (int d = 0; d < MGK_MAXD; d++) n[d] = 1;
    for (int d = 0; d < no; d++) n[MGK_MAXO - no + d] = N->n[d];
    for (int d = 0; d < nr; d++) n[MGK_MAXD - nr + d] = N->n[MGK_MAXO + d];
    for (int j = 0; j < 6; j++) {
        int64_t s[MGK_MAXD] = {0};
        for (int d = 0; d < no; d++) s[MGK_MAXO - no + d] = refs[j]->s[d];
        for (int d = 0; d < nr; d++) s[MGK_MAXD - nr + d] = refs[j]->s[MGK_MAXO + d];
        memcpy(refs[j]->s, s, sizeof s);
    }
    memcpy(N->n, n, sizeof n);
}

/* Appends an index table: for every point of the nest (row-major over its canonical dims),
 * the slot that `slot_at(point)` names; makes `X` a gather ref over it. */
typedef struct gather_src {
    const rr *R;
    const uint32_t *members; /* statements of the group, in the group's order */
    size_t nouter;           /* points of the outer dims */
    const stmt *s0;
    uint32_t segi; /* segment */
    int which; /* 0: init, 1: term operand a, 2: term operand b, 3: elementwise operand 0, 4: 1 */
} gather_src;

static uint32_t gather_slot(const gather_src *G, size_t point, size_t rlen) {
    const rr *R = G->R;
    size_t outer = point / rlen, r = point % rlen;
    const stmt *s = &R->st[G->members[outer]];
    if (G->which == 0) return slot_of(R, s->init);
    if (G->which >= 3) return slot_of(R, R->f->opnd[R->f->off[s->node] + (uint32_t)(G->which - 3)]);
    const seg *g = &R->segs[s->s0 + G->segi];
    const term *tm = &R->terms[s->t0 + g->r0 + r];
    return slot_of(R, G->which == 1 ? tm->a : tm->b);
}

static int add_gather(rr *R, mgk_nest *N, mgk_ref *X, const gather_src *G, size_t rlen) {
    mg_tape *t = R->t;
    size_t npoints = G->nouter * rlen;
    if (!mg_tape__grow(t, (void **)&t->ix, &R->ix_cap, sizeof(mgk_idx), t->nix + npoints)) return 0;
    for (size_t p = 0; p < npoints; p++) t->ix[t->nix + p] = (mgk_idx)gather_slot(G, p, rlen);
    X->gather = 1;
    X->base = (mgk_i64)t->nix;
    /* positions row-major over the canonical dims; a sum's start is read once per output, so
     * its table spans the outer dims only (stride 0 along the reduction dims) */
    int dims = X == &N->init ? MGK_MAXO : MGK_MAXD;
    mgk_i64 step = 1;
    for (int d = MGK_MAXD; d-- > 0;) {
        X->s[d] = N->n[d] == 1 || d >= dims ? 0 : step;
        if (d < dims) step *= N->n[d];
    }
    t->nix += npoints;
    return 1;
}

static int push_fwd_nest(rr *R, const mgk_nest *N, const stmt *s0, size_t npoints, size_t rlen) {
    mg_tape *t = R->t;
    mg_nest_info info;
    memset(&info, 0, sizeof info);
    info.loss_cone = (s0->cone & MG_FZ_LOSS_CONE) != 0;
    info.out_cone = (s0->cone & MG_FZ_OUT_CONE) != 0;
    info.seq = 1;
    info.work = (double)npoints * (double)(rlen ? rlen : 1);
    const mgk_ref *refs[6] = {&N->out, &N->init, &N->x[0], &N->x[1], &N->x[2], &N->x[3]};
    for (int j = 0; j < 6; j++) info.has_gather |= refs[j]->gather != 0;
    if (!mg_tape__push_nest(t, &R->nest_cap, N, &info)) return 0;
    mg_instr in;
    memset(&in, 0, sizeof in);
    in.kind = MG_I_NEST;
    in.a = (uint32_t)(t->nnests - 1);
    in.cone = s0->cone;
    return mg_tape__push_instr(t, &t->fwd, &t->nfwd, &R->fwd_cap, &in);
}

/* A group's sequences (out, init or elementwise operands, each segment's term operands' first
 * slots) and their affine fit over the group's members. */
typedef struct gfit {
    int64_t *seqs[2 + 2 * MAXSEG];
    int use[2 + 2 * MAXSEG];  /* fitted */
    int want[2 + 2 * MAXSEG]; /* to fit (the rest are read through index tables) */
    int nseg, ns;             /* segments; sequences (seqs[0 .. ns)) */
    uint32_t nops;            /* elementwise operands */
    int64_t str[(2 + 2 * MAXSEG) * MGK_MAXD];
    fitres fr;
} gfit;

/* Fits group `members` (N statements, not variadic): 1, -1 when the outputs are not affine, 0
 * out of memory. */
static int group_fit(rr *R, const uint32_t *members, size_t N, gfit *G) {
    /* the sequences whose bases must be affine over the group: out, init / elementwise operands,
     * and per segment its term operands' first slots */
    const mg_fz *f = R->f;
    const stmt *s0 = &R->st[members[0]];
    const int nseg = G->nseg = s0->kind == S_RED ? (int)s0->ns : 0;
    const int ns = G->ns = 2 + (s0->kind == S_RED ? 2 * nseg : 1);
    if (!GROW(R, seqbuf, capseq, (size_t)ns * N)) return 0;
    int64_t **seqs = G->seqs;
    int *use = G->use;
    for (int j = 0; j < ns; j++) {
        seqs[j] = R->seqbuf + (size_t)j * N;
        use[j] = 0;
    }
    const uint32_t nops = G->nops =
        s0->kind == S_ELEM ? f->off[s0->node + 1] - f->off[s0->node] : 0;
    for (size_t i = 0; i < N; i++) {
        const stmt *s = &R->st[members[i]];
        seqs[0][i] = slot_of(R, s->node);
        if (s0->kind == S_ELEM) {
            seqs[1][i] = nops > 0 ? slot_of(R, f->opnd[f->off[s->node]]) : 0;
            seqs[2][i] = nops > 1 ? slot_of(R, f->opnd[f->off[s->node] + 1]) : 0;
        } else {
            seqs[1][i] = s->init != UINT32_MAX ? slot_of(R, s->init) : 0;
            for (int q = 0; q < nseg; q++) {
                const seg *g = &R->segs[s->s0 + q];
                const term *tm = &R->terms[s->t0 + g->r0];
                seqs[2 + 2 * q][i] = slot_of(R, tm->a);
                seqs[3 + 2 * q][i] = tm->kind == MGK_T_MUL ? slot_of(R, tm->b) : 0;
            }
        }
    }
    use[0] = 1;
    if (s0->kind == S_ELEM) {
        use[1] = nops > 0;
        use[2] = nops > 1;
    } else {
        use[1] = s0->mode == MGK_SUMI;
        for (int q = 0; q < nseg; q++) {
            const seg *g = &R->segs[s0->s0 + q];
            use[2 + 2 * q] = !g->gather_a;
            use[3 + 2 * q] = R->terms[s0->t0 + g->r0].kind == MGK_T_MUL && !g->gather_b;
        }
    }
    memcpy(G->want, use, sizeof G->want);
    memset(G->str, 0, sizeof G->str);
    return fit(seqs, use, ns, N, MGK_MAXO, 2, &G->fr, G->str) ? 1 : -1;
}

/* Where a group's fit reads some sequences through tables (want[j] && !use[j]) but the group is
 * a few runs along which every wanted sequence has constant differences (layers side by side over
 * one input, of different widths: one layer's weights begin after the other's biases, not a row
 * further), the starts of those runs, at most MAXSEG of them, in `cut` (cut[pieces] = N).
 * Returns the number of runs, 0 when the group stays whole. */
static size_t group_pieces(const gfit *G, size_t N, size_t cut[MAXSEG + 1]) {
    const int ns = G->ns;
    int dropped = 0;
    for (int j = 0; j < ns; j++) dropped |= G->want[j] && !G->use[j];
    if (!dropped || N < 2) return 0;
    size_t pieces = 0;
    for (size_t i = 0; i < N;) {
        if (pieces == MAXSEG) return 0;
        cut[pieces++] = i;
        size_t e = i + 1;
        while (e < N) {
            int same = 1;
            for (int j = 0; j < ns && same; j++)
                same = !G->want[j] || e == i + 1 ||
                       G->seqs[j][e] - G->seqs[j][e - 1] == G->seqs[j][i + 1] - G->seqs[j][i];
            if (!same) break;
            e++;
        }
        i = e;
    }
    cut[pieces] = N;
    return pieces >= 2 ? pieces : 0;
}

/* Emits the nests of one group: `members` are statement indices in slot order. With `split`, a
 * group that group_pieces cuts is emitted as its pieces, each a group. */
static int emit_group(rr *R, const uint32_t *members, size_t N, int split) {
    mg_tape *t = R->t;
    const mg_fz *f = R->f;
    const stmt *s0 = &R->st[members[0]];
    if (s0->kind == S_NARY) {
        for (size_t i = 0; i < N; i++) {
            const stmt *s = &R->st[members[i]];
            uint32_t no = f->off[s->node + 1] - f->off[s->node];
            if (!mg_tape__grow(t, (void **)&t->ix, &R->ix_cap, sizeof(mgk_idx), t->nix + no))
                return 0;
            for (uint32_t j = 0; j < no; j++)
                t->ix[t->nix + j] = slot_of(R, f->opnd[f->off[s->node] + j]);
            mg_instr in;
            memset(&in, 0, sizeof in);
            in.kind = MG_I_NARY;
            in.op = s->op;
            in.flags = f->bias[s->node] ? MG_FLAG_BIAS : 0;
            in.cone = s->cone;
            in.a = (uint32_t)t->nix;
            in.b = no;
            in.n = (uint32_t)f->k[s->node];
            in.out = slot_of(R, s->node);
            t->nix += no;
            if (!mg_tape__push_instr(t, &t->fwd, &t->nfwd, &R->fwd_cap, &in)) return 0;
        }
        return 1;
    }
    gfit GF;
    const int fitted = group_fit(R, members, N, &GF);
    if (fitted <= 0) return fitted; /* -1: the outputs are not affine */
    size_t cut[MAXSEG + 1];
    const size_t pieces = split ? group_pieces(&GF, N, cut) : 0;
    for (size_t q = 0; q < pieces; q++) { /* GF's sequences are scratch the pieces reuse */
        const int e = emit_group(R, members + cut[q], cut[q + 1] - cut[q], 0);
        if (e <= 0) return e;
    }
    if (pieces) return 1;
    int64_t *const *seqs = GF.seqs;
    const int *use = GF.use, *want = GF.want, nseg = GF.nseg;
    const uint32_t nops = GF.nops;
    const int64_t *str = GF.str;
    const fitres fr = GF.fr;

    /* the nests: one per segment (one for an elementwise group) */
    int nnest = s0->kind == S_RED ? nseg : 1;
    for (int q = 0; q < nnest; q++) {
        mgk_nest nest;
        memset(&nest, 0, sizeof nest);
        int no = fr.nd, nr = 0;
        for (int d = 0; d < no; d++) nest.n[d] = fr.n[d];
        for (int d = 0; d < MGK_MAXD; d++) nest.out.s[d] = d < no ? str[d] : 0;
        nest.out.base = seqs[0][0];
        nest.out.arr = MGK_D;
        const seg *g = NULL;
        size_t rlen = 1;
        if (s0->kind == S_ELEM) {
            nest.mode = MGK_SET;
            nest.term = MGK_T_OP;
            nest.op = s0->op;
            nest.k = f->k[s0->node];
            for (uint32_t j = 0; j < nops; j++) {
                mgk_ref *X = &nest.x[j];
                X->base = seqs[1 + j][0];
                for (int d = 0; d < no; d++) X->s[d] = str[(1 + j) * MGK_MAXD + d];
            }
        } else {
            g = &R->segs[s0->s0 + q];
            const term *tm = &R->terms[s0->t0 + g->r0];
            nest.mode = q == 0 ? s0->mode : MGK_ACC;
            nest.term = tm->kind;
            if (is_window(s0)) { /* one segment: make_segments never cuts a window */
                nest.term = MGK_T_MAXR;
                nest.op = MG_OP_MAX;
                nest.pre = s0->pre;
            }
            nr = g->nd;
            for (int d = 0; d < nr; d++) {
                nest.n[MGK_MAXO + d] = g->n[d];
                rlen *= (size_t)g->n[d];
            }
            if (q == 0 && s0->mode == MGK_SUMI) {
                nest.init.base = seqs[1][0];
                for (int d = 0; d < no; d++) nest.init.s[d] = str[MGK_MAXD + d];
            }
            nest.x[0].base = seqs[2 + 2 * q][0];
            nest.x[1].base = seqs[3 + 2 * q][0];
            for (int d = 0; d < no; d++) {
                nest.x[0].s[d] = str[(2 + 2 * q) * MGK_MAXD + d];
                nest.x[1].s[d] = str[(3 + 2 * q) * MGK_MAXD + d];
            }
            for (int d = 0; d < nr; d++) {
                nest.x[0].s[MGK_MAXO + d] = g->sa[d];
                nest.x[1].s[MGK_MAXO + d] = g->sb[d];
            }
        }
        mg_nest__canon(&nest, no, nr);
        /* operands that are not affine: index tables over the nest's points */
        gather_src G = {R, members, N, s0, (uint32_t)q, 0};
        if (s0->kind == S_ELEM) {
            for (uint32_t j = 0; j < nops; j++)
                if (want[1 + j] && !use[1 + j]) {
                    G.which = 3 + (int)j;
                    if (!add_gather(R, &nest, &nest.x[j], &G, 1)) return 0;
                }
        } else {
            if (q == 0 && want[1] && !use[1]) {
                G.which = 0;
                if (!add_gather(R, &nest, &nest.init, &G, 1)) return 0;
            }
            int ga = (want[2 + 2 * q] && !use[2 + 2 * q]) || g->gather_a;
            int gb = R->terms[s0->t0 + g->r0].kind == MGK_T_MUL &&
                     ((want[3 + 2 * q] && !use[3 + 2 * q]) || g->gather_b);
            if (ga) {
                G.which = 1;
                if (!add_gather(R, &nest, &nest.x[0], &G, rlen)) return 0;
            }
            if (gb) {
                G.which = 2;
                if (!add_gather(R, &nest, &nest.x[1], &G, rlen)) return 0;
            }
        }
        if (!push_fwd_nest(R, &nest, s0, N, rlen)) return 0;
    }
    t->ngroups++;
    return 1;
}

/* ---- the pass ---------------------------------------------------------------------------------
 */

/* A statement's sort key: (level, creation serial) or (signature hash, slot), with its index. The
 * keys are copied out once so that the sort reads them in sequence: comparing through the
 * statements and the serials (two dependent loads from arrays of a million nodes per comparison)
 * was a fifth of the time a million-value CNN took to freeze. Serials are unique, and so are the
 * slots of a level, so the order is total. */
typedef struct skey {
    uint64_t k1, k2;
    uint32_t i;
} skey;

static int key_less(const skey *x, const skey *y) {
    return x->k1 != y->k1 ? x->k1 < y->k1 : x->k2 < y->k2;
}

/* Sorts the statement indices v[0..n) by (level, serial), or by (signature hash, slot) with
 * `by_hash` (a level's slots follow creation order, or its kinds: level_layout): a stable merge
 * sort of their keys (no recursion over the data's size). */
static int sort_idx(rr *R, uint32_t *v, size_t n, int by_hash) {
    if (n < 2) return 1;
    skey *a = mg_tape__alloc(R->t, n, 2 * sizeof(skey));
    if (!a) return 0;
    skey *b = a + n;
    for (size_t i = 0; i < n; i++) {
        const stmt *x = &R->st[v[i]];
        a[i].k1 = by_hash ? x->hash : x->level;
        a[i].k2 = by_hash ? R->f->slot[x->node] : R->f->serial[x->node];
        a[i].i = v[i];
    }
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) b[k++] = key_less(&a[j], &a[i]) ? a[j++] : a[i++];
            while (i < mid) b[k++] = a[i++];
            while (j < hi) b[k++] = a[j++];
        }
        skey *sw = a;
        a = b;
        b = sw;
    }
    for (size_t i = 0; i < n; i++) v[i] = a[i].i;
    R->t->alloc.free_fn(a < b ? a : b, R->t->alloc.ctx);
    return 1;
}

/* Where the j-th of `len` values of a level with P kinds (kind j % P, unit j / P) is stored
 * kind-major, from the level's first slot. */
static size_t kind_major_at(size_t j, size_t len, size_t P) { return (j % P) * (len / P) + j / P; }

/* Stores statements v[0..len) kind-major from slot `base` (kind_major_at). */
static void kind_major(rr *R, const uint32_t *v, size_t len, size_t P, size_t base) {
    for (size_t j = 0; j < len; j++)
        R->f->slot[R->st[v[j]].node] = (uint32_t)(base + kind_major_at(j, len, P));
}

/* The reader lists (rd_off, rd): one pass to count, one to fill. Returns 0 out of memory. */
static int build_readers(rr *R) {
    const size_t nn = R->f->n;
    R->rd_off = mg_tape__alloc(R->t, nn + 1, sizeof(uint32_t));
    R->stamp = mg_tape__alloc(R->t, R->nst ? R->nst : 1, sizeof(uint32_t));
    if (!R->rd_off || !R->stamp) return 0;
    memset(R->rd_off, 0, (nn + 1) * sizeof(uint32_t));
    memset(R->stamp, 0, (R->nst ? R->nst : 1) * sizeof(uint32_t));
    size_t total = 0;
#define COUNT(node)                                                                                \
    do {                                                                                           \
        if (R->stmt_of[node] != UINT32_MAX) R->rd_off[(node) + 1]++, total++;                      \
    } while (0)
    for (size_t i = 0; i < R->nst; i++) EACH_READ(R, &R->st[i], COUNT);
#undef COUNT
    if (total >= UINT32_MAX) return 0; /* not reached: slots stop at UINT32_MAX / 2 */
    for (size_t k = 0; k < nn; k++) R->rd_off[k + 1] += R->rd_off[k];
    R->rd = mg_tape__alloc(R->t, total ? total : 1, sizeof(uint32_t));
    if (!R->rd) return 0;
    /* fill from each list's end, statements in reverse: every list comes out in increasing
     * statement order */
    for (size_t i = R->nst; i-- > 0;) {
#define FILL(node)                                                                                 \
    do {                                                                                           \
        if (R->stmt_of[node] != UINT32_MAX) R->rd[--R->rd_off[(node) + 1]] = (uint32_t)i;          \
    } while (0)
        EACH_READ(R, &R->st[i], FILL);
#undef FILL
    }
    /* each rd_off[k + 1] now holds list k's start: shift the starts down one place */
    for (size_t k = 0; k < nn; k++) R->rd_off[k] = R->rd_off[k + 1];
    R->rd_off[nn] = (uint32_t)total;
    return 1;
}

/* What the sequence of a reader's slots in seqbuf[0..len) costs: its length unless it fits with
 * unit innermost stride (forwards or backwards), as vector blocks read it. */
static size_t seq_cost(rr *R, size_t len, int maxd) {
    if (len < 2) return 0;
    int64_t *seqs[1] = {R->seqbuf}, str[MGK_MAXD];
    int use[1] = {1};
    fitres fr;
    if (!fit(seqs, use, 1, len, maxd, 0, &fr, str) || !fr.nd) return len;
    return str[fr.nd - 1] == 1 || str[fr.nd - 1] == -1 ? 0 : len;
}

/* Operand j of statement s as an elementwise reader reads it: an elementwise statement's
 * operands, a max's elements (its loop runs along the windows, as an elementwise one's does);
 * UINT32_MAX for none. */
static uint32_t elem_operand(const rr *R, const stmt *s, uint32_t j) {
    const mg_fz *f = R->f;
    if (s && s->kind == S_ELEM && f->off[s->node] + j < f->off[s->node + 1])
        return f->opnd[f->off[s->node] + j];
    if (s && is_window(s) && j < s->nt) return R->terms[s->t0 + j].a;
    return UINT32_MAX;
}

/* Reads of the level v[0..n) (slots start + creation position) that do not run along unit
 * strides, with the level stored in creation order (P == 0) or kind-major with P kinds: per
 * reduction that reads it (with `reductions`), each run of consecutive terms of one shape reading
 * it, per operand (a, b); per level and op of its elementwise readers (and maxima over windows), in
 * creation order, each operand position. *cost is the sum of those sequences' costs (seq_cost).
 * With `steps_by`, it says instead whether any elementwise reader's sequence steps by `period`
 * between its first two values, and *cost is left 0. Returns 0 out of memory. */
static int reader_cost(rr *R, const uint32_t *v, size_t n, size_t start, size_t P,
                       const uint32_t *rdv, size_t nrd, int reductions, size_t *cost, size_t period,
                       int *steps_by) {
    const mg_fz *f = R->f;
    const uint32_t lv = R->st[v[0]].level;
    *cost = 0;
#define MEMBER(node) (R->stmt_of[node] != UINT32_MAX && R->level[node] == lv)
#define MAPPED(node)                                                                               \
    ((int64_t)(P ? start + kind_major_at(f->slot[node] - start, n, P) : f->slot[node]))
    for (size_t i = 0; reductions && i < nrd; i++) {
        const stmt *s = &R->st[rdv[i]];
        /* a reduction far longer than the level reads little of it (and scanning it once per
         * level it reads could take quadratic time) */
        if (s->kind != S_RED || is_window(s) || s->nt > 4 * n) continue;
        for (int w = 0; w < 2; w++) {
            size_t len = 0;
            const term *prev = NULL;
            for (uint32_t q = 0; q < s->nt; q++) {
                const term *tm = &R->terms[s->t0 + q];
                const uint32_t node = w == 0 ? tm->a : tm->kind == MGK_T_MUL ? tm->b : UINT32_MAX;
                const int member = node != UINT32_MAX && MEMBER(node);
                if (len && (!member || !term_shape_eq(R, prev, tm))) {
                    *cost += seq_cost(R, len, MGK_MAXR);
                    len = 0;
                }
                if (!member) continue;
                if (!GROW(R, seqbuf, capseq, len + 1)) return 0;
                R->seqbuf[len++] = MAPPED(node);
                prev = tm;
            }
            *cost += seq_cost(R, len, MGK_MAXR);
        }
    }
    uint32_t nops = 2; /* a max over a window reads its elements as operands 0, 1, ... */
    for (size_t i = 0; i < nrd; i++)
        if (is_window(&R->st[rdv[i]]) && R->st[rdv[i]].nt > nops) nops = R->st[rdv[i]].nt;
    for (uint32_t j = 0; j < nops; j++) { /* elementwise readers' operand j */
        size_t len = 0;
        const stmt *first = NULL;
        for (size_t i = 0; i <= nrd; i++) {
            const stmt *s = i < nrd ? &R->st[rdv[i]] : NULL;
            const uint32_t node = elem_operand(R, s, j);
            const int reads = node != UINT32_MAX && MEMBER(node);
            if (len && (!reads || s->level != first->level || s->op != first->op)) {
                if (!steps_by) *cost += seq_cost(R, len, MGK_MAXO);
                /* or the step between the first two values (a full fit of every sequence took 4%
                 * of a 1M-value CNN's freeze) */
                else if (len > 1 && (R->seqbuf[1] - R->seqbuf[0] == (int64_t)period ||
                                     R->seqbuf[0] - R->seqbuf[1] == (int64_t)period))
                    *steps_by = 1;
                len = 0;
            }
            if (!reads) continue;
            if (!len) first = s;
            if (!GROW(R, seqbuf, capseq, len + 1)) return 0;
            R->seqbuf[len++] = MAPPED(node);
        }
    }
#undef MAPPED
#undef MEMBER
    return 1;
}

/* Whether to store the level v[0..n) (slots start .. start + n - 1) kind-major with P kinds, P
 * from 5 on (n / P units, at least 8): when its elementwise readers step through it by P in
 * creation order (a maxout unit's pieces, made unit by unit and read piece by piece over the
 * units), and kind-major leaves fewer of its readers' reads off unit strides (reader_cost). P is
 * what the level's own fit or signatures show as its innermost kinds, so its own nest stays
 * affine, its dims swapped: a period seen only in the readers (a pool over blocks of 5 of an 8-wide
 * outer product; a global max per channel over a ReLU, which would read its convolution 100
 * apart) made the producer read through index tables or strided (0.5x, 0.73x compiled), and a
 * level fitted as one long dim (each piece's weights and bias together) already runs as one
 * wide nest. Strides of 2-4 are read in vector blocks through in-register permutes, nearly as
 * fast as unit strides (a 2x2 max-pool's input stored even and odd columns apart moved the stride
 * into its ReLU and made the 48-channel CNN 0.89x compiled). *yes is set; returns 0 out of
 * memory. */
static int kinds_for_readers(rr *R, const uint32_t *v, size_t n, size_t start, size_t P, int *yes) {
    *yes = 0;
    if (P < 5 || n % P || n / P < 8) return 1;
    if (!R->rd_off && !build_readers(R)) return 0;
    if (++R->nstamp == 0) { /* wrapped: clear the marks */
        memset(R->stamp, 0, (R->nst ? R->nst : 1) * sizeof(uint32_t));
        R->nstamp = 1;
    }
    size_t nrd = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t node = R->st[v[i]].node;
        for (uint32_t e = R->rd_off[node]; e < R->rd_off[node + 1]; e++) {
            const uint32_t s = R->rd[e];
            if (R->stamp[s] == R->nstamp) continue;
            R->stamp[s] = R->nstamp;
            if (!GROW(R, rdbuf, caprd, nrd + 1)) return 0;
            R->rdbuf[nrd++] = s;
        }
    }
    /* the readers as the program orders them: by level, then creation */
    if (!sort_idx(R, R->rdbuf, nrd, 0)) return 0;
    size_t creation, kinds;
    int seen = 0;
    /* the steps first (elementwise readers alone): most levels have no reader stepping by P */
    if (!reader_cost(R, v, n, start, 0, R->rdbuf, nrd, 0, &creation, P, &seen)) return 0;
    if (!seen) return 1;
    if (!reader_cost(R, v, n, start, 0, R->rdbuf, nrd, 1, &creation, 0, NULL) ||
        !reader_cost(R, v, n, start, P, R->rdbuf, nrd, 1, &kinds, 0, NULL))
        return 0;
    *yes = kinds < creation;
    return 1;
}

/* The layout of a level whose statements v[0..n), in creation order, have slots start .. start
 * + n - 1: creation order, except a level that cycles through P kinds unit by unit, P from 2 to 4,
 * for at least 8 units, stored kind-major (kind_major), so that each kind's values are consecutive
 * along the units, as loops over the units read and write them:
 *  - P signatures in turn (a GRU's gate pre-activations, unit by unit: z r n z r n ...; from 5
 *    to 16 of them where the readers are better off: kinds_for_readers), or
 *  - one signature, whose fit's innermost dim is P (a GRU's z and r gates, two by two over the
 *    units; a convolution's output with 2-4 channels innermost; complex numbers as (re, im)), or
 *    of 5 or more kinds where its readers are better off (kinds_for_readers).
 * A reduction that reads such a level in creation order (a dense layer over pairs) then sums over
 * two dims, the kinds and the units, in the same order. Only a whole level: with other statements
 * in it (before or after the cycle, or a partial last cycle), a reader over the level in creation
 * order, or a kind's group, would no longer be affine (index tables, up to 1.8x slower on the
 * tape), so such a level keeps creation order. Returns 0 out of memory. */
static int level_layout(rr *R, const uint32_t *v, size_t n, size_t start) {
    size_t i, P;
    if (n < 16 || R->st[v[0]].kind == S_NARY) return 1;
    for (i = 0; i + 1 < n; i++)
        if (!same_signature(R, &R->st[v[i]], &R->st[v[i + 1]])) break;
    if (i + 1 >= n) { /* one signature: the outputs, consecutive, fit innermost */
        gfit G;
        const int e = group_fit(R, v, n, &G);
        if (e == 0) return 0;
        if (e < 0 || G.fr.nd < 2) return 1;
        P = (size_t)G.fr.n[G.fr.nd - 1];
        if (P >= 2 && P <= 4 && n / P >= 8) {
            kind_major(R, v, n, P, start);
            return 1;
        }
        int yes; /* more kinds: as the readers are better off */
        if (!kinds_for_readers(R, v, n, start, P, &yes)) return 0;
        if (yes) kind_major(R, v, n, P, start);
        return 1;
    }
    for (P = 2; P <= 16; P++) { /* the shortest period of the whole level */
        if (n % P || n / P < 8) continue;
        for (i = 0; i + P < n; i++)
            if (!same_signature(R, &R->st[v[i]], &R->st[v[i + P]])) break;
        if (i + P >= n) {
            int yes = P <= 4;
            /* from 5 kinds on, as the readers are better off (a maxout unit's pieces in several
             * forms) */
            if (P >= 5 && !kinds_for_readers(R, v, n, start, P, &yes)) return 0;
            if (yes) kind_major(R, v, n, P, start);
            return 1;
        }
    }
    return 1;
}

/* ---- the inputs' layout ------------------------------------------------------------------------
 * Inputs are leaves in the caller's column order. A program that reads them in another order (a
 * fixed permutation of the pixels, a hand-picked list of them) would read them through index
 * tables, point by point: an MLP over permuted pixels trained 25x slower compiled and 60x slower
 * on the tape. So the inputs may be stored in the order the program first reads them (unread ones
 * after, in column order), when that leaves fewer of their reads without an affine form, or as
 * many but fewer read backwards:
 * t->in_perm[k] is then the column slot input0 + k holds, and the driver loads rows through it. */

/* Reads of inputs that no affine function describes, with column c at slot input0 + map[c] (the
 * caller's order when `map` is NULL): per run of a reduction's terms of one shape, the run's
 * input operands; per level, the input operands of its elementwise statements of one op in
 * creation order. A sequence that does not fit costs its length in cost[0]; one that fits
 * backwards (its innermost stride negative: no vector blocks) costs it in cost[1]. */
static int input_cost(rr *R, const uint32_t *order, const uint32_t *map, size_t cost[2]) {
    const mg_fz *f = R->f;
    const mgk_i64 in0 = (mgk_i64)R->t->input0;
    cost[0] = cost[1] = 0;
#define IN_SLOT(node) (map ? in0 + (mgk_i64)map[f->slot[node] - in0] : (mgk_i64)f->slot[node])
    for (size_t i = 0; i < R->nst; i++) { /* reductions */
        const stmt *s = &R->st[order[i]];
        if (s->kind != S_RED) continue;
        for (uint32_t r = 0, e; r < s->nt; r = e) {
            const term *t0 = &R->terms[s->t0 + r];
            for (e = r + 1; e < s->nt && term_shape_eq(R, t0, &R->terms[s->t0 + e]);) e++;
            for (int w = 0; w < 2; w++) {
                if (w ? t0->kind != MGK_T_MUL || cls_of(R, t0->b) != MG_C_INPUT
                      : cls_of(R, t0->a) != MG_C_INPUT)
                    continue;
                if (!GROW(R, seqbuf, capseq, e - r)) return 0;
                for (uint32_t q = r; q < e; q++) {
                    const term *tm = &R->terms[s->t0 + q];
                    R->seqbuf[q - r] = IN_SLOT(w ? tm->b : tm->a);
                }
                int64_t *seqs[1] = {R->seqbuf}, str[MGK_MAXD];
                int use[1] = {1};
                fitres fr;
                if (!fit(seqs, use, 1, e - r, MGK_MAXR, 0, &fr, str)) cost[0] += e - r;
                else if (fr.nd && str[fr.nd - 1] < 0) cost[1] += e - r;
            }
        }
    }
    for (int j = 0; j < 2; j++) { /* elementwise statements' operand j */
        size_t len = 0;
        const stmt *first = NULL;
        for (size_t i = 0; i <= R->nst; i++) {
            const stmt *s = i < R->nst ? &R->st[order[i]] : NULL;
            const int reads = s && s->kind == S_ELEM &&
                              f->off[s->node] + (uint32_t)j < f->off[s->node + 1] &&
                              cls_of(R, f->opnd[f->off[s->node] + (uint32_t)j]) == MG_C_INPUT;
            if (len && (!reads || s->level != first->level || s->op != first->op)) {
                int64_t *seqs[1] = {R->seqbuf}, str[MGK_MAXD];
                int use[1] = {1};
                fitres fr;
                if (!fit(seqs, use, 1, len, MGK_MAXO, 0, &fr, str)) cost[0] += len;
                else if (fr.nd && str[fr.nd - 1] < 0) cost[1] += len;
                len = 0;
            }
            if (!reads) continue;
            if (!len) first = s;
            if (!GROW(R, seqbuf, capseq, len + 1)) return 0;
            R->seqbuf[len++] = IN_SLOT(f->opnd[f->off[s->node] + (uint32_t)j]);
        }
    }
#undef IN_SLOT
    return 1;
}

/* Stores the inputs in the order the program first reads them where that makes more of their
 * reads affine, or as many but fewer of them backwards (a sequence read in reverse), see above;
 * `inputs` (MG_IN_*) may force either order instead. `order`: the statements by (level,
 * creation). `*alt`: 1 when the two orders differ. Returns 0 out of memory. */
static int input_layout(rr *R, const uint32_t *order, int inputs, int *alt) {
    mg_tape *t = R->t;
    const mg_fz *f = R->f;
    const size_t I = t->ninputs;
    *alt = 0;
    if (I < 2) return 1;
    uint32_t *rank = mg_tape__alloc(t, I, sizeof(uint32_t));
    if (!rank) return 0;
    memset(rank, 0xff, I * sizeof(uint32_t));
    uint32_t next = 0;
#define SEE(node)                                                                                  \
    do {                                                                                           \
        if (cls_of(R, node) == MG_C_INPUT && rank[f->slot[node] - t->input0] == UINT32_MAX)        \
            rank[f->slot[node] - t->input0] = next++;                                              \
    } while (0)
    for (size_t i = 0; i < R->nst; i++) {
        const stmt *s = &R->st[order[i]];
        if (s->kind == S_RED) {
            for (uint32_t q = 0; q < s->nt; q++) {
                SEE(R->terms[s->t0 + q].a);
                if (R->terms[s->t0 + q].kind == MGK_T_MUL) SEE(R->terms[s->t0 + q].b);
            }
        } else if (s->kind == S_ELEM) {
            for (uint32_t j = f->off[s->node]; j < f->off[s->node + 1]; j++) SEE(f->opnd[j]);
        }
    }
#undef SEE
    int moved = 0;
    for (size_t c = 0; c < I; c++) {
        if (rank[c] == UINT32_MAX) rank[c] = next++;
        moved |= rank[c] != c;
    }
    size_t given[2] = {0, 0}, read[2] = {0, 0};
    int ok = 1;
    *alt = moved;
    if (moved && inputs == MG_IN_AUTO && (ok = input_cost(R, order, NULL, given)) &&
        (given[0] || given[1]))
        ok = input_cost(R, order, rank, read);
    if (ok && moved &&
        (inputs == MG_IN_READ ||
         (inputs == MG_IN_AUTO &&
          (read[0] < given[0] || (read[0] == given[0] && read[1] < given[1]))))) {
        t->in_perm = mg_tape__alloc(t, I, sizeof(mgk_idx));
        if (!t->in_perm) ok = 0;
        for (size_t c = 0; ok && c < I; c++) t->in_perm[rank[c]] = (mgk_idx)c;
        for (size_t k = 0; ok && k < f->n; k++)
            if (f->op[k] == MG_OP_LEAF && cls_of(R, (uint32_t)k) == MG_C_INPUT)
                f->slot[k] = (uint32_t)t->input0 + rank[f->slot[k] - t->input0];
    }
    t->alloc.free_fn(rank, t->alloc.ctx);
    return ok;
}

/* The shared values' slots: reroll lays them out first, from first_op on, as the first levels;
 * then they move to [shared0, shared0 + K) and the inputs and targets K slots on (the values
 * after them keep theirs), in every slot the program names: its refs, index tables and variadic
 * operand lists, and the frozen graph's slots. A ref reads one class (signatures keep them
 * apart), so its slots move by one offset. */
static mgk_i64 moved_slot(const mg_tape *t, size_t in0, size_t K, mgk_i64 s) {
    if (s < (mgk_i64)in0 || s >= (mgk_i64)(t->first_op + K)) return s;
    return s < (mgk_i64)t->first_op ? s + (mgk_i64)K : s - (mgk_i64)t->first_op + (mgk_i64)in0;
}

static void move_shared(mg_tape *t, const mg_fz *f, size_t K) {
    const size_t in0 = t->input0;
    for (size_t k = 0; k < f->n; k++)
        if (f->slot[k] != UINT32_MAX) f->slot[k] = (uint32_t)moved_slot(t, in0, K, f->slot[k]);
    for (size_t i = 0; i < t->nix; i++) t->ix[i] = (mgk_idx)moved_slot(t, in0, K, t->ix[i]);
    for (size_t i = 0; i < t->nfwd; i++)
        if (t->fwd[i].kind == MG_I_NARY)
            t->fwd[i].out = (uint32_t)moved_slot(t, in0, K, t->fwd[i].out);
    for (size_t n = 0; n < t->nnests; n++) {
        mgk_nest *N = &t->nests[n];
        mgk_ref *refs[6] = {&N->out, &N->init, &N->x[0], &N->x[1], &N->x[2], &N->x[3]};
        for (int j = 0; j < 6; j++)
            if (!refs[j]->gather) refs[j]->base = moved_slot(t, in0, K, refs[j]->base);
    }
    t->input0 += K, t->target0 += K, t->first_op += K;
}

int mg_reroll(mg_tape *t, const mg_fz *f, int scalar, int inputs, int *alt) {
    rr R;
    memset(&R, 0, sizeof R);
    R.t = t;
    R.f = f;
    int st = MG_ENOMEM;
    uint32_t *order = NULL;
    *alt = 0;
    R.stmt_of = mg_tape__alloc(t, f->n, sizeof(uint32_t));
    R.absorbed = mg_tape__alloc(t, f->n, 1);
    R.level = mg_tape__alloc(t, f->n, sizeof(uint32_t));
    if (!R.stmt_of || !R.absorbed || !R.level) goto done;
    memset(R.stmt_of, 0xff, f->n * sizeof(uint32_t));
    memset(R.absorbed, 0, f->n);
    memset(R.level, 0, f->n * sizeof(uint32_t));
    if (t->input0 != t->shared0) { /* a second reroll (freeze.c): the leaves where they began */
        const uint32_t K = (uint32_t)(t->input0 - t->shared0);
        for (size_t k = 0; k < f->n; k++)
            if (f->op[k] == MG_OP_LEAF && (f->cls[k] == MG_C_INPUT || f->cls[k] == MG_C_TARGET))
                f->slot[k] -= K;
        t->input0 -= K, t->target0 -= K, t->first_op -= K;
    }
    size_t shared_end = SIZE_MAX; /* the first slot after the shared values */
    /* while statements are made, level holds each addition's tree depth: one more than its
     * operands' highest where both are additions, else its addition operand's (a chain of
     * additions, a convolution's however long, is depth 0), 0 for other nodes */
    for (size_t k = 0; k < f->n; k++) {
        if (f->op[k] != MG_OP_ADD) continue;
        const uint32_t a = f->opnd[f->off[k]], b = f->opnd[f->off[k] + 1];
        const int aa = f->op[a] == MG_OP_ADD, ba = f->op[b] == MG_OP_ADD;
        const uint32_t da = aa ? R.level[a] : 0, db = ba ? R.level[b] : 0;
        R.level[k] = aa && ba ? 1 + (da > db ? da : db) : da + db;
    }
    if (!make_statements(&R, scalar)) goto done;
    memset(R.level, 0, f->n * sizeof(uint32_t));
    t->nstatements = R.nst;
    t->rerolled = !scalar;
    R.next_slot = t->first_op;
    for (size_t k = 0; k < f->n; k++)
        if (R.absorbed[k]) t->nfolded++;

    order = mg_tape__alloc(t, R.nst, sizeof(uint32_t));
    if (!order) goto done;
    if (scalar) {
        /* one nest per node, slots in topological order */
        for (size_t i = 0; i < R.nst; i++) f->slot[R.st[i].node] = (uint32_t)R.next_slot++;
        for (size_t i = 0; i < R.nst; i++) {
            R.st[i].ns = 0;
            uint32_t one = (uint32_t)i;
            int e = emit_group(&R, &one, 1, 0);
            if (e <= 0) goto done;
        }
    } else {
        uint32_t shared_levels = 0;
        for (size_t i = 0; i < R.nst; i++) {
            stmt *s = &R.st[i];
            s->level = stmt_level(&R, s);
            R.level[s->node] = s->level;
            order[i] = (uint32_t)i;
            if (cls_of(&R, s->node) == MG_C_SHARED && s->level > shared_levels)
                shared_levels = s->level;
        }
        if (shared_levels) /* the shared values' levels first */
            for (size_t i = 0; i < R.nst; i++)
                if (cls_of(&R, R.st[i].node) != MG_C_SHARED) {
                    R.st[i].level += shared_levels;
                    R.level[R.st[i].node] = R.st[i].level;
                }
        if (!sort_idx(&R, order, R.nst, 0) || !input_layout(&R, order, inputs, alt)) goto done;
        for (size_t lo = 0; lo < R.nst;) {
            size_t hi = lo;
            while (hi < R.nst && R.st[order[hi]].level == R.st[order[lo]].level) hi++;
            if (shared_end == SIZE_MAX && cls_of(&R, R.st[order[lo]].node) != MG_C_SHARED)
                shared_end = R.next_slot;
            /* slots for the level, in creation order */
            for (size_t i = lo; i < hi; i++)
                f->slot[R.st[order[i]].node] = (uint32_t)(R.next_slot + (i - lo));
            R.next_slot += hi - lo;
            for (size_t i = lo; i < hi; i++) {
                stmt *s = &R.st[order[i]];
                if (!make_segments(&R, s) || !make_signature(&R, s)) goto done;
            }
            if (!level_layout(&R, order + lo, hi - lo, R.next_slot - (hi - lo))) goto done;
            if (!sort_idx(&R, order + lo, hi - lo, 1)) goto done;
            for (size_t g0 = lo; g0 < hi;) {
                size_t g1 = g0 + 1;
                while (g1 < hi && same_signature(&R, &R.st[order[g0]], &R.st[order[g1]])) g1++;
                int e = emit_group(&R, order + g0, g1 - g0, 1);
                if (e < 0) {
                    /* the group's outputs are not affine in the level's layout: fresh slots */
                    for (size_t i = g0; i < g1; i++)
                        f->slot[R.st[order[i]].node] = (uint32_t)R.next_slot++;
                    e = emit_group(&R, order + g0, g1 - g0, 1);
                }
                if (e <= 0) goto done;
                g0 = g1;
            }
            R.nsig = 0; /* signatures of this level are done with */
            lo = hi;
        }
    }
    if (R.next_slot > UINT32_MAX / 2) {
        st = mg_tape__fail(t, MG_ERANGE, "freeze: too many slots (%zu)", R.next_slot);
        goto done;
    }
    t->nslots = R.next_slot;
    if (shared_end == SIZE_MAX) shared_end = scalar ? t->first_op : R.next_slot;
    if (shared_end > t->first_op) move_shared(t, f, shared_end - t->first_op);
    t->nfwd_nests = t->nnests;
    st = MG_OK;
done:
    if (order) t->alloc.free_fn(order, t->alloc.ctx);
    rr_free(&R);
    if (st == MG_ENOMEM && t->status == MG_OK) mg_tape__fail(t, MG_ENOMEM, "freeze: out of memory");
    return st == MG_OK ? MG_OK : (t->status != MG_OK ? t->status : st);
}
