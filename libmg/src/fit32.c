/* The training driver (drive.h) over float32 slot arrays: code emitted with float32 storage
 * (mg_emit_options.float32) runs every nest; libmg runs the programs, the batches, the threads and
 * SGD over its arrays as for double ones (the variadic ops, the losses, run kernels.h's float32
 * instances, which accumulate in double). */
#define _POSIX_C_SOURCE 200809L /* sched_yield */
#define MGK_REAL float
#define MGK_REAL_BYTES 4
#define MGK_LANES 16 /* as the emitter writes float32 code: the arrays' padding follows */
#include "ir.h"

_Static_assert(MG_F32_PAD >= MGK_PAD, "attach pads the float32 arrays for these blocks");

#define MG_DRV(name) mg_tape__##name##_f32
#define MG_DRV_LINK
#define MG_R_DATA(t) ((t)->data32)
#define MG_R_GRAD(t) ((t)->grad32)
#define MG_R_PW(t) ((t)->pw32)
#define MG_R_PG(t) ((t)->pg32)
/* attach checked that every nest has a kernel */
#define MG_RUN_NEST(t, k, R) (t)->kern[k]((const void *)(R))
#include "drive.h"

void mg_tape__f32_in(mg_tape *t, int what) {
    if (what & MG_F32_DATA)
        for (size_t i = 0; i < t->nslots; i++) t->data32[i] = (float)t->data[i];
    if (what & MG_F32_GRAD)
        for (size_t i = 0; i < t->nslots; i++) t->grad32[i] = (float)t->grad[i];
}

void mg_tape__f32_out(mg_tape *t, int what) {
    if (what & MG_F32_DATA)
        for (size_t i = 0; i < t->nslots; i++) t->data[i] = t->data32[i];
    if (what & MG_F32_GRAD)
        for (size_t i = 0; i < t->nslots; i++) t->grad[i] = t->grad32[i];
}
