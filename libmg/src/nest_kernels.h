/* Loop nests: the one implementation of every loop the compiler recovers from a scalar graph.
 *
 * This text is compiled into libmg's interpreter (descriptors read at run time, one instance per
 * term kind and op) and pasted verbatim into generated C (each hot nest a function calling
 * mgk_nest_path with a `static const` descriptor, which the C compiler folds into loops with
 * constant bounds and strides). Both run the same statements in the same order, so they compute
 * the same bits. The includer defines mgk_real (kernels.h) and the op table's formulas,
 * mgk_op_fwd/mgk_op_da/mgk_op_db, first.
 *
 * A nest has up to four outer dims (0..3) and four reduction dims (4..7); unused dims have size 1.
 * Dim 3 is the vector dim: MGK_F_BLOCK computes MGK_LANES outputs along it at once (each
 * output's terms still added in order, so blocking never changes a value); the last block of a
 * row may be partial: it computes every lane but stores the valid ones, and may read up to
 * MGK_LANES - 1 elements past the row, so every array a nest reads has MGK_PAD elements of
 * padding after its last slot. Per output point
 * (i0..i3):
 *   MGK_SET   out = term(i)                                   (no reduction dims)
 *   MGK_SUM0  out = 0 + term(i, r0) + term(i, r1) + ...       (r in row-major order)
 *   MGK_SUMI  out = init(i) + term(i, r0) + ...
 *   MGK_ACC   out = out + term(i, r0) + ...
 * MGK_F_STEP (SGD fused into a parameter's only gradient nest, an MGK_ACC one; init names the
 * parameter): a run with `first` set starts the sums from 0 instead of out (the fit's first
 * samples into these gradients: nothing needs zeroing), and a run with `bstep` set applies SGD
 * instead of storing, init -= lr * (og + sum) with og the batch's other chunk's gradient at the
 * same element (none at batch size 1), and out untouched: at batch size 1 every sample's nest
 * (`first` and `bstep`), in a batch on one thread the last chunk's last samples, whose sum is
 * the batch's gradient with the other chunk's added in chunk order: what the driver's separate
 * step computes, so the same bits, without a pass over the gradients.
 * MGK_F_PRESTEP (the batch-1 forward of a layer whose weights' fused SGD was deferred from the
 * previous sample's backward, schedule.c's pre-steps): when the run carries the previous
 * sample's per-sample arrays (QD, QG) and lr is nonzero, each weight x0 is stepped right before
 * it is read, x0 -= lr * (0 + g * x) with g the previous sample's gradient at this point's
 * output and x its x1 here: the deferred nest's arithmetic, so the same bits, with one pass
 * over the weights per sample instead of two.
 * Terms: ONE x0, MUL x0*x1, OP op(x0, x1, k), DA dA(x0, x1, k, x2)*x3, DB dB(...)*x3; MAXR and
 * DMAXR, a max over the reduction points (of pre(x0) with `pre` set) and its gradient, run apart
 * (mgk_maxr). An operand is element base + t*ts + sum_k s[k]*i_k of array `arr` (t: the enclosing
 * sequential loop's iteration), or, with `gather`, the element that position of the index table
 * names. MGK_F_SPLIT (gradient sums over shared weights, never forward values) adds the innermost
 * reduction dim, where it is at least MGK_LANES long, in MGK_LANES interleaved partial sums, kept
 * over every other reduction dim and the samples and combined once per output in a fixed order: the
 * same bits on every backend and thread count. MGK_F_SCATTER (gradients whose target moves along
 * more dims than a nest has outer dims) adds every term straight into its own output element,
 * out(i, r) += term(i, r), visiting the points in row-major order, except that a per-sample
 * output's row of products (or values) runs over its reduction points, and along the row at each
 * (mgk_scatter_row). MGK_F_BAND (an MGK_F_STEP
 * nest that reads only per-sample operands, schedule.c) runs the rows of dim 2 that the run names
 * (mgk_run::lo2, hi2): a batch whose samples are all in flight runs such a nest after its chunks,
 * in bands of rows, one per thread (drive.h). Each output's arithmetic does not depend on the band.
 */
#ifndef MGK_NEST_KERNELS_H
#define MGK_NEST_KERNELS_H

#define MGK_MAXO 4
#define MGK_MAXR 4
#define MGK_MAXD 8
/* Lanes per block: 8, or 16 in code emitted with float32 storage (the includer defines it; the
 * schedule's decisions do not depend on it, and every path handles partial blocks). */
#ifndef MGK_LANES
#define MGK_LANES 8
#endif
#if MGK_LANES != 8 && MGK_LANES != 16
#error "MGK_LANES is 8 or 16"
#endif
#define MGK_PAD MGK_LANES /* elements of padding after every slot array */

typedef long long mgk_i64;

enum { MGK_SET = 0, MGK_SUM0 = 1, MGK_SUMI = 2, MGK_ACC = 3 };
enum {
    MGK_T_ONE = 0,
    MGK_T_MUL = 1,
    MGK_T_OP = 2,
    MGK_T_DA = 3,
    MGK_T_DB = 4,
    MGK_T_MAXR = 5,  /* a max over the reduction points (mgk_maxr) */
    MGK_T_DMAXR = 6, /* its gradient (mgk_maxr) */
    MGK_NTERMS = 7
};
/* Arrays: the shared slots (parameters, constants) and their gradients, the packed parameters and
 * theirs, and the per-sample slots (inputs, targets, values) and their gradients. A batch holds
 * `nb` samples' per-sample slots `ss` elements apart; at batch size 1, BD is the tape's own data
 * from its first input slot on, so one descriptor serves every batch size. */
enum { MGK_D = 0, MGK_G = 1, MGK_PW = 2, MGK_PG = 3, MGK_BD = 4, MGK_BG = 5 };
/* ... and, for MGK_F_PRESTEP only, the previous sample's per-sample slots and gradients (at the
 * same positions as BD's and BG's; NULL outside a batch-1 fit's samples after the first) */
enum { MGK_QD = 6, MGK_QG = 7, MGK_NARR = 8 };
enum {
    MGK_F_BLOCK = 1,
    MGK_F_SPLIT = 2,
    MGK_F_STEP = 4,
    MGK_F_SCATTER = 8,
    MGK_F_TILE = 16,
    MGK_F_PRESTEP = 32,
    MGK_F_BAND = 64
};

typedef struct mgk_ref {
    mgk_i64 base;        /* element at index 0 and t = 0 */
    mgk_i64 ts;          /* added per iteration of the enclosing sequential loop */
    mgk_i64 s[MGK_MAXD]; /* stride per dim */
    int arr;             /* MGK_D ... MGK_BG */
    int gather;          /* nonzero: the position is an entry of mgk_run::ix, holding the element */
} mgk_ref;

typedef struct mgk_nest {
    int mode, term, op, flags;
    int pre;             /* MAXR, DMAXR: the unary op applied to each element first (0: none) */
    int zero_;           /* 0: no padding bytes (nests are hashed and compared as bytes) */
    double k;            /* the op's constant (POW's exponent; pre's, for a max's elements) */
    mgk_i64 n[MGK_MAXD]; /* sizes: outer dims 0..3, reduction dims 4..7 */
    mgk_ref out, init, x[4];
} mgk_nest;

/* What a nest runs over: the arrays, the gather tables, the sequential loop's iteration, the batch
 * (nb samples, ss elements apart in BD and BG), and the learning rate of nests that apply SGD as
 * they go (MGK_F_STEP, batch size 1 only). Its layout does not depend on mgk_real. With nb > 1, BD
 * and BG hold nb rounded up to a multiple of MGK_TS_MAX samples: a tile of samples may run into
 * the ones past nb, whose values nothing else reads. */
#define MGK_TS_MAX 8 /* rows of the largest register tile, a multiple of MGK_TS and MGK_TSS */
typedef struct mgk_run {
    mgk_real *a[MGK_NARR];
    const mgk_idx *ix;
    mgk_i64 t;
    mgk_i64 nb, ss;
    double lr;
    /* MGK_F_STEP nests: the other chunk's gradients (G and PG, at the same elements; NULL when
     * there is none), whether the sums start from zero, whether the nest steps */
    mgk_real *og[2];
    int first, bstep;
    /* MGK_F_BAND nests: with hi2 > 0, only the outer points with lo2 <= i2 < hi2 (a band of rows
     * one thread runs; lo2 a multiple of MGK_TS_MAX, hi2 too or n[2]); otherwise every point */
    mgk_i64 lo2, hi2;
} mgk_run;

/* A per-sample operand. */
#define MGK_PS(X) ((X)->arr >= MGK_BD)
/* A weight w stepped by a pre-step (MGK_F_PRESTEP): the deferred gradient nest's arithmetic, a
 * sum from zero of its one term g * x, then SGD, so the same bits as the step it replaces. `zero`
 * is 0 in w's type (a scalar or a vector); every kernel that pre-steps weights uses this. */
#define MGK_PRESTEPPED(w, lr, zero, g, x) ((w) - (lr) * ((zero) + (g) * (x)))
/* Whether a nest's sums start from zero (MGK_SUM0, or an MGK_F_STEP nest's run with `first`). */
#define MGK_ZS(N, R) ((N)->mode == MGK_SUM0 || (((N)->flags & MGK_F_STEP) && (R)->first))
/* An MGK_F_STEP nest's other gradient at out's element `po`, or NULL. */
#define MGK_OG(N, R, po)                                                                           \
    ((R)->og[(N)->out.arr == MGK_PG] ? (R)->og[(N)->out.arr == MGK_PG] + (po) : (mgk_real *)0)

#if defined(__GNUC__) || defined(__clang__)
/* always inlined; and possibly unused: a generated file runs only some of these */
#define MGK_HOT static inline __attribute__((always_inline, unused))
#else
#define MGK_HOT static inline
#endif

/* Vector lanes: with GNU C vector extensions (gcc, clang) a block of MGK_LANES outputs is held
 * in MGK_NV native vectors of MGK_VW lanes (one AVX-512 register, two AVX ones or four SSE2 ones
 * for doubles: the width follows the target the code is compiled for); elsewhere (tcc, MSVC) the
 * plain lane loops below do the same arithmetic. Lanewise IEEE operations in the same order:
 * the same bits either way. MGK_REAL_BYTES is sizeof(mgk_real), for the preprocessor. */
#ifndef MGK_REAL_BYTES
#define MGK_REAL_BYTES 8
#endif
#define MGK_QL (16 / MGK_REAL_BYTES) /* lanes of a quarter block: 2 doubles or 4 floats */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__TINYC__) && !defined(MGK_NO_VECTOR)
#define MGK_VECTOR 1
#if defined(__AVX512F__)
#define MGK_VBYTES 64
#elif defined(__AVX__)
#define MGK_VBYTES 32
#else
#define MGK_VBYTES 16
#endif
#if MGK_VBYTES > MGK_LANES * MGK_REAL_BYTES
#undef MGK_VBYTES
#define MGK_VBYTES (MGK_LANES * MGK_REAL_BYTES)
#endif
#define MGK_VW (MGK_VBYTES / MGK_REAL_BYTES) /* lanes per native vector */
#define MGK_NV (MGK_LANES / MGK_VW)          /* native vectors per block */
#define MGK_VW_LOG2 (MGK_VW == 2 ? 1 : MGK_VW == 4 ? 2 : MGK_VW == 8 ? 3 : 4)
typedef mgk_real mgk_vec __attribute__((vector_size(MGK_VBYTES)));
/* the same, at any element's address, and allowed to alias the slot arrays */
typedef mgk_real mgk_vec_u
    __attribute__((vector_size(MGK_VBYTES), aligned(MGK_REAL_BYTES), may_alias));
/* unaligned loads and stores; macros, since a function passing such vectors by value would
 * change the ABI on targets without registers that wide. Plain assignments, not memcpy: taking a
 * vector's address would keep a tile's accumulators in memory (gcc then spills all of them). */
#define MGK_VLOAD(v, p) ((v) = *(const mgk_vec_u *)(const void *)(p))
#define MGK_VSTORE(p, v) (*(mgk_vec_u *)(void *)(p) = (v))
/* every lane x (not {0} + x: adding zero turns -0.0 into +0.0) */
#if MGK_VW == 2
#define MGK_VSPLAT(x) ((mgk_vec){(x), (x)})
#elif MGK_VW == 4
#define MGK_VSPLAT(x) ((mgk_vec){(x), (x), (x), (x)})
#elif MGK_VW == 8
#define MGK_VSPLAT(x) ((mgk_vec){(x), (x), (x), (x), (x), (x), (x), (x)})
#elif MGK_VW == 16
#define MGK_VSPLAT(x)                                                                              \
    ((mgk_vec){(x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x)})
#else
#error "unexpected vector width"
#endif
/* lanes p[0], p[s], p[2s], ... of one native vector, the first m of them, zeros after (a strided
 * output loaded once per tile, whose zero lanes are never stored; a split sum's last terms in a
 * row, whose zero lanes add +0.0 * +0.0) */
#define MGK_GL(p, s, m, l) ((l) < (m) ? (p)[(l) * (s)] : (mgk_real)0)
#if MGK_VW == 2
#define MGK_VGATHER(p, s, m) ((mgk_vec){MGK_GL(p, s, m, 0), MGK_GL(p, s, m, 1)})
#elif MGK_VW == 4
#define MGK_VGATHER(p, s, m)                                                                       \
    ((mgk_vec){MGK_GL(p, s, m, 0), MGK_GL(p, s, m, 1), MGK_GL(p, s, m, 2), MGK_GL(p, s, m, 3)})
#elif MGK_VW == 8
#define MGK_VGATHER(p, s, m)                                                                       \
    ((mgk_vec){MGK_GL(p, s, m, 0), MGK_GL(p, s, m, 1), MGK_GL(p, s, m, 2), MGK_GL(p, s, m, 3),     \
               MGK_GL(p, s, m, 4), MGK_GL(p, s, m, 5), MGK_GL(p, s, m, 6), MGK_GL(p, s, m, 7)})
#else
#define MGK_VGATHER(p, s, m)                                                                       \
    ((mgk_vec){MGK_GL(p, s, m, 0), MGK_GL(p, s, m, 1), MGK_GL(p, s, m, 2), MGK_GL(p, s, m, 3),     \
               MGK_GL(p, s, m, 4), MGK_GL(p, s, m, 5), MGK_GL(p, s, m, 6), MGK_GL(p, s, m, 7),     \
               MGK_GL(p, s, m, 8), MGK_GL(p, s, m, 9), MGK_GL(p, s, m, 10), MGK_GL(p, s, m, 11),   \
               MGK_GL(p, s, m, 12), MGK_GL(p, s, m, 13), MGK_GL(p, s, m, 14),                      \
               MGK_GL(p, s, m, 15)})
#endif
/* Unrolls the loop that follows completely: the loops over a block's vectors and a tile's rows,
 * whose accumulators must live in registers (gcc -O2 leaves an 8-row loop rolled, with every
 * accumulator in memory: a load, an add and a store per row and term). */
#define MGK_UNROLL _Pragma("GCC unroll 16")
/* Quarter blocks: 16-byte vectors of MGK_QL lanes (every target has them), for the last block of
 * a row when at most MGK_QL of its lanes are valid (mgk_tile_q). */
typedef mgk_real mgk_vq __attribute__((vector_size(16)));
typedef mgk_real mgk_vq_u __attribute__((vector_size(16), aligned(MGK_REAL_BYTES), may_alias));
#if MGK_QL == 2
#define MGK_QSPLAT(x) ((mgk_vq){(x), (x)})
#define MGK_QGATHER(p, s, m) ((mgk_vq){MGK_GL(p, s, m, 0), MGK_GL(p, s, m, 1)})
#else
#define MGK_QSPLAT(x) ((mgk_vq){(x), (x), (x), (x)})
#define MGK_QGATHER(p, s, m)                                                                       \
    ((mgk_vq){MGK_GL(p, s, m, 0), MGK_GL(p, s, m, 1), MGK_GL(p, s, m, 2), MGK_GL(p, s, m, 3)})
#endif
/* A fused step's loads of the parameter and of the other chunk's gradient (`m` lanes of the
 * vector at p valid): whole vectors for full blocks, the valid lanes alone for the last block of a
 * row, whose other lanes are the next row's elements, which another thread may be stepping at the
 * same time (a band of rows, MGK_F_BAND). */
#define MGK_STEP_LANES(v, p, m)                                                                    \
    do {                                                                                           \
        if ((m) >= MGK_VW) MGK_VLOAD(v, p);                                                        \
        else (v) = MGK_VGATHER(p, 1, m);                                                           \
    } while (0)
/* Stride-2 lanes (a 2x2 pool's columns) as shuffles of whole vectors, where the compiler has
 * __builtin_shufflevector (clang, gcc 12): MGK_EVEN(a, b) is the even lanes of a then b
 * (MGK_ODD(a, b) the odd ones);
 * MGK_ZIP_LO(v, a) puts v's first half in a's even lanes and MGK_ZIP_HI(v, a) its second half,
 * a's odd lanes kept. (MGK_STRIDE2 0: lane by lane, as before gcc 12.) */
