/* The compiler's IR: frozen graphs (the passes' input), loop nests and programs (their output),
 * and the tape that owns them. Shared by the stages, one file each:
 *   freeze.c     graph -> frozen graph (nodes, roles, constants), then drives the stages
 *   reroll.c     frozen graph -> statements -> loop nests (grouping, affine fit, slot layout)
 *   roll.c       repeated runs of nests -> sequential loops (a recurrent model's time steps)
 *   hoist.c      nests that do not depend on their loop leave it (before it in the forward
 *                program, after it in the backward one), the iterations becoming one of their dims
 *   split.c      a nest reading parameters as one run across other nests' blocks of weights (an
 *                L2 term over every parameter) cut at the blocks' edges, so they can be packed
 *   autodiff.c   forward program -> backward program (gradient nests)
 *   schedule.c   how each nest runs: vector blocks, split reductions, packed weights, fused SGD,
 *                pre-steps (fused SGD deferred to the next sample's forward)
 *   interpret.c  runs a nest (nest kernels from nest_kernels.h, or compiled ones)
 *   emit.c       programs -> C
 *   drive.h      training: samples, batches, threads, SGD, over either storage type:
 *   fit.c        ... over double slots (and the public entry points), fit32.c over float32
 *   tape.c       the public accessors */
#ifndef MG_IR_H
#define MG_IR_H

#include "graph_impl.h"
#include "mg/tape.h"

/* Graph identity and ownership (live, of this graph). */
static inline uint64_t mg_ir__graph_id(const mg_graph *g) { return mg_graph__id(g); }
static inline int mg_ir__owns(const mg_graph *g, const mg_value *v) { return mg_graph__owns(g, v); }

/* The op table's formulas for the nest kernels (the generated code gets the same functions
 * written out as text by the emitter). */
static inline double mgk_op_fwd(int op, double A, double B, double K) {
    return mg_op__forward(op, A, B, K);
}
static inline double mgk_op_da(int op, double A, double B, double K, double Y) {
    double dA, dB;
    mg_op__derivs(op, A, B, K, Y, &dA, &dB);
    return dA;
}
static inline double mgk_op_db(int op, double A, double B, double K, double Y) {
    double dA, dB;
    mg_op__derivs(op, A, B, K, Y, &dA, &dB);
    return dB;
}
_Static_assert(MG_OP_LEAF == 0, "a nest's pre 0 is none");
#define MGK_OP_RELU MG_OP_RELU
#include "nest_kernels.h"
_Static_assert(offsetof(mgk_nest, k) == 6 * sizeof(int) &&
                   offsetof(mgk_nest, n) == offsetof(mgk_nest, k) + sizeof(double),
               "mgk_nest has no padding bytes: nests are hashed and compared as bytes");

/* ---- frozen graphs ---------------------------------------------------------------------------
 * The graph reachable from the roots in topological order, as flat arrays the passes read
 * without touching the graph again. Node k's operands are opnd[off[k] .. off[k+1]). */

/* Classes of values: what a slot holds. Part of every grouping signature, so one loop never
 * mixes, say, parameters and computed values in one operand. MG_C_SHARED: a computed value of
 * the loss's cone alone that no input or target reaches (micrograd's L2 term, sum(p*p)): the
 * same for every sample of a batch, so it lives among the shared slots and a batch computes it
 * once (freeze.c marks them; reroll.c lays them out; drive.h runs them once per batch). */
enum {
    MG_C_PARAM = 0,
    MG_C_CONST = 1,
    MG_C_INPUT = 2,
    MG_C_TARGET = 3,
    MG_C_VALUE = 4,
    MG_C_SHARED = 5
};

enum { MG_FZ_LOSS_CONE = 1, MG_FZ_OUT_CONE = 2, MG_FZ_ROOT = 4 };

