// The native Value type. See value.hpp for why it is not a pybind11 class.
#include "value.hpp"

#include "ptrmap.h" // libmg/src/ptrmap.h: libmg's internal pointer map

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace mgpy {

PyObject *StaleValueError = nullptr;

namespace {

// Checkpoint domains, one per live thread (see graph()). Domain 0 is never handed out: it is
// what threads beyond the 255th share. Ids return to the pool when their thread exits (the
// thread_local's destructor, which runs without the GIL: hence the mutex).
std::mutex domain_lock;
uint64_t domain_taken[4] = {1, 0, 0, 0}; // bit d of the 256: domain d is some live thread's

struct ThreadDomain {
    int id = 0;
    ~ThreadDomain() {
        if (id <= 0) return;
        std::lock_guard<std::mutex> hold(domain_lock);
        domain_taken[id >> 6] &= ~(1ull << (id & 63));
    }
};

thread_local ThreadDomain this_thread; // returns the id at thread exit
thread_local int this_domain = -1;     // the hot path: a plain int, no TLS wrapper call

int new_thread_domain() {
    std::lock_guard<std::mutex> hold(domain_lock);
    int id = 0;
    for (int d = 1; d < 256; d++)
        if (!(domain_taken[d >> 6] & (1ull << (d & 63)))) {
            domain_taken[d >> 6] |= 1ull << (d & 63);
            id = d;
            break;
        }
    this_thread.id = id;
    return this_domain = id;
}

int current_domain = -1; // the graph's domain as last set (every caller holds the GIL)

} // namespace

mg_graph *graph() {
    // Lives as long as the process: handles may be deallocated during interpreter shutdown, in
    // any order, and each needs the graph to release its value.
    static mg_graph *g = [] {
        mg_graph *gg = mg_graph_new();
        if (gg) mg_graph_set_autofree(gg, 1);
        return gg;
    }();
    // Every caller holds the GIL, so the domain stays the caller's until it returns.
    int d = this_domain >= 0 ? this_domain : new_thread_domain();
    if (d != current_domain && g) {
        mg_graph_set_domain(g, d);
        current_domain = d;
    }
    return g;
}

void set_stale_model_error() {
    PyErr_SetString(StaleValueError,
                    "this model's parameters were released: it was created inside a checkpoint() "
                    "block that has exited (create models before entering the checkpoint)");
}

PyObject *raise_graph_error(const char *what) {
    mg_graph *g = graph();
    int st = mg_graph_last_status(g);
    const char *msg = mg_graph_last_error(g);
    if (st == MG_ENOMEM) PyErr_Format(PyExc_MemoryError, "%s: %s", what, msg);
    else if (st == MG_OK) PyErr_Format(PyExc_RuntimeError, "%s failed", what);
    else PyErr_Format(PyExc_ValueError, "%s: %s", what, msg);
    mg_graph_clear_error(g);
    return nullptr;
}

// ---- node -> handle map -----------------------------------------------------------------

namespace {

// node -> its canonical handle (a ValueObject *), so `_prev` returns the same objects; libmg's
// pointer map (libmg/src/ptrmap.h), allocating through the C library as libmg does.
mg_ptrmap handles = MG_PTRMAP_INIT;

ValueObject *handle_of(mg_value *v) {
    size_t i = mg_ptrmap_find(&handles, v);
    return i == MG_PTRMAP_NONE ? nullptr : reinterpret_cast<ValueObject *>(handles.slots[i].val);
}

// Forgets `h` as its node's handle, unless another handle has taken the node over since.
void forget_handle(ValueObject *h) {
    size_t i = mg_ptrmap_find(&handles, h->v);
    if (i != MG_PTRMAP_NONE && handles.slots[i].val == reinterpret_cast<uintptr_t>(h))
        mg_ptrmap_erase_at(&handles, i);
}

// node -> its label (the lecture notebook's `Value(2.0, label='a')` and `v.label = 'a'`), kept
// beside the nodes so that no Value grows by a byte: the project's pointer map again, each value
// a Label. An entry records its node's serial: a label belongs to one node, and a released
// node's slot, reused, has none. Entries of released nodes are dropped in a sweep whenever the
// map has doubled since the last one.
struct Label {
    uint64_t serial;
    PyObject *text; // an exact str, owned: freeing it runs no Python code
};
mg_ptrmap labels = MG_PTRMAP_INIT;
size_t labels_after_sweep = 0;

Label *label_at(size_t i) { return reinterpret_cast<Label *>(labels.slots[i].val); }

// Frees the entry at index i (its label and record) and erases it.
void drop_label(size_t i) {
    Label *l = label_at(i);
    mg_ptrmap_erase_at(&labels, i);
    Py_DECREF(l->text);
    PyMem_Free(l);
}

void sweep_labels() {
    // an erase moves later entries back into the hole, so index i is looked at again; an entry
    // that wraps around from the front may be looked at twice, which is harmless
    for (size_t i = 0; i < labels.cap;) {
        const mg_value *v = static_cast<const mg_value *>(labels.slots[i].key);
        if (v && !mg_value_is_live(v, label_at(i)->serial)) drop_label(i);
        else i++;
    }
    labels_after_sweep = labels.len;
}

// The label of (v, serial), borrowed; nullptr when it has none.
PyObject *label_of(const mg_value *v, uint64_t serial) {
    size_t i = mg_ptrmap_find(&labels, v);
    return i != MG_PTRMAP_NONE && label_at(i)->serial == serial ? label_at(i)->text : nullptr;
}

// Sets (label: a str) or removes (label: nullptr or '') the label of a live node. -1: exception.
// The map keeps an exact str (a subclass is copied): freeing one runs no Python code, so no
// __del__ re-enters the map while it changes, and a label can hold no reference to a Value (no
// cycle the collector cannot see).
int put_label(const mg_value *v, uint64_t serial, PyObject *label) {
    PyObject *text = nullptr;
    if (label && PyUnicode_GET_LENGTH(label) > 0) {
        text = PyUnicode_FromObject(label); // a new reference: the same object for an exact str
        if (!text) return -1;
    }
    size_t i = mg_ptrmap_find(&labels, v);
    if (i != MG_PTRMAP_NONE) {
        if (!text) {
            drop_label(i);
            return 0;
        }
        Label *l = label_at(i);
        PyObject *old = l->text;
        *l = Label{serial, text};
        Py_DECREF(old);
        return 0;
    }
    if (!text) return 0;
    if (labels.len >= 2 * labels_after_sweep + 1024) sweep_labels();
    Label *l = static_cast<Label *>(PyMem_Malloc(sizeof(Label)));
    uintptr_t *entry = l ? mg_ptrmap_put(&labels, v, mg_default_allocator(), nullptr) : nullptr;
    if (!entry) {
        PyMem_Free(l);
        Py_DECREF(text);
        PyErr_NoMemory();
        return -1;
    }
    *l = Label{serial, text};
    *entry = reinterpret_cast<uintptr_t>(l);
    return 0;
}

bool check_label(PyObject *o) {
    if (PyUnicode_Check(o)) return true;
    PyErr_Format(PyExc_TypeError, "Value.label must be a str, not %.200s", Py_TYPE(o)->tp_name);
    return false;
}

inline bool read_number(PyObject *o, double *out) {
    if (PyFloat_CheckExact(o)) {
        *out = PyFloat_AS_DOUBLE(o);
        return true;
    }
    if (PyLong_CheckExact(o)) {
        *out = PyLong_AsDouble(o);
        return !(*out == -1.0 && PyErr_Occurred());
    }
    if (PyUnicode_Check(o) || PyBytes_Check(o) || PyByteArray_Check(o) || !PyNumber_Check(o))
        return false;
    // numpy scalars, bools, Fractions, Decimals, anything with __float__ or __index__
    *out = PyFloat_AsDouble(o);
    if (*out == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
    }
    return true;
}

// Points a fresh handle at its node (one reference) and records it as the node's canonical
// handle. On failure the handle is deallocated, which drops the reference again.
PyObject *attach(ValueObject *h, mg_value *v) {
    h->v = v;
    h->serial = mg_value_serial(v);
    mg_value_retain(v);
    uintptr_t *entry = mg_ptrmap_put(&handles, v, mg_default_allocator(), nullptr);
    if (!entry) {
        Py_DECREF(h);
        return PyErr_NoMemory();
    }
    *entry = reinterpret_cast<uintptr_t>(h); // replaces a stale handle's entry, if any
    return reinterpret_cast<PyObject *>(h);
}

PyObject *stale_error() {
    PyErr_SetString(StaleValueError,
                    "this Value was released (its graph was restored to an earlier checkpoint)");
    return nullptr;
}

// The live canonical handle of (v, serial), or nullptr.
ValueObject *canonical(mg_value *v, uint64_t serial) {
    ValueObject *h = handle_of(v);
    return h && h->serial == serial ? h : nullptr;
}

} // namespace

PyObject *wrap_serial(mg_value *v, uint64_t serial) {
    if (!mg_value_is_live(v, serial)) return stale_error();
    ValueObject *h = canonical(v, serial);
    if (!h) {
        h = PyObject_New(ValueObject, &ValueType); // may run Python code
        if (!h) return nullptr;
        h->v = nullptr; // an empty handle deallocates harmlessly
        h->serial = 0;
        ValueObject *other = canonical(v, serial);
        if (!mg_value_is_live(v, serial) || other) {
            Py_DECREF(h);
            if (!other) return stale_error();
            h = other; // Python code made one meanwhile
        } else {
            return attach(h, v);
        }
    }
    Py_INCREF(h);
    return reinterpret_cast<PyObject *>(h);
}

PyObject *wrap(mg_value *v) {
    if (!v) return raise_graph_error("operation");
    return wrap_serial(v, mg_value_serial(v));
}

mg_value *live(ValueObject *h) {
    if (mg_value_is_live(h->v, h->serial)) return h->v;
    stale_error();
    return nullptr;
}

bool as_number(PyObject *o, double *out) {
    if (!is_value(o) && read_number(o, out)) return true;
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "expected a Value or a real number, got %.200s",
                     Py_TYPE(o)->tp_name);
    return false;
}