#if (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)) && !defined(MGK_NO_EVEN)
#define MGK_STRIDE2 1
#define MGK_SV __builtin_shufflevector
#if MGK_VW == 2
#define MGK_EVEN(a, b) MGK_SV(a, b, 0, 2)
#define MGK_ODD(a, b) MGK_SV(a, b, 1, 3)
#define MGK_ZIP_LO(v, a) MGK_SV(v, a, 0, 3)
#define MGK_ZIP_HI(v, a) MGK_SV(v, a, 1, 3)
#elif MGK_VW == 4
#define MGK_EVEN(a, b) MGK_SV(a, b, 0, 2, 4, 6)
#define MGK_ODD(a, b) MGK_SV(a, b, 1, 3, 5, 7)
#define MGK_ZIP_LO(v, a) MGK_SV(v, a, 0, 5, 1, 7)
#define MGK_ZIP_HI(v, a) MGK_SV(v, a, 2, 5, 3, 7)
#elif MGK_VW == 8
#define MGK_EVEN(a, b) MGK_SV(a, b, 0, 2, 4, 6, 8, 10, 12, 14)
#define MGK_ODD(a, b) MGK_SV(a, b, 1, 3, 5, 7, 9, 11, 13, 15)
#define MGK_ZIP_LO(v, a) MGK_SV(v, a, 0, 9, 1, 11, 2, 13, 3, 15)
#define MGK_ZIP_HI(v, a) MGK_SV(v, a, 4, 9, 5, 11, 6, 13, 7, 15)
#else
#define MGK_EVEN(a, b) MGK_SV(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
#define MGK_ODD(a, b) MGK_SV(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31)
#define MGK_ZIP_LO(v, a) MGK_SV(v, a, 0, 17, 1, 19, 2, 21, 3, 23, 4, 25, 5, 27, 6, 29, 7, 31)
#define MGK_ZIP_HI(v, a) MGK_SV(v, a, 8, 17, 9, 19, 10, 21, 11, 23, 12, 25, 13, 27, 14, 29, 15, 31)
#endif
/* the even lanes of the 2 * MGK_VW elements at p */
#define MGK_EVEN2(p)                                                                               \
    MGK_EVEN(*(const mgk_vec_u *)(const void *)(p),                                                \
             *(const mgk_vec_u *)(const void *)((p) + MGK_VW))
#else
#define MGK_STRIDE2 0
#define MGK_EVEN2(p) MGK_VGATHER(p, 2, MGK_VW)
#endif
#else
#define MGK_VECTOR 0
#define MGK_UNROLL /* (a hint to gcc and clang; the scalar paths are correct rolled) */
#endif

/* Index-table entries name an element of the shared arrays (D, G) or, with MGK_IX_PS set, of the
 * per-sample ones (BD for D, BG for G): one table may mix parameters and per-sample values. */
#define MGK_IX_PS 0x80000000u
MGK_HOT mgk_real *mgk_gat(const mgk_run *R, const mgk_ref *X, const mgk_i64 pos, const mgk_i64 so) {
    const mgk_idx e = R->ix[pos];
    return (e & MGK_IX_PS) ? R->a[MGK_BD + (X->arr & 1)] + (e & ~MGK_IX_PS) + so : R->a[X->arr] + e;
}
/* The element of ref X at position `pos`, and the same in the sample `so` elements on (per-sample
 * elements only: a shared element is the same for every sample). */
#define MGK_AT(R, X, pos) ((X)->gather ? mgk_gat(R, X, pos, 0) : (R)->a[(X)->arr] + (pos))
#define MGK_ATS(R, X, pos, so)                                                                     \
    ((X)->gather ? mgk_gat(R, X, pos, so) : (R)->a[(X)->arr] + (pos) + (MGK_PS(X) ? (so) : 0))

MGK_HOT mgk_real mgk_term(const int term, const int op, const double k, const mgk_real *p0,
                          const mgk_real *p1, const mgk_real *p2, const mgk_real *p3) {
    switch (term) {
    case MGK_T_ONE: return *p0;
    case MGK_T_MUL: return *p0 * *p1;
    case MGK_T_OP: return (mgk_real)mgk_op_fwd(op, *p0, *p1, k);
    case MGK_T_DA: return (mgk_real)mgk_op_da(op, *p0, *p1, k, *p2) * *p3;
    default: return (mgk_real)mgk_op_db(op, *p0, *p1, k, *p2) * *p3;
    }
}

/* Every reduction point of a nest with sizes n, the samples summed over (nbr) outermost: the one
 * order in which every kernel adds an output's terms (the caller declares sm and r4..r7). */
#define MGK_EACH_TERM(nbr, n)                                                                      \
    for (sm = 0; sm < (nbr); sm++)                                                                 \
        for (r4 = 0; r4 < (n)[4]; r4++)                                                            \
            for (r5 = 0; r5 < (n)[5]; r5++)                                                        \
                for (r6 = 0; r6 < (n)[6]; r6++)                                                    \
                    for (r7 = 0; r7 < (n)[7]; r7++)

/* The positions of a ref at the reduction point (r4..r7) relative to an outer point. */
#define MGK_RPOS(X, r4, r5, r6, r7)                                                                \
    ((r4) * (X)->s[4] + (r5) * (X)->s[5] + (r6) * (X)->s[6] + (r7) * (X)->s[7])
#define MGK_TERM_AT(N, R, term, op, q0, q1, q2, q3, so)                                            \
    mgk_term(term, op, (N)->k, MGK_ATS(R, &(N)->x[0], q0, so), MGK_ATS(R, &(N)->x[1], q1, so),     \
             MGK_ATS(R, &(N)->x[2], q2, so), MGK_ATS(R, &(N)->x[3], q3, so))

/* The sizes with `small` applied: dims 0, 4 and 5 known to be 1. */
#define MGK_SIZES(n, nn, small)                                                                    \
    const mgk_i64 n[MGK_MAXD] = {                                                                  \
        (small) ? 1 : (nn)[0], (nn)[1], (nn)[2], (nn)[3], (small) ? 1 : (nn)[4],                   \
        (small) ? 1 : (nn)[5], (nn)[6], (nn)[7]}

/* The fixed order in which a split sum's lanes are added: lanes o..o+7 of P(lane), in pairs
 * (mgk_point1; mgk_lanes adds vectors of samples in the same order). */
#define MGK_TREE8(P, o)                                                                            \
    (((P(o) + P((o) + 1)) + (P((o) + 2) + P((o) + 3))) +                                           \
     ((P((o) + 4) + P((o) + 5)) + (P((o) + 6) + P((o) + 7))))
#if MGK_LANES == 8
#define MGK_TREE(P) MGK_TREE8(P, 0)
#else
#define MGK_TREE(P) (MGK_TREE8(P, 0) + MGK_TREE8(P, 8))
#endif

/* Whether a split sum runs in vectors (mgk_point1, mgk_split_pts): lane l of vector k holds the
 * sum of lane k * MGK_VW + l, for a product or a single operand read along r7 in order or not
 * at all. */
#define MGK_SPLIT_VEC(N, term)                                                                     \
    (((N)->flags & MGK_F_SPLIT) && (N)->n[7] >= MGK_LANES &&                                       \
     ((term) == MGK_T_MUL || (term) == MGK_T_ONE) && !(N)->x[0].gather && !(N)->x[1].gather &&     \
     ((N)->x[0].s[7] == 0 || (N)->x[0].s[7] == 1) &&                                               \
     ((term) == MGK_T_ONE || (N)->x[1].s[7] == 0 || (N)->x[1].s[7] == 1))

/* gcc 12.2's loop vectorizer miscompiles a loop over samples around a sum of two terms whose
 * operands step backwards (-1) along the reduction: it adds three products per sample, not two
 * (a recurrent model's weight gradient hoisted after a reversed loop of two steps, at batch sizes
 * of 3 and more: `for (s...) for (r = 0; r < 2; r++) a += g[40 - r + s*ss] * h[30 - r + s*ss]`
 * gives wrong sums at -O2; clang, -O1 and -fno-tree-loop-vectorize give the right ones). Where a
 * term operand steps backwards along a reduction dim (constant in generated code: no other nest
 * pays), an empty asm that takes the sum through memory each sample keeps that loop scalar.
 * test_reroll.py's test_a_reversed_two_step_gradient_sums_the_samples_of_a_batch holds it. */
#define MGK_REVERSED_X(X) ((X).s[4] < 0 || (X).s[5] < 0 || (X).s[6] < 0 || (X).s[7] < 0)
#define MGK_REVERSED_R(N)                                                                          \
    (MGK_REVERSED_X((N)->x[0]) || MGK_REVERSED_X((N)->x[1]) || MGK_REVERSED_X((N)->x[2]) ||        \
     MGK_REVERSED_X((N)->x[3]))
#if defined(__GNUC__) && !defined(__clang__)
#define MGK_REVERSED_FENCE(N, v)                                                                   \
    do {                                                                                           \
        if (MGK_REVERSED_R(N)) __asm__("" : "+m"(v));                                              \
    } while (0)
#else
#define MGK_REVERSED_FENCE(N, v) ((void)0)
#endif

/* One output point, scalar (also what is neither blocked nor tiled): positions at the outer point
 * are po (out), pi (init), p0..p3 (term operands). `step`: the run applies SGD (MGK_F_STEP).
 * `nbr`: samples to sum over (a shared output, a parameter's gradient, in a batch), outermost. */
MGK_HOT void mgk_point1(const mgk_nest *N, const mgk_run *R, const int term, const int op,
                        const int step, const int small, const mgk_i64 nbr, const mgk_i64 s0,
                        mgk_i64 po, mgk_i64 pi, mgk_i64 p0, mgk_i64 p1, mgk_i64 p2, mgk_i64 p3) {
    MGK_SIZES(n, N->n, small);
    const mgk_ref *X = N->x;
    mgk_real acc;
    mgk_i64 r4, r5, r6, r7, sm;
    if (N->mode == MGK_SET) {
        *MGK_ATS(R, &N->out, po, s0) = MGK_TERM_AT(N, R, term, op, p0, p1, p2, p3, s0);
        return;
    }
    if (N->flags & MGK_F_SCATTER) {
#ifndef MGK_NO_SCATTER_ROWS
        if ((term == MGK_T_ONE || term == MGK_T_MUL) && !N->out.gather && !X[0].gather &&
            (term == MGK_T_ONE || !X[1].gather)) {
            /* the same additions in the same order, the positions advanced along the innermost
             * reduction dim instead of computed for each term from every dim and stride (a padded
             * convolution's corner weights' gradients, shared, summed over a batch's samples; a
             * per-sample output's rows run in mgk_scatter_row instead). Defining
             * MGK_NO_SCATTER_ROWS leaves it out (to compare: a test checks the bits). */
            const mgk_i64 os = N->out.s[7], as = X[0].s[7], bs = X[1].s[7];
            for (sm = 0; sm < nbr; sm++) {
                const mgk_i64 ss = s0 + sm * R->ss;
                mgk_real *const ob = R->a[N->out.arr] + po + (MGK_PS(&N->out) ? ss : 0);
                const mgk_real *const ab = R->a[X[0].arr] + p0 + (MGK_PS(&X[0]) ? ss : 0);
                const mgk_real *const bb =
                    term == MGK_T_ONE ? ab : R->a[X[1].arr] + p1 + (MGK_PS(&X[1]) ? ss : 0);
                for (r4 = 0; r4 < n[4]; r4++)
                    for (r5 = 0; r5 < n[5]; r5++)
                        for (r6 = 0; r6 < n[6]; r6++) {
                            mgk_real *o = ob + MGK_RPOS(&N->out, r4, r5, r6, 0);
                            const mgk_real *a = ab + MGK_RPOS(&X[0], r4, r5, r6, 0);
                            const mgk_real *b = bb + MGK_RPOS(&X[1], r4, r5, r6, 0);
                            for (r7 = 0; r7 < n[7]; r7++)
                                o[r7 * os] +=
                                    term == MGK_T_ONE ? a[r7 * as] : a[r7 * as] * b[r7 * bs];
                        }
            }
            return;
        }
#endif
        MGK_EACH_TERM(nbr, n)
        *MGK_ATS(R, &N->out, po + MGK_RPOS(&N->out, r4, r5, r6, r7), s0 + sm * R->ss) +=
            MGK_TERM_AT(N, R, term, op, p0 + MGK_RPOS(&X[0], r4, r5, r6, r7),
                        p1 + MGK_RPOS(&X[1], r4, r5, r6, r7), p2 + MGK_RPOS(&X[2], r4, r5, r6, r7),
                        p3 + MGK_RPOS(&X[3], r4, r5, r6, r7), s0 + sm * R->ss);
        return;
    }
    acc = MGK_ZS(N, R)          ? (mgk_real)0
          : N->mode == MGK_SUMI ? *MGK_ATS(R, &N->init, pi, s0)
                                : *MGK_ATS(R, &N->out, po, s0);
    {
        /* A plain sum adds the terms into acc in order. A split sum's lane l adds, in order over
         * (samples, r4, r5, r6), the terms at r7 = l, l + MGK_LANES, ...; the lanes are then added
         * once, in a fixed order. A row's last terms (n[7] % MGK_LANES of them) go to the first
         * lanes; the others add nothing (a lane starts at +0.0 and so never holds -0.0, which
         * adding +0.0 would change). One sum of lanes per output, not per row: in cnn48 a kernel
         * weight's gradient sums 26 rows of 26 products, and each row's sum of lanes (seven
         * additions and the lanes' extraction, after three blocks of products) cost more than its
         * products (cnn, cnn2, cnn48: 4-6% faster at batch sizes 1 and 32). */
        const mgk_i64 full = n[7] / MGK_LANES * MGK_LANES;
        const int m = (int)(n[7] - full);
        /* a row shorter than a block (float32's 16 lanes over 10 classes) adds in order: its sum
         * of lanes would cost more than its terms */
        const int split = (N->flags & MGK_F_SPLIT) && n[7] >= MGK_LANES;
        mgk_real part[MGK_LANES];
        int l, tree = 0; /* tree: the lanes were added in vector registers */
#define MGK_PART(l) part[l]
#if MGK_VECTOR
        if (MGK_SPLIT_VEC(N, term)) {
            /* the same lanes, lane l of vector k holding part[k * MGK_VW + l] */
            mgk_vec v[MGK_NV], a = MGK_VSPLAT((mgk_real)0), b = a;
            int k;
            MGK_UNROLL
            for (k = 0; k < MGK_NV; k++) v[k] = MGK_VSPLAT((mgk_real)0);
            for (sm = 0; sm < nbr; sm++) {
                const mgk_i64 so = s0 + sm * R->ss;
                for (r4 = 0; r4 < n[4]; r4++)
                    for (r5 = 0; r5 < n[5]; r5++)
                        for (r6 = 0; r6 < n[6]; r6++) {
                            const mgk_real *y0 =
                                MGK_ATS(R, &X[0], p0 + MGK_RPOS(&X[0], r4, r5, r6, 0), so);
                            const mgk_real *y1 =
                                MGK_ATS(R, &X[1], p1 + MGK_RPOS(&X[1], r4, r5, r6, 0), so);
                            if (!X[0].s[7]) a = MGK_VSPLAT(*y0);
                            if (term == MGK_T_MUL && !X[1].s[7]) b = MGK_VSPLAT(*y1);
                            for (r7 = 0; r7 < full; r7 += MGK_LANES) {
                                MGK_UNROLL
                                for (k = 0; k < MGK_NV; k++) {
                                    if (X[0].s[7]) MGK_VLOAD(a, y0 + r7 + k * MGK_VW);
                                    if (term == MGK_T_ONE) {
                                        v[k] += a;
                                    } else {
                                        if (X[1].s[7]) MGK_VLOAD(b, y1 + r7 + k * MGK_VW);
                                        v[k] += a * b;
                                    }
                                }
                            }
                            if (m) { /* the row's last terms, zeros in the lanes past them (built
                                      * lane by lane: loading whole vectors and masking them was
                                      * 4% slower on the CNN) */
                                MGK_UNROLL
                                for (k = 0; k < MGK_NV; k++) {
                                    const int mk = m - k * MGK_VW;
                                    const mgk_vec ta = MGK_VGATHER(
                                        y0 + X[0].s[7] * (full + k * MGK_VW), X[0].s[7], mk);
                                    if (term == MGK_T_ONE) {
                                        v[k] += ta;
                                    } else {
                                        const mgk_vec tb = MGK_VGATHER(
                                            y1 + X[1].s[7] * (full + k * MGK_VW), X[1].s[7], mk);
                                        v[k] += ta * tb;
                                    }
                                }
                            }
                        }
            }
            /* added lane from register (through memory, each lane's load waited for the vector's
             * store: a fifth of an RNN's backward) */
#define MGK_VLANE(l) v[(l) / MGK_VW][(l) % MGK_VW]
            acc += MGK_TREE(MGK_VLANE);
#undef MGK_VLANE
            tree = 1;
        }
#endif
        if (!tree) { /* split sums' lanes, or a plain sum */
            MGK_UNROLL
            for (l = 0; l < MGK_LANES; l++) part[l] = (mgk_real)0;
            for (sm = 0; sm < nbr; sm++) {
                const mgk_i64 so = s0 + sm * R->ss;
                for (r4 = 0; r4 < n[4]; r4++)
                    for (r5 = 0; r5 < n[5]; r5++)
                        for (r6 = 0; r6 < n[6]; r6++) {
                            const mgk_i64 q0 = p0 + MGK_RPOS(&X[0], r4, r5, r6, 0),
                                          q1 = p1 + MGK_RPOS(&X[1], r4, r5, r6, 0);
                            const mgk_i64 q2 = p2 + MGK_RPOS(&X[2], r4, r5, r6, 0),
                                          q3 = p3 + MGK_RPOS(&X[3], r4, r5, r6, 0);
#define MGK_TERM7(r7)                                                                              \
    MGK_TERM_AT(N, R, term, op, q0 + (r7) * X[0].s[7], q1 + (r7) * X[1].s[7],                      \
                q2 + (r7) * X[2].s[7], q3 + (r7) * X[3].s[7], so)
                            if (split && (term == MGK_T_MUL || term == MGK_T_ONE)) {
                                /* a block's terms at constant lane indices, so that the lanes
                                 * stay in registers (indexed by r7 % MGK_LANES, each term's lane
                                 * was a load and a store: a padded convolution's kernel gradient
                                 * along its edge columns, rows 28 elements apart). Products and
                                 * values only: unrolled, an op's formula in every lane made the
                                 * interpreter's instances a sixth larger, and no gradient sum
                                 * of an op's term over shared weights is known. */
                                for (r7 = 0; r7 < full; r7 += MGK_LANES) {
                                    MGK_UNROLL
                                    for (l = 0; l < MGK_LANES; l++) part[l] += MGK_TERM7(r7 + l);
                                }
                                MGK_UNROLL
                                for (l = 0; l < MGK_LANES; l++)
                                    if (l < m) part[l] += MGK_TERM7(full + l);
                            } else if (split) {
                                for (r7 = 0; r7 < n[7]; r7++) part[r7 % MGK_LANES] += MGK_TERM7(r7);
                            } else {
                                for (r7 = 0; r7 < n[7]; r7++) acc += MGK_TERM7(r7);
                                MGK_REVERSED_FENCE(N, acc);
                            }
#undef MGK_TERM7
                        }
            }
            if (split) acc += MGK_TREE(MGK_PART);
        }
#undef MGK_PART
    }
    if (step) {
        mgk_real *w = MGK_ATS(R, &N->init, pi, s0);
        const mgk_real *og = MGK_OG(N, R, po);
        *w -= (mgk_real)R->lr * (og ? *og + acc : acc);
    } else {
        *MGK_ATS(R, &N->out, po, s0) = acc;
    }
}

