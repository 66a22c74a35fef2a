// micrograd_c._core: thin bindings over libmg. One C call per binding; the pure-Python layer
// (micrograd_c.engine, .nn, .functional) is the public API.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "value.hpp"

extern "C" {
#include <mg/tape.h>
}

namespace py = pybind11;
using mgpy::graph;

namespace {

[[noreturn]] void throw_graph_error(const char *what) {
    mgpy::raise_graph_error(what);
    throw py::error_already_set();
}

// Nodes for a sequence of Values and numbers, in two phases, because converting a number may run
// Python code (its __float__), and that code may change the sequence, drop Values or restore a
// checkpoint:
// 1. the constructor copies the sequence into a tuple (which holds a reference to every item,
//    whatever the callback does to the sequence) and converts every number;
// 2. resolve() (or resolve_all() over every sequence an op reads) looks the Values up (the
//    liveness check) and makes the numbers constant leaves. No Python code runs from there to the
//    C call that uses the nodes.
// At destruction each constant's temporary reference is dropped, which frees it unless an op now
// uses it.
class Nodes {
  public:
    explicit Nodes(py::handle seq, const char *what) {
        if (!PySequence_Check(seq.ptr()))
            throw py::type_error(std::string(what) + ": expected a sequence");
        items = py::reinterpret_steal<py::tuple>(PySequence_Tuple(seq.ptr()));
        if (!items) throw py::error_already_set();
        size_t n = items.size();
        numbers.resize(n);
        for (size_t i = 0; i < n; i++) {
            PyObject *o = PyTuple_GET_ITEM(items.ptr(), (Py_ssize_t)i);
            if (!mgpy::is_value(o) && !mgpy::as_number(o, &numbers[i])) {
                if (PyErr_ExceptionMatches(PyExc_TypeError)) {
                    PyErr_Clear();
                    throw py::type_error(std::string(what) +
                                         ": expected Values or real numbers, got " +
                                         Py_TYPE(o)->tp_name);
                }
                throw py::error_already_set();
            }
        }
    }
    void resolve() {
        size_t n = items.size();
        v.reserve(n);
        for (size_t i = 0; i < n; i++) {
            PyObject *o = PyTuple_GET_ITEM(items.ptr(), (Py_ssize_t)i);
            mg_value *node = mgpy::is_value(o)
                                 ? mgpy::live(reinterpret_cast<mgpy::ValueObject *>(o))
                                 : mgpy::constant(numbers[i]);
            if (!node) throw py::error_already_set();
            if (!mgpy::is_value(o)) {
                mg_value_retain(node);
                consts.push_back(node);
            }
            v.push_back(node);
        }
    }
    size_t size() const { return items.size(); }
    ~Nodes() {
        for (mg_value *c : consts) mg_value_release(graph(), c);
    }
    Nodes(const Nodes &) = delete;
    Nodes &operator=(const Nodes &) = delete;
    std::vector<mg_value *> v; // after resolve()

  private:
    py::tuple items;
    std::vector<double> numbers;
    std::vector<mg_value *> consts;
};

template <class... N>
void resolve_all(N &...nodes) {
    (nodes.resolve(), ...);
}

// A size argument: an integer (anything with __index__) in [min, SIZE_MAX], else a one-line
// TypeError or ValueError in micrograd_c's words.
size_t count_arg(py::handle o, const char *what, const char *name, size_t min) {
    if (!PyIndex_Check(o.ptr()))
        throw py::type_error(std::string(what) + ": " + name + " must be an integer, not " +
                             Py_TYPE(o.ptr())->tp_name);
    py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(o.ptr()));
    if (!i) throw py::error_already_set();
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    if (overflow > 0 || (v > 0 && (unsigned long long)v > (unsigned long long)SIZE_MAX))
        throw py::value_error(std::string(what) + ": " + name + " " +
                              py::str(i).cast<std::string>() + " is too many");
    if (overflow < 0 || v < (long long)min)
        throw py::value_error(std::string(what) + ": " + name + " must be at least " +
                              std::to_string(min) + ", got " + py::str(i).cast<std::string>());
    return (size_t)v;
}

py::object wrap(mg_value *v, const char *what) {
    if (!v) throw_graph_error(what);
    PyObject *o = mgpy::wrap(v);
    if (!o) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(o);
}

// Handles for n nodes: the serials are read before the first handle is allocated (allocation
// may run Python code that releases nodes: see mgpy::wrap_serial).
py::list wrap_all(mg_value *const *v, size_t n, const char *what) {
    std::vector<uint64_t> serials(n);
    for (size_t i = 0; i < n; i++) {
        if (!v[i]) throw_graph_error(what);
        serials[i] = mg_value_serial(v[i]);
    }
    py::list out(n);
    for (size_t i = 0; i < n; i++) {
        PyObject *o = mgpy::wrap_serial(v[i], serials[i]);
        if (!o) throw py::error_already_set();
        PyList_SET_ITEM(out.ptr(), (Py_ssize_t)i, o);
    }
    return out;
}

