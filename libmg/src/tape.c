/* Tapes: lifetime, accessors, errors and the helpers every compiler stage allocates through. */
#include "ir.h"

#include <stdio.h>
#include <string.h>

int mg_tape__fail(mg_tape *t, int status, const char *fmt, ...) {
    if (!t) return status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->err, sizeof t->err, fmt, ap);
    va_end(ap);
    t->status = status;
    return status;
}

void *mg_tape__alloc(mg_tape *t, size_t count, size_t size) {
    if (count && size > SIZE_MAX / count) {
        mg_tape__fail(t, MG_ENOMEM, "allocation of %zu x %zu bytes overflows", count, size);
        return NULL;
    }
    size_t bytes = count * size;
    void *p = t->alloc.malloc_fn(bytes ? bytes : 1, t->alloc.ctx);
    if (!p) mg_tape__fail(t, MG_ENOMEM, "out of memory allocating %zu bytes", count * size);
    return p;
}

void *mg_tape__ws(mg_tape *t, int which, size_t count, size_t size, int *fresh) {
    if (count && size > SIZE_MAX / count) {
        mg_tape__fail(t, MG_ENOMEM, "allocation of %zu x %zu bytes overflows", count, size);
        return NULL;
    }
    const size_t want = count * size, bytes = want ? want : 1;
    if (t->ws[which] && t->ws_bytes[which] >= bytes) return t->ws[which];
    if (t->ws[which]) t->alloc.free_fn(t->ws[which], t->alloc.ctx);
    t->ws[which] = mg_tape__alloc(t, bytes, 1);
    t->ws_bytes[which] = t->ws[which] ? bytes : 0;
    if (fresh) *fresh = 1;
    return t->ws[which];
}

size_t mg_tape_trim(mg_tape *t) {
    size_t freed = 0;
    for (int i = 0; t && i < MG_WS_N; i++) {
        if (t->ws[i]) t->alloc.free_fn(t->ws[i], t->alloc.ctx);
        freed += t->ws_bytes[i];
        t->ws[i] = NULL;
        t->ws_bytes[i] = 0;
    }
    if (t) t->ws_pg_zero = 0;
    return freed;
}

int mg_tape__grow(mg_tape *t, void **buf, size_t *cap, size_t elem, size_t need) {
    if (need <= *cap) return 1;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem) {
            mg_tape__fail(t, MG_ENOMEM, "buffer size overflows");
            return 0;
        }
        nc *= 2;
    }
    void *p = t->alloc.realloc_fn(*buf, nc * elem, t->alloc.ctx);
    if (!p) {
        mg_tape__fail(t, MG_ENOMEM, "out of memory growing a buffer to %zu bytes", nc * elem);
        return 0;
    }
    *buf = p;
    *cap = nc;
    return 1;
}

int mg_tape__push_nest(mg_tape *t, size_t *cap, const mgk_nest *nest, const mg_nest_info *info) {
    size_t icap = *cap;
    if (!mg_tape__grow(t, (void **)&t->nests, cap, sizeof(mgk_nest), t->nnests + 1)) return 0;
    if (!mg_tape__grow(t, (void **)&t->info, &icap, sizeof(mg_nest_info), t->nnests + 1)) return 0;
    *cap = icap < *cap ? icap : *cap;
    t->nests[t->nnests] = *nest;
    t->info[t->nnests] = *info;
    t->nnests++;
    return 1;
}

int mg_tape__push_instr(mg_tape *t, mg_instr **prog, size_t *len, size_t *cap, const mg_instr *in) {
    if (!mg_tape__grow(t, (void **)prog, cap, sizeof(mg_instr), *len + 1)) return 0;
    (*prog)[(*len)++] = *in;
    return 1;
}

void mg_tape_free(mg_tape *t) {
    if (!t) return;
    mg_tape_trim(t);
    mg_allocator a = t->alloc;
    void *bufs[] = {t->outputs,  t->data,   t->grad,         t->nests,         t->info,
                    t->fwd,      t->bwd,    t->ix,           t->packs,         t->pw,
                    t->pg,       t->packed, t->param_values, t->param_serials, t->fused,
                    t->fused_p,  t->step_d, t->step_d1,      t->step_p1,       t->zero,
                    t->identity, t->data32, t->grad32,       t->pw32,          t->pg32,
                    t->pre,      t->in_perm};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) a.free_fn(bufs[i], a.ctx);
    a.free_fn(t, a.ctx);
}

const char *mg_tape_last_error(const mg_tape *t) { return t ? t->err : "no tape"; }

/* Every call that can fail clears `err` on entry and mg_tape__fail() sets both: a stale `status`
 * from an earlier failure is hidden by the empty message. */
int mg_tape_last_status(const mg_tape *t) {
    if (!t) return MG_EINVAL;
    return t->err[0] ? t->status : MG_OK;
}

size_t mg_tape_nslots(const mg_tape *t) { return t ? t->nslots : 0; }
size_t mg_tape_ninstr(const mg_tape *t) { return t ? t->nfwd : 0; }
size_t mg_tape_nparams(const mg_tape *t) { return t ? t->nparams : 0; }
size_t mg_tape_ninputs(const mg_tape *t) { return t ? t->ninputs : 0; }
size_t mg_tape_ntargets(const mg_tape *t) { return t ? t->ntargets : 0; }
size_t mg_tape_noutputs(const mg_tape *t) { return t ? t->noutputs : 0; }
int mg_tape_has_loss(const mg_tape *t) { return t && t->has_loss; }
double *mg_tape_data(mg_tape *t) { return t ? t->data : NULL; }
double *mg_tape_grad(mg_tape *t) { return t ? t->grad : NULL; }