/* A scattered nest's row of n[3] points of one sample (MGK_F_SCATTER with a per-sample output: a
 * stride-2 convolution's input gradient, each input element receiving from several points): the
 * terms added reduction point by reduction point, along the row at each, the order every build
 * follows for such rows. The points in the order r7, r4, r5, r6: consecutive ones then write other
 * rows of the output (a kernel's rows), where r7 (its columns) shifts the row by an element, and a
 * vector loaded from the shifted stores of the point before could not be forwarded from them. The
 * points of a row write distinct elements (out's stride along it is not 0) and a nest never reads
 * what it writes, so at each reduction point the row runs as vectors where its output is
 * unit-stride, or stride 2 in a block with another after it in the row (whole vectors of the row's
 * span, the odd elements written back as they were), and its operands unit-stride or broadcast; the
 * rest lane by lane. Per point (mgk_point1), each term was a load, an add and a store through one
 * element after another (cnn2: 46% of a fit). Defining MGK_NO_SCATTER_ROWS leaves the vectors out
 * (to compare: a test checks the bits). */
#define MGK_SCATTER_ROW_OK(N, term)                                                                \
    (((term) == MGK_T_MUL || (term) == MGK_T_ONE) && (N)->out.s[3] != 0 && !(N)->out.gather &&     \
     !(N)->x[0].gather && ((term) == MGK_T_ONE || !(N)->x[1].gather))
MGK_HOT void mgk_scatter_row(const mgk_nest *N, const mgk_run *R, const int term, const int small,
                             const mgk_i64 po, const mgk_i64 p0, const mgk_i64 p1) {
    MGK_SIZES(n, N->n, small);
    const mgk_ref *O = &N->out, *X = N->x;
    const mgk_i64 n3 = n[3], so = O->s[3], s0 = X[0].s[3];
    const mgk_i64 s1 = term == MGK_T_ONE ? 0 : X[1].s[3];
    mgk_real *const ob = R->a[O->arr] + po;
    const mgk_real *const ab = R->a[X[0].arr] + p0;
    const mgk_real *const bb = term == MGK_T_ONE ? ab : R->a[X[1].arr] + p1;
    mgk_i64 r4, r5, r6, r7, i3;
    for (r7 = 0; r7 < n[7]; r7++)
        for (r4 = 0; r4 < n[4]; r4++)
            for (r5 = 0; r5 < n[5]; r5++)
                for (r6 = 0; r6 < n[6]; r6++) {
                    mgk_real *const o = ob + MGK_RPOS(O, r4, r5, r6, r7);
                    const mgk_real *const a = ab + MGK_RPOS(&X[0], r4, r5, r6, r7);
                    const mgk_real *const b =
                        term == MGK_T_ONE ? a : bb + MGK_RPOS(&X[1], r4, r5, r6, r7);
                    i3 = 0;
#if MGK_VECTOR && !defined(MGK_NO_SCATTER_ROWS)
                    if ((so == 1 || (MGK_STRIDE2 && so == 2)) && (s0 == 0 || s0 == 1) &&
                        (s1 == 0 || s1 == 1)) {
                        /* whole blocks; stride 2: those with another point after them */
                        for (; i3 + MGK_LANES < n3 + (so == 1); i3 += MGK_LANES) {
                            int k;
                            MGK_UNROLL
                            for (k = 0; k < MGK_NV; k++) {
                                const mgk_i64 j = i3 + k * MGK_VW;
                                mgk_vec x, y, v;
                                if (s0) MGK_VLOAD(x, a + j);
                                else x = MGK_VSPLAT(a[0]);
                                if (term == MGK_T_MUL) {
                                    if (s1) MGK_VLOAD(y, b + j);
                                    else y = MGK_VSPLAT(b[0]);
                                    x = x * y;
                                }
                                if (so == 1) {
                                    MGK_VLOAD(v, o + j);
                                    MGK_VSTORE(o + j, v + x);
                                }
#if MGK_STRIDE2
                                else {
                                    mgk_vec lo, hi;
                                    MGK_VLOAD(lo, o + 2 * j);
                                    MGK_VLOAD(hi, o + 2 * j + MGK_VW);
                                    v = MGK_EVEN(lo, hi) + x;
                                    MGK_VSTORE(o + 2 * j, MGK_ZIP_LO(v, lo));
                                    MGK_VSTORE(o + 2 * j + MGK_VW, MGK_ZIP_HI(v, hi));
                                }
#endif
                            }
                        }
                    }
#endif
                    for (; i3 < n3; i3++)
                        o[i3 * so] += term == MGK_T_ONE ? a[i3 * s0] : a[i3 * s0] * b[i3 * s1];
                }
}

#if MGK_VECTOR
/* Whether mgk_block sums a term of kind `term` (one or mul) over whole vectors of lanes (its first
 * path; a step or a pre-step asks more); where it does not, it adds lane by lane with strides read
 * at run time, and a term with nothing to sum (one product per point, as in a gradient's outer
 * product with a strided operand) runs faster as an elementwise row: in the interpreter's
 * instances only (a GRU's nests past the emitter's budget: its fit 1.05x). Generated code knows
 * the strides, and the C compiler, which could not drop the row's code from such nests before
 * their descriptor's fields were folded, spent up to a quarter more time on a CNN's file. */
#define MGK_BLOCK_VECTORS(N, term) MGK_BLOCK_VECTORS_IF(N, term, MGK_LANES_01)
/* ... with the operands' lane strides that `ok` admits (mgk_block also admits 2 in a whole
 * block) */
#define MGK_BLOCK_VECTORS_IF(N, term, ok)                                                          \
    ((N)->out.s[3] == 1 && ok((N)->x[0].s[3]) && ((term) == MGK_T_ONE || ok((N)->x[1].s[3])) &&    \
     ((N)->mode != MGK_SUMI || (N)->init.s[3] <= 1) && (N)->mode != MGK_SET &&                     \
     (N)->init.s[3] >= 0)
#define MGK_LANES_01(s) ((s) == 0 || (s) == 1)
#endif

/* MGK_LANES consecutive points along the vector dim (no gather refs), `nl` of them valid: lane l
 * of operand j is at p_j + l * s_j. The lanes are what the C compiler vectorises; each lane's
 * terms are added in the order the scalar path adds them. */
MGK_HOT void mgk_block(const mgk_nest *N, const mgk_run *R, const int term, const int op,
                       const int step, const int pre, const int small, const mgk_i64 nbr,
                       const int nl, mgk_i64 po, mgk_i64 pi, mgk_i64 p0, mgk_i64 p1, mgk_i64 p2,
                       mgk_i64 p3) {
    MGK_SIZES(n, N->n, small);
    const mgk_ref *X = N->x;
    mgk_real *o = R->a[N->out.arr] + po;
    const mgk_i64 so = N->out.s[3];
    const mgk_real *x0 = R->a[X[0].arr] + p0, *x1 = R->a[X[1].arr] + p1;
    const mgk_real *x2 = R->a[X[2].arr] + p2, *x3 = R->a[X[3].arr] + p3;
    const mgk_i64 s0 = X[0].s[3], s1 = X[1].s[3], s2 = X[2].s[3], s3 = X[3].s[3];
    const mgk_i64 ps0 = MGK_PS(&X[0]) ? R->ss : 0, ps1 = MGK_PS(&X[1]) ? R->ss : 0;
    const mgk_i64 ps2 = MGK_PS(&X[2]) ? R->ss : 0, ps3 = MGK_PS(&X[3]) ? R->ss : 0;
    mgk_real acc[MGK_LANES];
    mgk_i64 r4, r5, r6, r7, sm;
    int l;
#if MGK_VECTOR
    /* sums of products (or of values) over unit-stride or broadcast lanes, as vectors; in a whole
     * block, also over stride-2 lanes (a stride-2 convolution's input along its output columns),
     * each vector the even lanes of two (MGK_EVEN2: one element past the block's last lane is
     * read, inside the same array and sample at worst in its padding, MGK_PAD, and unused) */
#define MGK_LANES_S(s) (MGK_LANES_01(s) || (MGK_STRIDE2 && (s) == 2 && nl == MGK_LANES))
    if ((term == MGK_T_MUL || term == MGK_T_ONE) && MGK_BLOCK_VECTORS_IF(N, term, MGK_LANES_S) &&
        (!step || N->init.s[3] == 1) && (!pre || (nl == MGK_LANES && s0 == 1 && s1 == 0))) {
        mgk_vec v[MGK_NV], a = MGK_VSPLAT((mgk_real)0), b = a;
        const mgk_vec lr = MGK_VSPLAT((mgk_real)R->lr);
        int k;
        MGK_UNROLL
        for (k = 0; k < MGK_NV; k++) {
            if (MGK_ZS(N, R)) v[k] = MGK_VSPLAT((mgk_real)0);
            else if (N->mode == MGK_SUMI && N->init.s[3] == 0)
                v[k] = MGK_VSPLAT(R->a[N->init.arr][pi]);
            else if (N->mode == MGK_SUMI) MGK_VLOAD(v[k], R->a[N->init.arr] + pi + k * MGK_VW);
            else MGK_VLOAD(v[k], o + k * MGK_VW);
        }
        MGK_EACH_TERM(nbr, n) {
            const mgk_real *y0 = x0 + sm * ps0 + MGK_RPOS(&X[0], r4, r5, r6, r7);
            const mgk_real *y1 = x1 + sm * ps1 + MGK_RPOS(&X[1], r4, r5, r6, r7);
            if (!s0) a = MGK_VSPLAT(*y0);
            if (term == MGK_T_MUL && !s1) b = MGK_VSPLAT(*y1);
            if (pre) { /* the weights stepped before they are read */
                const mgk_vec xq = MGK_VSPLAT(R->a[MGK_QD][p1 + MGK_RPOS(&X[1], r4, r5, r6, r7)]);
                MGK_UNROLL
                for (k = 0; k < MGK_NV; k++) {
                    mgk_vec g;
                    MGK_VLOAD(g, R->a[MGK_QG] + po + k * MGK_VW);
                    MGK_VLOAD(a, y0 + k * MGK_VW);
                    a = MGK_PRESTEPPED(a, lr, MGK_VSPLAT((mgk_real)0), g, xq);
                    MGK_VSTORE((mgk_real *)y0 + k * MGK_VW, a);
                }
            }
            MGK_UNROLL
            for (k = 0; k < MGK_NV; k++) {
                if (s0 == 1) MGK_VLOAD(a, y0 + k * MGK_VW);
#if MGK_STRIDE2
                else if (s0 == 2) a = MGK_EVEN2(y0 + 2 * k * MGK_VW);
#endif
                if (term == MGK_T_ONE) {
                    v[k] += a;
                } else {
                    if (s1 == 1) MGK_VLOAD(b, y1 + k * MGK_VW);
#if MGK_STRIDE2
                    else if (s1 == 2) b = MGK_EVEN2(y1 + 2 * k * MGK_VW);
#endif
                    v[k] += a * b;
                }
            }
        }
        if (step) {
            mgk_real *w = R->a[N->init.arr] + pi;
            const mgk_real *og = MGK_OG(N, R, po);
            MGK_UNROLL
            for (k = 0; k < MGK_NV; k++) {
                if (og) {
                    MGK_STEP_LANES(b, og + k * MGK_VW, nl - k * MGK_VW);
                    v[k] = b + v[k];
                }
                MGK_STEP_LANES(a, w + k * MGK_VW, nl - k * MGK_VW);
                v[k] = a - lr * v[k];
            }
            o = w;
        }
        if (nl == MGK_LANES) {
            MGK_UNROLL
            for (k = 0; k < MGK_NV; k++) MGK_VSTORE(o + k * MGK_VW, v[k]);
        } else {
            MGK_UNROLL
            for (k = 0; k < MGK_NV; k++) MGK_VSTORE(acc + k * MGK_VW, v[k]);
            for (l = 0; l < nl; l++) o[l] = acc[l];
        }
        return;
    }
#undef MGK_LANES_S
    /* the pre-stepped last block of a row when exactly MGK_QL lanes are valid (an MLP layer's 50
     * outputs: six blocks, then 2), as one quarter vector: the lane loops below, the same
     * operations in the same order, with nothing touched past the row (at batch 1 the MLP's
     * tape ran 1.12x faster, its generated code 1.01-1.02x: gcc had made two scalar chains of
     * the lane loops) */
    if (pre && nl == MGK_QL && term == MGK_T_MUL && s0 == 1 && s1 == 0 && so == 1 &&
        N->mode != MGK_SET && !step && N->init.s[3] >= 0 && N->init.s[3] <= 1) {
        const mgk_vq lr = MGK_QSPLAT((mgk_real)R->lr);
        const mgk_vq g = *(const mgk_vq_u *)(const void *)(R->a[MGK_QG] + po);
        const mgk_real *in = R->a[N->init.arr] + pi;
        mgk_vq v;
        if (MGK_ZS(N, R)) v = MGK_QSPLAT((mgk_real)0);
        else if (N->mode == MGK_SUMI && N->init.s[3] == 0) v = MGK_QSPLAT(in[0]);
        else if (N->mode == MGK_SUMI) v = *(const mgk_vq_u *)(const void *)in;
        else v = *(const mgk_vq_u *)(const void *)o;
        MGK_EACH_TERM(nbr, n) {
            mgk_real *y0 = (mgk_real *)x0 + sm * ps0 + MGK_RPOS(&X[0], r4, r5, r6, r7);
            const mgk_real *y1 = x1 + sm * ps1 + MGK_RPOS(&X[1], r4, r5, r6, r7);
            const mgk_vq xq = MGK_QSPLAT(R->a[MGK_QD][p1 + MGK_RPOS(&X[1], r4, r5, r6, r7)]);
            mgk_vq a = *(const mgk_vq_u *)(const void *)y0;
            a = MGK_PRESTEPPED(a, lr, MGK_QSPLAT((mgk_real)0), g, xq);
            *(mgk_vq_u *)(void *)y0 = a;
            v += a * MGK_QSPLAT(*y1);
        }
        *(mgk_vq_u *)(void *)o = v;
        return;
    }
#endif
    if (N->mode == MGK_SET) {
        for (l = 0; l < nl; l++)
            acc[l] = mgk_term(term, op, N->k, x0 + l * s0, x1 + l * s1, x2 + l * s2, x3 + l * s3);
        for (l = 0; l < nl; l++) o[l * so] = acc[l];
        return;
    }
    if (MGK_ZS(N, R)) {
        for (l = 0; l < nl; l++) acc[l] = (mgk_real)0;
    } else if (N->mode == MGK_SUMI) {
        const mgk_real *in = R->a[N->init.arr] + pi;
        const mgk_i64 si = N->init.s[3];
        for (l = 0; l < nl; l++) acc[l] = in[l * si];
    } else {
        for (l = 0; l < nl; l++) acc[l] = o[l * so];
    }
    MGK_EACH_TERM(nbr, n) {
        const mgk_real *y0 = x0 + sm * ps0 + MGK_RPOS(&X[0], r4, r5, r6, r7);
        const mgk_real *y1 = x1 + sm * ps1 + MGK_RPOS(&X[1], r4, r5, r6, r7);
        const mgk_real *y2 = x2 + sm * ps2 + MGK_RPOS(&X[2], r4, r5, r6, r7);
        const mgk_real *y3 = x3 + sm * ps3 + MGK_RPOS(&X[3], r4, r5, r6, r7);
        if (pre) { /* the weights stepped before they are read */
            const mgk_real *gq = R->a[MGK_QG] + po;
            const mgk_real *xq = R->a[MGK_QD] + p1 + MGK_RPOS(&X[1], r4, r5, r6, r7);
            const mgk_real lr = (mgk_real)R->lr;
            for (l = 0; l < nl; l++) {
                mgk_real *w = (mgk_real *)y0 + l * s0;
                *w = MGK_PRESTEPPED(*w, lr, (mgk_real)0, gq[l * so], xq[l * s1]);
            }
        }
        for (l = 0; l < nl; l++)
            acc[l] += mgk_term(term, op, N->k, y0 + l * s0, y1 + l * s1, y2 + l * s2, y3 + l * s3);
    }
    if (step) {
        mgk_real *w = R->a[N->init.arr] + pi;
        const mgk_real *og = MGK_OG(N, R, po);
        const mgk_i64 sw = N->init.s[3];
        const mgk_real lr = (mgk_real)R->lr;
        /* the test outside the loop: inside, gcc reads og through a masked load even when it is
         * NULL, whose fault suppression costs a microcode assist per vector (maxout's weight
         * gradient, compiled, ran 8x slower than its tape) */
        if (og)
            for (l = 0; l < nl; l++) w[l * sw] -= lr * (og[l * so] + acc[l]);
        else
            for (l = 0; l < nl; l++) w[l * sw] -= lr * acc[l];
    } else {
        for (l = 0; l < nl; l++) o[l * so] = acc[l];
    }
}

