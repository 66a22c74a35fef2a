/* The C emitter: a tape's programs as C over the same slot layout.
 *
 * Training code specialises the hottest nests (estimated terms per sample, within a budget):
 * each becomes a function that runs nest_kernels.h's kernel on a `static const` descriptor,
 * which the C compiler folds into loops with constant bounds and strides. libmg keeps walking
 * the programs and calls these functions for their nests (mg_tape_attach()); the other nests
 * run libmg's own instances of the same kernel. One function per nest keeps the compiler's work
 * linear in the number of nests (one large function is not).
 *
 * Inference-only code specialises every nest the outputs need and walks the forward program
 * itself, with the parameters inlined: it needs nothing but <math.h>. */
#include "ir.h"

#include <stdio.h>
#include <string.h>

/* Raised whenever the generated code changes; part of compiled-code cache keys. */
#define MG_EMITTER_VERSION 16
#define MG_DEFAULT_KERNELS 32

int mg_tape_emitter_version(void) { return MG_EMITTER_VERSION; }

/* The texts of kernels.h and nest_kernels.h, embedded at build time (see libmg/meson.build). */
extern const char mg__kernels_text[];
extern const char mg__nest_kernels_text[];

typedef struct sbuf {
    const mg_allocator *a;
    char *s;
    size_t len, cap;
    int failed;
} sbuf;

/* Room for `extra` more bytes plus the terminating NUL; 0 (and `failed` set) when out of memory. */
static int reserve(sbuf *b, size_t extra) {
    if (b->failed) return 0;
    if (extra > SIZE_MAX / 4 - b->len) {
        b->failed = 1;
        return 0;
    }
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
        if (!strpbrk(tmp, ".eEn")) puts_(b, ".0");
    }
}

static void put_int(sbuf *b, long long v) {
    if (v >= -2147483647LL && v <= 2147483647LL) putf(b, "%lld", v);
    else putf(b, "%lldLL", v);
}