mg_value *node_of(py::handle o, const char *what) {
    if (!mgpy::is_value(o.ptr())) throw py::type_error(std::string(what) + ": expected a Value");
    mg_value *v = mgpy::as_node(o.ptr());
    if (!v) throw py::error_already_set();
    return v;
}

void check_len(size_t a, size_t b, const char *what) {
    if (a != b)
        throw py::value_error(std::string(what) + ": the two sequences have lengths " +
                              std::to_string(a) + " and " + std::to_string(b));
}

mg_activation activation_of(py::handle o) {
    if (!PyUnicode_Check(o.ptr()))
        throw py::type_error(std::string("activation must be a string, not ") +
                             Py_TYPE(o.ptr())->tp_name);
    std::string name = o.cast<std::string>();
    int a = mg_activation_from_name(name.c_str());
    if (a < 0) {
        std::string known;
        for (int i = 0; i < MG_ACT_COUNT; i++)
            known += std::string(i ? ", " : "") + mg_activation_name(i);
        throw py::value_error("unknown activation '" + name + "' (expected one of " + known + ")");
    }
    return static_cast<mg_activation>(a);
}

const char *activation_name(mg_activation a) { return mg_activation_name(a); }

// ---- nn: C structs shared between an owner and the views into it -------------------------

using Owner = std::shared_ptr<void>;

// Raises StaleValueError when a model's parameters were released (see mg_mlp_is_live).
void require_live(int live) {
    if (live) return;
    mgpy::set_stale_model_error();
    throw py::error_already_set();
}

// Converts `values` (which may run Python code: array conversion calls __float__), then checks
// the model and writes: nothing runs between the check and the writes.
template <class M>
void set_param_data(const M &m, py::handle values, const char *what) {
    auto arr = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(values);
    if (!arr) {
        PyErr_Clear();
        throw py::type_error(std::string(what) + ": expected an array of numbers");
    }
    std::vector<mg_value *> ps = m.params();
    if ((size_t)arr.size() != ps.size())
        throw py::value_error(std::string(what) + ": expected " + std::to_string(ps.size()) +
                              " parameters, got " + std::to_string(arr.size()));
    const double *d = arr.data();
    for (size_t i = 0; i < ps.size(); i++) mg_value_set_data(ps[i], d[i]);
}

py::array_t<double> get_param_data(const std::vector<mg_value *> &ps) {
    py::array_t<double> out(ps.size());
    double *d = out.mutable_data();
    for (size_t i = 0; i < ps.size(); i++) d[i] = mg_value_data(ps[i]);
    return out;
}

py::array_t<double> get_param_grad(const std::vector<mg_value *> &ps) {
    py::array_t<double> out(ps.size());
    double *d = out.mutable_data();
    for (size_t i = 0; i < ps.size(); i++) d[i] = mg_value_grad(ps[i]);
    return out;
}

// The structs' parameters, after checking that none was released (StaleValueError otherwise).
struct Neuron {
    Owner owner;
    mg_neuron *n;
    int live() const { return mg_neuron_is_live(n); }
    std::vector<mg_value *> params() const {
        require_live(live());
        std::vector<mg_value *> p(mg_neuron_param_count(n));
        mg_neuron_params(n, p.data());
        return p;
    }
};

struct Layer {
    Owner owner;
    mg_layer *l;
    int live() const { return mg_layer_is_live(l); }
    std::vector<mg_value *> params() const {
        require_live(live());
        std::vector<mg_value *> p(mg_layer_param_count(l));
        mg_layer_params(l, p.data());
        return p;
    }
};

struct MLP {
    Owner owner;
    mg_mlp *m;
    int live() const { return mg_mlp_is_live(m); }
    std::vector<mg_value *> params() const {
        require_live(live());
        std::vector<mg_value *> p(mg_mlp_param_count(m));
        mg_mlp_params(m, p.data());
        return p;
    }
};

template <class M>
py::object call_layerlike(const M &model, size_t nin, size_t nout, py::handle x, const char *what,
                          int (*call)(mg_graph *, const void *, mg_value *const *, mg_value **),
                          const void *obj) {
    Nodes in(x, what);
    if (in.size() != nin)
        throw py::value_error(std::string(what) + ": expected " + std::to_string(nin) +
                              " inputs, got " + std::to_string(in.size()));
    in.resolve();
    require_live(model.live());
    std::vector<mg_value *> out(nout);
    if (call(graph(), obj, in.v.data(), out.data()) != MG_OK) throw_graph_error(what);
    return wrap_all(out.data(), nout, what);
}