#if MGK_VECTOR && defined(MGK_ELEM_ROWS)
/* A row of `len` points of an elementwise term (an op, dA or dB; in the interpreter also one
 * product or value per point where mgk_block would add it lane by lane, MGK_BLOCK_VECTORS) along
 * the vector dim of a nest with no reduction: what mgk_block computes for each block, lane by lane
 * the same terms, without its per-block set-up. Each operand's lanes are read from consecutive
 * elements (in place where its stride is 1, else copied into a block first: a broadcast repeated, a
 * strided operand gathered), so that the C compiler vectorises the op's formula over the block with
 * plain vector loads. The last block computes every lane and stores its valid ones: an operand read
 * in place reads at most MGK_LANES - 1 elements past the row, which the padding allows; a copied
 * one copies only the valid lanes (the others are zeros). The interpreter's instances define
 * MGK_ELEM_ROWS 1, every such row: with strides known only at run time, mgk_block built every
 * lane of every operand on its own. Generated code, whose strides and sizes are constants,
 * defines it 2: only rows of more than one block that end in a partial one, which mgk_block
 * computes lane by lane (a 2x2 max-pool's rows of 14: cnn48 1.2x faster); its full blocks are as
 * fast as these (rows of 16, as in an RNN cell: slower here), and a row shorter than a block
 * would compute every lane of an op that may be costly (a softmax's exp over 7 tokens). */
MGK_HOT void mgk_elem_rows_in(const mgk_nest *N, const mgk_run *R, const int term, const int op,
                              const mgk_i64 len, mgk_i64 po, mgk_i64 pi, mgk_i64 p0, mgk_i64 p1,
                              mgk_i64 p2, mgk_i64 p3, const int el) {
    const mgk_ref *X = N->x;
    mgk_real *o = R->a[N->out.arr] + po;
    const mgk_real *in = R->a[N->init.arr] + pi;
    const mgk_real *x0 = R->a[X[0].arr] + p0, *x1 = R->a[X[1].arr] + p1;
    const mgk_real *x2 = R->a[X[2].arr] + p2, *x3 = R->a[X[3].arr] + p3;
    const mgk_i64 so = N->out.s[3], si = N->init.s[3];
    const mgk_i64 s0 = X[0].s[3], s1 = X[1].s[3], s2 = X[2].s[3], s3 = X[3].s[3];
    const int four = term >= MGK_T_DA; /* dA and dB read x2 and x3 */
/* an operand's lanes into block B: a broadcast in every lane, else the valid lanes, zeros after.
 * Built in vector registers and stored a native vector at a time: lanes stored one by one and
 * then loaded as one vector cannot be forwarded from the store buffer, and that stall (one per
 * operand and block) was most of the time of a strided row (a 2x2 max-pool's, 13 wide). */
#define MGK_COPY_LANES(B, x, st)                                                                   \
    do {                                                                                           \
        MGK_UNROLL                                                                                 \
        for (int k_ = 0; k_ < (el / MGK_VW); k_++)                                                 \
            MGK_VSTORE(B + k_ * MGK_VW,                                                            \
                       (st) == 0 ? MGK_VSPLAT(*(x))                                                \
                       : (st) == 2 && inner                                                        \
                           ? MGK_EVEN2((x) + k_ * MGK_VW * 2)                                      \
                           : MGK_VGATHER((x) + k_ * MGK_VW * (st), (st), nv - k_ * MGK_VW));       \
    } while (0)
    for (mgk_i64 i = 0; i < len; i += el) {
        const int nv = len - i < el ? (int)(len - i) : el;
        /* a block with another after it in the row: its stride-2 operands' and output's lanes
         * run in whole vectors, which reach one element past its last lane, still inside the
         * row's span (the same sample's elements, no other thread's), so touched safely */
        const int inner = MGK_STRIDE2 && i + el < len;
        mgk_real f[MGK_LANES], b0[MGK_LANES], b1[MGK_LANES], b2[MGK_LANES], b3[MGK_LANES];
        const mgk_real *z0 = x0, *z1 = x1, *z2 = x2, *z3 = x3;
        int l;
        if (s0 != 1) {
            MGK_COPY_LANES(b0, x0, s0);
            z0 = b0;
        }
        if (term != MGK_T_ONE && s1 != 1) {
            MGK_COPY_LANES(b1, x1, s1);
            z1 = b1;
        }
        if (four && s2 != 1) {
            MGK_COPY_LANES(b2, x2, s2);
            z2 = b2;
        }
        if (four && s3 != 1) {
            MGK_COPY_LANES(b3, x3, s3);
            z3 = b3;
        }
        for (l = 0; l < el; l++) f[l] = mgk_term(term, op, N->k, z0 + l, z1 + l, z2 + l, z3 + l);
        /* the start of each sum as mgk_block takes it, then the one term added; a full block
         * of a unit-stride output is stored as vectors, which the next nest's vector loads of
         * it can be forwarded from */
#if MGK_STRIDE2
        if (so == 2 && inner && MGK_PS(&N->out) && (N->mode == MGK_SET || MGK_ZS(N, R))) {
            /* a per-sample output's even lanes into whole vectors of its row, the odd ones
             * written back as they were (no nest runs on a sample's elements meanwhile) */
            MGK_UNROLL
            for (int k = 0; k < (el / MGK_VW); k++) {
                mgk_vec v, a, b;
                MGK_VLOAD(v, f + k * MGK_VW);
                if (N->mode != MGK_SET) v = MGK_VSPLAT((mgk_real)0) + v;
                MGK_VLOAD(a, o + 2 * k * MGK_VW);
                MGK_VLOAD(b, o + 2 * k * MGK_VW + MGK_VW);
                MGK_VSTORE(o + 2 * k * MGK_VW, MGK_ZIP_LO(v, a));
                MGK_VSTORE(o + 2 * k * MGK_VW + MGK_VW, MGK_ZIP_HI(v, b));
            }
        } else
#endif
            if (so == 1 && nv == el && N->mode == MGK_SET)
            for (l = 0; l < el; l++) o[l] = f[l];
        else if (so == 1 && nv == el && MGK_ZS(N, R))
            for (l = 0; l < el; l++) o[l] = (mgk_real)0 + f[l];
        else if (so == 1 && nv == el && N->mode == MGK_SUMI && si == 1)
            for (l = 0; l < el; l++) o[l] = in[l] + f[l];
        else if (so == 1 && nv == el && N->mode != MGK_SUMI)
            for (l = 0; l < el; l++) o[l] = o[l] + f[l];
        else if (N->mode == MGK_SET)
            for (l = 0; l < nv; l++) o[l * so] = f[l];
        else if (MGK_ZS(N, R))
            for (l = 0; l < nv; l++) o[l * so] = (mgk_real)0 + f[l];
        else if (N->mode == MGK_SUMI)
            for (l = 0; l < nv; l++) o[l * so] = in[l * si] + f[l];
        else
            for (l = 0; l < nv; l++) o[l * so] = o[l * so] + f[l];
        o += el * so;
        in += el * si;
        x0 += el * s0;
        x1 += el * s1;
        x2 += el * s2;
        x3 += el * s3;
    }
#undef MGK_COPY_LANES
}
/* Blocks of one native vector where the row ends in a partial block (a 2x2 max-pool's rows of
 * 14 doubles with AVX2: 3 vectors and 2 lanes, not 1 block of 8 and 6 lanes one by one; cnn48
 * compiled 1.08x at batch 1 and 32, tape 1.17x; cnn's rows of 13, tape 1.2-1.3x), else of
 * MGK_LANES (rows of 16 in blocks of 4 ran the GRU's tape 0.97x). Each lane computes the same
 * operations whatever the blocks. */
MGK_HOT void mgk_elem_rows(const mgk_nest *N, const mgk_run *R, const int term, const int op,
                           const mgk_i64 len, mgk_i64 po, mgk_i64 pi, mgk_i64 p0, mgk_i64 p1,
                           mgk_i64 p2, mgk_i64 p3) {
    if (len % MGK_LANES) mgk_elem_rows_in(N, R, term, op, len, po, pi, p0, p1, p2, p3, MGK_VW);
    else mgk_elem_rows_in(N, R, term, op, len, po, pi, p0, p1, p2, p3, MGK_LANES);
}
#endif

#if MGK_VECTOR
/* Samples per tile of a batch (MGK_TSS): 8 with AVX-512 or AVX2 (whose weight vectors then serve
 * eight samples per load; tiles of 4 ran the MLP and a CNN at batch 32 0.95-0.97x), 4 with SSE2.
 * Rows per tile along an outer dim (MGK_TS: rows of a matrix-vector product, a convolution's
 * positions): in generated code (MGK_CONST_SHAPES, whose tile counts are constants), 8 with one
 * native vector per block (AVX-512), else 4, so eight vector accumulators with AVX2 as with
 * AVX-512: tiles of 8 x 2 vectors need more registers than AVX2 has (16 accumulators, the
 * operands' vectors and a broadcast); the MLP's batch-1 forward ran 1.11x faster in tiles of 4,
 * and their unrolled code was up to a tenth of gcc's time on generated code. The interpreter's
 * instances, whose tile counts are read at run time, keep MGK_TSS rows (with tiles of 4 in arrays
 * for 8, attention's tape ran 0.85x). */
#define MGK_TSS (16 / MGK_NV > 8 ? 8 : 16 / MGK_NV)
#ifdef MGK_CONST_SHAPES
#define MGK_TS (MGK_NV == 1 ? 8 : 4)
#else
#define MGK_TS MGK_TSS
#endif
/* A register tile: `nt` rows (at most MGK_TSS) of MGK_LANES outputs, the rows `ro` (out), `ri`
 * (init) and `rb` (operand b) elements apart, for sums of products x0 * x1 where x0 is the same
 * for every row and unit-stride along the lanes, and x1 is one value per row (broadcast along the
 * lanes): each x0 vector is loaded once for the tile (the micro-kernel of a matrix product). Rows
 * are samples of a batch, or outer points. `nbr` samples are summed over, outermost, as ever.
 * `nl` lanes are valid: the last block of a row computes every lane (reading at most
 * MGK_LANES - 1 elements past the row, which the padding allows) and stores the valid ones.
 * With `ra` nonzero, x0 moves by `ra` elements from row to row and x1 by `rb` (0: the same
 * value for every row): the rows are then consecutive blocks along the vector dim, so that a
 * matrix-vector product (batch size 1) keeps several independent sums in flight instead of one
 * chain of dependent additions per block. */
MGK_HOT void mgk_tile(const mgk_nest *N, const mgk_run *R, const int small, const mgk_i64 nbr,
                      const int nt, const int nl, mgk_real *o, const mgk_real *in,
                      const mgk_real *a0, const mgk_real *b0, const mgk_i64 ro, const mgk_i64 ri,
                      const mgk_i64 ra, const mgk_i64 rb, const int pre, const int step) {
    MGK_SIZES(n, N->n, small);
    const mgk_ref *X = N->x;
    const mgk_i64 psa = MGK_PS(&X[0]) ? R->ss : 0, psb = MGK_PS(&X[1]) ? R->ss : 0;
    const mgk_i64 so = N->out.s[3]; /* 1, or a strided output (a convolution along channels) */
    mgk_vec v[MGK_TSS][MGK_NV] = {{MGK_VSPLAT((mgk_real)0)}}, a[MGK_NV], b;
    mgk_i64 r4, r5, r6, r7, sm;
    int k, q;
    /* MGK_F_PRESTEP (rows that read distinct weights, ra nonzero): the previous sample's output
     * gradient at this tile's outputs and its x1 at x1's position, and the learning rate */
    const mgk_real *const qg = pre ? R->a[MGK_QG] + (o - R->a[N->out.arr]) : o;
    const mgk_real *const qx = pre ? R->a[MGK_QD] + (b0 - R->a[X[1].arr]) : b0;
    const mgk_vec lr = MGK_VSPLAT((mgk_real)R->lr);
    /* ... that gradient is the same at every reduction point: held in registers */
    mgk_vec gv[MGK_TSS][MGK_NV] = {{MGK_VSPLAT((mgk_real)0)}};
    if (pre) {
        MGK_UNROLL
        for (q = 0; q < nt; q++) {
            MGK_UNROLL
            for (k = 0; k < MGK_NV; k++) MGK_VLOAD(gv[q][k], qg + q * ro + k * MGK_VW);
        }
    }
    MGK_UNROLL
    for (q = 0; q < nt; q++) {
        MGK_UNROLL
        for (k = 0; k < MGK_NV; k++) {
            if (MGK_ZS(N, R)) v[q][k] = MGK_VSPLAT((mgk_real)0);
            else if (N->mode == MGK_SUMI && N->init.s[3] == 0) v[q][k] = MGK_VSPLAT(in[q * ri]);
            else if (N->mode == MGK_SUMI) MGK_VLOAD(v[q][k], in + q * ri + k * MGK_VW);
            else if (so == 1) MGK_VLOAD(v[q][k], o + q * ro + k * MGK_VW);
            else v[q][k] = MGK_VGATHER(o + q * ro + k * MGK_VW * so, so, nl - k * MGK_VW);
        }
    }
    MGK_EACH_TERM(nbr, n) {
        const mgk_real *y0 = a0 + sm * psa + MGK_RPOS(&X[0], r4, r5, r6, r7);
        const mgk_real *y1 = b0 + sm * psb + MGK_RPOS(&X[1], r4, r5, r6, r7);
        if (pre) { /* each row's weights stepped, then read */
            const mgk_real *const xr = qx + MGK_RPOS(&X[1], r4, r5, r6, r7);
            const mgk_vec b1 = MGK_VSPLAT(y1[0]), x1 = MGK_VSPLAT(xr[0]);
            MGK_UNROLL
            for (q = 0; q < nt; q++) {
                const mgk_vec xq = rb ? MGK_VSPLAT(xr[q * rb]) : x1;
                b = rb ? MGK_VSPLAT(y1[q * rb]) : b1;
                MGK_UNROLL
                for (k = 0; k < MGK_NV; k++) {
                    mgk_real *const w = (mgk_real *)y0 + q * ra + k * MGK_VW;
                    MGK_VLOAD(a[k], w);
                    a[k] = MGK_PRESTEPPED(a[k], lr, MGK_VSPLAT((mgk_real)0), gv[q][k], xq);
                    MGK_VSTORE(w, a[k]);
                    v[q][k] += a[k] * b;
                }
            }
            continue;
        }
        MGK_UNROLL
        for (k = 0; k < MGK_NV; k++) MGK_VLOAD(a[k], y0 + k * MGK_VW);
        MGK_UNROLL
        for (q = 0; q < nt; q++) {
            b = MGK_VSPLAT(y1[q * rb]);
            MGK_UNROLL
            for (k = 0; k < MGK_NV; k++) {
                if (ra) MGK_VLOAD(a[k], y0 + q * ra + k * MGK_VW);
                v[q][k] += a[k] * b;
            }
        }
    }
    if (step) { /* MGK_F_STEP (unit-stride output): the parameter stepped instead */
        const mgk_real *const og = MGK_OG(N, R, o - R->a[N->out.arr]);
        MGK_UNROLL
        for (q = 0; q < nt; q++) {
            MGK_UNROLL
            for (k = 0; k < MGK_NV; k++) {
                if (og) {
                    MGK_STEP_LANES(b, og + q * ro + k * MGK_VW, nl - k * MGK_VW);
                    v[q][k] = b + v[q][k];
                }
                MGK_STEP_LANES(a[k], in + q * ri + k * MGK_VW, nl - k * MGK_VW);
                v[q][k] = a[k] - lr * v[q][k];
            }
        }
    }
    mgk_real *const dst = step ? (mgk_real *)in : o; /* where the tile goes, rows rd apart */
    const mgk_i64 rd = step ? ri : ro;
    if (nl == MGK_LANES && so == 1) {
        MGK_UNROLL
        for (q = 0; q < nt; q++) {
            MGK_UNROLL
            for (k = 0; k < MGK_NV; k++) MGK_VSTORE(dst + q * rd + k * MGK_VW, v[q][k]);
        }
    } else { /* a strided output, or the last block of a row (every lane computed, the valid
              * ones stored): lane by lane, at constant lane indices (storing the vectors into an
              * array first would make gcc keep every accumulator of the tile in memory) */
        MGK_UNROLL
        for (q = 0; q < nt; q++) {
            mgk_real *const p = dst + q * rd;
#define MGK_LANE_OUT(l)                                                                            \
    if ((l) < nl) p[(l) * so] = v[q][(l) / MGK_VW][(l) % MGK_VW]
            MGK_LANE_OUT(0);
            MGK_LANE_OUT(1);
            MGK_LANE_OUT(2);
            MGK_LANE_OUT(3);
            MGK_LANE_OUT(4);
            MGK_LANE_OUT(5);
            MGK_LANE_OUT(6);
            MGK_LANE_OUT(7);
#if MGK_LANES == 16
            MGK_LANE_OUT(8);
            MGK_LANE_OUT(9);
            MGK_LANE_OUT(10);
            MGK_LANE_OUT(11);
            MGK_LANE_OUT(12);
            MGK_LANE_OUT(13);
            MGK_LANE_OUT(14);
            MGK_LANE_OUT(15);
#endif
#undef MGK_LANE_OUT
        }
    }
}
#endif

