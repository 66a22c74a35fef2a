/* Neurons, layers and MLPs over graph values. */
#include "graph_impl.h"
#include "mg/nn.h"

#include <math.h>
#include <string.h>

/* ---- structs ----------------------------------------------------------------------------- */

/* Structs hold their parameters as (pointer, serial) pairs, as Python handles do: a restore to a
 * checkpoint older than the struct releases the parameters and lets new values reuse the slots,
 * and only the serial tells the two apart. Every use checks them first. */
struct mg_neuron {
    mg_graph *g;
    size_t nin;
    mg_activation act;
    mg_value *b;
    uint64_t bs;  /* b's serial */
    mg_value **w; /* w[nin] */
    uint64_t *ws; /* ws[nin]: the weights' serials */
};

struct mg_layer {
    mg_graph *g;
    size_t nin, nout;
    mg_neuron **neurons; /* neurons[nout] */
};

struct mg_mlp {
    mg_graph *g;
    size_t nin, nlayers;
    mg_layer **layers; /* layers[nlayers] */
    size_t max_width;
};

/* ---- the activation table ---------------------------------------------------------------- */

#define MG__ACT_NAME(id, name, op) name,
static const char *const act_names[MG_ACT_COUNT] = {MG_ACTIVATION_LIST(MG__ACT_NAME)};
#define MG__ACT_OP(id, name, op) op,
static const int act_ops[MG_ACT_COUNT] = {MG_ACTIVATION_LIST(MG__ACT_OP)};

const char *mg_activation_name(int act) {
    return act >= 0 && act < MG_ACT_COUNT ? act_names[act] : NULL;
}
int mg_activation_op(int act) { return act >= 0 && act < MG_ACT_COUNT ? act_ops[act] : -1; }

int mg_activation_from_name(const char *name) {
    if (!name) return -1;
    for (int a = 0; a < MG_ACT_COUNT; a++)
        if (strcmp(act_names[a], name) == 0) return a;
    return -1;
}

static int valid_act(mg_activation act) { return (int)act >= 0 && act < MG_ACT_COUNT; }

static mg_value *activate(mg_graph *g, mg_activation act, mg_value *x) {
    int op = mg_activation_op(act);
    return op < 0 ? x : mg_apply(g, op, x, NULL, 0.0);
}

/* Largest input or neuron count: keeps every array size and parameter count far from overflow. */
#define MG_NN_MAX (SIZE_MAX / sizeof(mg_value *) / 4)

/* Whether every parameter is still the value the neuron created (not released by a restore). */
static int neuron_live(const mg_neuron *n) {
    if (!mg_value_is_live(n->b, n->bs)) return 0;
    for (size_t i = 0; i < n->nin; i++)
        if (!mg_value_is_live(n->w[i], n->ws[i])) return 0;
    return 1;
}

static int layer_live(const mg_layer *l) {
    for (size_t i = 0; i < l->nout; i++)
        if (!neuron_live(l->neurons[i])) return 0;
    return 1;
}

static int mlp_live(const mg_mlp *m) {
    for (size_t i = 0; i < m->nlayers; i++)
        if (!layer_live(m->layers[i])) return 0;
    return 1;
}

int mg_neuron_is_live(const mg_neuron *n) { return n && neuron_live(n); }
int mg_layer_is_live(const mg_layer *l) { return l && layer_live(l); }
int mg_mlp_is_live(const mg_mlp *m) { return m && mlp_live(m); }

static int released(mg_graph *g, const char *what) {
    return mg_graph__fail(g, MG_EINVAL,
                          "%s: a parameter was released (restored to a checkpoint saved before the "
                          "model was created); the model can no longer be used",
                          what);
}

/* Frees the struct and drops its parameter references; the parameters themselves stay in the
 * graph (they are leaves; restore or graph_free reclaims them). A parameter a restore released is
 * not released again: its slot may hold another value now. */
void mg_neuron_free(mg_neuron *n) {
    if (!n) return;
    mg_graph *g = n->g;
    if (n->w && n->ws)
        for (size_t i = 0; i < n->nin; i++)
            if (mg_value_is_live(n->w[i], n->ws[i])) mg_value_release(g, n->w[i]);
    if (mg_value_is_live(n->b, n->bs)) mg_value_release(g, n->b);
    mg_graph__free(g, n->w);
    mg_graph__free(g, n->ws);
    mg_graph__free(g, n);
}