static int valid_prefix(const char *p) {
    if (!p || !*p || strlen(p) > 64) return 0;
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_')) return 0;
    for (; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_'))
            return 0;
    return 1;
}

/* The op table's formulas as the functions nest_kernels.h calls. Their `pow` is the C library's
 * through a pointer the C compiler cannot see through: with the exponent a constant of the
 * descriptor, gcc would otherwise compute pow(x, 2.0) as x * x and pow(x, -1.0) as 1.0 / x, which
 * round differently from the library (and from libmg's interpreter) for about one x in a
 * thousand. */
static void emit_ops(sbuf *b) {
    puts_(b, "static double (*const volatile mgk_libm_pow)(double, double) = pow;\n"
             "#define pow(a, b) mgk_libm_pow(a, b)\n");
    static const char *const names[3] = {
        "mgk_op_fwd(int op, double A, double B, double K)",
        "mgk_op_da(int op, double A, double B, double K, double Y)",
        "mgk_op_db(int op, double A, double B, double K, double Y)"};
    for (int which = 0; which < 3; which++) {
        putf(b, "static inline double %s {\n    (void)A; (void)B; (void)K;%s\n    switch (op) {\n",
             names[which], which ? " (void)Y;" : "");
        for (int op = 0; op < MG_OP_COUNT; op++) {
            if (mg_op__arity[op] < 1) continue;
            putf(b, "    case %d: return (%s); /* %s */\n", op, mg_op_formula(op, which),
                 mg_op_name(op));
        }
        puts_(b, "    default: return NAN;\n    }\n}\n");
    }
    puts_(b, "#undef pow\n");
    /* the op a max's window may apply to its elements in vector blocks (nest_kernels.h) */
    putf(b, "#define MGK_OP_RELU %d\n", (int)MG_OP_RELU);
}

static void emit_ref(sbuf *b, const mgk_ref *X) {
    int last = -1;
    for (int d = 0; d < MGK_MAXD; d++)
        if (X->s[d]) last = d;
    if (!X->base && !X->ts && last < 0 && !X->arr && !X->gather) {
        puts_(b, "{0}");
        return;
    }
    puts_(b, "{");
    put_int(b, X->base);
    puts_(b, ", ");
    put_int(b, X->ts);
    puts_(b, ", {");
    for (int d = 0; d <= last; d++) {
        if (d) puts_(b, ", ");
        put_int(b, X->s[d]);
    }
    putf(b, "%s}, %d, %d}", last < 0 ? "0" : "", X->arr, X->gather);
}

static void emit_nest(sbuf *b, const mgk_nest *N) {
    putf(b, "    {%d, %d, %d, %d, %d, 0, ", N->mode, N->term, N->op, N->flags, N->pre);
    put_double(b, N->k);
    puts_(b, ", {");
    for (int d = 0; d < MGK_MAXD; d++) {
        if (d) puts_(b, ", ");
        put_int(b, N->n[d]);
    }
    puts_(b, "},\n     ");
    emit_ref(b, &N->out);
    puts_(b, ", ");
    emit_ref(b, &N->init);
    puts_(b, ",\n     {");
    for (int j = 0; j < 4; j++) {
        if (j) puts_(b, ", ");
        emit_ref(b, &N->x[j]);
    }
    puts_(b, "}}");
}

static void emit_ix(sbuf *b, const mg_tape *t) {
    puts_(b, "static const mgk_idx mg_ix[] = {");
    for (size_t i = 0; i < t->nix; i++)
        putf(b, "%s%u", i == 0 ? "\n    " : i % 16 ? ", " : ",\n    ", (unsigned)t->ix[i]);
    puts_(b, t->nix ? "\n};\n" : "0};\n");
}

/* A nest's call in libmg's interpreter costs about as much as this many of its terms (its set-up
 * with sizes and strides read at run time), which a specialised nest's constants save: a nest in
 * a sequential loop is called once per iteration. Counted, the GRU's elementwise gate nests (16
 * units, 27 steps) displace run-once gradient nests from its 32 (b1 1.06x, b32 1.01x, CPU time). */
#define MG_CALL_TERMS 256.0

/* A nest's estimated cost per sample in the interpreter: its terms and its calls. */
static double hot_score(const mg_nest_info *I) { return I->work + MG_CALL_TERMS * (double)I->seq; }

/* The nests to specialise: the `budget` hottest (hot_score), in nest order. */
static size_t pick_hot(const mg_tape *t, size_t budget, uint8_t *hot, int out_cone_only) {
    size_t picked = 0;
    memset(hot, 0, t->nnests);
    if (budget >= t->nnests) {
        for (size_t k = 0; k < t->nnests; k++)
            if (!out_cone_only || (k < t->nfwd_nests && t->info[k].out_cone)) hot[k] = 1, picked++;
        return picked;
    }
    for (size_t round = 0; round < budget; round++) {
        size_t best = SIZE_MAX;
        for (size_t k = 0; k < t->nnests; k++) {
            if (hot[k] || (out_cone_only && !(k < t->nfwd_nests && t->info[k].out_cone))) continue;
            if (best == SIZE_MAX || hot_score(&t->info[k]) > hot_score(&t->info[best])) best = k;
        }
        if (best == SIZE_MAX) break;
        hot[best] = 1;
        picked++;
    }
    return picked;
}

static void emit_header(sbuf *b, const mg_tape *t, int inference) {
    mg_tape_stats s;
    mg_tape_get_stats(t, &s);
    putf(b,
         "/* Generated by libmg's C emitter (version %d). Do not edit.\n"
         " * %s program %016llx: %zu statements, %zu forward and %zu backward\n"
         " * loop nests, %zu sequential loops. Slots: %zu (parameters [0, %zu), constants [%zu, "
         "%zu),\n"
         " * shared values [%zu, %zu), inputs [%zu, %zu), targets [%zu, %zu), values [%zu, %zu)). "
         "*/\n",
         MG_EMITTER_VERSION, inference ? "Inference" : "Training",
         (unsigned long long)t->fingerprint, s.statements, s.forward_nests, s.backward_nests,
         s.loops, t->nslots, t->nparams, t->const0, t->shared0, t->shared0, t->input0, t->input0,
         t->target0, t->target0, t->first_op, t->first_op, t->nslots);
}

/* Training code compiles as one file, or as MG_NPARTS files in parallel (micrograd_c's
 * toolchain does so where it has several cores). The emitter assigns the nest functions to the
 * parts for 2, 3 and 4 parts, balancing their estimated compile costs (kernel_cost); any other
 * count takes descriptor index modulo MG_NPARTS. Part 0 also holds the program table. */
static const char emit_parts_note[] =
    "/* Compile as one file, or as MG_NPARTS parts (-DMG_PART=p -DMG_NPARTS=n, p = 0 .. n-1) "
    "linked\n"
    " * together. MG_HAS(k, p2, p3, p4): the nest function of descriptor k is in part p2 of 2, p3 "
    "of 3,\n"
    " * p4 of 4, or k modulo n of any other n; part 0 also holds the program. */\n"
    "#ifdef MG_PART\n"
    "#define MG_HAS(k, p2, p3, p4)                                                             "
    "\\\n"
    "    ((MG_NPARTS == 2 ? (p2) : MG_NPARTS == 3 ? (p3) : MG_NPARTS == 4 ? (p4) : (k) % "
    "MG_NPARTS) == \\\n"
    "     MG_PART)\n"
    "#if defined(__GNUC__)\n#define MG_KFN __attribute__((visibility(\"hidden\")))\n#else\n#define "
    "MG_KFN\n#endif\n"
    "#else\n"
    "#define MG_HAS(k, p2, p3, p4) 1\n#define MG_KFN static\n"
    "#endif\n";

/* A nest function's compile cost, relative: gcc -O2's CPU time for it in hundredths of a second
 * on a 2 GHz Zen 1, fitted by least squares to compile times of random subsets of the functions of
 * seven model zoo families (benchmarks/zoo.py, 167 functions; benchmarks/compile_costs.py measures
 * them again). A nest whose samples run in register tiles (a dense layer's forward) keeps the
 * most code, 0.10-0.17 s; a matrix product over a shared output whose rows may run in bands (a
 * layer's weight gradient with fused SGD) about 0.11-0.17 s; other shared-output tiles, the rows
 * of each sample in tiles and a nest of points (no blocks; more with split sums or steps)
 * 0.04-0.16 s; every other nest 0.02-0.11 s. The previous weights, by tile kind alone, left one
 * part of the Elman RNN 0.45 s behind the other (now 0.05 s, simulated). Not refitted
 * after the row tiles changed (2026-11-27: a convolution's forward lost its tiles of samples and
 * costs 0.04-0.08 s; the split of cnn2 then fitted 0.94 / 1.12 s against an even 1.03 s). */
#define MG_KCOST_MAX 18
static size_t kernel_cost(const mgk_nest *N) {
    const int tile = MGK_TILE_KIND(N);
    if (tile == 1) return (N->flags & MGK_F_BAND) ? MG_KCOST_MAX : 10;
    if (tile == 2) return 16;
    if (tile == 3) return 7;
    if (!(N->flags & MGK_F_BLOCK))
        return ((N->flags & MGK_F_SPLIT) ? 8 : 5) + ((N->flags & MGK_F_STEP) ? 4 : 0);
    return 5;
}

/* The part of each of the `nk` nest functions (costs in `cost`) when there are `P` parts:
 * heaviest first, each to the least loaded part so far (the lowest on ties). */
static void assign_parts(const size_t *cost, size_t nk, unsigned P, uint8_t *part) {
    size_t load[4] = {0, 0, 0, 0};
    for (size_t w = MG_KCOST_MAX; w >= 1; w--)
        for (size_t j = 0; j < nk; j++) {
            if (cost[j] != w) continue;
            unsigned best = 0;
            for (unsigned q = 1; q < P; q++)
                if (load[q] < load[best]) best = q;
            part[j] = (uint8_t)best;
            load[best] += w;
        }
}

/* Specialised nests: descriptors and one function each. `map[k]` gets the descriptor index;
 * `cost` (one per nest) and `part` (three per nest) are scratch. */
static void emit_kernels(sbuf *b, const mg_tape *t, const uint8_t *hot, size_t *map, size_t *cost,
                         uint8_t *part) {
    size_t j = 0;
    puts_(b, "static const mgk_nest mg_nests[] = {\n");
    for (size_t k = 0; k < t->nnests; k++) {
        if (!hot[k]) continue;
        if (j) puts_(b, ",\n");
        putf(b, "    /* nest %zu */\n", k);
        emit_nest(b, &t->nests[k]);
        map[k] = j++;
    }
    puts_(b, j ? "\n};\n" : "    {0}\n};\n");
    for (size_t k = 0; k < t->nnests; k++)
        if (hot[k]) cost[map[k]] = kernel_cost(&t->nests[k]);
    for (unsigned P = 2; P <= 4; P++) assign_parts(cost, j, P, part + (P - 2) * j);
    for (size_t k = 0; k < t->nnests; k++)
        if (hot[k])
            putf(b,
                 "#if MG_HAS(%zu, %u, %u, %u)\n"
                 "MG_KFN void mg_k%zu(const void *r) {\n"
                 "    MGK_NEST_PATH(&mg_nests[%zu], (const mgk_run *)r, %d, %d, 0, %d, %d, "
                 "%d, %lld);\n}\n#endif\n",
                 map[k], (unsigned)part[map[k]], (unsigned)part[j + map[k]],
                 (unsigned)part[2 * j + map[k]], k, map[k], t->nests[k].term, t->nests[k].op,
                 MGK_PS(&t->nests[k].out) ? 1 : 0, (int)MGK_TILE_KIND(&t->nests[k]),
                 (t->nests[k].flags & MGK_F_BLOCK) ? 1 : 0, (long long)t->nests[k].n[3]);
}

/* The inference walker: the forward program's instructions the outputs need. */
static void emit_walk(sbuf *b, const mg_tape *t) {
    for (size_t i = 0; i < t->nfwd; i++) {
        const mg_instr *in = &t->fwd[i];
        if (in->kind == MG_I_SEQ) {
            if (!(in->cone & MG_FZ_OUT_CONE)) {
                i += in->a;
                continue;
            }
            putf(b, "    for (R.t = 0; R.t < %u; R.t++) {\n", in->b);
            for (size_t q = 1; q <= in->a; q++) {
                const mg_instr *bi = &t->fwd[i + q];
                if (bi->cone & MG_FZ_OUT_CONE) putf(b, "        mg_k%u(&R);\n", bi->a);
            }
            puts_(b, "    }\n    R.t = 0;\n");
            i += in->a;
            continue;
        }
        if (!(in->cone & MG_FZ_OUT_CONE)) continue;
        if (in->kind == MG_I_NEST) {
            putf(b, "    mg_k%u(&R);\n", in->a);
        } else if (in->kind == MG_I_NARY) {
            const char *fn = NULL;
            switch ((mg_op)in->op) {
            case MG_OP_SUM: fn = "mgk_sum_fwd(d, mg_ix + %u, %u)"; break;
            case MG_OP_DOT:
                fn = in->flags & MG_FLAG_BIAS ? "mgk_dot_fwd(d, mg_ix + %u, %u, 1)"
                                              : "mgk_dot_fwd(d, mg_ix + %u, %u, 0)";
                break;
            case MG_OP_MSE: fn = "mgk_mse_fwd(d, mg_ix + %u, %u)"; break;
            case MG_OP_HINGE: fn = "mgk_hinge_fwd(d, mg_ix + %u, %u)"; break;
            case MG_OP_XENT: fn = "mgk_xent_fwd(d, mg_ix + %u, %u)"; break;
            case MG_OP_LEAF: MG_ELEMENTWISE_CASES
            case MG_OP_COUNT: break;
            }
            if (!fn) continue;
            putf(b, "    d[%u] = ", in->out);
            putf(b, fn, in->a, in->op == MG_OP_SUM ? in->b : in->n);
            puts_(b, ";\n");
        }
    }
}

char *mg_tape_emit_c(mg_tape *t, const mg_emit_options *opt, size_t *len) {
    if (!t) return NULL;
    t->err[0] = '\0';
    mg_emit_options o;
    memset(&o, 0, sizeof o);
    if (opt) o = *opt;
    const char *P = o.prefix ? o.prefix : "mgc_";
    if (!valid_prefix(P)) {
        mg_tape__fail(t, MG_EINVAL,
                      "emit: the prefix must be a C identifier of at most 64 characters");
        return NULL;
    }
    int inference = o.inference_only != 0;
    int f32 = o.float32 && !inference;
    size_t budget = o.max_kernels ? o.max_kernels : MG_DEFAULT_KERNELS;
    if (inference) budget = SIZE_MAX;
    const size_t nn = t->nnests ? t->nnests : 1;
    uint8_t *hot = mg_tape__alloc(t, nn, 4);                 /* and the parts (emit_kernels) */
    size_t *map = mg_tape__alloc(t, nn, 2 * sizeof(size_t)); /* and the costs */
    sbuf b = {&t->alloc, NULL, 0, 0, 0};
    if (!hot || !map) goto fail;
    pick_hot(t, budget, hot, inference);

    emit_header(&b, t, inference);
    puts_(&b,
          inference ? "#define MG_HAS(k, p2, p3, p4) 1\n#define MG_KFN static\n" : emit_parts_note);
    if (f32) /* twice the lanes per block: the same vector registers hold 16 floats */
        puts_(&b, "#define MGK_REAL float /* float32 storage */\n#define MGK_REAL_BYTES 4\n"
                  "#define MGK_LANES 16\n");
    puts_(&b, mg__kernels_text);
    puts_(&b, "\n/* ---- the op table's formulas ---- */\n");
    emit_ops(&b);
    puts_(&b, "#define MGK_ELEM_ROWS 2 /* rows that end in a partial block (nest_kernels.h) */\n"
              "#define MGK_CONST_SHAPES 1 /* tiles for constant sizes (nest_kernels.h) */\n");
    puts_(&b, mg__nest_kernels_text);
    puts_(&b, "\n/* ---- the program's nests ---- */\n");
    emit_kernels(&b, t, hot, map, map + nn, hot + nn);

    if (inference) {
        emit_ix(&b, t); /* training code's nests read libmg's copy */
        /* parameters and constants inlined */
        puts_(&b, "static const double mg_init_values[] = {");
        for (size_t s = 0; s < t->input0; s++) {
            puts_(&b, s == 0 ? "\n    " : s % 4 ? ", " : ",\n    ");
            put_double(&b, t->data[s]);
        }
        puts_(&b, t->input0 ? "\n};\n" : "0.0};\n");
        if (t->npacked) { /* the weights the nests read packed (schedule.c), with the padding */
            double *pv = mg_tape__alloc(t, t->npacked, sizeof(double));
            if (!pv) goto fail;
            mg_tape__packed_values(t, pv);
            putf(&b, "static double mg_packed_values[%zu] = {", t->npacked + MGK_PAD);
            for (size_t q = 0; q < t->npacked; q++) {
                puts_(&b, q == 0 ? "\n    " : q % 4 ? ", " : ",\n    ");
                put_double(&b, pv[q]);
            }
            puts_(&b, "\n};\n");
            t->alloc.free_fn(pv, t->alloc.ctx);
        }
        putf(&b, "static const mgk_idx mg_out_slots[] = {");
        for (size_t i = 0; i < t->noutputs; i++)
            putf(&b, "%s%u", i ? ", " : "", (unsigned)t->outputs[i]);
        puts_(&b, t->noutputs ? "};\n" : "0};\n");
        if (t->in_perm) { /* the column of x each input slot holds (reroll.c's input layout) */
            puts_(&b, "static const mgk_idx mg_in_cols[] = {");
            for (size_t i = 0; i < t->ninputs; i++)
                putf(&b, "%s%u",
                     i == 0   ? "\n    "
                     : i % 16 ? ", "
                              : ",\n    ",
                     (unsigned)t->in_perm[i]);
            puts_(&b, "\n};\n");
        }
        putf(&b, "\n#define %sWORK %zu\n#define %sNINPUTS %zu\n#define %sNOUTPUTS %zu\n", P,
             t->nslots + MGK_PAD, P, t->ninputs, P, t->noutputs);
        putf(&b,
             "/* y[%zu] = model(x[%zu]). work holds %sWORK doubles, or is NULL to use a static "
             "buffer\n"
             " * (then the call is not reentrant). */\n"
             "void %sinfer(const double *x, double *y, double *work) {\n"
             "    static double mg_static_work[%zu];\n"
             "    double *d = work ? work : mg_static_work;\n"
             "    size_t i;\n"
             "    mgk_run R;\n"
             "    R.a[MGK_D] = d;\n    R.a[MGK_G] = R.a[MGK_PG] = R.a[MGK_BG] = NULL;\n"
             "    R.a[MGK_QD] = R.a[MGK_QG] = NULL; /* no pre-steps in inference */\n"
             "    R.a[MGK_PW] = %s; /* read only */\n"
             "    R.a[MGK_BD] = d + %zu; /* one sample: its slots follow the shared ones */\n"
             "    R.ix = mg_ix;\n    R.t = 0;\n    R.nb = 1;\n    R.ss = 0;\n    R.lr = 0.0;\n"
             "    R.og[0] = R.og[1] = NULL;\n    R.first = R.bstep = 0;\n"
             "    R.lo2 = R.hi2 = 0; /* every row */\n"
             "    for (i = 0; i < %zu; i++) d[i] = mg_init_values[i];\n"
             "    for (i = 0; i < %zu; i++) d[%zu + i] = x[%s];\n",
             t->noutputs, t->ninputs, P, P, t->nslots + MGK_PAD,
             t->npacked ? "mg_packed_values" : "NULL", t->input0, t->input0, t->ninputs, t->input0,
             t->in_perm ? "mg_in_cols[i]" : "i");
        emit_walk(&b, t);
        putf(&b, "    for (i = 0; i < %zu; i++) y[i] = d[mg_out_slots[i]];\n}\n", t->noutputs);
    } else {
        puts_(&b,
              "\n/* ---- entry point: what mg_tape_attach() takes (libmg's mg_compiled) ---- */\n"
              "typedef void (*mg_kernel_fn_t)(const void *);\n"
              "typedef struct mg_compiled_t {\n    unsigned abi, real_bytes;\n    unsigned long "
              "long fingerprint;\n"
              "    size_t nnests;\n    const mg_kernel_fn_t *kernels;\n"
              "    double (*step_probe)(double, double, double, double);\n} mg_compiled_t;\n");
        puts_(&b, "#ifdef MG_PART\n");
        for (size_t k = 0; k < t->nnests; k++)
            if (hot[k]) putf(&b, "MG_KFN void mg_k%zu(const void *r);\n", k);
        puts_(&b, "#endif\n#if !defined(MG_PART) || MG_PART == 0\n");
        putf(&b, "static const mg_kernel_fn_t mg_kernels[%zu] = {", t->nnests ? t->nnests : 1);
        int first = 1;
        for (size_t k = 0; k < t->nnests; k++)
            if (hot[k]) {
                putf(&b, "%s[%zu] = mg_k%zu", first ? "\n    " : ",\n    ", k, k);
                first = 0;
            }
        puts_(&b, first ? "0};\n" : "\n};\n");
        puts_(&b, "/* the fused steps' arithmetic as these flags compile it (mg_compiled) */\n"
                  "static double mg_step_probe(double w, double lr, double o, double a) {\n"
                  "    const mgk_real W = (mgk_real)w, L = (mgk_real)lr, O = (mgk_real)o, A = "
                  "(mgk_real)a;\n    return (double)(W - L * (O + A));\n}\n");
        putf(&b,
             "const mg_compiled_t %sprogram = {%d, (unsigned)sizeof(mgk_real), 0x%016llxULL, %zu, "
             "mg_kernels, mg_step_probe};\n"
             "const int %semitter_version = %d;\n#endif\n",
             P, MG_COMPILED_ABI, (unsigned long long)t->fingerprint, t->nnests, P,
             MG_EMITTER_VERSION);
    }
    if (b.failed) goto fail;
    t->alloc.free_fn(hot, t->alloc.ctx);
    t->alloc.free_fn(map, t->alloc.ctx);
    if (len) *len = b.len;
    return b.s;
fail:
    if (hot) t->alloc.free_fn(hot, t->alloc.ctx);
    if (map) t->alloc.free_fn(map, t->alloc.ctx);
    if (b.s) t->alloc.free_fn(b.s, t->alloc.ctx);
    if (t->status == MG_OK || !t->err[0]) mg_tape__fail(t, MG_ENOMEM, "emit: out of memory");
    return NULL;
}

/* ---- a readable listing -----------------------------------------------------------------------
 */

static const char *const arr_names[MGK_NARR] = {"data",   "grad",        "packed", "packed_grad",
                                                "sample", "sample_grad", "kept",   "kept_grad"};
static const char *const mode_names[4] = {"=", "= 0 +", "= init +", "+="};

static void describe_ref(sbuf *b, const mgk_nest *N, const mgk_ref *X, const char *name) {
    static const char *const idx[MGK_MAXD] = {"i0", "i1", "i2", "i3", "r0", "r1", "r2", "r3"};
    putf(b, "%s%s[%s%lld", name, X->gather ? "@table" : "", X->gather ? "" : arr_names[X->arr],
         (long long)X->base);
    if (X->ts) putf(b, " %+lld*t", (long long)X->ts);
    for (int d = 0; d < MGK_MAXD; d++)
        if (N->n[d] > 1 && X->s[d]) putf(b, " %+lld*%s", (long long)X->s[d], idx[d]);
    puts_(b, "]");
}

static void describe_nest(sbuf *b, const mg_tape *t, size_t k, const char *indent) {
    const mgk_nest *N = &t->nests[k];
    static const char *const term_names[MGK_NTERMS] = {"x0",    "x0*x1", "op",  "dA*x3",
                                                       "dB*x3", "max",   "max'"};
    putf(b, "%snest %zu: (", indent, k);
    int first = 1;
    for (int d = 0; d < MGK_MAXO; d++)
        if (N->n[d] > 1) putf(b, "%s%lld", first ? "" : ", ", (long long)N->n[d]), first = 0;
    puts_(b, " | ");
    first = 1;
    for (int d = MGK_MAXO; d < MGK_MAXD; d++)
        if (N->n[d] != 1) putf(b, "%s%lld", first ? "" : ", ", (long long)N->n[d]), first = 0;
    putf(b, ") %s ", N->mode == MGK_SET ? "set" : N->mode == MGK_ACC ? "acc" : "sum");
    describe_ref(b, N, &N->out, "out");
    putf(b, " %s %s", mode_names[N->mode],
         N->term >= MGK_T_OP && N->term <= MGK_T_DB ? mg_op_name(N->op) : term_names[N->term]);
    if (N->term >= MGK_T_MAXR) puts_(b, " over r");
    if (N->term >= MGK_T_MAXR && N->pre) putf(b, " of %s", mg_op_name(N->pre));
    if (N->term == MGK_T_DA || N->term == MGK_T_DB) puts_(b, N->term == MGK_T_DA ? "'A" : "'B");
    puts_(b, "  ");
    if (N->mode == MGK_SUMI) {
        describe_ref(b, N, &N->init, "init");
        puts_(b, " ");
    }
    static const char *const xn[4] = {"x0", "x1", "x2", "x3"};
    int nx = N->term == MGK_T_ONE || N->term == MGK_T_MAXR    ? 1
             : N->term == MGK_T_MUL || N->term == MGK_T_DMAXR ? 2
             : N->term == MGK_T_OP                            ? mg_op__arity[N->op]
                                                              : 4;
    for (int j = 0; j < nx; j++) {
        describe_ref(b, N, &N->x[j], xn[j]);
        puts_(b, " ");
    }
    static const char *const tiles[4] = {"", " [tiles: rows]", " [tiles: samples of a batch]",
                                         " [tiles: rows of each sample]"};
    putf(b, "%s%s%s%s%s%s%s%s%s\n", N->flags & MGK_F_BLOCK ? " [blocks]" : "",
         tiles[MGK_TILE_KIND(N)], N->flags & MGK_F_SPLIT ? " [split sums]" : "",
         N->flags & MGK_F_STEP ? " [fused SGD]" : "",
         N->flags & MGK_F_BAND ? " [bandable rows]" : "",
         t->info[k].pre ? " [waits for the next forward]" : "",
         N->flags & MGK_F_PRESTEP ? " [steps its weights first]" : "",
         N->flags & MGK_F_SCATTER ? " [scatter]" : "", t->kern && t->kern[k] ? " [compiled]" : "");
}

static void describe_prog(sbuf *b, const mg_tape *t, const mg_instr *prog, size_t len) {
    for (size_t i = 0; i < len; i++) {
        const mg_instr *in = &prog[i];
        if (in->kind == MG_I_SEQ) {
            putf(b, "  loop t = %s %u:\n", in->flags ? "reversed, over" : "0 ..", in->b);
            for (size_t q = 1; q <= in->a; q++)
                if (prog[i + q].kind == MG_I_NEST) describe_nest(b, t, prog[i + q].a, "    ");
            i += in->a;
        } else if (in->kind == MG_I_NEST) {
            describe_nest(b, t, in->a, "  ");
        } else {
            putf(b, "  %s %s over %u operands -> slot %u\n", mg_op_name(in->op),
                 in->kind == MG_I_NARY ? "" : "(gradient)", in->b, in->out);
        }
    }
}

char *mg_tape_describe(mg_tape *t, size_t *len) {
    if (!t) return NULL;
    mg_tape_stats s;
    mg_tape_get_stats(t, &s);
    sbuf b = {&t->alloc, NULL, 0, 0, 0};
    putf(&b,
         "%zu values -> %zu statements -> %zu forward and %zu backward loop nests, %zu sequential "
         "loops\n"
         "slots: parameters [0, %zu), constants [%zu, %zu), ",
         s.nodes, s.statements, s.forward_nests, s.backward_nests, s.loops, t->nparams, t->const0,
         t->shared0);
    if (t->shared0 < t->input0)
        putf(&b, "shared values [%zu, %zu) (once per batch: %s), ", t->shared0, t->input0,
             t->nsh_fwd ? "the first forward and last backward instructions that touch no sample"
                        : "no, every sample computes them");
    putf(&b, "inputs [%zu, %zu), targets [%zu, %zu), values [%zu, %zu); %zu parameters packed%s\n",
         t->input0, t->target0, t->target0, t->first_op, t->first_op, t->nslots, t->npacked,
         t->in_perm ? "; inputs stored in the order the program reads them" : "");
    puts_(&b, "forward:\n");
    describe_prog(&b, t, t->fwd, t->nfwd);
    if (t->has_loss) {
        puts_(&b, "backward:\n");
        describe_prog(&b, t, t->bwd, t->nbwd);
    }
    if (b.failed) {
        if (b.s) t->alloc.free_fn(b.s, t->alloc.ctx);
        return NULL;
    }
    if (len) *len = b.len;
    return b.s;
}

void mg_tape_free_source(const mg_tape *t, char *src) {
    if (t && src) t->alloc.free_fn(src, t->alloc.ctx);
}