#if MGK_VECTOR
/* mgk_tile for the last block of a row when at most MGK_QL lanes are valid (`nl`), in quarter
 * blocks: a row of 50 outputs is six blocks of 8 doubles and 2 outputs, whose block would cost as
 * much as a full one (two operations per AVX-512 instruction on CPUs that split them). The rows
 * of samples or along dim 2 only (mgk_tile without `ra` and `pre`); each lane computes what
 * mgk_tile's lane does, in the same order: the same bits. */
MGK_HOT void mgk_tile_q(const mgk_nest *N, const mgk_run *R, const int small, const mgk_i64 nbr,
                        const int nt, const int nl, mgk_real *o, const mgk_real *in,
                        const mgk_real *a0, const mgk_real *b0, const mgk_i64 ro, const mgk_i64 ri,
                        const mgk_i64 rb, const int step) {
    MGK_SIZES(n, N->n, small);
    const mgk_ref *X = N->x;
    const mgk_i64 psa = MGK_PS(&X[0]) ? R->ss : 0, psb = MGK_PS(&X[1]) ? R->ss : 0;
    const mgk_i64 so = N->out.s[3];
    mgk_vq v[MGK_TSS] = {MGK_QSPLAT((mgk_real)0)}, a;
    mgk_i64 r4, r5, r6, r7, sm;
    int q;
    MGK_UNROLL
    for (q = 0; q < nt; q++) {
        if (MGK_ZS(N, R)) v[q] = MGK_QSPLAT((mgk_real)0);
        else if (N->mode == MGK_SUMI && N->init.s[3] == 0) v[q] = MGK_QSPLAT(in[q * ri]);
        else if (N->mode == MGK_SUMI) v[q] = *(const mgk_vq_u *)(const void *)(in + q * ri);
        else if (so == 1) v[q] = *(const mgk_vq_u *)(const void *)(o + q * ro);
        else v[q] = MGK_QGATHER(o + q * ro, so, nl);
    }
    MGK_EACH_TERM(nbr, n) {
        const mgk_real *y0 = a0 + sm * psa + MGK_RPOS(&X[0], r4, r5, r6, r7);
        const mgk_real *y1 = b0 + sm * psb + MGK_RPOS(&X[1], r4, r5, r6, r7);
        a = *(const mgk_vq_u *)(const void *)y0;
        MGK_UNROLL
        for (q = 0; q < nt; q++) v[q] += a * MGK_QSPLAT(y1[q * rb]);
    }
    if (step) { /* as in mgk_tile */
        const mgk_real *const og = MGK_OG(N, R, o - R->a[N->out.arr]);
        const mgk_vq lr = MGK_QSPLAT((mgk_real)R->lr);
        MGK_UNROLL
        for (q = 0; q < nt; q++) { /* the valid lanes alone (MGK_STEP_LANES) */
            if (og) v[q] = MGK_QGATHER(og + q * ro, 1, nl) + v[q];
            v[q] = MGK_QGATHER(in + q * ri, 1, nl) - lr * v[q];
        }
    }
    mgk_real *const dst = step ? (mgk_real *)in : o;
    const mgk_i64 rd = step ? ri : ro;
    MGK_UNROLL
    for (q = 0; q < nt; q++) {
        mgk_real *const p = dst + q * rd;
        p[0] = v[q][0];
        if (nl > 1) p[so] = v[q][1];
#if MGK_QL == 4
        if (nl > 2) p[2 * so] = v[q][2];
        if (nl > 3) p[3 * so] = v[q][3];
#endif
    }
}
#endif

/* Whether a nest with `n3` points along its vector dim ends its rows in a quarter block: at most
 * MGK_QL lanes of the last one valid (mgk_tile_q). Generated code passes n3 as a literal, so
 * this is a constant before gcc inlines anything, and the nests that never run a quarter block
 * do not carry one. It only decides which code is present: the quarter tile runs where a
 * block's valid lanes (nl) are at most MGK_QL, whatever n3 says. */
#define MGK_QTAIL(n3) (MGK_VECTOR && (n3) % MGK_LANES != 0 && (n3) % MGK_LANES <= MGK_QL)

/* The position of ref X at outer point (i0, i1, i2, i3) of sequential iteration t. */
#define MGK_OPOS(X, t, i0, i1, i2, i3)                                                             \
    ((X)->base + (t) * (X)->ts + (i0) * (X)->s[0] + (i1) * (X)->s[1] + (i2) * (X)->s[2] +          \
     (i3) * (X)->s[3])

/* Sample lanes: a per-sample output that sums a short row of per-sample x0 times a shared x1
 * whose elements along the output dim are not adjacent (x1 = W[i][r], a transposed weight: an
 * MLP's or a CNN's input gradient through its dense layer, an RNN's through its recurrence) has no
 * vector along i3 and at most a partial one along r7 (float32's 16 lanes over 10 classes: scalar).
 * With a batch in flight, MGK_VW samples run in the lanes of one vector instead: x0's row of each
 * is loaded once per row of outputs, and each x1 element once for all of them. Every lane adds its
 * sample's terms in mgk_point1's order (in order, or a split sum's lanes then MGK_TREE), so the
 * same bits as one sample at a time (MLP batch 32: 1.02x, float32 1.04x). Rows up to MGK_SL_MAX
 * terms, one reduction dim. Defining MGK_NO_LANES leaves it out (to compare: a test checks the
 * bits). */
#define MGK_SL_MAX 32
#define MGK_LANES_OK(N)                                                                            \
    ((N)->mode == MGK_SUM0 && (N)->term == MGK_T_MUL &&                                            \
     !((N)->flags & (MGK_F_STEP | MGK_F_SCATTER | MGK_F_PRESTEP)) && MGK_PS(&(N)->out) &&          \
     MGK_PS(&(N)->x[0]) && !MGK_PS(&(N)->x[1]) && !(N)->out.gather && !(N)->x[0].gather &&         \
     !(N)->x[1].gather && (N)->x[0].s[3] == 0 && (N)->n[4] == 1 && (N)->n[5] == 1 &&               \
     (N)->n[6] == 1 && (N)->n[7] >= 1 && (N)->n[7] <= MGK_SL_MAX)
#if MGK_VECTOR && !defined(MGK_NO_LANES)
/* The outputs of samples sm .. sm + MGK_VW - 1 of a nest where MGK_LANES_OK. */
MGK_HOT void mgk_lanes(const mgk_nest *N, const mgk_run *R, const int small, const mgk_i64 sm) {
    const mgk_i64 *n = N->n, t = R->t, ss = R->ss, n7 = n[7];
    const mgk_ref *O = &N->out, *X = N->x;
    const int split = (N->flags & MGK_F_SPLIT) && n7 >= MGK_LANES;
    mgk_vec T[MGK_SL_MAX];
    mgk_i64 i0, i1, i2, i3, r7;
    int l;
    for (i0 = 0; i0 < (small ? 1 : n[0]); i0++)
        for (i1 = 0; i1 < n[1]; i1++)
            for (i2 = 0; i2 < n[2]; i2++) {
                const mgk_real *x0 = R->a[X[0].arr] + MGK_OPOS(&X[0], t, i0, i1, i2, 0) + sm * ss;
                const mgk_real *w = R->a[X[1].arr] + MGK_OPOS(&X[1], t, i0, i1, i2, 0);
                mgk_real *o = R->a[O->arr] + MGK_OPOS(O, t, i0, i1, i2, 0) + sm * ss;
                for (r7 = 0; r7 < n7; r7++) T[r7] = MGK_VGATHER(x0 + r7 * X[0].s[7], ss, MGK_VW);
                for (i3 = 0; i3 < n[3]; i3++, w += X[1].s[3], o += O->s[3]) {
                    mgk_vec acc = MGK_VSPLAT((mgk_real)0);
                    if (split) {
                        mgk_vec P[MGK_LANES];
                        MGK_UNROLL
                        for (l = 0; l < MGK_LANES; l++) P[l] = MGK_VSPLAT((mgk_real)0);
                        for (r7 = 0; r7 < n7; r7++)
                            P[r7 % MGK_LANES] += T[r7] * MGK_VSPLAT(w[r7 * X[1].s[7]]);
#define MGK_PV(l) P[l]
                        acc += MGK_TREE(MGK_PV);
#undef MGK_PV
                    } else {
                        for (r7 = 0; r7 < n7; r7++) acc += T[r7] * MGK_VSPLAT(w[r7 * X[1].s[7]]);
                    }
                    MGK_UNROLL
                    for (l = 0; l < MGK_VW; l++) o[l * ss] = acc[l];
                }
            }
}
/* Whole vectors of a batch's samples through mgk_lanes; the rest one at a time below. */
#define MGK_NP_SAMPLE_LANES                                                                        \
    if (ps && tile == 0 && !block && term == MGK_T_MUL && nb >= MGK_VW && MGK_LANES_OK(N)) {       \
        const mgk_i64 lanes = nb - nb % MGK_VW;                                                    \
        for (sm = 0; sm < lanes; sm += MGK_VW) mgk_lanes(N, R, small, sm);                         \
        sm0 = lanes;                                                                               \
    }
#else
#define MGK_NP_SAMPLE_LANES
#endif

/* Lane trees of MGK_VW points at once (split points, split rows): `tr` gets, in lane j, the sum of
 * the lanes of point j's vectors v[j][0..MGK_NV), added as MGK_TREE adds them. Each level adds the
 * adjacent lanes of two vectors (the even lanes of both plus the odd ones, MGK_TREE's additions and
 * operand order), halving the lanes a point holds and doubling the points a vector holds; then the
 * native vectors' trees are added as MGK_TREE adds them: 14 shuffles and 7 additions for 8 points,
 * where one point at a time its lanes were 8 extractions and 7 scalar additions. */
#if MGK_VECTOR && MGK_STRIDE2
#define MGK_VTREE_OK 1
#if MGK_NV == 1
#define MGK_VTREE_NV(lv) (lv)[0]
#elif MGK_NV == 2
#define MGK_VTREE_NV(lv) ((lv)[0] + (lv)[1])
#else
#define MGK_VTREE_NV(lv) (((lv)[0] + (lv)[1]) + ((lv)[2] + (lv)[3]))
#endif
#define MGK_VTREE(v, tr)                                                                           \
    do {                                                                                           \
        mgk_vec lv_[MGK_NV];                                                                       \
        int k_, j_, lev_;                                                                          \
        MGK_UNROLL                                                                                 \
        for (k_ = 0; k_ < MGK_NV; k_++) {                                                          \
            mgk_vec w_[MGK_VW];                                                                    \
            MGK_UNROLL                                                                             \
            for (j_ = 0; j_ < MGK_VW; j_++) w_[j_] = (v)[j_][k_];                                  \
            /* levels counted by one: gcc unrolled no loop of h /= 2 */                            \
            MGK_UNROLL                                                                             \
            for (lev_ = 1; lev_ <= MGK_VW_LOG2; lev_++) {                                          \
                MGK_UNROLL                                                                         \
                for (j_ = 0; j_ < MGK_VW / 2; j_++) /* (a constant count: -O0 warned) */           \
                    if (j_ < MGK_VW >> lev_)                                                       \
                        w_[j_] = MGK_EVEN(w_[2 * j_], w_[2 * j_ + 1]) +                            \
                                 MGK_ODD(w_[2 * j_], w_[2 * j_ + 1]);                              \
            }                                                                                      \
            lv_[k_] = w_[0];                                                                       \
        }                                                                                          \
        (tr) = MGK_VTREE_NV(lv_);                                                                  \
    } while (0)
#else
#define MGK_VTREE_OK 0
#endif

/* A split sum's point at positions po_ (out), pi_ (init) whose lanes added to `tree_` (split
 * points, split rows): its sum, init (or 0, or out) + tree_, applied as SGD to init (`step`) or
 * stored at out, as mgk_point1 ends. */
#define MGK_PT_FINISH(N, R, step, po_, pi_, tree_)                                                 \
    do {                                                                                           \
        mgk_real acc_ = MGK_ZS(N, R)            ? (mgk_real)0                                      \
                        : (N)->mode == MGK_SUMI ? *MGK_AT(R, &(N)->init, pi_)                      \
                                                : *MGK_AT(R, &(N)->out, po_);                      \
        acc_ += (tree_);                                                                           \
        if (step) {                                                                                \
            mgk_real *w_ = MGK_AT(R, &(N)->init, pi_);                                             \
            const mgk_real *og_ = MGK_OG(N, R, po_);                                               \
            *w_ -= (mgk_real)(R)->lr * (og_ ? *og_ + acc_ : acc_);                                 \
        } else {                                                                                   \
            *MGK_AT(R, &(N)->out, po_) = acc_;                                                     \
        }                                                                                          \
    } while (0)

/* A stepping nest (MGK_F_STEP) whose terms read the array it steps runs one point at a time (not
 * in split points or split rows): a point's sum could read a weight an earlier point stepped,
 * which the points' sums all made before any step would not (no such nest is known: its gradient
 * is never one nest). */
#define MGK_PTS_STEP_OK(N, term, step)                                                             \
    (!(step) ||                                                                                    \
     ((N)->x[0].arr != (N)->init.arr && ((term) == MGK_T_ONE || (N)->x[1].arr != (N)->init.arr)))

/* Split points: a split sum's output points (MGK_SPLIT_VEC) one at a time add each block of
 * terms into the same vectors, one chain of dependent additions per point (cnn48's kernel
 * gradient: 26 rows of 4 blocks per weight, each addition waiting for the last). Up to MGK_PT
 * points of a row of dims 2 and 3 run at once instead, each in its own vectors, in mgk_point1's
 * order, and their lanes added with MGK_VTREE (or MGK_TREE one point at a time): the same bits,
 * with MGK_PT chains in flight. MGK_PT keeps the points' vectors within the registers. Defining
 * MGK_NO_SPLIT_PTS leaves it out (to compare: a test checks the bits). */