mg_neuron *mg_neuron_new(mg_graph *g, size_t nin, mg_activation act, mg_init init, mg_rng *rng) {
    if (!g) return NULL;
    if (!valid_act(act) || (init != MG_INIT_UNIFORM && init != MG_INIT_SCALED)) {
        mg_graph__fail(g, MG_EINVAL, "mg_neuron_new: bad activation or init");
        return NULL;
    }
    if (nin == 0) {
        mg_graph__fail(g, MG_EINVAL, "mg_neuron_new: a neuron needs at least one input");
        return NULL;
    }
    if (nin > MG_NN_MAX) {
        mg_graph__fail(g, MG_ERANGE, "mg_neuron_new: %zu inputs is too many", nin);
        return NULL;
    }
    mg_graph_checkpoint cp = mg_graph_save(g);
    mg_neuron *n = mg_graph__malloc(g, sizeof *n);
    if (!n) return NULL;
    memset(n, 0, sizeof *n);
    n->g = g;
    n->act = act;
    n->w = mg_graph__malloc(g, nin * sizeof(mg_value *)); /* no overflow: nin <= MG_NN_MAX */
    if (!n->w) goto fail;
    n->ws = mg_graph__malloc(g, nin * sizeof(uint64_t));
    if (!n->ws) goto fail;
    double scale = init == MG_INIT_SCALED && nin > 0 ? 1.0 / sqrt((double)nin) : 1.0;
    for (size_t i = 0; i < nin; i++) {
        double x = rng ? mg_rng_uniform(rng, -1.0, 1.0) * scale : 0.0;
        mg_value *w = mg_scalar(g, x);
        if (!w) goto fail;
        mg_value_retain(w);
        n->ws[n->nin] = mg_value_serial(w);
        n->w[n->nin++] = w;
    }
    n->b = mg_scalar(g, 0.0);
    if (!n->b) goto fail;
    mg_value_retain(n->b);
    n->bs = mg_value_serial(n->b);
    return n;
fail:
    /* roll back: drop the references, then free the parameters created so far */
    mg_neuron_free(n);
    mg_graph_restore(g, cp);
    return NULL;
}

/* The neuron on `x`, its parameters known to be live. */
static mg_value *neuron_apply(mg_graph *g, const mg_neuron *n, mg_value *const *x) {
    mg_graph_checkpoint cp = mg_graph_save(g);
    mg_value *act = mg_affine(g, n->w, x, n->nin, n->b);
    mg_value *y = act ? activate(g, n->act, act) : NULL;
    if (!y) mg_graph_restore(g, cp);
    return y;
}

mg_value *mg_neuron_call(mg_graph *g, const mg_neuron *n, mg_value *const *x) {
    if (!g || !n) return NULL;
    if (n->g != g) {
        mg_graph__fail(g, MG_EINVAL, "mg_neuron_call: neuron belongs to another graph");
        return NULL;
    }
    if (n->nin && !x) {
        mg_graph__fail(g, MG_EINVAL, "mg_neuron_call: NULL input array");
        return NULL;
    }
    if (!neuron_live(n)) {
        released(g, "mg_neuron_call");
        return NULL;
    }
    return neuron_apply(g, n, x);
}

size_t mg_neuron_param_count(const mg_neuron *n) { return n ? n->nin + 1 : 0; }

static size_t neuron_params(const mg_neuron *n, mg_value **out) {
    memcpy(out, n->w, n->nin * sizeof(mg_value *));
    out[n->nin] = n->b;
    return n->nin + 1;
}

size_t mg_neuron_params(const mg_neuron *n, mg_value **out) {
    if (!n || !out) return 0;
    if (!neuron_live(n)) return released(n->g, "mg_neuron_params"), 0;
    return neuron_params(n, out);
}

size_t mg_neuron_nin(const mg_neuron *n) { return n ? n->nin : 0; }
mg_activation mg_neuron_activation(const mg_neuron *n) { return n ? n->act : MG_ACT_LINEAR; }

void mg_neuron_set_activation(mg_neuron *n, mg_activation act) {
    if (n && valid_act(act)) n->act = act;
}

/* ---- layers ------------------------------------------------------------------------------ */

void mg_layer_free(mg_layer *l) {
    if (!l) return;
    if (l->neurons)
        for (size_t i = 0; i < l->nout; i++) mg_neuron_free(l->neurons[i]);
    mg_graph__free(l->g, l->neurons);
    mg_graph__free(l->g, l);
}