typedef struct mg_fz {
    size_t n;         /* nodes */
    uint8_t *op;      /* op per node */
    uint8_t *bias;    /* DOT nodes: 1 when the last operand is a bias */
    uint8_t *cone;    /* MG_FZ_* flags */
    uint8_t *cls;     /* leaves: their class; ops: MG_C_VALUE */
    double *k;        /* elementwise: the op's constant; variadic: the term count */
    double *data;     /* current value */
    uint64_t *serial; /* creation order */
    uint32_t *off;    /* n + 1 */
    uint32_t *opnd;
    uint32_t *uses; /* operand uses (+2 for roots) */
    uint32_t *slot; /* leaves: fixed slots; ops: assigned by the passes (UINT32_MAX: none) */
} mg_fz;

/* ---- programs --------------------------------------------------------------------------------
 * A program is a list of instructions: a nest, a variadic op (the losses) over an operand list,
 * or a sequential loop running the next `a` instructions `b` times, t = 0, 1, ... (reversed in
 * backward programs: t = b-1 down to 0, its body already in backward order). */
enum { MG_I_NEST = 0, MG_I_NARY = 1, MG_I_SEQ = 2, MG_I_NARY_BWD = 3 };

typedef struct mg_instr {
    uint8_t kind;
    uint8_t op;    /* NARY: the op */
    uint8_t flags; /* NARY: MG_FLAG_BIAS; SEQ: 1 when reversed */
    uint8_t cone;  /* MG_FZ_LOSS_CONE / MG_FZ_OUT_CONE of what it computes */
    uint32_t a;    /* NEST: the nest; NARY: first operand entry in ix; SEQ: body length */
    uint32_t b;    /* NARY: operand count; SEQ: iterations */
    uint32_t n;    /* NARY: the op's term count */
    uint32_t out;  /* NARY: the result's slot */
} mg_instr;

/* A nest plus what the passes know about it. */
typedef struct mg_nest_info {
    uint8_t loss_cone, out_cone;
    uint8_t grad;  /* 1 for a gradient nest */
    uint8_t alias; /* outputs may repeat across outer points */
    uint8_t has_gather;
    uint8_t shared; /* reads and writes shared slots alone: one run per batch, never per sample */
    uint32_t seq;   /* iterations of the sequential loop it runs in (1: none) */
    uint32_t pre;   /* a gradient nest a batch-1 fit may defer to the next forward: 1 + its entry in
                       mg_tape::pre (schedule.c's pre-steps); 0 otherwise */
    double work;    /* estimated terms per sample, for the emitter's budget */
} mg_nest_info;

/* A deferred step (schedule.c's pre-steps): gradient nest `bwd` applies SGD to weights that
 * forward nest `fwd` alone reads, each once. In a batch-1 fit, the driver skips `bwd` and keeps
 * the per-sample elements it would have read, gradients [glo, ghi) and values [xlo, xhi)
 * (positions in the per-sample arrays), for `fwd` to step the weights with in the next sample. */
typedef struct mg_prestep {
    uint32_t fwd, bwd;
    int64_t glo, ghi, xlo, xhi;
} mg_prestep;

/* A packed parameter block: elements elem(i) = base + sum_k s[k]*i_k over dims n (row-major
 * in packed order), living at pw[p0 + i] while a call runs. */
typedef struct mg_pack {
    int64_t base;
    int64_t s[MGK_MAXD];
    int64_t n[MGK_MAXD];
    int nd;
    size_t p0, len;
} mg_pack;

/* A pack's elements in packed order: the slot at multi-index idx, and the next multi-index
 * (row-major, the last dim fastest). Packing, unpacking and the schedule walk packs this way. */
static inline mgk_i64 mg_pack__slot(const mg_pack *P, const mgk_i64 *idx) {
    mgk_i64 slot = P->base;
    for (int q = 0; q < P->nd; q++) slot += idx[q] * P->s[q];
    return slot;
}
static inline void mg_pack__next(const mg_pack *P, mgk_i64 *idx) {
    for (int q = P->nd - 1; q >= 0 && ++idx[q] == P->n[q]; q--) idx[q] = 0;
}