#if MGK_VECTOR && !defined(MGK_NO_SPLIT_PTS)
#define MGK_PT (MGK_NV >= 4 ? 2 : 8 / MGK_NV)
/* MGK_PT points of a split sum at positions po[j], pi[j] (out, init), p0[j], p1[j] (x0, x1),
 * with `nbr` samples. */
MGK_HOT void mgk_split_pts(const mgk_nest *N, const mgk_run *R, const int term, const int step,
                           const int small, const mgk_i64 nbr, const mgk_i64 *po, const mgk_i64 *pi,
                           const mgk_i64 *p0, const mgk_i64 *p1) {
    MGK_SIZES(n, N->n, small);
    const mgk_ref *X = N->x;
    const mgk_i64 full = n[7] / MGK_LANES * MGK_LANES, s07 = X[0].s[7], s17 = X[1].s[7];
    const int m = (int)(n[7] - full);
    /* x1 the same at every point (a kernel's output gradient, for each of its weights) */
    const int one1 = term == MGK_T_ONE || (X[1].s[2] == 0 && X[1].s[3] == 0);
    mgk_vec v[MGK_PT][MGK_NV];
    mgk_i64 r4, r5, r6, r7, sm;
    int j, k;
    MGK_UNROLL
    for (j = 0; j < MGK_PT; j++) {
        MGK_UNROLL
        for (k = 0; k < MGK_NV; k++) v[j][k] = MGK_VSPLAT((mgk_real)0);
    }
    for (sm = 0; sm < nbr; sm++) {
        const mgk_i64 so = sm * R->ss;
        for (r4 = 0; r4 < n[4]; r4++)
            for (r5 = 0; r5 < n[5]; r5++)
                for (r6 = 0; r6 < n[6]; r6++) {
                    const mgk_real *y0[MGK_PT], *y1[MGK_PT];
                    mgk_vec a[MGK_PT], b[MGK_PT];
                    MGK_UNROLL
                    for (j = 0; j < MGK_PT; j++) {
                        y0[j] = MGK_ATS(R, &X[0], p0[j] + MGK_RPOS(&X[0], r4, r5, r6, 0), so);
                        y1[j] = one1 && j
                                    ? y1[0]
                                    : MGK_ATS(R, &X[1], p1[j] + MGK_RPOS(&X[1], r4, r5, r6, 0), so);
                        a[j] = b[j] = MGK_VSPLAT((mgk_real)0);
                        if (!s07) a[j] = MGK_VSPLAT(*y0[j]);
                        if (term == MGK_T_MUL && !s17) b[j] = MGK_VSPLAT(*y1[j]);
                    }
                    for (r7 = 0; r7 < full; r7 += MGK_LANES) {
                        MGK_UNROLL
                        for (k = 0; k < MGK_NV; k++) {
                            mgk_vec bk = b[0];
                            if (term == MGK_T_MUL && s17 && one1)
                                MGK_VLOAD(bk, y1[0] + r7 + k * MGK_VW);
                            MGK_UNROLL
                            for (j = 0; j < MGK_PT; j++) {
                                mgk_vec aj = a[j], bj = one1 ? bk : b[j];
                                if (s07) MGK_VLOAD(aj, y0[j] + r7 + k * MGK_VW);
                                if (term == MGK_T_ONE) {
                                    v[j][k] += aj;
                                } else {
                                    if (s17 && !one1) MGK_VLOAD(bj, y1[j] + r7 + k * MGK_VW);
                                    v[j][k] += aj * bj;
                                }
                            }
                        }
                    }
                    if (m) { /* the row's last terms, zeros in the lanes past them (mgk_point1) */
                        MGK_UNROLL
                        for (k = 0; k < MGK_NV; k++) {
                            const int mk = m - k * MGK_VW;
                            mgk_vec tb = b[0];
                            if (term == MGK_T_MUL && one1)
                                tb = MGK_VGATHER(y1[0] + s17 * (full + k * MGK_VW), s17, mk);
                            MGK_UNROLL
                            for (j = 0; j < MGK_PT; j++) {
                                const mgk_vec ta =
                                    MGK_VGATHER(y0[j] + s07 * (full + k * MGK_VW), s07, mk);
                                if (term == MGK_T_ONE) {
                                    v[j][k] += ta;
                                } else {
                                    const mgk_vec tj =
                                        one1 ? tb
                                             : MGK_VGATHER(y1[j] + s17 * (full + k * MGK_VW), s17,
                                                           mk);
                                    v[j][k] += ta * tj;
                                }
                            }
                        }
                    }
                }
    }
#if MGK_VTREE_OK && MGK_PT == MGK_VW
    mgk_vec tr;
    MGK_VTREE(v, tr);
    MGK_UNROLL
    for (j = 0; j < MGK_PT; j++) MGK_PT_FINISH(N, R, step, po[j], pi[j], tr[j]);
#else
#define MGK_VLANE(l) v[j][(l) / MGK_VW][(l) % MGK_VW]
    MGK_UNROLL
    for (j = 0; j < MGK_PT; j++) MGK_PT_FINISH(N, R, step, po[j], pi[j], MGK_TREE(MGK_VLANE));
#undef MGK_VLANE
#endif
}
/* The points of rows [lo2, hi2) of dim 2 at (i0, i1), in row-major order: MGK_PT at a time, the
 * rest one by one, where a point's sum is at least 4 blocks long per sample (a dense layer's input
 * gradient, rows of 10 terms, one block and a rest, ran slower this way: most of a point's cost is
 * then its positions and its lanes' tree, not a chain of additions; split rows take those). Per
 * sample, so that in generated code the sizes alone decide and gcc drops the path from every other
 * nest (a bias gradient of 8 points over 12 terms gave cnn5s2 a sixth more compile time). */
#define MGK_NP_SPLIT_PTS                                                                           \
    if (!block && !pre && N->mode != MGK_SET && !(N->flags & MGK_F_SCATTER) && !O->gather &&       \
        !I->gather && MGK_SPLIT_VEC(N, term) && (hi2 - lo2) * n[3] >= MGK_PT &&                    \
        MGK_PTS_STEP_OK(N, term, step) &&                                                          \
        n[4] * n[5] * n[6] * ((n[7] + MGK_LANES - 1) / MGK_LANES) >= 4) {                          \
        const mgk_i64 np = (hi2 - lo2) * n[3];                                                     \
        mgk_i64 pt;                                                                                \
        for (pt = 0; pt < np; pt += MGK_PT) {                                                      \
            mgk_i64 po_[MGK_PT], pi_[MGK_PT], p0_[MGK_PT], p1_[MGK_PT];                            \
            const int cnt = np - pt < MGK_PT ? (int)(np - pt) : MGK_PT;                            \
            int j;                                                                                 \
            for (j = 0; j < cnt; j++) {                                                            \
                const mgk_i64 j2 = lo2 + (pt + j) / n[3], j3 = (pt + j) % n[3];                    \
                po_[j] = MGK_OPOS(O, t, i0, i1, j2, j3);                                           \
                pi_[j] = MGK_OPOS(I, t, i0, i1, j2, j3);                                           \
                p0_[j] = MGK_OPOS(&X[0], t, i0, i1, j2, j3);                                       \
                p1_[j] = MGK_OPOS(&X[1], t, i0, i1, j2, j3);                                       \
            }                                                                                      \
            if (cnt == MGK_PT) mgk_split_pts(N, Rb, term, step, small, nbr, po_, pi_, p0_, p1_);   \
            else                                                                                   \
                for (j = 0; j < cnt; j++)                                                          \
                    mgk_point1(N, Rb, term, op, step, small, nbr, 0, po_[j], pi_[j], p0_[j],       \
                               p1_[j], 0, 0); /* no x2, x3 in these terms */                       \
        }                                                                                          \
        continue;                                                                                  \
    }
#else
#define MGK_NP_SPLIT_PTS
#endif

#if MGK_VTREE_OK && (MGK_NV == 1 || MGK_LANES == 8) && !defined(MGK_NO_SPLIT_ROWS)
/* Split rows: MGK_VW consecutive points of a row along dim 3 of a split sum too short for split
 * points (a dense layer's input gradient: per input, 10 products with the output gradient, one
 * block and a rest) at once, each in its own vectors, in mgk_point1's order, the operand that
 * does not move along the row (the output gradient) loaded once for all, and their lanes added
 * by MGK_VTREE: the same bits as one point at a time, whose positions and lane tree were most of
 * a point's cost. Positions are those of the row's first point, strides along dim 3 so (out), si
 * (init), s0, s1 (x0, x1); `nbr` samples. Every sum is made before any is stored, so the points'
 * outputs must be distinct (so != 0, checked where it is called). Defining MGK_NO_SPLIT_ROWS
 * leaves it out (to compare: a test checks the bits). */
MGK_HOT void mgk_split_row(const mgk_nest *N, const mgk_run *R, const int term, const int step,
                           const int small, const mgk_i64 nbr, const mgk_i64 po, const mgk_i64 pi,
                           const mgk_i64 p0, const mgk_i64 p1, const mgk_i64 so, const mgk_i64 si,
                           const mgk_i64 s0, const mgk_i64 s1) {
    MGK_SIZES(n, N->n, small);
    const mgk_ref *X = N->x;
    const mgk_i64 full = n[7] / MGK_LANES * MGK_LANES, s07 = X[0].s[7], s17 = X[1].s[7];
    const int m = (int)(n[7] - full);
    const int mul = term == MGK_T_MUL;
    mgk_vec v[MGK_VW][MGK_NV], tr;
    mgk_i64 r4, r5, r6, r7, sm;
    int j, k;
    MGK_UNROLL
    for (j = 0; j < MGK_VW; j++) {
        MGK_UNROLL
        for (k = 0; k < MGK_NV; k++) v[j][k] = MGK_VSPLAT((mgk_real)0);
    }
    for (sm = 0; sm < nbr; sm++) {
        const mgk_i64 ss = sm * R->ss;
        for (r4 = 0; r4 < n[4]; r4++)
            for (r5 = 0; r5 < n[5]; r5++)
                for (r6 = 0; r6 < n[6]; r6++) {
                    /* the row's first point's operands; point j's are j * s0 (s1) further */
                    const mgk_real *y0 = MGK_ATS(R, &X[0], p0 + MGK_RPOS(&X[0], r4, r5, r6, 0), ss);
                    const mgk_real *y1 =
                        mul ? MGK_ATS(R, &X[1], p1 + MGK_RPOS(&X[1], r4, r5, r6, 0), ss) : y0;
                    for (r7 = 0; r7 < full; r7 += MGK_LANES) {
                        MGK_UNROLL
                        for (k = 0; k < MGK_NV; k++) {
                            const mgk_i64 off = r7 + k * MGK_VW;
                            mgk_vec a0 = MGK_VSPLAT((mgk_real)0), b0 = a0;
                            /* an operand fixed along the row, loaded once */
                            if (!s0) {
                                if (s07) MGK_VLOAD(a0, y0 + off);
                                else a0 = MGK_VSPLAT(*y0);
                            }
                            if (mul && !s1) {
                                if (s17) MGK_VLOAD(b0, y1 + off);
                                else b0 = MGK_VSPLAT(*y1);
                            }
                            MGK_UNROLL
                            for (j = 0; j < MGK_VW; j++) {
                                mgk_vec aj = a0, bj = b0;
                                if (s0) {
                                    if (s07) MGK_VLOAD(aj, y0 + j * s0 + off);
                                    else aj = MGK_VSPLAT(y0[j * s0]);
                                }
                                if (!mul) {
                                    v[j][k] += aj;
                                    continue;
                                }
                                if (s1) {
                                    if (s17) MGK_VLOAD(bj, y1 + j * s1 + off);
                                    else bj = MGK_VSPLAT(y1[j * s1]);
                                }
                                v[j][k] += aj * bj;
                            }
                        }
                    }
                    if (m) { /* the row's last terms, zeros in the lanes past them (mgk_point1) */
                        MGK_UNROLL
                        for (k = 0; k < MGK_NV; k++) {
                            const int mk = m - k * MGK_VW;
                            const mgk_i64 off = full + k * MGK_VW;
                            const mgk_vec ta0 = MGK_VGATHER(y0 + s07 * off, s07, mk);
                            const mgk_vec tb0 = mul ? MGK_VGATHER(y1 + s17 * off, s17, mk) : ta0;
                            MGK_UNROLL
                            for (j = 0; j < MGK_VW; j++) {
                                const mgk_vec ta =
                                    s0 ? MGK_VGATHER(y0 + j * s0 + s07 * off, s07, mk) : ta0;
                                if (!mul) {
                                    v[j][k] += ta;
                                    continue;
                                }
                                v[j][k] +=
                                    ta * (s1 ? MGK_VGATHER(y1 + j * s1 + s17 * off, s17, mk) : tb0);
                            }
                        }
                    }
                }
    }
    MGK_VTREE(v, tr);
    MGK_UNROLL
    for (j = 0; j < MGK_VW; j++) MGK_PT_FINISH(N, R, step, po + j * so, pi + j * si, tr[j]);
}
#define MGK_NP_SPLIT_ROW                                                                           \
    if (!pre && N->mode != MGK_SET && !(N->flags & MGK_F_SCATTER) && !O->gather && !I->gather &&   \
        MGK_SPLIT_VEC(N, term) && n[3] >= MGK_VW && so != 0 && MGK_PTS_STEP_OK(N, term, step))     \
        for (; i3 + MGK_VW <= n[3]; i3 += MGK_VW) {                                                \
            mgk_split_row(N, Rb, term, step, small, nbr, po, pi, q0, q1, so, si, s0, s1);          \
            po += MGK_VW * so;                                                                     \
            pi += MGK_VW * si;                                                                     \
            q0 += MGK_VW * s0;                                                                     \
            q1 += MGK_VW * s1;                                                                     \
            q2 += MGK_VW * s2;                                                                     \
            q3 += MGK_VW * s3;                                                                     \
        }
#else
#define MGK_NP_SPLIT_ROW
#endif

/* Whether a nest can run in register tiles along `axis`: 2 (outer dim 2) or 8 (the samples of a
 * batch). The schedule sets MGK_F_TILE where its shape allows; the sizes decide at run time. */
#define MGK_TILE_OK(N)                                                                             \
    (MGK_VECTOR && ((N)->flags & MGK_F_TILE) && (N)->term == MGK_T_MUL && (N)->mode != MGK_SET &&  \
     (N)->out.s[3] != 0 && (N)->x[0].s[3] == 1 && (N)->x[1].s[3] == 0 && !(N)->out.gather &&       \
     !(N)->x[0].gather && !(N)->x[1].gather && ((N)->mode != MGK_SUMI || (N)->init.s[3] <= 1))
/* Whether x0 is the same for every point along dim 2 (tiles whose rows run along dim 2). */
#define MGK_ROWS2(N) ((N)->x[0].s[2] == 0 && (N)->n[2] > 1)
/* Which tiles a nest runs in, from its descriptor alone: 1 rows along dim 2 (a shared output),
 * 3 rows along dim 2 of each sample (a per-sample output: a convolution's positions, its weights
 * loaded once per tile), 2 samples (a per-sample output read through a shared weight without such
 * rows: a dense layer), 0 none. Rows before samples: a nest with both kept two tiles' code, one
 * per batch size, and its tiles of samples were no faster at batch 32 (CNNs 0.99-1.07x, the GRU
 * 1.00x without them), but took two thirds of its gcc time (a padded 5x5 CNN's five forward
 * nests with rows: 0.21 -> 0.07 s each; the two parts' gcc time of that CNN 2.98 -> 2.47 s, of
 * the GRU 2.74 -> 2.28 s). */
#define MGK_TILE_KIND(N)                                                                           \
    (!MGK_TILE_OK(N)      ? 0                                                                      \
     : !MGK_PS(&(N)->out) ? (MGK_ROWS2(N) ? 1 : 0)                                                 \
     : MGK_ROWS2(N)       ? 3                                                                      \
     : !MGK_PS(&(N)->x[0]) && MGK_PS(&(N)->x[1]) && !((N)->flags & MGK_F_STEP) ? 2                 \
                                                                               : 0)

/* Runs a nest. `term` and `op` repeat N->term and N->op as constants, so that each call site (an
 * interpreter instance, or a generated function) keeps only its own term's code. `small`: dims 0,
 * 4 and 5 have size 1 (a nest with at most three outer and two reduction dims, which is nearly
 * every nest once contiguous dims are merged), so the interpreter's instances for such nests skip
 * those loops. The paths: `ps`, the output is per-sample; `tile`, MGK_TILE_KIND; `block`,
 * MGK_F_BLOCK; `n3` repeats N->n[3] (MGK_QTAIL). Generated functions give them as constants, so the
 * C compiler never keeps the others. A nest writing per-sample values runs once per sample (or,
 * tiled, several samples at a time); one writing a shared array (a parameter's gradient) sums over
 * the samples inside each output.
 *
 * This is one body over mgk_point1, mgk_block and mgk_tile, not a chain of inline functions: the
 * C compiler optimises each function of such a chain on its own, with every inner one inlined,
 * before it copies the outermost into a nest's function; a chain five deep was most of the time
 * gcc spent on generated code. For the same reason the body is a macro, MGK_NEST_PATH_BODY, over
 * the names N, R, term, op, small, ps, tile, block and n3: the interpreter's instances call the
 * function mgk_nest_path, and each nest function of generated code is MGK_NEST_PATH(...), the
 * body itself with its constants, so gcc never optimises a generic copy of it first (that copy,
 * every path with run-time conditions, was 8-9% of gcc's instructions on a generated file).
 *
 * The paths that need vectors, as statements of the body: */