mg_layer *mg_layer_new(mg_graph *g, size_t nin, size_t nout, mg_activation act, mg_init init,
                       mg_rng *rng) {
    if (!g) return NULL;
    if (nout == 0) {
        mg_graph__fail(g, MG_EINVAL, "mg_layer_new: a layer needs at least one neuron");
        return NULL;
    }
    if (nin == 0) {
        mg_graph__fail(g, MG_EINVAL, "mg_layer_new: a layer needs at least one input");
        return NULL;
    }
    if (nin > MG_NN_MAX || nout > MG_NN_MAX) {
        mg_graph__fail(g, MG_ERANGE, "mg_layer_new: %zu x %zu weights is too many", nout, nin);
        return NULL;
    }
    mg_graph_checkpoint cp = mg_graph_save(g);
    mg_layer *l = mg_graph__malloc(g, sizeof *l);
    if (!l) return NULL;
    l->g = g;
    l->nin = nin;
    l->nout = 0;
    l->neurons = mg_graph__malloc(g, nout * sizeof(mg_neuron *));
    if (!l->neurons) goto fail;
    for (size_t i = 0; i < nout; i++) {
        mg_neuron *n = mg_neuron_new(g, nin, act, init, rng);
        if (!n) goto fail;
        l->neurons[l->nout++] = n;
    }
    return l;
fail:
    mg_layer_free(l);
    mg_graph_restore(g, cp);
    return NULL;
}

/* The layer on `x` (checked here: an MLP's first layer gets the caller's) into `out`, its
 * parameters known to be live; `who` names the public call in error messages. */
static int layer_apply(mg_graph *g, const mg_layer *l, mg_value *const *x, mg_value **out,
                       const char *who) {
    if (!x) return mg_graph__fail(g, MG_EINVAL, "%s: NULL input array", who);
    for (size_t i = 0; i < l->nin; i++)
        if (!x[i]) return mg_graph__fail(g, MG_EINVAL, "%s: input %zu is NULL", who, i);
    mg_graph_checkpoint cp = mg_graph_save(g);
    for (size_t i = 0; i < l->nout; i++) {
        out[i] = neuron_apply(g, l->neurons[i], x);
        if (!out[i]) {
            mg_graph_restore(g, cp);
            if (g->status == MG_OK) return mg_graph__fail(g, MG_EINVAL, "%s: bad input", who);
            return g->status;
        }
    }
    return MG_OK;
}

int mg_layer_call(mg_graph *g, const mg_layer *l, mg_value *const *x, mg_value **out) {
    if (!g) return MG_EINVAL;
    if (!l || !out) return mg_graph__fail(g, MG_EINVAL, "mg_layer_call: NULL argument");
    if (l->g != g)
        return mg_graph__fail(g, MG_EINVAL, "mg_layer_call: layer belongs to another graph");
    if (!layer_live(l)) return released(g, "mg_layer_call");
    return layer_apply(g, l, x, out, "mg_layer_call");
}

size_t mg_layer_param_count(const mg_layer *l) { return l ? l->nout * (l->nin + 1) : 0; }

static size_t layer_params(const mg_layer *l, mg_value **out) {
    size_t k = 0;
    for (size_t i = 0; i < l->nout; i++) k += neuron_params(l->neurons[i], out + k);
    return k;
}

size_t mg_layer_params(const mg_layer *l, mg_value **out) {
    if (!l || !out) return 0;
    if (!layer_live(l)) return released(l->g, "mg_layer_params"), 0;
    return layer_params(l, out);
}

size_t mg_layer_nin(const mg_layer *l) { return l ? l->nin : 0; }
size_t mg_layer_nout(const mg_layer *l) { return l ? l->nout : 0; }
mg_neuron *mg_layer_neuron(const mg_layer *l, size_t i) {
    return l && i < l->nout ? l->neurons[i] : NULL;
}

/* ---- MLPs -------------------------------------------------------------------------------- */

void mg_mlp_free(mg_mlp *m) {
    if (!m) return;
    if (m->layers)
        for (size_t i = 0; i < m->nlayers; i++) mg_layer_free(m->layers[i]);
    mg_graph__free(m->g, m->layers);
    mg_graph__free(m->g, m);
}