mg_value *constant(double x) {
    mg_value *c = mg_scalar(graph(), x);
    if (!c) raise_graph_error("constant");
    return c;
}

mg_value *as_node(PyObject *o) {
    if (is_value(o)) return live(reinterpret_cast<ValueObject *>(o));
    double x;
    return as_number(o, &x) ? constant(x) : nullptr;
}

// ---- the type -----------------------------------------------------------------------------

namespace {

void value_dealloc(PyObject *self) {
    ValueObject *h = reinterpret_cast<ValueObject *>(self);
    forget_handle(h);
    if (mg_value_is_live(h->v, h->serial)) mg_value_release(graph(), h->v);
    Py_TYPE(self)->tp_free(self);
}

PyObject *value_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static const char *kwlist[] = {"data", "_children", "_op", "label", nullptr};
    PyObject *data = nullptr, *children = nullptr, *op = nullptr, *label = nullptr;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|OOO:Value", const_cast<char **>(kwlist), &data,
                                     &children, &op, &label))
        return nullptr;
    if (label && !check_label(label)) return nullptr;
    if (children) {
        Py_ssize_t n = PyObject_Length(children);
        if (n < 0) return nullptr;
        if (n > 0) {
            PyErr_SetString(PyExc_TypeError,
                            "Value(data, _children) with children is not supported: custom ops "
                            "cannot carry a Python _backward here; compose built-in ops "
                            "(tanh, exp, log, sigmoid, **, ...) instead");
            return nullptr;
        }
    }
    double x;
    if (is_value(data) || !read_number(data, &x)) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "Value data must be a real number, not %.200s",
                         Py_TYPE(data)->tp_name);
        return nullptr;
    }
    // the handle first: allocating it may run Python code (finalizers), the node no code
    ValueObject *h = reinterpret_cast<ValueObject *>(type->tp_alloc(type, 0)); // zeroed: empty
    if (!h) return nullptr;
    mg_value *v = mg_scalar(graph(), x);
    if (!v) {
        Py_DECREF(h);
        return raise_graph_error("Value");
    }
    PyObject *r = attach(h, v);
    if (r && label && put_label(v, mg_value_serial(v), label) < 0) Py_CLEAR(r);
    return r;
}