#if MGK_VECTOR
#define MGK_NP_SAMPLE_TILES                                                                        \
    if (ps && tile == 2 && nb >= MGK_TSS / 2) {                                                    \
        /* samples in tiles of MGK_TSS: x0 (a shared weight) loaded once for all of them. At least \
         * half a tile left over runs as a whole tile, into the samples past nb (mgk_run); fewer   \
         * run one by one below, as at batch size 1. Each sample's sums are in the same order on   \
         * either path. A second copy of the tile for a run-time number of samples was a sixth of  \
         * the C compiler's time on generated code. */                                             \
        const mgk_i64 *n = N->n, t = R->t, ss = R->ss;                                             \
        const mgk_ref *O = &N->out, *I = &N->init, *X = N->x;                                      \
        const mgk_i64 ri = MGK_PS(I) ? ss : 0;                                                     \
        const mgk_i64 tiled = nb % MGK_TSS >= MGK_TSS / 2 ? nb : nb - nb % MGK_TSS;                \
        mgk_i64 i0, i1, i2, i3;                                                                    \
        _Static_assert(MGK_TS_MAX % MGK_TSS == 0, "a batch's samples hold whole tiles");           \
        for (sm = 0; sm < tiled; sm += MGK_TSS) {                                                  \
            mgk_run Rs = *R;                                                                       \
            Rs.a[MGK_BD] += sm * ss;                                                               \
            Rs.a[MGK_BG] += sm * ss;                                                               \
            for (i0 = 0; i0 < (small ? 1 : n[0]); i0++)                                            \
                for (i1 = 0; i1 < n[1]; i1++)                                                      \
                    for (i2 = 0; i2 < n[2]; i2++)                                                  \
                        for (i3 = 0; i3 < n[3]; i3 += MGK_LANES) {                                 \
                            const int nl = n[3] - i3 < MGK_LANES ? (int)(n[3] - i3) : MGK_LANES;   \
                            mgk_real *o = Rs.a[O->arr] + MGK_OPOS(O, t, i0, i1, i2, i3);           \
                            const mgk_real *in = Rs.a[I->arr] + MGK_OPOS(I, t, i0, i1, i2, i3);    \
                            const mgk_real *a0 =                                                   \
                                Rs.a[X[0].arr] + MGK_OPOS(&X[0], t, i0, i1, i2, i3);               \
                            const mgk_real *b0 =                                                   \
                                Rs.a[X[1].arr] + MGK_OPOS(&X[1], t, i0, i1, i2, i3);               \
                            if (MGK_QTAIL(n3) && nl <= MGK_QL)                                     \
                                mgk_tile_q(N, &Rs, small, 1, MGK_TSS, nl, o, in, a0, b0, ss, ri,   \
                                           ss, 0);                                                 \
                            else                                                                   \
                                mgk_tile(N, &Rs, small, 1, MGK_TSS, nl, o, in, a0, b0, ss, ri, 0,  \
                                         ss, 0, 0);                                                \
                        }                                                                          \
        }                                                                                          \
        sm0 = tiled;                                                                               \
    }
#define MGK_ROW_TILES(NT)                                                                          \
    for (i3 = 0; i3 < n[3]; i3 += MGK_LANES) {                                                     \
        const int nl = n[3] - i3 < MGK_LANES ? (int)(n[3] - i3) : MGK_LANES;                       \
        if (MGK_QTAIL(n3) && nl <= MGK_QL)                                                         \
            mgk_tile_q(N, Rb, small, nbr, NT, nl, Rb->a[O->arr] + MGK_OPOS(O, t, i0, i1, i2, i3),  \
                       Rb->a[I->arr] + MGK_OPOS(I, t, i0, i1, i2, i3),                             \
                       Rb->a[X[0].arr] + MGK_OPOS(&X[0], t, i0, i1, i2, i3),                       \
                       Rb->a[X[1].arr] + MGK_OPOS(&X[1], t, i0, i1, i2, i3), O->s[2], I->s[2],     \
                       X[1].s[2], step);                                                           \
        else                                                                                       \
            mgk_tile(N, Rb, small, nbr, NT, nl, Rb->a[O->arr] + MGK_OPOS(O, t, i0, i1, i2, i3),    \
                     Rb->a[I->arr] + MGK_OPOS(I, t, i0, i1, i2, i3),                               \
                     Rb->a[X[0].arr] + MGK_OPOS(&X[0], t, i0, i1, i2, i3),                         \
                     Rb->a[X[1].arr] + MGK_OPOS(&X[1], t, i0, i1, i2, i3), O->s[2], I->s[2], 0,    \
                     X[1].s[2], 0, step);                                                          \
    }
#define MGK_NP_ROWS                                                                                \
    if (tile2 && term == MGK_T_MUL && (!step || O->s[3] == 1) && !pre) {                           \
        /* rows along dim 2 in tiles: x0 is the same for every row (stride 0). The                 \
         * full tiles, then the rows left (n[2] % MGK_TS), so that in generated code               \
         * (constant sizes) the tile is kept once per row count that occurs, not                   \
         * once more for a run-time count. */                                                      \
        for (i2 = lo2; i2 + MGK_TS <= hi2; i2 += MGK_TS) MGK_ROW_TILES(MGK_TS)                     \
        if (i2 < hi2) {                                                                            \
            /* rows start at 0 or at a band's start, a multiple of MGK_TS_MAX, and a band ends at  \
             * another or at n[2]: the rows left are n[2] % MGK_TS. Written so, not hi2 - i2, the  \
             * count is a constant in generated code whether the nest runs in bands or not (with   \
             * hi2 - i2, gcc kept a second copy of the tile for a run-time count: half of a banded \
             * gradient's code, 40% of its compile time) */                                        \
            const int nt = (int)(n[2] % MGK_TS);                                                   \
            MGK_ROW_TILES(nt)                                                                      \
        }                                                                                          \
        continue;                                                                                  \
    }
#define MGK_NP_WIDE                                                                                \
    if (wide) { /* full blocks, up to MGK_TS at a time (mgk_tile's `ra`) */                        \
        const mgk_i64 full = n[3] / MGK_LANES;                                                     \
        mgk_i64 bq;                                                                                \
        for (bq = 0; bq < full; bq += MGK_TS) {                                                    \
            const int nt = full - bq < MGK_TS ? (int)(full - bq) : MGK_TS;                         \
            mgk_tile(N, Rb, small, nbr, nt, MGK_LANES, Rb->a[O->arr] + po, Rb->a[I->arr] + pi,     \
                     Rb->a[X[0].arr] + q0, Rb->a[X[1].arr] + q1, MGK_LANES * so, MGK_LANES * si,   \
                     MGK_LANES * s0, MGK_LANES * s1, pre, 0);                                      \
            po += nt * MGK_LANES * so;                                                             \
            pi += nt * MGK_LANES * si;                                                             \
            q0 += nt * MGK_LANES * s0;                                                             \
            q1 += nt * MGK_LANES * s1;                                                             \
            q2 += nt * MGK_LANES * s2;                                                             \
            q3 += nt * MGK_LANES * s3;                                                             \
        }                                                                                          \
        i3 = full * MGK_LANES;                                                                     \
    }
#else
#define MGK_NP_SAMPLE_TILES
#define MGK_NP_ROWS
#define MGK_NP_WIDE
#endif
#if MGK_VECTOR && defined(MGK_ELEM_ROWS)
/* A row that mgk_elem_rows can run: one term per point (no reduction dims), one sample, no step
 * fused or pre-step. */
#define MGK_ROW_OF_ONE_TERMS                                                                       \
    (!step && !pre && nbr == 1 && (small || (n[4] == 1 && n[5] == 1)) && n[6] == 1 && n[7] == 1)
#define MGK_NP_ELEM_ROWS                                                                           \
    if ((term >= MGK_T_OP || (MGK_ELEM_ROWS == 1 && !MGK_BLOCK_VECTORS(N, term))) &&               \
        MGK_ROW_OF_ONE_TERMS && (MGK_ELEM_ROWS == 1 || (n[3] > MGK_LANES && n[3] % MGK_LANES))) {  \
        /* an elementwise term with no reduction: the row in one go */                             \
        mgk_elem_rows(N, Rb, term, op, n[3], po, pi, q0, q1, q2, q3);                              \
        continue;                                                                                  \
    }
/* In the interpreter, a row of points that is not blocked (shorter than a block, with strided
 * operands: a 2x2 average pool's sums and gradients, 7 wide with stride 2) and sums nothing runs
 * as an elementwise row too, instead of point by point with every position computed from the run-
 * time strides: the same one addition per point (cnn5s2 tape 1.4x, cnn2 1.3x). */
#if MGK_ELEM_ROWS == 1
#define MGK_NP_POINT_ROWS                                                                          \
    if (MGK_ROW_OF_ONE_TERMS && n[3] >= 2 && !(N->flags & MGK_F_SCATTER) && !O->gather &&          \
        !I->gather && !X[0].gather && !X[1].gather && !X[2].gather && !X[3].gather) {              \
        mgk_elem_rows(N, Rb, term, op, n[3], po, pi, q0, q1, q2, q3);                              \
        continue;                                                                                  \
    }
#else
#define MGK_NP_POINT_ROWS
#endif
#else
#define MGK_NP_ELEM_ROWS
#define MGK_NP_POINT_ROWS
#endif