int layer_call(mg_graph *g, const void *l, mg_value *const *x, mg_value **out) {
    return mg_layer_call(g, static_cast<const mg_layer *>(l), x, out);
}
int mlp_call(mg_graph *g, const void *m, mg_value *const *x, mg_value **out) {
    return mg_mlp_call(g, static_cast<const mg_mlp *>(m), x, out);
}

// ---- frozen programs -------------------------------------------------------------------------

using Array = py::array_t<double, py::array::c_style | py::array::forcecast>;
using Array32 = py::array_t<float, py::array::c_style | py::array::forcecast>;

struct Tape {
    std::unique_ptr<mg_tape, void (*)(mg_tape *)> t{nullptr, mg_tape_free};
    std::mutex run;           // one C call at a time: the GIL is released while C runs
    py::object kernels_owner; // keeps a loaded compiled library alive
};

// The tape's run lock for a call that keeps the GIL (it writes Values, or builds Python objects
// from tape state): waited for without the GIL, since a fit holds the lock for a whole epoch
// without it. So write_back copies the parameters between epochs, never in the middle of one.
std::unique_lock<std::mutex> lock_run(Tape &tp) {
    std::unique_lock<std::mutex> lock(tp.run, std::defer_lock);
    py::gil_scoped_release nogil;
    lock.lock();
    return lock;
}

// Whether X is an array of 4-byte floats (any such dtype: an unpickled array's dtype is equal to
// float32's, not it), which fit reads as floats and predict widens a block at a time.
bool float32_rows(py::handle X) {
    if (!py::isinstance<py::array>(X)) return false;
    py::dtype dt = py::reinterpret_borrow<py::array>(X).dtype();
    return dt.kind() == 'f' && dt.itemsize() == 4;
}

// Rows of `width` numbers (doubles, or A's element type): (n, width), or (width,) as one row when
// `allow_vector`; (n,) when width is 1. Copies only when the dtype, layout or alignment requires
// it.
template <class A = Array>
A rows_of(py::handle a, size_t width, const char *what, size_t *n, bool allow_vector) {
    A arr = A::ensure(a);
    if (!arr) {
        PyErr_Clear();
        throw py::type_error(std::string(what) + ": expected an array of numbers");
    }
    // C reads the rows through a T pointer: a buffer at an odd address is copied (ensure only
    // asks for C order)
    if (reinterpret_cast<std::uintptr_t>(arr.data()) % alignof(typename A::value_type) != 0)
        arr = A::ensure(arr.attr("copy")());
    if (arr.ndim() == 2 && (size_t)arr.shape(1) == width) {
        *n = (size_t)arr.shape(0);
    } else if (arr.ndim() == 1 && allow_vector && (size_t)arr.shape(0) == width) {
        *n = 1;
    } else if (arr.ndim() == 1 && width == 1) {
        *n = (size_t)arr.shape(0);
    } else {
        std::string shape = "(";
        for (py::ssize_t i = 0; i < arr.ndim(); i++)
            shape += (i ? ", " : "") + std::to_string(arr.shape(i));
        shape += arr.ndim() == 1 ? ",)" : ")";
        throw py::value_error(std::string(what) + ": expected shape (n, " + std::to_string(width) +
                              ")" + (allow_vector ? " or (" + std::to_string(width) + ",)" : "") +
                              ", got " + shape);
    }
    return arr;
}

// A tape call's status as an exception, with the message libmg recorded on the tape
// (mg_tape_last_error): the bindings check only what C cannot see (array shapes and lengths).
void check_tape(mg_tape *t, int st) {
    if (st == MG_OK) return;
    std::string msg = mg_tape_last_error(t);
    if (msg.empty()) msg = mg_strerror(st);
    if (st == MG_ENOMEM) {
        PyErr_SetString(PyExc_MemoryError, msg.c_str());
        throw py::error_already_set();
    }
    throw py::value_error(msg);
}

py::array_t<double> slot_view(py::object owner, double *base, size_t n) {
    return py::array_t<double>({(py::ssize_t)n}, {(py::ssize_t)sizeof(double)}, base, owner);
}

} // namespace

