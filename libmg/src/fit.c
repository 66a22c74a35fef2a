/* The training driver over double slot arrays (drive.h), and the public entry points, which run
 * it, or fit32.c's float32 instance when the attached code has float32 storage. */
#define _POSIX_C_SOURCE 200809L /* sched_yield */
#include "ir.h"

#define MG_DRV(name) mg_tape__##name##_f64
#define MG_DRV_LINK static
#define MG_R_DATA(t) ((t)->data)
#define MG_R_GRAD(t) ((t)->grad)
#define MG_R_PW(t) ((t)->pw)
#define MG_R_PG(t) ((t)->pg)
#define MG_RUN_NEST(t, k, R) mg_ir__run_nest(t, k, R)
#include "drive.h"

/* A float32 call: the tape's double arrays it reads in (rounded), the call, and the arrays it
 * writes out. A call that fails has changed nothing (it fails before it runs), so the double
 * arrays keep their values, unrounded. */
#define MG_F32_CALL(t, in, out, call)                                                              \
    do {                                                                                           \
        mg_tape__f32_in(t, in);                                                                    \
        int st_ = (call);                                                                          \
        if (st_ == MG_OK) mg_tape__f32_out(t, out);                                                \
        return st_;                                                                                \
    } while (0)

enum { D_ = MG_F32_DATA, G_ = MG_F32_GRAD };

int mg_tape_forward(mg_tape *t, const double *x, const double *y) {
    if (t && t->f32) MG_F32_CALL(t, D_, D_, mg_tape__forward_f32(t, x, y));
    return mg_tape__forward_f64(t, x, y);
}

int mg_tape_backward(mg_tape *t) {
    if (t && t->f32) MG_F32_CALL(t, D_ | G_, G_, mg_tape__backward_f32(t));
    return mg_tape__backward_f64(t);
}

int mg_tape_step(mg_tape *t, double lr, size_t count) {
    if (t && t->f32) MG_F32_CALL(t, D_ | G_, D_ | G_, mg_tape__step_f32(t, lr, count));
    return mg_tape__step_f64(t, lr, count);
}

int mg_tape_predict(mg_tape *t, const double *X, size_t n, double *out) {
    if (t && t->f32) MG_F32_CALL(t, D_, D_, mg_tape__predict_f32(t, X, n, out));
    return mg_tape__predict_f64(t, X, n, out);
}

int mg_tape_fit(mg_tape *t, const double *X, const double *Y, size_t n, const mg_fit_options *opt,
                double *mean_loss) {
    if (t && t->f32) MG_F32_CALL(t, D_, D_ | G_, mg_tape__fit_f32(t, X, Y, n, opt, mean_loss));
    return mg_tape__fit_f64(t, X, Y, n, opt, mean_loss);
}