#define MGK_NEST_PATH_BODY                                                                         \
    const mgk_i64 nb = R->nb > 1 ? R->nb : 1;                                                      \
    mgk_i64 sm, sm0 = 0; /* sm0: the first sample the per-sample passes below run */               \
    MGK_NP_SAMPLE_TILES                                                                            \
    MGK_NP_SAMPLE_LANES                                                                            \
    /* A shared output sums over the samples inside each output point (one pass, nb samples);      \
     * a per-sample output makes one pass per sample. */                                           \
    for (sm = sm0; sm < (ps ? nb : 1); sm++) {                                                     \
        mgk_run Rs = *R;                                                                           \
        const mgk_run *const Rb = &Rs;                                                             \
        const mgk_i64 nbr = ps ? 1 : nb;                                                           \
        /* rows along dim 2 in tiles */                                                            \
        const int tile2 = ps ? tile == 3 : tile == 1;                                              \
        if (ps) {                                                                                  \
            Rs.a[MGK_BD] += sm * R->ss;                                                            \
            Rs.a[MGK_BG] += sm * R->ss;                                                            \
        }                                                                                          \
        const mgk_i64 *n = N->n;                                                                   \
        const mgk_ref *O = &N->out, *I = &N->init, *X = N->x;                                      \
        const mgk_i64 t = Rb->t;                                                                   \
        const int step = (N->flags & MGK_F_STEP) && Rb->bstep;                                     \
        /* the weights stepped as they are read, with the previous sample's gradient */            \
        const int pre = (N->flags & MGK_F_PRESTEP) && Rb->a[MGK_QD] && Rb->a[MGK_QG] &&            \
                        Rb->lr != 0.0 && Rb->nb <= 1;                                              \
        /* sums of products along the vector dim of a unit-stride x0 and a broadcast x1 (a         \
         * matrix-vector product): full blocks in tiles of blocks */                               \
        const int wide = MGK_VECTOR && term == MGK_T_MUL && !step && N->mode != MGK_SET &&         \
                         O->s[3] == 1 && X[0].s[3] == 1 && X[1].s[3] == 0 && !O->gather &&         \
                         !X[0].gather && !X[1].gather && I->s[3] >= 0 &&                           \
                         (N->mode != MGK_SUMI || I->s[3] <= 1) && n3 >= 2 * MGK_LANES;             \
        (void)wide;                                                                                \
        (void)tile2; /* both unused without vectors (MGK_NO_VECTOR, tcc) */                        \
        const mgk_i64 n0 = small ? 1 : n[0], n1 = n[1];                                            \
        /* the rows of dim 2 this run computes (constants, except in an MGK_F_BAND nest) */        \
        const int band = (N->flags & MGK_F_BAND) && Rb->hi2 > 0;                                   \
        const mgk_i64 lo2 = band ? Rb->lo2 : 0, hi2 = band ? Rb->hi2 : n[2];                       \
        const mgk_i64 so = O->s[3], si = I->s[3], s0 = X[0].s[3], s1 = X[1].s[3], s2 = X[2].s[3],  \
                      s3 = X[3].s[3];                                                              \
        mgk_i64 i0, i1, i2, i3;                                                                    \
        for (i0 = 0; i0 < n0; i0++)                                                                \
            for (i1 = 0; i1 < n1; i1++) {                                                          \
                MGK_NP_ROWS                                                                        \
                MGK_NP_SPLIT_PTS                                                                   \
                for (i2 = lo2; i2 < hi2; i2++) {                                                   \
                    /* positions at (i0, i1, i2, 0), advanced along the vector dim */              \
                    mgk_i64 po = MGK_OPOS(O, t, i0, i1, i2, 0),                                    \
                            pi = MGK_OPOS(I, t, i0, i1, i2, 0);                                    \
                    mgk_i64 q0 = MGK_OPOS(&X[0], t, i0, i1, i2, 0),                                \
                            q1 = MGK_OPOS(&X[1], t, i0, i1, i2, 0);                                \
                    mgk_i64 q2 = MGK_OPOS(&X[2], t, i0, i1, i2, 0),                                \
                            q3 = MGK_OPOS(&X[3], t, i0, i1, i2, 0);                                \
                    if (block) {                                                                   \
                        i3 = 0;                                                                    \
                        MGK_NP_WIDE                                                                \
                        MGK_NP_ELEM_ROWS                                                           \
                        for (; i3 < n[3]; i3 += MGK_LANES) {                                       \
                            const int nl = n[3] - i3 < MGK_LANES ? (int)(n[3] - i3) : MGK_LANES;   \
                            /* n3, a constant in generated code: rows of whole blocks              \
                             * carry no copy for a partial one (gcc warned about its dead          \
                             * second vector) */                                                   \
                            if (n3 % MGK_LANES == 0 || nl == MGK_LANES)                            \
                                mgk_block(N, Rb, term, op, step, pre, small, nbr, MGK_LANES, po,   \
                                          pi, q0, q1, q2, q3);                                     \
                            else /* the partial last block */                                      \
                                mgk_block(N, Rb, term, op, step, pre, small, nbr, nl, po, pi, q0,  \
                                          q1, q2, q3);                                             \
                            po += MGK_LANES * so;                                                  \
                            pi += MGK_LANES * si;                                                  \
                            q0 += MGK_LANES * s0;                                                  \
                            q1 += MGK_LANES * s1;                                                  \
                            q2 += MGK_LANES * s2;                                                  \
                            q3 += MGK_LANES * s3;                                                  \
                        }                                                                          \
                    } else {                                                                       \
                        MGK_NP_POINT_ROWS                                                          \
                        if ((N->flags & MGK_F_SCATTER) && ps && nbr == 1 && !step && !pre &&       \
                            MGK_SCATTER_ROW_OK(N, term)) {                                         \
                            mgk_scatter_row(N, Rb, term, small, po, q0, q1);                       \
                            continue;                                                              \
                        }                                                                          \
                        i3 = 0;                                                                    \
                        MGK_NP_SPLIT_ROW                                                           \
                        for (; i3 < n[3]; i3++) {                                                  \
                            /* a gathered output whose entry here is a per-sample element is no    \
                             * sum over the batch: each sample's point runs on its own */          \
                            const int each = O->gather && nbr > 1 &&                               \
                                             !(N->flags & MGK_F_SCATTER) &&                        \
                                             (Rb->ix[po] & MGK_IX_PS);                             \
                            mgk_i64 sp;                                                            \
                            for (sp = 0; sp < (each ? nbr : 1); sp++)                              \
                                mgk_point1(N, Rb, term, op, step, small, each ? 1 : nbr,           \
                                           each ? sp * Rb->ss : 0, po, pi, q0, q1, q2, q3);        \
                            po += so;                                                              \
                            pi += si;                                                              \
                            q0 += s0;                                                              \
                            q1 += s1;                                                              \
                            q2 += s2;                                                              \
                            q3 += s3;                                                              \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
    }

/* Max reductions. MGK_T_MAXR (mode MGK_SET): out = x0(r0) max x0(r1) max ... over the reduction
 * points in row-major order, the op table's max applied left to right: a chain a.max(b).max(c)
 * as written, so the same bits (reroll.c folds such chains, a max-pool's windows). MGK_T_DMAXR,
 * its gradient, has the forward nest's dims: per outer point it replays the chain's backward over
 * the window x0 and the output's gradient x1, from the last element down, and stores (MGK_SUM0:
 * 0 + g) or adds (MGK_ACC) each element's gradient at out, which moves along every dim x0 does:
 * one pass over the window instead of one nest per max and operand. Windows of at most
 * MGK_MAXWIN elements (reroll.c folds no longer chain). With `pre` (a unary op; reroll.c folds
 * ReLU, MGK_OP_RELU, where each element is a ReLU read by its window alone, of a value the ReLU
 * alone reads) the elements are
 * pre(x0): the forward computes each as pre's own nest would, and the gradient multiplies each
 * element's share, 0 + g as pre's gradient slot would have held it, by pre's derivative at x0 and
 * pre(x0), as pre's gradient nest would: the same bits as the ReLU nest, the window and the two
 * gradient nests they replace, without the ReLU's values and gradients in memory. Points run in
 * row-major order, samples outermost, or with MGK_F_BLOCK (set where no two points write one
 * element) and `pre` none or ReLU, MGK_LANES points along dim 3 at a time as native vectors
 * (mgk_maxr_block). */
#define MGK_MAXWIN 32
#ifndef MGK_OP_RELU
#error "the includer defines MGK_OP_RELU, the op table's relu"
#endif
#if MGK_VECTOR
/* A block's lanes as native vectors, the chain's steps as compares and blends: in lane loops gcc
 * leaves the op table's `max` and its derivatives as branches ("control flow in loop", not
 * if-converted), which random data mispredicts (such lanes ran 3x slower than the elementwise
 * nests they replace). The blends are the op table's formulas lane by lane, `(A > B || A != A) ?
 * A : B`, `A > B ? 1 : (A == B ? 0.5 : 0)`, `B > A ? 1 : (A == B ? 0.5 : 0)`, and a ReLU
 * element's `A < 0 ? 0 : A` and `Y > 0 ? 1 : 0`: the same bits as the scalar path below (the one
 * place ops' formulas are written twice; test_reroll.py's test_max_windows_... holds generated
 * code with and without vectors and the tape to the same bits over ReLU's ties and windows of
 * +0, -0 and equal values). */
#if MGK_REAL_BYTES == 8
typedef long long mgk_vmask __attribute__((vector_size(MGK_VBYTES)));
#else
typedef int mgk_vmask __attribute__((vector_size(MGK_VBYTES)));
#endif
#define MGK_VSEL(c, x, y) ((mgk_vec)(((mgk_vmask)(x) & (c)) | ((mgk_vmask)(y) & ~(c))))
#define MGK_VMAX(A, B) MGK_VSEL(((A) > (B)) | ((A) != (A)), A, B)
/* lanes x[l * st], l < nv, into the native vectors V[0 .. MGK_NV) (zeros after); lanes 2 apart
 * in a whole block as the even lanes of whole vectors (MGK_EVEN2: one element past the last
 * lane's is read, at worst the sample's padding, MGK_PAD; this nest does not write x0 or x1) */
#define MGK_MAXR_LOAD(V, x, st)                                                                    \
    do {                                                                                           \
        MGK_UNROLL                                                                                 \
        for (int k_ = 0; k_ < MGK_NV; k_++) {                                                      \
            if ((st) == 1 && nv == MGK_LANES) MGK_VLOAD((V)[k_], (x) + k_ * MGK_VW);               \
            else                                                                                   \
                (V)[k_] = (st) == 2 && nv == MGK_LANES                                             \
                              ? MGK_EVEN2((x) + k_ * MGK_VW * 2)                                   \
                              : MGK_VGATHER((x) + k_ * MGK_VW * (st), (st), nv - k_ * MGK_VW);     \
        }                                                                                          \
    } while (0)
#if MGK_STRIDE2 /* two vectors' lanes interleaved: a, b -> a0 b0 a1 b1 ... (low, high halves) */
#if MGK_VW == 2
#define MGK_ILV_LO(a, b) MGK_SV(a, b, 0, 2)
#define MGK_ILV_HI(a, b) MGK_SV(a, b, 1, 3)
#elif MGK_VW == 4
#define MGK_ILV_LO(a, b) MGK_SV(a, b, 0, 4, 1, 5)
#define MGK_ILV_HI(a, b) MGK_SV(a, b, 2, 6, 3, 7)
#elif MGK_VW == 8
#define MGK_ILV_LO(a, b) MGK_SV(a, b, 0, 8, 1, 9, 2, 10, 3, 11)
#define MGK_ILV_HI(a, b) MGK_SV(a, b, 4, 12, 5, 13, 6, 14, 7, 15)
#else
#define MGK_ILV_LO(a, b) MGK_SV(a, b, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23)
#define MGK_ILV_HI(a, b) MGK_SV(a, b, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31)
#endif
#endif
/* One block of nv points along dim 3 (o, x0, x1 at its first point). A gradient stored 2 apart
 * whose window's innermost dim is a pair of neighbours (a 2x2 pool's columns) is stored as whole
 * vectors, the pair's lanes interleaved. */
MGK_HOT void mgk_maxr_block(const mgk_nest *N, const int term, const int relu, const int nv,
                            mgk_real *o, const mgk_real *x0, const mgk_real *x1) {
    const mgk_i64 *n = N->n;
    const mgk_ref *O = &N->out, *X = N->x;
    const mgk_i64 s0 = X[0].s[3], s1 = X[1].s[3], os = O->s[3];
    const mgk_vec one = MGK_VSPLAT((mgk_real)1), half = MGK_VSPLAT((mgk_real)0.5),
                  zero = MGK_VSPLAT((mgk_real)0);
    mgk_vec v[MGK_MAXWIN][MGK_NV], m[MGK_MAXWIN][MGK_NV], g[MGK_NV], f[MGK_NV], h[MGK_NV];
    mgk_i64 qo[MGK_MAXWIN], r4, r5, r6, r7;
    int w = 0, k, q, l;
    MGK_UNROLL
    for (q = 0; q < MGK_NV; q++) h[q] = zero; /* (set before it is read: w is even with pairs) */
    /* every loop unrolled in generated code (constant sizes): the window in registers */
    MGK_UNROLL
    for (r4 = 0; r4 < n[4]; r4++) {
        MGK_UNROLL
        for (r5 = 0; r5 < n[5]; r5++) {
            MGK_UNROLL
            for (r6 = 0; r6 < n[6]; r6++) {
                MGK_UNROLL
                for (r7 = 0; r7 < n[7]; r7++, w++) {
                    MGK_MAXR_LOAD(v[w], x0 + MGK_RPOS(&X[0], r4, r5, r6, r7), s0);
                    qo[w] = MGK_RPOS(O, r4, r5, r6, r7);
                    MGK_UNROLL
                    for (q = 0; q < MGK_NV; q++) {
                        if (relu) v[w][q] = MGK_VSEL(v[w][q] < zero, zero, v[w][q]);
                        m[w][q] = w ? MGK_VMAX(m[w - 1][q], v[w][q]) : v[w][q];
                    }
                }
            }
        }
    }
    if (term == MGK_T_MAXR) {
        if (os == 1 && nv == MGK_LANES) {
            MGK_UNROLL
            for (q = 0; q < MGK_NV; q++) MGK_VSTORE(o + q * MGK_VW, m[w - 1][q]);
        } else {
            for (l = 0; l < nv; l++) o[l * os] = m[w - 1][l / MGK_VW][l % MGK_VW];
        }
        return;
    }
    MGK_MAXR_LOAD(g, x1, s1);
#if MGK_STRIDE2
    const int pairs = os == 2 && n[7] == 2 && O->s[7] == 1 && nv == MGK_LANES;
#else
    const int pairs = 0;
#endif
    MGK_UNROLL
    for (k = w - 1; k >= 0; k--) {
        mgk_real *const ok = o + qo[k];
        MGK_UNROLL
        for (q = 0; q < MGK_NV; q++) {
            if (k) {
                const mgk_vec A = m[k - 1][q], B = v[k][q], tie = MGK_VSEL(A == B, half, zero);
                f[q] = MGK_VSEL(B > A, one, tie) * g[q];
                g[q] = zero + MGK_VSEL(A > B, one, tie) * g[q];
            } else {
                f[q] = g[q];
            }
            if (relu) f[q] = MGK_VSEL(v[k][q] > zero, one, zero) * (zero + f[q]);
            if (N->mode == MGK_SUM0) f[q] = zero + f[q];
        }
#if MGK_STRIDE2
        if (pairs) { /* k odd: the pair's second, stored with the first (k - 1) */
            MGK_UNROLL
            for (q = 0; q < MGK_NV; q++) {
                if (k & 1) {
                    h[q] = f[q];
                    continue;
                }
                mgk_vec lo = MGK_ILV_LO(f[q], h[q]), hi = MGK_ILV_HI(f[q], h[q]), a, b;
                if (N->mode != MGK_SUM0) {
                    MGK_VLOAD(a, ok + 2 * q * MGK_VW);
                    MGK_VLOAD(b, ok + 2 * q * MGK_VW + MGK_VW);
                    lo = a + lo;
                    hi = b + hi;
                }
                MGK_VSTORE(ok + 2 * q * MGK_VW, lo);
                MGK_VSTORE(ok + 2 * q * MGK_VW + MGK_VW, hi);
            }
            continue;
        }
#endif
        if (os == 1 && nv == MGK_LANES) {
            MGK_UNROLL
            for (q = 0; q < MGK_NV; q++) {
                mgk_vec a = f[q];
                if (N->mode != MGK_SUM0) {
                    MGK_VLOAD(a, ok + q * MGK_VW);
                    a = a + f[q];
                }
                MGK_VSTORE(ok + q * MGK_VW, a);
            }
        } else if (N->mode == MGK_SUM0) {
            for (l = 0; l < nv; l++) ok[l * os] = f[l / MGK_VW][l % MGK_VW];
        } else {
            for (l = 0; l < nv; l++) ok[l * os] = ok[l * os] + f[l / MGK_VW][l % MGK_VW];
        }
    }
}
#endif
MGK_HOT void mgk_maxr(const mgk_nest *N, const mgk_run *R, const int term, const int op,
                      const int pre) {
    /* every sample's: a max's values and gradients are a sample's own (reroll.c folds windows
     * of per-sample values alone), also where a table names them */
    const mgk_i64 *n = N->n, t = R->t, nb = R->nb > 1 ? R->nb : 1;
    const mgk_ref *O = &N->out, *X = N->x;
    mgk_i64 sm, i0, i1, i2, i3, r4, r5, r6, r7;
    if (n[4] * n[5] * n[6] * n[7] > MGK_MAXWIN) return; /* never made (reroll.c) */
    for (sm = 0; sm < nb; sm++) {
        const mgk_i64 so = sm * R->ss;
        for (i0 = 0; i0 < n[0]; i0++)
            for (i1 = 0; i1 < n[1]; i1++)
                for (i2 = 0; i2 < n[2]; i2++) {
                    i3 = 0;
#if MGK_VECTOR
                    if ((N->flags & MGK_F_BLOCK) && (!pre || pre == MGK_OP_RELU)) {
                        /* direct refs: a blocked nest has no tables */
                        const int relu = pre == MGK_OP_RELU;
                        mgk_real *o =
                            R->a[O->arr] + MGK_OPOS(O, t, i0, i1, i2, 0) + (MGK_PS(O) ? so : 0);
                        const mgk_real *x0 = R->a[X[0].arr] + MGK_OPOS(&X[0], t, i0, i1, i2, 0) +
                                             (MGK_PS(&X[0]) ? so : 0);
                        const mgk_real *x1 = R->a[X[1].arr] + MGK_OPOS(&X[1], t, i0, i1, i2, 0) +
                                             (MGK_PS(&X[1]) ? so : 0);
                        for (; i3 < n[3]; i3 += MGK_LANES) {
                            const mgk_i64 left = n[3] - i3, back = MGK_LANES - left;
                            if (left >= MGK_LANES)
                                mgk_maxr_block(N, term, relu, MGK_LANES, o, x0, x1);
                            else if (N->mode != MGK_ACC && n[3] >= MGK_LANES)
                                /* the row's last points as a whole block ending at its end: its
                                 * first lanes compute points the block before stored, and store
                                 * the same bits again (SET and SUM0 store, they do not add) */
                                mgk_maxr_block(N, term, relu, MGK_LANES, o - back * O->s[3],
                                               x0 - back * X[0].s[3], x1 - back * X[1].s[3]);
                            else /* the row's partial last block */
                                mgk_maxr_block(N, term, relu, (int)left, o, x0, x1);
                            o += MGK_LANES * O->s[3];
                            x0 += MGK_LANES * X[0].s[3];
                            x1 += MGK_LANES * X[1].s[3];
                        }
                        continue;
                    }
#endif
                    for (; i3 < n[3]; i3++) {
                        const mgk_i64 po = MGK_OPOS(O, t, i0, i1, i2, i3),
                                      p0 = MGK_OPOS(&X[0], t, i0, i1, i2, i3);
                        mgk_real x[MGK_MAXWIN], v[MGK_MAXWIN], m[MGK_MAXWIN], g;
                        mgk_i64 qo[MGK_MAXWIN];
                        int w = 0, k;
                        for (r4 = 0; r4 < n[4]; r4++)
                            for (r5 = 0; r5 < n[5]; r5++)
                                for (r6 = 0; r6 < n[6]; r6++)
                                    for (r7 = 0; r7 < n[7]; r7++, w++) {
                                        x[w] = *MGK_ATS(R, &X[0],
                                                        p0 + MGK_RPOS(&X[0], r4, r5, r6, r7), so);
                                        v[w] =
                                            pre ? (mgk_real)mgk_op_fwd(pre, x[w], 0, N->k) : x[w];
                                        m[w] =
                                            w ? (mgk_real)mgk_op_fwd(op, m[w - 1], v[w], 0) : v[w];
                                        qo[w] = po + MGK_RPOS(O, r4, r5, r6, r7);
                                    }
                        if (term == MGK_T_MAXR) {
                            *MGK_ATS(R, O, po, so) = m[w - 1];
                            continue;
                        }
                        g = *MGK_ATS(R, &X[1], MGK_OPOS(&X[1], t, i0, i1, i2, i3), so);
                        for (k = w - 1; k >= 0; k--) {
                            mgk_real gk =
                                k ? (mgk_real)mgk_op_db(op, m[k - 1], v[k], 0, m[k]) * g : g;
                            if (pre)
                                gk = (mgk_real)mgk_op_da(pre, x[k], 0, N->k, v[k]) *
                                     ((mgk_real)0 + gk);
                            mgk_real *const o = MGK_ATS(R, O, qo[k], so);
                            *o = N->mode == MGK_SUM0 ? (mgk_real)0 + gk : *o + gk;
                            if (k)
                                g = (mgk_real)0 +
                                    (mgk_real)mgk_op_da(op, m[k - 1], v[k], 0, m[k]) * g;
                        }
                    }
                }
    }
}
#if MGK_VECTOR
#undef MGK_MAXR_LOAD
#undef MGK_VMAX
#undef MGK_VSEL
#endif
#if MGK_STRIDE2
#undef MGK_ILV_LO
#undef MGK_ILV_HI
#endif

MGK_HOT void mgk_nest_path(const mgk_nest *N, const mgk_run *R, const int term, const int op,
                           const int small, const int ps, const int tile, const int block,
                           const mgk_i64 n3) {
    if (term == MGK_T_MAXR || term == MGK_T_DMAXR) {
        mgk_maxr(N, R, term, op, N->pre);
        return;
    }
    MGK_NEST_PATH_BODY
}

/* A nest function of generated code: the body above with the nest's descriptor, its term and op
 * and its paths as constants. The body's names are locals initialised from the arguments, so an
 * argument must not mention N, R, term, op, small, ps, tile, block or n3 (the emitter passes
 * `&mg_nests[k]`, `(const mgk_run *)r` and integer constants). */
#define MGK_NEST_PATH(N_, R_, term_, op_, small_, ps_, tile_, block_, n3_)                         \
    do {                                                                                           \
        const mgk_nest *const N = (N_);                                                            \
        const mgk_run *const R = (R_);                                                             \
        const int term = (term_), op = (op_), small = (small_), ps = (ps_), tile = (tile_),        \
                  block = (block_);                                                                \
        const mgk_i64 n3 = (n3_);                                                                  \
        if (term == MGK_T_MAXR || term == MGK_T_DMAXR) {                                           \
            mgk_maxr(N, R, term, op, N->pre);                                                      \
        } else {                                                                                   \
            MGK_NEST_PATH_BODY                                                                     \
        }                                                                                          \
    } while (0)

/* The same, the paths taken read from the descriptor (the interpreter's instances). */
MGK_HOT void mgk_nest_shape(const mgk_nest *N, const mgk_run *R, const int term, const int op,
                            const int small) {
    mgk_nest_path(N, R, term, op, small, MGK_PS(&N->out), MGK_TILE_KIND(N),
                  (N->flags & MGK_F_BLOCK) != 0, N->n[3]);
}

#endif /* MGK_NEST_KERNELS_H */