// Frees a node made for a failed op (a constant, or the divisor's reciprocal): it has no other
// reference. NULL is a no-op.
inline void drop_temp(mg_value *n) {
    if (n) {
        mg_value_retain(n);
        mg_value_release(graph(), n);
    }
}

// The exceptions Python's float `x ** k` raises, which micrograd's __pow__ (and its division,
// `a * b**-1`) inherit: false with the exception set.
bool pow_allowed(double x, double k) {
    if (x == 0.0 && k < 0.0) {
        PyErr_SetString(PyExc_ZeroDivisionError, "0.0 cannot be raised to a negative power");
        return false;
    }
    if (std::isinf(std::pow(x, k)) && std::isfinite(x) && std::isfinite(k)) {
        PyErr_SetString(PyExc_OverflowError, "(34, 'Numerical result out of range')");
        return false;
    }
    return true;
}

// `lhs / rhs` as micrograd computes it, `lhs * rhs**-1`: a product with the divisor's reciprocal
// (a pow node when the divisor is a Value, the constant `x ** -1` when it is a number), so data
// and gradients are micrograd's bit for bit (one IEEE division rounds differently: 7/3).
PyObject *divide(PyObject *lhs, PyObject *rhs, bool lv, bool rv, double x) {
    mg_value *a = nullptr, *t = nullptr;
    if (rv) {
        mg_value *b = live(reinterpret_cast<ValueObject *>(rhs));
        if (!b || !pow_allowed(mg_value_data(b), -1.0)) return nullptr;
        a = lv ? live(reinterpret_cast<ValueObject *>(lhs)) : constant(x);
        if (!a) return nullptr;
        t = mg_apply(graph(), MG_OP_POW, b, nullptr, -1.0);
        if (!t) {
            if (!lv) drop_temp(a);
            return raise_graph_error("pow");
        }
    } else {
        if (!pow_allowed(x, -1.0)) return nullptr;
        a = live(reinterpret_cast<ValueObject *>(lhs));
        if (!a) return nullptr;
        t = constant(std::pow(x, -1.0));
        if (!t) return nullptr;
    }
    // micrograd: `self * other**-1`, and for a number on the left `other * self**-1`, which
    // Python turns into `(self**-1) * other`
    mg_value *y =
        lv ? mg_apply(graph(), MG_OP_MUL, a, t, 0.0) : mg_apply(graph(), MG_OP_MUL, t, a, 0.0);
    if (!y) {
        drop_temp(t);
        if (!lv) drop_temp(a);
        return raise_graph_error("mul");
    }
    return wrap(y);
}