/* The buffers of mg_tape::ws: a batched fit's per-sample slots and gradients (every chunk's, one
 * after the other; predict's rows use the first), and per chunk its shared-slot and packed
 * gradients, its variadic ops' scratch and operand lists (drive.h asserts two chunks). */
enum {
    MG_WS_BD,
    MG_WS_BG,
    MG_WS_G,                  /* + chunk */
    MG_WS_PG = MG_WS_G + 2,   /* + chunk */
    MG_WS_SCR = MG_WS_PG + 2, /* + chunk */
    MG_WS_SIX = MG_WS_SCR + 2,
    MG_WS_N = MG_WS_SIX + 2
};

struct mg_tape {
    mg_allocator alloc;
    int status;
    char err[256];
    uint64_t graph_id;
    /* slot layout: parameters [0, nparams), constants [const0, shared0), shared values
     * [shared0, input0) (MG_C_SHARED), then the per-sample slots: inputs, targets, values */
    size_t nslots, nparams, nconsts, ninputs, ntargets, noutputs;
    size_t const0, shared0, input0, target0, first_op;
    /* the forward program's first `nsh_fwd` instructions compute the shared values and the
     * backward program's last `nsh_bwd` propagate their gradients (only shared slots in either):
     * a batch runs them once, before and after its samples (drive.h) */
    size_t nsh_fwd, nsh_bwd;
    int has_loss;
    uint32_t loss;
    size_t loss_pw; /* the loss's position in pw when it is a packed parameter, else SIZE_MAX */
    mgk_idx *outputs;
    mgk_idx *in_perm;     /* slot input0 + k holds column in_perm[k] of the inputs (reroll.c's input
                             layout); NULL: column k */
    size_t target_output; /* the first output computed from a target, or SIZE_MAX (predict) */
    double *data, *grad;
    /* the programs */
    mgk_nest *nests;
    mg_nest_info *info;
    size_t nnests, nfwd_nests; /* forward nests come first */
    mg_instr *fwd, *bwd;
    size_t nfwd, nbwd;
    mgk_idx *ix; /* variadic operand lists and gather tables */
    size_t nix;
    mgk_idx *identity; /* 0, 1, ..., nary_max - 1: variadic ops over gathered operands */
    size_t nary_max;   /* the most operands of a variadic instruction */
    /* packed parameters (scheduling) */
    mg_pack *packs;
    size_t npacks, npacked;
    double *pw, *pg;
    uint8_t *packed;          /* per parameter: 1 when it lives in a pack during calls */
    uint8_t *fused, *fused_p; /* per parameter / packed element: its gradient nest applies SGD
                                 itself at batch size 1 (MGK_F_STEP) */
    /* SGD: parameters outside packs (all / not fused), pack positions not fused */
    mgk_idx *step_d, *step_d1, *step_p1;
    size_t nstep_d, nstep_d1, nstep_p1;
    /* deferred steps (pre-steps) */
    mg_prestep *pre;
    size_t npre;
    /* gradient slots backward must zero first: ranges [zero[2i], zero[2i+1]) */
    mgk_idx *zero;
    size_t nzero;
    size_t nzero_sh; /* the first nzero_sh entries: ranges of shared values' gradients */
    /* statistics */
    size_t nstatements, ngroups, nseq, nfolded;
    size_t nhoisted; /* nests hoist.c moved out of sequential loops (both programs) */
    int rerolled;
    /* write-back */
    mg_value **param_values;
    uint64_t *param_serials;
    /* compiled kernels, per nest (NULL: the interpreter's) */
    const mg_kernel_fn *kern;
    /* the attached code rounds the SGD step otherwise than libmg (mg_compiled::step_probe): a
     * batch's fused steps are off */
    int kern_contracts;
    /* float32 storage (attached code emitted with it; every nest compiled): the working copies
     * of data, grad, pw and pg; the double arrays stay what the accessors read */
    int f32;
    float *data32, *grad32, *pw32, *pg32;
    uint64_t fingerprint;
    size_t nodes;
    /* working memory of batched fits and predicts (drive.h: MG_WS_*), kept from one call to the
     * next (a training loop that calls fit once per batch allocated and zeroed its chunks'
     * arrays every call), until mg_tape_trim() or mg_tape_free(); bytes of each buffer */
    void *ws[MG_WS_N];
    size_t ws_bytes[MG_WS_N];
    int ws_pg_zero; /* the last batched fit ran on one thread: it left the chunks' pg zero where
                       the next one reads before writing (drive.h) */
};

