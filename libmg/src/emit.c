/* The C emitter: a tape as self-contained C over the same slot layout. */
#include "tape_impl.h"

#include <stdio.h>
#include <string.h>

/* Raised whenever the generated code changes; part of compiled-code cache keys. */
#define MG_EMITTER_VERSION 3

int mg_emitter_version(void) { return MG_EMITTER_VERSION; }

/* The text of kernels.h, embedded at build time (see libmg/meson.build). */
extern const char mg__kernels_text[];

typedef struct sbuf {
    const mg_allocator *a;
    char *s;
    size_t len, cap;
    int failed;
} sbuf;

/* Room for `extra` more bytes plus the terminating NUL; 0 (and `failed` set) when out of memory. */
static int reserve(sbuf *b, size_t extra) {
    if (b->failed) return 0;
    if (b->len + extra + 1 <= b->cap) return 1;
    size_t nc = b->cap ? b->cap : 4096;
    while (nc < b->len + extra + 1) nc *= 2;
    char *ns = b->a->realloc_fn(b->s, nc, b->a->ctx);
    if (!ns) {
        b->failed = 1;
        return 0;
    }
    b->s = ns;
    b->cap = nc;
    return 1;
}

static void put(sbuf *b, const char *text, size_t n) {
    if (!reserve(b, n)) return;
    memcpy(b->s + b->len, text, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void puts_(sbuf *b, const char *text) { put(b, text, strlen(text)); }

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void putf(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        return;
    }
    if ((size_t)n < sizeof tmp) {
        put(b, tmp, (size_t)n);
        return;
    }
    /* longer than the scratch buffer: format again into the output itself */
    if (!reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* A double as a C expression that reads back exactly. */
static void put_double(sbuf *b, double x) {
    if (x != x) puts_(b, "NAN");
    else if (x == HUGE_VAL) puts_(b, "HUGE_VAL");
    else if (x == -HUGE_VAL) puts_(b, "(-HUGE_VAL)");
    else {
        char tmp[40];
        snprintf(tmp, sizeof tmp, "%.17g", x);
        puts_(b, tmp);
        if (!strpbrk(tmp, ".eE")) puts_(b, ".0");
    }
}

static int valid_prefix(const char *p) {
    if (!p || !*p) return 0;
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_')) return 0;
    for (; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_'))
            return 0;
    return 1;
}

/* Helpers for the elementwise ops the tape uses, from the op table's formula text. */
static void emit_op_helpers(sbuf *b, const mg_tape *t) {
    char used[MG_OP_COUNT] = {0};
    for (size_t i = 0; i < t->ninstr; i++) used[t->instr[i].op] = 1;
    for (int op = 0; op < MG_OP_COUNT; op++) {
        if (!used[op] || mg_op__arity[op] < 1) continue;
        const char *name = mg_op_name(op);
        putf(b, "static inline double mgf_%s(double A, double B, double K) {\n"
                "    (void)A; (void)B; (void)K;\n    return (%s);\n}\n",
             name, mg_op_formula(op, 0));
        putf(b, "static inline void mgd_%s(double A, double B, double K, double Y, double *dA, double *dB) {\n"
                "    (void)A; (void)B; (void)K; (void)Y;\n    *dA = (%s);\n    *dB = (%s);\n}\n",
             name, mg_op_formula(op, 1), mg_op_formula(op, 2));
    }
}

static void emit_index_table(sbuf *b, const mg_tape *t) {
    puts_(b, "static const mgk_idx mg_ix[] = {");
    for (size_t i = 0; i < t->nidx; i++)
        putf(b, "%s%u", i == 0 ? "\n    " : i % 16 ? ", " : ",\n    ", (unsigned)t->idx[i]);
    puts_(b, t->nidx ? "\n};\n" : "0};\n");
}

static void emit_forward_body(sbuf *b, const mg_tape *t) {
    for (size_t i = 0; i < t->ninstr; i++) {
        const mg_instr *p = &t->instr[i];
        size_t n = mg_op__arity[p->op] < 0 ? (size_t)p->k : 0; /* k is a count only for variadic ops */
        int ar = mg_op__arity[p->op];
        if (p->kind == MG_K_MATVEC) {
            const mgk_mv *v = &t->mvs[p->a];
            putf(b, "    mgk_mv_fwd(d, c->pw, %u, %u, %u, %u, %u, %u, %u);\n", v->m, v->n, v->b0, v->ldb,
                 v->x0, v->out0, v->p0);
        } else if (p->kind == MG_K_MAP) {
            putf(b, "    for (j = 0; j < %u; j++) d[%u + j] = mgf_%s(d[%u + j], 0.0, ", p->b, p->out,
                 mg_op_name(p->op), p->a);
            put_double(b, p->k);
            puts_(b, ");\n");
        } else if (ar == 2) {
            putf(b, "    d[%u] = mgf_%s(d[%u], d[%u], 0.0);\n", p->out, mg_op_name(p->op), p->a, p->b);
        } else if (ar == 1) {
            putf(b, "    d[%u] = mgf_%s(d[%u], 0.0, ", p->out, mg_op_name(p->op), p->a);
            put_double(b, p->k);
            puts_(b, ");\n");
        } else {
            switch ((mg_op)p->op) {
            case MG_OP_SUM: putf(b, "    d[%u] = mgk_sum_fwd(d, mg_ix + %u, %u);\n", p->out, p->a, p->b); break;
            case MG_OP_DOT:
                putf(b, "    d[%u] = mgk_dot_fwd(d, mg_ix + %u, %zu, %d);\n", p->out, p->a, n,
                     (p->flags & MG_FLAG_BIAS) != 0);
                break;
            case MG_OP_MSE: putf(b, "    d[%u] = mgk_mse_fwd(d, mg_ix + %u, %zu);\n", p->out, p->a, n); break;
            case MG_OP_HINGE: putf(b, "    d[%u] = mgk_hinge_fwd(d, mg_ix + %u, %zu);\n", p->out, p->a, n); break;
            case MG_OP_XENT: putf(b, "    d[%u] = mgk_xent_fwd(d, mg_ix + %u, %zu);\n", p->out, p->a, n); break;
            case MG_OP_LEAF:
                MG_ELEMENTWISE_CASES
            case MG_OP_COUNT: break;
            }
        }
    }
}

static void emit_backward_body(sbuf *b, const mg_tape *t) {
    putf(b, "    const mgk_ctx *c = (const mgk_ctx *)ctx;\n    size_t i, j;\n    double dA, dB;\n"
            "    (void)c; (void)j; (void)dA; (void)dB;\n"
            "    for (i = %zu; i < %zu; i++) g[i] = 0.0;\n", t->nparams, t->nslots);
    if (t->has_loss) putf(b, "    g[%u] += 1.0;\n", t->loss);
    for (size_t i = t->nloss_instr; i-- > 0;) {
        const mg_instr *p = &t->instr[i];
        size_t n = mg_op__arity[p->op] < 0 ? (size_t)p->k : 0; /* k is a count only for variadic ops */
        int ar = mg_op__arity[p->op];
        if (p->kind == MG_K_MATVEC) {
            const mgk_mv *v = &t->mvs[p->a];
            putf(b, "    mgk_mv_bwd(d, g, c->pw, c->pg, %u, %u, %u, %u, %u, %u, %u, %u, c->lr, c->rec, %u);\n",
                 v->m, v->n, v->b0, v->ldb, v->x0, v->out0, v->p0, v->need_gx, v->roff);
        } else if (p->kind == MG_K_MAP) {
            putf(b, "    for (j = %u; j-- > 0;) {\n        mgd_%s(d[%u + j], 0.0, ", p->b, mg_op_name(p->op), p->a);
            put_double(b, p->k);
            putf(b, ", d[%u + j], &dA, &dB);\n        g[%u + j] += dA * g[%u + j];\n    }\n", p->out, p->a, p->out);
        } else if (ar == 2) {
            putf(b, "    mgd_%s(d[%u], d[%u], 0.0, d[%u], &dA, &dB);\n"
                    "    g[%u] += dA * g[%u];\n    g[%u] += dB * g[%u];\n",
                 mg_op_name(p->op), p->a, p->b, p->out, p->a, p->out, p->b, p->out);
        } else if (ar == 1) {
            putf(b, "    mgd_%s(d[%u], 0.0, ", mg_op_name(p->op), p->a);
            put_double(b, p->k);
            putf(b, ", d[%u], &dA, &dB);\n    g[%u] += dA * g[%u];\n", p->out, p->a, p->out);
        } else {
            switch ((mg_op)p->op) {
            case MG_OP_SUM: putf(b, "    mgk_sum_bwd(g, mg_ix + %u, %u, g[%u]);\n", p->a, p->b, p->out); break;
            case MG_OP_DOT:
                putf(b, "    mgk_dot_bwd(d, g, mg_ix + %u, %zu, %d, g[%u]);\n", p->a, n,
                     (p->flags & MG_FLAG_BIAS) != 0, p->out);
                break;
            case MG_OP_MSE: putf(b, "    mgk_mse_bwd(d, g, mg_ix + %u, %zu, g[%u]);\n", p->a, n, p->out); break;
            case MG_OP_HINGE: putf(b, "    mgk_hinge_bwd(d, g, mg_ix + %u, %zu, g[%u]);\n", p->a, n, p->out); break;
            case MG_OP_XENT: putf(b, "    mgk_xent_bwd(d, g, mg_ix + %u, %zu, g[%u]);\n", p->a, n, p->out); break;
            case MG_OP_LEAF:
                MG_ELEMENTWISE_CASES
            case MG_OP_COUNT: break;
            }
        }
    }
}

/* The raised layers, the free parameters and the layout the driver runs on. */
static void emit_layout_tables(sbuf *b, const mg_tape *t) {
    puts_(b, "static const mgk_mv mg_mvs[] = {");
    for (size_t i = 0; i < t->nmv; i++) {
        const mgk_mv *v = &t->mvs[i];
        putf(b, "%s\n    {%u, %u, %u, %u, %u, %u, %u, %u, %u, %u, %u}", i ? "," : "", v->m, v->n, v->w0,
             v->ldw, v->b0, v->ldb, v->x0, v->out0, v->p0, v->need_gx, v->roff);
    }
    puts_(b, t->nmv ? "\n};\n" : "{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}};\n");
    puts_(b, "static const mgk_idx mg_free[] = {");
    int ranges = t->nmv != 0;
    if (ranges)
        for (size_t i = 0; i < t->nfree; i++)
            putf(b, "%s%u", i == 0 ? "\n    " : i % 16 ? ", " : ",\n    ", (unsigned)t->free_params[i]);
    puts_(b, ranges && t->nfree ? "\n};\n" : "0};\n");
    putf(b, "static const mgk_layout mg_layout = {%zu, %zu, %zu, %zu, %zu, %zu, %zu, %u, mg_out_slots,\n"
            "    mg_mvs, %zu, %zu, mg_free, %zu, %zu};\n",
         t->nslots, t->nparams, t->ninputs, t->ntargets, t->noutputs, t->nparams, t->nparams + t->ninputs,
         (unsigned)t->loss, t->nmv, t->npacked, t->nmv ? t->nfree : (size_t)0, t->layout.nrec);
}

/* Constant slots' values (and, inference-only, the parameters') as a table plus a loader. */
static void emit_init_table(sbuf *b, const mg_tape *t, int with_params) {
    size_t from = with_params ? 0 : t->nparams + t->ninputs + t->ntargets;
    size_t c0 = t->nparams + t->ninputs + t->ntargets;
    puts_(b, "static const double mg_init_values[] = {");
    size_t k = 0;
    for (size_t s = from; s < t->first_op; s++) {
        if (s >= t->nparams && s < c0) continue; /* inputs and targets come from samples */
        puts_(b, k == 0 ? "\n    " : k % 4 ? ", " : ",\n    ");
        put_double(b, t->data[s]);
        k++;
    }
    puts_(b, k ? "\n};\n" : "0.0};\n");
    puts_(b, "static void mg_load_init(mgk_real *d) {\n    size_t s, k = 0;\n");
    if (with_params) putf(b, "    for (s = 0; s < %zu; s++) d[s] = mg_init_values[k++];\n", t->nparams);
    putf(b, "    for (s = %zu; s < %zu; s++) d[s] = mg_init_values[k++];\n    (void)k;\n}\n", c0, t->first_op);
}

char *mg_tape_emit_c(const mg_tape *t, const mg_emit_options *opt, size_t *len) {
    if (!t) return NULL;
    mg_emit_options o = {0};
    if (opt) o = *opt;
    const char *P = o.prefix ? o.prefix : "mgc_";
    if (!valid_prefix(P)) return NULL;
    sbuf b = {&t->alloc, NULL, 0, 0, 0};

    putf(&b, "/* Generated by libmg's C emitter (version %d). Do not edit.\n"
             " * %zu slots: parameters [0, %zu), inputs [%zu, %zu), targets [%zu, %zu),\n"
             " * constants [%zu, %zu), op results [%zu, %zu); %zu instructions. */\n",
         MG_EMITTER_VERSION, t->nslots, t->nparams, t->nparams, t->nparams + t->ninputs,
         t->nparams + t->ninputs, t->nparams + t->ninputs + t->ntargets,
         t->nparams + t->ninputs + t->ntargets, t->first_op, t->first_op, t->nslots, t->ninstr);
    if (o.float32 && !o.inference_only) puts_(&b, "#define MGK_REAL float /* float32 storage */\n");
    puts_(&b, mg__kernels_text);
    puts_(&b, "\n/* ---- the program ---- */\n");
    emit_op_helpers(&b, t);
    emit_index_table(&b, t);
    puts_(&b, "static const mgk_idx mg_out_slots[] = {");
    for (size_t i = 0; i < t->noutputs; i++) putf(&b, "%s%u", i ? ", " : "", (unsigned)t->outputs[i]);
    puts_(&b, t->noutputs ? "};\n" : "0};\n");
    emit_init_table(&b, t, o.inference_only);

    emit_layout_tables(&b, t);
    puts_(&b, "static void mg_forward(void *ctx, mgk_real *d) {\n"
              "    const mgk_ctx *c = (const mgk_ctx *)ctx;\n    size_t j;\n    (void)c; (void)j;\n");
    emit_forward_body(&b, t);
    puts_(&b, "}\n");

    if (o.inference_only) {
        putf(&b, "\n#define %sWORK %zu\n#define %sNINPUTS %zu\n#define %sNOUTPUTS %zu\n", P,
             t->nslots + t->npacked, P, t->ninputs, P, t->noutputs);
        putf(&b, "/* y[%zu] = model(x[%zu]); work holds %zu doubles, or is NULL to use a static\n"
                 " * buffer (then the call is not reentrant). */\n"
                 "void %sinfer(const double *x, double *y, mgk_real *work) {\n"
                 "    static mgk_real mg_static_work[%zu];\n"
                 "    mgk_real *d = work ? work : mg_static_work;\n    size_t i;\n"
                 "    mgk_ctx c;\n"
                 "    c.pw = d + %zu;\n    c.pg = NULL;\n    c.prog = NULL;\n    c.lr = 0.0;\n    c.rec = NULL;\n"
                 "    mg_load_init(d);\n"
                 "    mgk_pack(&mg_layout, d, c.pw);\n"
                 "    for (i = 0; i < %zu; i++) d[%zu + i] = x[i];\n"
                 "    mg_forward(&c, d);\n"
                 "    for (i = 0; i < %zu; i++) y[i] = d[mg_out_slots[i]];\n}\n",
             t->noutputs, t->ninputs, t->nslots + t->npacked, P, t->nslots + t->npacked + 1, t->nslots,
             t->ninputs, t->nparams, t->noutputs);
    } else {
        puts_(&b, "static void mg_backward(void *ctx, const mgk_real *d, mgk_real *g) {\n");
        emit_backward_body(&b, t);
        puts_(&b, "}\n");
        putf(&b,
             "\n/* ---- entry points ----\n"
             " * data and grad hold %snslots doubles each; packed and packed_grad hold %snpacked\n"
             " * (the raised layers' weights, transposed, while a call runs). */\n"
             "const size_t %snslots = %zu, %snparams = %zu, %sninputs = %zu, %sntargets = %zu, "
             "%snoutputs = %zu, %snpacked = %zu;\n"
             "const int %semitter_version = %d;\n"
             "const size_t %sreal_bytes = sizeof(mgk_real);\n"
             "/* Writes the constants; parameters are the caller's (slots [0, nparams)). */\n"
             "void %sinit(mgk_real *data) { mg_load_init(data); }\n"
             "/* Kernels for libmg's mg_tape_set_kernels(): ctx is an mgk_ctx (packed weights). */\n"
             "void %sforward(void *ctx, mgk_real *data) { mg_forward(ctx, data); }\n"
             "void %sbackward(void *ctx, const mgk_real *data, mgk_real *grad) { mg_backward(ctx, data, grad); }\n"
             "/* One epoch of SGD over rows of X and Y; returns the mean loss. */\n"
             "double %sfit_epoch(mgk_real *data, mgk_real *grad, mgk_real *packed, mgk_real *packed_grad,\n"
             "                   const double *X, const double *Y, size_t n, size_t batch, double lr,\n"
             "                   size_t *perm, int shuffle, unsigned long long seed, unsigned long long epoch) {\n"
             "    mgk_ctx c;\n    c.pw = packed;\n    c.pg = packed_grad;\n    c.prog = NULL;\n    c.lr = 0.0;\n    c.rec = NULL;\n"
             "    return mgk_fit_epoch(&mg_layout, mg_forward, mg_backward, &c, data, grad, X, Y, n,\n"
             "                         batch, lr, perm, shuffle, seed, epoch);\n}\n"
             "/* libmg's batch kernel, built for this machine (mg_tape_set_outer_kernel). */\n"
             "void %souter_step(mgk_real *pw, mgk_real *pg, size_t m, size_t n, size_t p0, const mgk_real *rec,\n"
             "                  size_t nrec, size_t roff, size_t batch, double scale, size_t i0, size_t i1) {\n"
             "    mgk_mv_outer_step(pw, pg, m, n, p0, rec, nrec, roff, batch, scale, i0, i1);\n}\n"
             "void %spredict(mgk_real *data, mgk_real *packed, const double *X, size_t n, double *out) {\n"
             "    mgk_ctx c;\n    c.pw = packed;\n    c.pg = NULL;\n    c.prog = NULL;\n    c.lr = 0.0;\n    c.rec = NULL;\n"
             "    mgk_predict(&mg_layout, mg_forward, &c, data, X, n, out);\n}\n",
             P, P, P, t->nslots, P, t->nparams, P, t->ninputs, P, t->ntargets, P, t->noutputs, P,
             t->npacked, P, MG_EMITTER_VERSION, P, P, P, P, P, P, P);
    }
    if (b.failed) {
        t->alloc.free_fn(b.s, t->alloc.ctx);
        return NULL;
    }
    if (len) *len = b.len;
    return b.s;
}

void mg_tape_free_source(const mg_tape *t, char *src) {
    if (t && src) t->alloc.free_fn(src, t->alloc.ctx);
}