int mg_tape_get_stats(const mg_tape *t, mg_tape_stats *out) {
    if (!t || !out) return MG_EINVAL;
    memset(out, 0, sizeof *out);
    out->nodes = t->nodes;
    out->statements = t->nstatements;
    out->forward_nests = t->nfwd_nests;
    out->backward_nests = t->nnests - t->nfwd_nests;
    out->loops = t->nseq;
    out->packed = t->npacked;
    out->rerolled = t->rerolled;
    out->deferred_steps = t->npre;
    out->hoisted = t->nhoisted;
    return MG_OK;
}

double mg_tape_loss(const mg_tape *t) { return t && t->has_loss ? t->data[t->loss] : NAN; }
size_t mg_tape_loss_slot(const mg_tape *t) { return t && t->has_loss ? t->loss : 0; }

void mg_tape_outputs(const mg_tape *t, double *out) {
    if (!t || !out) return;
    for (size_t i = 0; i < t->noutputs; i++) out[i] = t->data[t->outputs[i]];
}

size_t mg_tape_write_back(const mg_tape *t, mg_graph *g) {
    if (!t || !g || mg_ir__graph_id(g) != t->graph_id) return 0;
    size_t k = 0;
    for (size_t i = 0; i < t->nparams; i++)
        if (mg_value_is_live(t->param_values[i], t->param_serials[i])) {
            t->param_values[i]->data = t->data[i];
            k++;
        }
    return k;
}

unsigned long long mg_tape_fingerprint(const mg_tape *t) { return t ? t->fingerprint : 0; }

/* Whether `probe` (code built with its own flags) rounds w - lr * (o + a) otherwise than libmg,
 * which never contracts it: on operands where a fused multiply-add keeps the product's 2^-60
 * (float32: 2^-26) that rounding it first loses. */
static int step_rounds_otherwise(double (*probe)(double, double, double, double), int f32) {
    volatile double e =
        f32 ? 0x1p-13 : 0x1p-30; /* volatile: computed at run time, like the probe */
    const double w = 1.0, lr = 1.0 + e, o = 0.0, a = 1.0 - e;
    double own;
    if (f32) own = (double)((float)w - (float)lr * ((float)o + (float)a));
    else own = w - lr * (o + a);
    const double got = probe(w, lr, o, a);
    return memcmp(&own, &got, sizeof own) != 0;
}

int mg_tape_attach(mg_tape *t, const mg_compiled *c) {
    if (!t) return MG_EINVAL;
    t->err[0] = '\0';
    if (!c) return mg_tape__fail(t, MG_EINVAL, "attach: no compiled program");
    if (c->abi != MG_COMPILED_ABI)
        return mg_tape__fail(t, MG_EINVAL, "attach: compiled for ABI %u, libmg has %u", c->abi,
                             MG_COMPILED_ABI);
    if (c->real_bytes != sizeof(double) && c->real_bytes != sizeof(float))
        return mg_tape__fail(t, MG_EINVAL,
                             "attach: compiled for %u-byte slots; libmg runs 8 (double) or 4 "
                             "(float32)",
                             c->real_bytes);
    if (c->fingerprint != t->fingerprint || c->nnests != t->nnests)
        return mg_tape__fail(t, MG_EINVAL, "attach: the code was generated for another program");
    int f32 = c->real_bytes == sizeof(float);
    if (f32) {
        /* libmg's interpreter runs double slots only: float32 code must run every nest */
        for (size_t k = 0; k < t->nnests; k++)
            if (!c->kernels || !c->kernels[k])
                return mg_tape__fail(t, MG_EINVAL,
                                     "attach: float32 code must compile every nest, and nest %zu "
                                     "has no kernel (emit it with max_kernels >= %zu)",
                                     k, t->nnests);
        float **bufs[] = {&t->data32, &t->grad32, &t->pw32, &t->pg32};
        size_t lens[] = {t->nslots, t->nslots, t->npacked, t->npacked};
        for (size_t i = 0; i < 4; i++) {
            if (*bufs[i]) continue; /* kept from an earlier attach */
            *bufs[i] = mg_tape__alloc(t, lens[i] + MG_F32_PAD, sizeof(float));
            if (!*bufs[i]) return mg_tape__fail(t, MG_ENOMEM, "attach: out of memory");
            memset(*bufs[i], 0, (lens[i] + MG_F32_PAD) * sizeof(float));
        }
    }
    mg_tape_trim(t); /* the working buffers hold the other storage type's, or other modes' */
    t->kern = c->kernels;
    t->f32 = f32;
    t->kern_contracts = c->step_probe && step_rounds_otherwise(c->step_probe, f32);
    return MG_OK;
}

void mg_tape_detach(mg_tape *t) {
    if (!t) return;
    mg_tape_trim(t);
    t->kern = NULL;
    t->f32 = 0;
    t->kern_contracts = 0;
}