mg_mlp *mg_mlp_new(mg_graph *g, size_t nin, const size_t *nouts, size_t nlayers, mg_activation act,
                   mg_init init, mg_rng *rng) {
    if (!g) return NULL;
    if (nlayers == 0 || !nouts) {
        mg_graph__fail(g, MG_EINVAL, "mg_mlp_new: an MLP needs at least one layer");
        return NULL;
    }
    if (nin == 0) {
        mg_graph__fail(g, MG_EINVAL, "mg_mlp_new: an MLP needs at least one input");
        return NULL;
    }
    if (nlayers > MG_NN_MAX) { /* before nouts is read: the count may not be its length */
        mg_graph__fail(g, MG_EINVAL, "mg_mlp_new: %zu layers is too many", nlayers);
        return NULL;
    }
    if (nin > MG_NN_MAX) {
        mg_graph__fail(g, MG_ERANGE, "mg_mlp_new: %zu inputs is too many", nin);
        return NULL;
    }
    for (size_t i = 0; i < nlayers; i++) {
        if (nouts[i] == 0) {
            mg_graph__fail(g, MG_EINVAL, "mg_mlp_new: layer %zu has zero width", i);
            return NULL;
        }
        if (nouts[i] > MG_NN_MAX) {
            mg_graph__fail(g, MG_ERANGE, "mg_mlp_new: layer %zu has %zu neurons, too many", i,
                           nouts[i]);
            return NULL;
        }
    }
    mg_graph_checkpoint cp = mg_graph_save(g);
    mg_mlp *m = mg_graph__malloc(g, sizeof *m);
    if (!m) return NULL;
    m->g = g;
    m->nin = nin;
    m->nlayers = 0;
    m->max_width = nin;
    m->layers = mg_graph__malloc(g, nlayers * sizeof(mg_layer *));
    if (!m->layers) goto fail;
    for (size_t i = 0; i < nlayers; i++) {
        size_t in = i == 0 ? nin : nouts[i - 1];
        mg_layer *l =
            mg_layer_new(g, in, nouts[i], i + 1 == nlayers ? MG_ACT_LINEAR : act, init, rng);
        if (!l) goto fail;
        m->layers[m->nlayers++] = l;
        if (nouts[i] > m->max_width) m->max_width = nouts[i];
    }
    return m;
fail:
    mg_mlp_free(m);
    mg_graph_restore(g, cp);
    return NULL;
}

int mg_mlp_call(mg_graph *g, const mg_mlp *m, mg_value *const *x, mg_value **out) {
    if (!g) return MG_EINVAL;
    if (!m || !out) return mg_graph__fail(g, MG_EINVAL, "mg_mlp_call: NULL argument");
    if (m->g != g) return mg_graph__fail(g, MG_EINVAL, "mg_mlp_call: MLP belongs to another graph");
    if (!mlp_live(m)) return released(g, "mg_mlp_call");
    mg_graph_checkpoint cp = mg_graph_save(g);
    /* two ping-pong buffers of the widest layer hold the activations between layers;
     * max_width <= MG_NN_MAX, so the size cannot wrap */
    mg_value **buf = mg_graph__malloc(g, 2 * m->max_width * sizeof(mg_value *));
    if (!buf) return MG_ENOMEM;
    mg_value *const *in = x;
    int st = MG_OK;
    for (size_t i = 0; i < m->nlayers && st == MG_OK; i++) {
        mg_value **dst = i + 1 == m->nlayers ? out : buf + (i % 2) * m->max_width;
        st = layer_apply(g, m->layers[i], in, dst, "mg_mlp_call");
        in = dst;
    }
    mg_graph__free(g, buf);
    if (st != MG_OK) mg_graph_restore(g, cp);
    return st;
}

size_t mg_mlp_param_count(const mg_mlp *m) {
    size_t k = 0;
    if (m)
        for (size_t i = 0; i < m->nlayers; i++) k += mg_layer_param_count(m->layers[i]);
    return k;
}

size_t mg_mlp_params(const mg_mlp *m, mg_value **out) {
    if (!m || !out) return 0;
    if (!mlp_live(m)) return released(m->g, "mg_mlp_params"), 0;
    size_t k = 0;
    for (size_t i = 0; i < m->nlayers; i++) k += layer_params(m->layers[i], out + k);
    return k;
}

size_t mg_mlp_nin(const mg_mlp *m) { return m ? m->nin : 0; }
size_t mg_mlp_nout(const mg_mlp *m) {
    return m && m->nlayers ? m->layers[m->nlayers - 1]->nout : 0;
}
size_t mg_mlp_nlayers(const mg_mlp *m) { return m ? m->nlayers : 0; }
mg_layer *mg_mlp_layer(const mg_mlp *m, size_t i) {
    return m && i < m->nlayers ? m->layers[i] : NULL;
}