// The explicit option also keeps -Wpedantic quiet about an empty variadic macro argument.
PYBIND11_MODULE(_core, m, py::mod_gil_used()) {
    m.doc() = "Compiled core of micrograd_c (libmg bindings). Not a public API: use micrograd_c.";

    if (mgpy::init_value_type(m.ptr()) < 0) throw py::error_already_set();

    // ---- the op table ----------------------------------------------------------------------
    py::list names, symbols, arities;
    for (int op = 0; op < MG_OP_COUNT; op++) {
        names.append(mg_op_name(op));
        symbols.append(mg_op_symbol(op));
        arities.append(mg_op_arity(op));
    }
    m.attr("OP_NAMES") = py::tuple(names);
    m.attr("OP_SYMBOLS") = py::tuple(symbols);
    m.attr("OP_ARITIES") = py::tuple(arities);
    py::list act_names, act_ops;
    for (int a = 0; a < MG_ACT_COUNT; a++) {
        act_names.append(mg_activation_name(a));
        act_ops.append(mg_activation_op(a));
    }
    m.attr("ACTIVATIONS") = py::tuple(act_names); // libmg's activation table
    m.attr("ACTIVATION_OPS") = py::tuple(act_ops);
    m.attr("LIBMG_VERSION") = MG_VERSION;

    m.def(
        "op_of", [](py::handle v) { return mg_value_op(node_of(v, "op_of")); }, py::arg("value"),
        "The op index (into OP_NAMES) that produced a Value.");
    m.def(
        "const_of", [](py::handle v) { return mg_value_const(node_of(v, "const_of")); },
        py::arg("value"), "The op's constant (pow's exponent; n for variadic ops).");
    m.def(
        "operands",
        [](py::handle v) {
            mg_value *n = node_of(v, "operands");
            size_t k = mg_value_noperands(n);
            std::vector<mg_value *> ops(k);
            for (size_t i = 0; i < k; i++) ops[i] = mg_value_operand(n, i);
            return wrap_all(ops.data(), k, "operands");
        },
        py::arg("value"), "The operands of a Value in op order (a list, duplicates kept).");

    // ---- the process graph -----------------------------------------------------------------
    m.def(
        "graph_len", [] { return mg_graph_len(graph()); },
        "Number of live values in the process graph.");
    m.def(
        "graph_bytes", [] { return mg_graph_bytes(graph()); },
        "Bytes the process graph uses (value blocks, operand arrays, working memory).");
    m.def("_label_count", mgpy::label_count,
          "Entries of the label table (labels of released Values included until its next sweep).");
    m.def(
        "checkpoint_save", [] { return mg_graph_save(graph()).serial; },
        "Marks the process graph's current point; returns a token for checkpoint_restore.");
    m.def(
        "checkpoint_restore",
        [](uint64_t token) {
            mg_graph_checkpoint cp{token};
            return mg_graph_restore(graph(), cp);
        },
        py::arg("token"),
        "Releases every value created since the token's save; returns the count.");

    // ---- variadic ops and losses ------------------------------------------------------------
    m.def(
        "sum",
        [](py::handle values) {
            Nodes v(values, "sum");
            v.resolve();
            return wrap(mg_sum(graph(), v.v.data(), v.v.size()), "sum");
        },
        py::arg("values"), "Sum of Values, added left to right, as one node.");
    m.def(
        "dot",
        [](py::handle a, py::handle b) {
            Nodes x(a, "dot"), y(b, "dot");
            check_len(x.size(), y.size(), "dot");
            resolve_all(x, y);
            return wrap(mg_dot(graph(), x.v.data(), y.v.data(), x.v.size()), "dot");
        },
        py::arg("a"), py::arg("b"), "Dot product of two sequences, as one node.");
    m.def(
        "affine",
        [](py::handle w, py::handle x, py::handle b) {
            Nodes ws(w, "affine"), xs(x, "affine");
            check_len(ws.size(), xs.size(), "affine");
            py::list bl;
            bl.append(b);
            Nodes bs(bl, "affine");
            resolve_all(ws, xs, bs);
            return wrap(mg_affine(graph(), ws.v.data(), xs.v.data(), ws.v.size(), bs.v[0]),
                        "affine");
        },
        py::arg("w"), py::arg("x"), py::arg("b"),
        "b + w[0]*x[0] + ... in micrograd's order, as one node.");
    m.def(
        "mse",
        [](py::handle p, py::handle t) {
            Nodes x(p, "mse"), y(t, "mse");
            check_len(x.size(), y.size(), "mse");
            resolve_all(x, y);
            return wrap(mg_mse(graph(), x.v.data(), y.v.data(), x.v.size()), "mse");
        },
        py::arg("pred"), py::arg("target"), "Mean squared error.");
    m.def(
        "hinge",
        [](py::handle s, py::handle y) {
            Nodes x(s, "hinge"), t(y, "hinge");
            check_len(x.size(), t.size(), "hinge");
            resolve_all(x, t);
            return wrap(mg_hinge(graph(), x.v.data(), t.v.data(), x.v.size()), "hinge");
        },
        py::arg("scores"), py::arg("labels"), "Mean max-margin loss of micrograd's moons demo.");
    m.def(
        "cross_entropy",
        [](py::handle logits, py::handle target) {
            Nodes z(logits, "cross_entropy");
            py::list tl;
            tl.append(target);
            Nodes t(tl, "cross_entropy");
            resolve_all(z, t);
            return wrap(mg_cross_entropy(graph(), z.v.data(), z.v.size(), t.v[0]), "cross_entropy");
        },
        py::arg("logits"), py::arg("target"), "Softmax cross-entropy from logits (stable).");

    // ---- nn ---------------------------------------------------------------------------------
    py::class_<Neuron>(m, "Neuron")
        .def(py::init([](py::handle nin, py::handle act) {
                 size_t n_in = count_arg(nin, "Neuron", "nin", 1);
                 mg_neuron *n =
                     mg_neuron_new(graph(), n_in, activation_of(act), MG_INIT_UNIFORM, nullptr);
                 if (!n) throw_graph_error("Neuron");
                 Owner o(n, [](void *p) { mg_neuron_free(static_cast<mg_neuron *>(p)); });
                 return Neuron{o, n};
             }),
             py::arg("nin"), py::arg("activation") = "relu")
        .def(
            "__call__",
            [](const Neuron &n, py::handle x) {
                Nodes in(x, "Neuron");
                if (in.size() != mg_neuron_nin(n.n))
                    throw py::value_error("Neuron: expected " + std::to_string(mg_neuron_nin(n.n)) +
                                          " inputs, got " + std::to_string(in.size()));
                in.resolve();
                require_live(n.live());
                return wrap(mg_neuron_call(graph(), n.n, in.v.data()), "Neuron");
            },
            py::arg("x"))
        .def("params",
             [](const Neuron &n) {
                 auto p = n.params();
                 return wrap_all(p.data(), p.size(), "params");
             })
        .def("get_data", [](const Neuron &n) { return get_param_data(n.params()); })
        .def("set_data", [](const Neuron &n, py::handle a) { set_param_data(n, a, "Neuron"); })
        .def_property_readonly("nin", [](const Neuron &n) { return mg_neuron_nin(n.n); })
        .def_property(
            "activation",
            [](const Neuron &n) { return activation_name(mg_neuron_activation(n.n)); },
            [](Neuron &n, py::handle a) { mg_neuron_set_activation(n.n, activation_of(a)); });

    py::class_<Layer>(m, "Layer")
        .def(py::init([](py::handle nin, py::handle nout, py::handle act) {
                 size_t n_in = count_arg(nin, "Layer", "nin", 1),
                        n_out = count_arg(nout, "Layer", "nout", 1);
                 mg_layer *l = mg_layer_new(graph(), n_in, n_out, activation_of(act),
                                            MG_INIT_UNIFORM, nullptr);
                 if (!l) throw_graph_error("Layer");
                 Owner o(l, [](void *p) { mg_layer_free(static_cast<mg_layer *>(p)); });
                 return Layer{o, l};
             }),
             py::arg("nin"), py::arg("nout"), py::arg("activation") = "relu")
        .def(
            "__call__",
            [](const Layer &l, py::handle x) {
                return call_layerlike(l, mg_layer_nin(l.l), mg_layer_nout(l.l), x, "Layer",
                                      layer_call, l.l);
            },
            py::arg("x"))
        .def(
            "neuron",
            [](const Layer &l, py::handle i) {
                mg_neuron *n = mg_layer_neuron(l.l, count_arg(i, "neuron", "index", 0));
                if (!n) throw py::index_error("neuron index out of range");
                return Neuron{l.owner, n};
            },
            py::arg("i"))
        .def("params",
             [](const Layer &l) {
                 auto p = l.params();
                 return wrap_all(p.data(), p.size(), "params");
             })
        .def("get_data", [](const Layer &l) { return get_param_data(l.params()); })
        .def("set_data", [](const Layer &l, py::handle a) { set_param_data(l, a, "Layer"); })
        .def_property_readonly("nin", [](const Layer &l) { return mg_layer_nin(l.l); })
        .def_property_readonly("nout", [](const Layer &l) { return mg_layer_nout(l.l); });

    py::class_<MLP>(m, "MLP")
        .def(py::init([](py::handle nin, py::handle nouts, py::handle act) {
                 size_t n_in = count_arg(nin, "MLP", "nin", 1);
                 if (!PySequence_Check(nouts.ptr()) || PyUnicode_Check(nouts.ptr()))
                     throw py::type_error(
                         std::string("MLP: nouts must be a sequence of layer widths, not ") +
                         Py_TYPE(nouts.ptr())->tp_name);
                 py::tuple ws = py::reinterpret_steal<py::tuple>(PySequence_Tuple(nouts.ptr()));
                 if (!ws) throw py::error_already_set();
                 std::vector<size_t> widths;
                 for (py::handle w : ws) {
                     if (!PyIndex_Check(w.ptr()))
                         throw py::type_error(
                             std::string("MLP: layer widths must be integers, not ") +
                             Py_TYPE(w.ptr())->tp_name);
                     widths.push_back(count_arg(w, "MLP", "layer width", 1));
                 }
                 if (widths.empty()) throw py::value_error("MLP: at least one layer is needed");
                 mg_mlp *mm = mg_mlp_new(graph(), n_in, widths.data(), widths.size(),
                                         activation_of(act), MG_INIT_UNIFORM, nullptr);
                 if (!mm) throw_graph_error("MLP");
                 Owner o(mm, [](void *p) { mg_mlp_free(static_cast<mg_mlp *>(p)); });
                 return MLP{o, mm};
             }),
             py::arg("nin"), py::arg("nouts"), py::arg("activation") = "relu")
        .def(
            "__call__",
            [](const MLP &mm, py::handle x) {
                return call_layerlike(mm, mg_mlp_nin(mm.m), mg_mlp_nout(mm.m), x, "MLP", mlp_call,
                                      mm.m);
            },
            py::arg("x"))
        .def(
            "layer",
            [](const MLP &mm, py::handle i) {
                mg_layer *l = mg_mlp_layer(mm.m, count_arg(i, "layer", "index", 0));
                if (!l) throw py::index_error("layer index out of range");
                return Layer{mm.owner, l};
            },
            py::arg("i"))
        .def("params",
             [](const MLP &mm) {
                 auto p = mm.params();
                 return wrap_all(p.data(), p.size(), "params");
             })
        .def("get_data", [](const MLP &mm) { return get_param_data(mm.params()); })
        .def("get_grad", [](const MLP &mm) { return get_param_grad(mm.params()); })
        .def("set_data", [](const MLP &mm, py::handle a) { set_param_data(mm, a, "MLP"); })
        .def_property_readonly("nin", [](const MLP &mm) { return mg_mlp_nin(mm.m); })
        .def_property_readonly("nlayers", [](const MLP &mm) { return mg_mlp_nlayers(mm.m); });

    // ---- frozen programs -------------------------------------------------------------------
    py::class_<Tape>(m, "Tape")
        .def(py::init([](py::object loss, py::handle inputs, py::handle targets, py::handle params,
                         py::handle outputs, bool raise_loops) {
                 auto nodes_of = [](py::handle seq, const char *what) {
                     std::vector<mg_value *> v;
                     if (seq.is_none()) return v;
                     for (py::handle o : seq) v.push_back(node_of(o, what));
                     return v;
                 };
                 std::vector<mg_value *> in = nodes_of(inputs, "inputs"),
                                         tg = nodes_of(targets, "targets"),
                                         ps = nodes_of(params, "params"),
                                         out = nodes_of(outputs, "outputs");
                 mg_tape_spec spec{loss.is_none() ? nullptr : node_of(loss, "loss"),
                                   in.data(),
                                   in.size(),
                                   tg.data(),
                                   tg.size(),
                                   ps.data(),
                                   ps.size(),
                                   out.data(),
                                   out.size(),
                                   raise_loops ? 0 : 1};
                 auto tp = std::make_unique<Tape>();
                 // with the GIL held: freezing walks (and marks) the process's graph, which
                 // Values on other threads build and differentiate under the GIL
                 tp->t.reset(mg_tape_freeze(graph(), &spec));
                 if (!tp->t) throw_graph_error("freeze");
                 return tp;
             }),
             py::arg("loss"), py::arg("inputs"), py::arg("targets"), py::arg("params"),
             py::arg("outputs"), py::arg("raise_loops") = true)
        .def_property_readonly("nslots", [](const Tape &tp) { return mg_tape_nslots(tp.t.get()); })
        .def_property_readonly("ninstr", [](const Tape &tp) { return mg_tape_ninstr(tp.t.get()); })
        .def_property_readonly("nparams",
                               [](const Tape &tp) { return mg_tape_nparams(tp.t.get()); })
        .def_property_readonly("ninputs",
                               [](const Tape &tp) { return mg_tape_ninputs(tp.t.get()); })
        .def_property_readonly("ntargets",
                               [](const Tape &tp) { return mg_tape_ntargets(tp.t.get()); })
        .def_property_readonly("noutputs",
                               [](const Tape &tp) { return mg_tape_noutputs(tp.t.get()); })
        .def_property_readonly("has_loss",
                               [](const Tape &tp) { return mg_tape_has_loss(tp.t.get()) != 0; })
        .def_property_readonly("fingerprint",
                               [](const Tape &tp) { return mg_tape_fingerprint(tp.t.get()); })
        .def(
            "stats",
            [](const Tape &tp) {
                mg_tape_stats s;
                mg_tape_get_stats(tp.t.get(), &s);
                py::dict d;
                d["nodes"] = s.nodes;
                d["statements"] = s.statements;
                d["forward_nests"] = s.forward_nests;
                d["backward_nests"] = s.backward_nests;
                d["loops"] = s.loops;
                d["packed"] = s.packed;
                d["rerolled"] = s.rerolled != 0;
                d["deferred_steps"] = s.deferred_steps;
                d["hoisted"] = s.hoisted;
                return d;
            },
            "What freezing made of the graph: nodes, statements, loop nests, sequential loops, "
            "packed parameters, deferred weight steps, nests hoisted out of sequential loops.")
        .def(
            "data",
            [](py::object self) {
                Tape &tp = self.cast<Tape &>();
                return slot_view(self, mg_tape_data(tp.t.get()), mg_tape_nslots(tp.t.get()));
            },
            "The data slots as a numpy view (parameters first).")
        .def(
            "grad",
            [](py::object self) {
                Tape &tp = self.cast<Tape &>();
                return slot_view(self, mg_tape_grad(tp.t.get()), mg_tape_nslots(tp.t.get()));
            },
            "The gradient slots as a numpy view.")
        .def(
            "forward",
            [](Tape &tp, py::handle x, py::handle y) {
                size_t n = 0;
                mg_tape *t = tp.t.get();
                Array xa = rows_of(x, mg_tape_ninputs(t), "forward: x", &n, true);
                if (n != 1)
                    throw py::value_error("forward: x must be one sample; use predict() for many");
                Array ya;
                if (!y.is_none()) {
                    size_t m = 0;
                    ya = rows_of(y, mg_tape_ntargets(t), "forward: y", &m, true);
                    if (m != 1) throw py::value_error("forward: y must be one sample");
                }
                py::array_t<double> out((py::ssize_t)mg_tape_noutputs(t));
                double *o = out.mutable_data();
                const double *xp = xa.data(), *yp = y.is_none() ? nullptr : ya.data();
                int st;
                {
                    py::gil_scoped_release nogil;
                    std::lock_guard<std::mutex> lock(tp.run);
                    st = mg_tape_forward(t, xp, yp);
                    if (st == MG_OK) mg_tape_outputs(t, o);
                }
                check_tape(t, st);
                return out;
            },
            py::arg("x"), py::arg("y") = py::none())
        .def_property_readonly("loss", [](const Tape &tp) { return mg_tape_loss(tp.t.get()); })
        .def_property_readonly("loss_slot",
                               [](const Tape &tp) { return mg_tape_loss_slot(tp.t.get()); })
        .def("backward",
             [](Tape &tp) {
                 int st;
                 {
                     py::gil_scoped_release nogil;
                     std::lock_guard<std::mutex> lock(tp.run);
                     st = mg_tape_backward(tp.t.get());
                 }
                 check_tape(tp.t.get(), st);
             })
        .def(
            "step",
            [](Tape &tp, double lr, size_t count) {
                std::lock_guard<std::mutex> lock(tp.run);
                check_tape(tp.t.get(), mg_tape_step(tp.t.get(), lr, count));
            },
            py::arg("lr"), py::arg("count") = 1)
        .def(
            "fit_epoch",
            [](Tape &tp, py::handle X, py::handle Y, size_t batch, double lr, bool shuffle,
               uint64_t seed, uint64_t epoch, size_t threads) {
                mg_tape *t = tp.t.get();
                size_t n = 0, m = 0;
                // float32 rows are read as they are (mg_fit_options.X32), others as doubles
                const bool x32 = float32_rows(X);
                Array xa;
                Array32 xa32;
                if (x32) xa32 = rows_of<Array32>(X, mg_tape_ninputs(t), "fit: X", &n, false);
                else xa = rows_of(X, mg_tape_ninputs(t), "fit: X", &n, false);
                Array ya;
                const double *yp = nullptr; // no Y for a program with targets: libmg says so
                if (mg_tape_ntargets(t) && !Y.is_none()) {
                    ya = rows_of(Y, mg_tape_ntargets(t), "fit: Y", &m, false);
                    if (m != n)
                        throw py::value_error("fit: X has " + std::to_string(n) +
                                              " rows but Y has " + std::to_string(m));
                    yp = ya.data();
                }
                mg_fit_options o{batch, lr, shuffle ? 1 : 0, seed, epoch, threads, nullptr};
                double mean = 0.0;
                int st;
                const double *xp = x32 ? nullptr : xa.data();
                if (x32) o.X32 = xa32.data();
                {
                    py::gil_scoped_release nogil;
                    std::lock_guard<std::mutex> lock(tp.run);
                    st = mg_tape_fit(t, xp, yp, n, &o, &mean);
                }
                check_tape(t, st);
                return mean;
            },
            py::arg("X"), py::arg("Y"), py::arg("batch_size"), py::arg("lr"), py::arg("shuffle"),
            py::arg("seed"), py::arg("epoch"), py::arg("threads") = 1)
        .def(
            "predict",
            [](Tape &tp, py::handle X) {
                mg_tape *t = tp.t.get();
                const size_t w = mg_tape_ninputs(t), no = mg_tape_noutputs(t);
                size_t n = 0;
                // float32 rows are widened to doubles (exactly) a block of rows at a time, not
                // all at once: held-out rows as float32 stay a block's worth of doubles
                const bool x32 = float32_rows(X);
                Array xa;
                Array32 xa32;
                if (x32) xa32 = rows_of<Array32>(X, w, "predict: X", &n, false);
                else xa = rows_of(X, w, "predict: X", &n, false);
                py::array_t<double> out({(py::ssize_t)n, (py::ssize_t)no});
                double *o = out.mutable_data();
                const size_t block = 4096;
                std::vector<double> wide(x32 ? std::min(n, block) * w : 0);
                int st = MG_OK;
                {
                    py::gil_scoped_release nogil;
                    std::lock_guard<std::mutex> lock(tp.run);
                    if (!x32) st = mg_tape_predict(t, xa.data(), n, o);
                    for (size_t k = 0; x32 && k < n && st == MG_OK; k += block) {
                        const size_t rows = std::min(block, n - k);
                        const float *src = xa32.data() + k * w;
                        for (size_t i = 0; i < rows * w; i++) wide[i] = src[i];
                        st = mg_tape_predict(t, wide.data(), rows, o + k * no);
                    }
                }
                check_tape(t, st);
                return out;
            },
            py::arg("X"))
        .def(
            "trim",
            [](Tape &tp) {
                auto lock = lock_run(tp);
                return mg_tape_trim(tp.t.get());
            },
            "Frees the working memory batched fit and predict calls keep for the next call; "
            "returns the bytes freed.")
        .def(
            "emit_c",
            [](Tape &tp, const std::string &prefix, bool inference_only, bool float32,
               size_t max_kernels) {
                mg_emit_options o{prefix.c_str(), inference_only ? 1 : 0, float32 ? 1 : 0,
                                  max_kernels};
                size_t len = 0;
                auto lock = lock_run(tp); // inference-only code inlines the parameters
                char *src = mg_tape_emit_c(tp.t.get(), &o, &len);
                if (!src) {
                    int st = mg_tape_last_status(tp.t.get()); // MG_EINVAL: prefix; MG_ENOMEM
                    check_tape(tp.t.get(), st != MG_OK ? st : MG_ENOMEM);
                }
                py::str out(src, len);
                mg_tape_free_source(tp.t.get(), src);
                return out;
            },
            py::arg("prefix") = "mgc_", py::arg("inference_only") = false,
            py::arg("float32") = false, py::arg("max_kernels") = 0)
        .def(
            "describe",
            [](Tape &tp) {
                size_t len = 0;
                auto lock = lock_run(tp);
                char *text = mg_tape_describe(tp.t.get(), &len);
                if (!text) throw std::bad_alloc();
                py::str out(text, len);
                mg_tape_free_source(tp.t.get(), text);
                return out;
            },
            "A readable listing of the frozen programs (loop nests, loops, losses).")
        .def(
            "attach",
            [](Tape &tp, uintptr_t program, py::object owner) {
                std::lock_guard<std::mutex> lock(tp.run);
                if (!program) {
                    mg_tape_detach(tp.t.get());
                    tp.kernels_owner = py::none();
                    return;
                }
                check_tape(
                    tp.t.get(),
                    mg_tape_attach(tp.t.get(), reinterpret_cast<const mg_compiled *>(program)));
                tp.kernels_owner = owner;
            },
            py::arg("program"), py::arg("owner") = py::none(),
            "Run the hot nests with a compiled library's kernels (the address of its "
            "<prefix>program); "
            "0 goes back to the interpreter.")
        .def(
            "write_back",
            [](Tape &tp) {
                auto lock = lock_run(tp);
                return mg_tape_write_back(tp.t.get(), graph());
            },
            "Copies the parameters into the Values they were frozen from; returns how many.");
    m.attr("EMITTER_VERSION") = mg_tape_emitter_version();
    m.def(
        "kernel_isa", [] { return std::string(mg_tape_kernel_isa()); },
        "Which build of the tape interpreter's kernels this process runs: 'avx512', 'avx2' or "
        "'baseline' (the widest the CPU supports, capped by the environment variable MG_ISA at "
        "first use). Every build computes the same bits.");
}