// Binary op in Python operand order (lhs op rhs); either side may be a number. The number is
// converted first: its __float__ may run Python code, which may release Values. Values are
// resolved to nodes only afterwards, and no Python code runs between that and the op.
PyObject *binary(int op, PyObject *lhs, PyObject *rhs) {
    bool lv = is_value(lhs), rv = is_value(rhs);
    if (!lv && !rv) Py_RETURN_NOTIMPLEMENTED;
    double x = 0.0;
    if ((!lv || !rv) && !read_number(lv ? rhs : lhs, &x)) {
        if (PyErr_Occurred()) return nullptr;
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (op == MG_OP_DIV) return divide(lhs, rhs, lv, rv, x);
    mg_value *a = lv ? live(reinterpret_cast<ValueObject *>(lhs)) : constant(x);
    if (!a) return nullptr;
    mg_value *b = rv ? live(reinterpret_cast<ValueObject *>(rhs)) : constant(x);
    if (!b) {
        if (!lv) drop_temp(a);
        return nullptr;
    }
    mg_value *y = mg_apply(graph(), op, a, b, 0.0);
    if (!y) {
        if (!lv) drop_temp(a);
        if (!rv) drop_temp(b);
        return raise_graph_error(mg_op_name(op));
    }
    return wrap(y);
}

PyObject *nb_add(PyObject *a, PyObject *b) { return binary(MG_OP_ADD, a, b); }
PyObject *nb_sub(PyObject *a, PyObject *b) { return binary(MG_OP_SUB, a, b); }
PyObject *nb_mul(PyObject *a, PyObject *b) { return binary(MG_OP_MUL, a, b); }
PyObject *nb_truediv(PyObject *a, PyObject *b) { return binary(MG_OP_DIV, a, b); }

PyObject *unary(int op, PyObject *self, double k = 0.0) {
    mg_value *a = live(reinterpret_cast<ValueObject *>(self));
    if (!a) return nullptr;
    return wrap(mg_apply(graph(), op, a, nullptr, k));
}

PyObject *nb_neg(PyObject *a) { return unary(MG_OP_NEG, a); }

PyObject *nb_pow(PyObject *base, PyObject *exp, PyObject *mod) {
    if (mod != Py_None) Py_RETURN_NOTIMPLEMENTED;
    if (is_value(base) && !is_value(exp)) {
        double k;
        if (!read_number(exp, &k)) {
            if (PyErr_Occurred()) return nullptr;
            Py_RETURN_NOTIMPLEMENTED;
        }
        mg_value *a = live(reinterpret_cast<ValueObject *>(base));
        if (!a || !pow_allowed(mg_value_data(a), k)) return nullptr;
        return unary(MG_OP_POW, base, k);
    }
    return binary(MG_OP_POWV, base, exp); // a Value as exponent, or number ** Value
}

// A method form of an operator (v.add(w)): where the operator returns NotImplemented (so that
// Python tries the other operand), a method call has nobody to defer to and raises.
PyObject *method_result(PyObject *r, int op, PyObject *arg) {
    if (r != Py_NotImplemented) return r;
    Py_DECREF(r);
    PyErr_Format(PyExc_TypeError, "%s(): expected a Value or a real number, got %.200s",
                 mg_op_name(op), Py_TYPE(arg)->tp_name);
    return nullptr;
}

// Methods generated from the op table: every elementwise op without a constant is a method
// named after the op (relu, tanh, exp, log, sigmoid, square, neg; add, mul, max, ...).
PyObject *unary_method(int op, PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (op == MG_OP_POW) { // the op with a constant: its argument is the exponent
        if (n != 1) {
            PyErr_SetString(PyExc_TypeError, "pow() takes exactly one argument (the exponent)");
            return nullptr;
        }
        return method_result(nb_pow(self, args[0], Py_None), op, args[0]);
    }
    if (n != 0) {
        PyErr_Format(PyExc_TypeError, "%s() takes no arguments", mg_op_name(op));
        return nullptr;
    }
    return unary(op, self);
}
#define MG__M1(id)                                                                                 \
    PyObject *m_##id(PyObject *self, PyObject *const *args, Py_ssize_t n) {                        \
        return unary_method(MG_OP_##id, self, args, n);                                            \
    }
#define MG__M2(id)                                                                                 \
    PyObject *m_##id(PyObject *self, PyObject *o) {                                                \
        return method_result(binary(MG_OP_##id, self, o), MG_OP_##id, o);                          \
    }
#define MG__METH_S(id, name, sym, ar, f, da, db) MG__M##ar(id)
#define MG__METH_N(id, name, sym)
MG_OP_LIST(MG__METH_S, MG__METH_N)
#undef MG__METH_S

PyObject *m_backward(PyObject *self, PyObject *) {
    mg_value *v = live(reinterpret_cast<ValueObject *>(self));
    if (!v) return nullptr;
    if (mg_backward(graph(), v) != MG_OK) return raise_graph_error("backward");
    Py_RETURN_NONE;
}

PyObject *m_backward_step(PyObject *self, PyObject *) {
    mg_value *v = live(reinterpret_cast<ValueObject *>(self));
    if (!v) return nullptr;
    if (mg_value_backward_step(graph(), v) != MG_OK) return raise_graph_error("_backward");
    Py_RETURN_NONE;
}

PyObject *get_label(PyObject *self, void *) {
    ValueObject *h = reinterpret_cast<ValueObject *>(self);
    if (!live(h)) return nullptr;
    PyObject *text = label_of(h->v, h->serial);
    if (!text) return PyUnicode_FromString("");
    Py_INCREF(text);
    return text;
}

int set_label(PyObject *self, PyObject *o, void *) {
    if (o && !check_label(o)) return -1;
    ValueObject *h = reinterpret_cast<ValueObject *>(self);
    if (!live(h)) return -1;
    return put_label(h->v, h->serial, o);
}

PyObject *get_data(PyObject *self, void *) {
    mg_value *v = live(reinterpret_cast<ValueObject *>(self));
    return v ? PyFloat_FromDouble(mg_value_data(v)) : nullptr;
}
PyObject *get_grad(PyObject *self, void *) {
    mg_value *v = live(reinterpret_cast<ValueObject *>(self));
    return v ? PyFloat_FromDouble(mg_value_grad(v)) : nullptr;
}
// The real number `o` assigned to Value.`what`, or false with a TypeError.
bool setter_number(PyObject *o, const char *what, double *x) {
    if (!is_value(o) && read_number(o, x)) return true;
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "Value.%s must be a real number, not %.200s", what,
                     Py_TYPE(o)->tp_name);
    return false;
}
int set_number(PyObject *self, PyObject *o, void (*set)(mg_value *, double), const char *what) {
    if (!o) {
        PyErr_Format(PyExc_AttributeError, "cannot delete %s", what);
        return -1;
    }
    // the number first: its __float__ may run Python code that releases this Value
    double x;
    if (!setter_number(o, what, &x)) return -1;
    mg_value *v = live(reinterpret_cast<ValueObject *>(self));
    if (!v) return -1;
    set(v, x);
    return 0;
}
int set_data(PyObject *self, PyObject *o, void *) {
    return set_number(self, o, mg_value_set_data, "data");
}
int set_grad(PyObject *self, PyObject *o, void *) {
    return set_number(self, o, mg_value_set_grad, "grad");
}

PyObject *get_prev(PyObject *self, void *) {
    mg_value *v = live(reinterpret_cast<ValueObject *>(self));
    if (!v) return nullptr;
    // operands and serials first: wrapping and set insertion allocate, which may run Python code
    size_t n = mg_value_noperands(v);
    std::vector<mg_value *> ops(n);
    std::vector<uint64_t> serials(n);
    for (size_t i = 0; i < n; i++) {
        ops[i] = mg_value_operand(v, i);
        serials[i] = mg_value_serial(ops[i]);
    }
    PyObject *s = PySet_New(nullptr);
    if (!s) return nullptr;
    for (size_t i = 0; i < n; i++) {
        PyObject *c = wrap_serial(ops[i], serials[i]);
        if (!c || PySet_Add(s, c) < 0) {
            Py_XDECREF(c);
            Py_DECREF(s);
            return nullptr;
        }
        Py_DECREF(c);
    }
    return s;
}

std::string format_const(double k) {
    if (std::isfinite(k) && k == std::floor(k) && std::fabs(k) < 9007199254740992.0)
        return std::to_string(static_cast<long long>(k));
    PyObject *f = PyFloat_FromDouble(k);
    PyObject *r = f ? PyObject_Repr(f) : nullptr;
    std::string out = r ? PyUnicode_AsUTF8(r) : "?";
    Py_XDECREF(r);
    Py_XDECREF(f);
    return out;
}

PyObject *get_op(PyObject *self, void *) {
    mg_value *v = live(reinterpret_cast<ValueObject *>(self));
    if (!v) return nullptr;
    int op = mg_value_op(v);
    std::string s = mg_op_symbol(op);
    if (op == MG_OP_POW) s += format_const(mg_value_const(v));
    return PyUnicode_FromString(s.c_str());
}

PyObject *get_id(PyObject *self, void *) {
    mg_value *v = live(reinterpret_cast<ValueObject *>(self));
    return v ? PyLong_FromUnsignedLongLong(mg_value_serial(v)) : nullptr;
}

PyObject *get_alive(PyObject *self, void *) {
    ValueObject *h = reinterpret_cast<ValueObject *>(self);
    return PyBool_FromLong(mg_value_is_live(h->v, h->serial));
}

PyObject *value_repr(PyObject *self) {
    ValueObject *h = reinterpret_cast<ValueObject *>(self);
    if (!mg_value_is_live(h->v, h->serial)) return PyUnicode_FromString("Value(<released>)");
    mg_value *v = h->v;
    PyObject *d = PyFloat_FromDouble(mg_value_data(v)), *g = PyFloat_FromDouble(mg_value_grad(v));
    PyObject *r = (d && g) ? PyUnicode_FromFormat("Value(data=%R, grad=%R)", d, g) : nullptr;
    Py_XDECREF(d);
    Py_XDECREF(g);
    return r;
}

PyObject *value_reduce(PyObject *self, PyObject *) {
    mg_value *v = live(reinterpret_cast<ValueObject *>(self));
    if (!v) return nullptr;
    if (mg_value_op(v) != MG_OP_LEAF) {
        PyErr_SetString(
            PyExc_TypeError,
            "only leaf Values can be pickled; pickle the model (its parameters) instead");
        return nullptr;
    }
    // Value(data) with the gradient (and the label, if any) restored through __setstate__
    ValueObject *h = reinterpret_cast<ValueObject *>(self);
    PyObject *label = label_of(h->v, h->serial);
    if (label)
        return Py_BuildValue("(O(d)(dO))", reinterpret_cast<PyObject *>(&ValueType),
                             mg_value_data(v), mg_value_grad(v), label);
    return Py_BuildValue("(O(d)d)", reinterpret_cast<PyObject *>(&ValueType), mg_value_data(v),
                         mg_value_grad(v));
}

// state: the gradient, or (gradient, label); nothing changes when either is refused
PyObject *value_setstate(PyObject *self, PyObject *state) {
    if (PyTuple_Check(state)) {
        if (PyTuple_GET_SIZE(state) != 2) {
            PyErr_SetString(PyExc_TypeError, "Value state must be grad or (grad, label)");
            return nullptr;
        }
        double x;
        PyObject *grad = PyTuple_GET_ITEM(state, 0);
        if (!check_label(PyTuple_GET_ITEM(state, 1)) || !setter_number(grad, "grad", &x))
            return nullptr;
        ValueObject *h = reinterpret_cast<ValueObject *>(self);
        if (!live(h) || put_label(h->v, h->serial, PyTuple_GET_ITEM(state, 1)) < 0) return nullptr;
        mg_value_set_grad(h->v, x);
        Py_RETURN_NONE;
    }
    if (set_grad(self, state, nullptr) < 0) return nullptr;
    Py_RETURN_NONE;
}

PyNumberMethods value_as_number = [] {
    PyNumberMethods m{};
    m.nb_add = nb_add;
    m.nb_subtract = nb_sub;
    m.nb_multiply = nb_mul;
    m.nb_true_divide = nb_truediv;
    m.nb_negative = nb_neg;
    m.nb_power = nb_pow;
    return m;
}();

#define MG__DEF_S(id, name, sym, ar, f, da, db)                                                    \
    {name, (PyCFunction)(void (*)(void))m_##id, (ar) == 1 ? METH_FASTCALL : METH_O,                \
     "The " name " op of libmg's op table."},
#define MG__DEF_N(id, name, sym)
PyMethodDef value_methods[] = {
    // clang-format off: one method per row of the op table, then the rest
    MG_OP_LIST(MG__DEF_S, MG__DEF_N)
    {"backward", m_backward, METH_NOARGS,
     "Seeds this Value's gradient with 1 and accumulates gradients into the leaves it depends on "
     "(intermediate gradients are recomputed from zero)."},
    {"_backward", m_backward_step, METH_NOARGS,
     "One step of the chain rule, as micrograd's _backward(): adds this Value's gradient times "
     "each local derivative into its operands' gradients (a leaf has none)."},
    // clang-format on
    {"__reduce__", value_reduce, METH_NOARGS, "Pickle support for leaf Values."},
    {"__setstate__", value_setstate, METH_O,
     "Pickle support: restores the gradient, or the gradient and the label."},
    {nullptr, nullptr, 0, nullptr}};
#undef MG__DEF_S
#undef MG__DEF_N

PyGetSetDef value_getset[] = {
    {"data", get_data, set_data, "The scalar (a float; writable).", nullptr},
    {"grad", get_grad, set_grad, "The gradient (a float; writable).", nullptr},
    {"_prev", get_prev, nullptr, "The operands, as a set of Values (micrograd's _prev).", nullptr},
    {"_op", get_op, nullptr, "The producing op's symbol ('' for leaves).", nullptr},
    {"_id", get_id, nullptr, "A number unique to this node within the process graph.", nullptr},
    {"label", get_label, set_label,
     "A name for drawing (a str, '' when unset; the lecture notebook's label).", nullptr},
    {"_alive", get_alive, nullptr, "False once a checkpoint restore released the value.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

} // namespace

PyTypeObject ValueType = [] {
    PyTypeObject t{};
    Py_SET_REFCNT(reinterpret_cast<PyObject *>(&t), 1); // what PyVarObject_HEAD_INIT sets
    t.tp_name = "micrograd_c.engine.Value";
    t.tp_basicsize = sizeof(ValueObject);
    t.tp_dealloc = value_dealloc;
    t.tp_repr = value_repr;
    t.tp_as_number = &value_as_number;
    t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE;
    t.tp_doc = "Value(data, _children=(), _op='', label='')\n--\n\n"
               "A scalar with a gradient: a node of the process-wide libmg graph.\n"
               "Arithmetic with Values and real numbers builds the graph; backward() fills .grad.";
    t.tp_methods = value_methods;
    t.tp_getset = value_getset;
    t.tp_new = value_new;
    return t;
}();

size_t label_count() { return labels.len; }

int init_value_type(PyObject *m) {
    if (!graph()) {
        PyErr_NoMemory();
        return -1;
    }
    if (PyType_Ready(&ValueType) < 0) return -1;
    // numpy defers to Value's reflected operators instead of building object arrays
    if (PyDict_SetItemString(ValueType.tp_dict, "__array_ufunc__", Py_None) < 0) return -1;
    Py_INCREF(&ValueType);
    if (PyModule_AddObject(m, "Value", reinterpret_cast<PyObject *>(&ValueType)) < 0) return -1;
    StaleValueError = PyErr_NewExceptionWithDoc(
        "micrograd_c.StaleValueError",
        "A Value whose node was released by a checkpoint restore was used.", PyExc_RuntimeError,
        nullptr);
    if (!StaleValueError) return -1;
    Py_INCREF(StaleValueError);
    return PyModule_AddObject(m, "StaleValueError", StaleValueError);
}

} // namespace mgpy