/* ---- stage entry points (internal) ------------------------------------------------------------
 */

/* Records an error on the tape (printf-style) and returns `status`. */
int mg_tape__fail(mg_tape *t, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

void *mg_tape__alloc(mg_tape *t, size_t count, size_t size); /* NULL on overflow or ENOMEM */
/* Working buffer `which` (MG_WS_*) of at least count * size bytes, kept on the tape: its previous
 * one where that is large enough (its contents are whatever the last call left), else a new one
 * (the old freed; uninitialised), and then *fresh (if not NULL) is set to 1. NULL on overflow or
 * ENOMEM (recorded), the buffer then freed. */
void *mg_tape__ws(mg_tape *t, int which, size_t count, size_t size, int *fresh);
int mg_tape__grow(mg_tape *t, void **buf, size_t *cap, size_t elem, size_t need);
int mg_tape__push_nest(mg_tape *t, size_t *cap, const mgk_nest *nest, const mg_nest_info *info);
int mg_tape__push_instr(mg_tape *t, mg_instr **prog, size_t *len, size_t *cap, const mg_instr *in);

/* reroll.c: statements, groups and slots -> forward nests and program (t->nests, t->fwd). With
 * `scalar`, one instruction per node (no folding, no grouping). `inputs`: the inputs' layout,
 * MG_IN_AUTO (the order the program reads them where that makes more reads affine, else the
 * caller's), MG_IN_GIVEN or MG_IN_READ; `*alt` is set to 1 when the two orders differ. Returns
 * MG_OK or an error. */
enum { MG_IN_AUTO = 0, MG_IN_GIVEN = 1, MG_IN_READ = 2 };
int mg_reroll(mg_tape *t, const mg_fz *fz, int scalar, int inputs, int *alt);
/* roll.c: compresses repeated runs of the forward program into sequential loops. */
int mg_roll(mg_tape *t);
/* hoist.c: moves the nests of the forward (backward 0) or backward (1) program's sequential
 * loops that do not depend on the loop out of it. */
int mg_hoist(mg_tape *t, int backward);
/* split.c: forward nests reading a run of parameters across blocks that other nests read as
 * blocks, cut at the blocks' edges (before autodiff, so that the gradients are cut alike). */
int mg_split(mg_tape *t);
/* autodiff.c: the backward program. */
int mg_autodiff(mg_tape *t);
/* schedule.c: block/split flags, packing, fused SGD, pre-steps. */
int mg_schedule(mg_tape *t);

/* interpret.c (double slot arrays) */
#if MGK_REAL_BYTES == 8
void mg_ir__run_nest(const mg_tape *t, size_t nest, const mgk_run *R);
#endif
uint64_t mg_ir__fingerprint(const mg_tape *t);
/* The driver's loops over parameters and data (drive.h), run by the same kernel build as the
 * nests (interp_kernels.c, interpret.c's choice), so that they use the CPU's vectors too: at batch
 * 32 an MLP spent a fifth of its time in them, in baseline SSE2. A step range is SGD over
 * q in [from, to): w[q] -= scale * (g0[q] + g1[q]) (g1 NULL: scale * g0[q]), zeroing the
 * gradients it reads when `zero` is set; to_float rounds n doubles to float, from_float widens
 * n floats to double (exactly). Each element is the same operation in every build: the same
 * bits. */
void mg_ir__step_d(double *w, double *g0, double *g1, size_t from, size_t to, double scale,
                   int zero);
void mg_ir__step_f(float *w, float *g0, float *g1, size_t from, size_t to, float scale, int zero);
void mg_ir__to_float(float *dst, const double *src, size_t n);
void mg_ir__from_float(double *dst, const float *src, size_t n);

/* fit.c: the packed copy of the parameters as a call would make it, into `pw` (t->npacked
 * doubles), without touching the tape (the inference-only emitter inlines it). */
void mg_tape__packed_values(mg_tape *t, double *pw);

/* fit32.c: float32 storage (code emitted with float32 slots attached). The driver entry points
 * over the float32 arrays, and the copies between them and the tape's double arrays (what every
 * accessor reads): in, before a call (values rounded to float32); out, after it. */
int mg_tape__forward_f32(mg_tape *t, const double *x, const double *y);
int mg_tape__backward_f32(mg_tape *t);
int mg_tape__step_f32(mg_tape *t, double lr, size_t count);
int mg_tape__predict_f32(mg_tape *t, const double *X, size_t n, double *out);
int mg_tape__fit_f32(mg_tape *t, const double *X, const double *Y, size_t n,
                     const mg_fit_options *opt, double *mean_loss);
/* Elements of padding after each float32 array: float32 code runs blocks of 16 lanes. */
#define MG_F32_PAD 16
/* Which arrays a float32 call reads (copied in) or writes (copied out): each public call copies
 * only those, so a single-sample call costs no more conversions than it needs. */
enum { MG_F32_DATA = 1, MG_F32_GRAD = 2 };
void mg_tape__f32_in(mg_tape *t, int what);
void mg_tape__f32_out(mg_tape *t, int what);

/* Whether slot `slot` is a computed value: one that needs a gradient (autodiff.c). */
static inline int mg_tape__is_value(const mg_tape *t, mgk_i64 slot) {
    return slot >= (mgk_i64)t->first_op ||
           (slot >= (mgk_i64)t->shared0 && slot < (mgk_i64)t->input0);
}

/* Whether term operand j of nest N is read: dA/dB of a unary op ignore their B operand (the one
 * rule every pass that walks a nest's reads uses: schedule.c, hoist.c). */
static inline int mg_nest__x_used(const mgk_nest *N, int j) {
    int ar = mg_op__arity[N->op];
    switch (N->term) {
    case MGK_T_ONE: return j == 0;
    case MGK_T_MUL: return j < 2;
    case MGK_T_OP: return j < ar;
    case MGK_T_MAXR: return j == 0;
    case MGK_T_DMAXR: return j < 2;
    default: return j != 1 || ar == 2;
    }
}
/* Whether every operand nest N reads is a sample's own element (BD, BG, never gathered): then no
 * step of a parameter can change what it reads (schedule.c's bands, drive.h's deferred nests). */
static inline int mg_nest__reads_samples(const mgk_nest *N) {
    for (int j = 0; j < 4; j++)
        if (mg_nest__x_used(N, j) && (!MGK_PS(&N->x[j]) || N->x[j].gather)) return 0;
    return 1;
}
/* Canonical form of a nest's dims: outer dims right-aligned at 3, reduction dims at 7. */
void mg_nest__canon(mgk_nest *N, int no, int nr);
/* Whether ref X is injective over dims with nonzero stride (1), or may repeat elements (0). */
int mg_ref__injective(const mgk_ref *X, const mgk_i64 *n, const mgk_idx *ix);
/* Calls visit(ctx, pos) for each position ref X of nest `nest` reaches: every point of the dims
 * it moves along, in every iteration of the nest's sequential loop when X steps with it. `pos` is
 * a slot for a direct ref and an index-table entry (t->ix) for a gathered one; positions repeat
 * when the ref does. Stops at the first visit that returns nonzero and returns its value; 0 when
 * every position was visited. The one walk over a ref's elements (scheduling, autodiff). */
int mg_ref__each(const mg_tape *t, size_t nest, const mgk_ref *X,
                 int (*visit)(void *ctx, mgk_i64 pos), void *ctx);

#endif /* MG_IR_H */
