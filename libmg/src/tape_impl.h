/* Internal layout of tapes, shared by the freezer/interpreter (tape.c) and the emitter (emit.c). */
#ifndef MG_TAPE_IMPL_H
#define MG_TAPE_IMPL_H

#include "graph_impl.h"
#include "mg/tape.h"

/* Instruction kinds: a graph op, or a loop the raising pass recovered. */
enum { MG_K_OP = 0, MG_K_MAP = 1, MG_K_MATVEC = 2 };

/* One instruction. MG_K_OP elementwise: out = op(d[a], d[b], k); variadic: operands are the `len`
 * slots at idx[a], `k` is the term count n, `flags` has MG_FLAG_BIAS for DOT with a bias.
 * MG_K_MAP: d[out + j] = op(d[a + j], k) for j < b (a unary op over a run of slots).
 * MG_K_MATVEC: the raised layer mvs[a]. */
typedef struct mg_instr {
    uint8_t op;
    uint8_t flags;
    uint16_t kind;
    uint32_t out;
    uint32_t a;
    uint32_t b; /* elementwise: second operand slot; variadic: len */
    double k;
} mg_instr;

struct mg_tape {
    mg_allocator alloc;
    size_t nslots, nparams, ninputs, ntargets, nconsts, noutputs;
    size_t first_op;      /* slots [first_op, nslots) hold op results */
    size_t ninstr;        /* instructions, topological order */
    size_t nloss_instr;   /* the first nloss_instr instructions are the loss's cone */
    int has_loss;
    uint32_t loss;        /* loss slot */
    mg_instr *instr;
    mgk_idx *idx;         /* operand slots of variadic instructions */
    size_t nidx;
    mgk_idx *outputs;     /* output slots */
    double *data, *grad;  /* data[nslots], grad[nslots] */
    mg_value **param_values; /* for write-back: the frozen parameters and their serials */
    uint64_t *param_serials;
    uint64_t graph_id;
    mgk_layout layout;
    mgk_mv *mvs;          /* raised layers */
    size_t nmv, npacked;
    mgk_idx *free_params; /* parameters outside the packed blocks */
    size_t nfree;
    double *pw, *pg;      /* packed weights and their gradients (npacked each) */
    mgk_ctx kctx;         /* what kernels receive */
    mg_tape_forward_fn fwd;
    mg_tape_backward_fn bwd;
    mg_tape_outer_fn outer; /* NULL: libmg's mgk_mv_outer_step */
};

#endif /* MG_TAPE_IMPL_H */
