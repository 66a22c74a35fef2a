// The Python Value type: a native CPython type over one libmg value of the process graph.
//
// Why not a pybind11 class: `w*x` runs millions of times in micrograd-style code, and a number
// slot called directly by the interpreter costs a fraction of pybind11's dispatch. Everything
// else in _core is ordinary pybind11.
#pragma once

#include <Python.h>

#include <cstdint>

extern "C" {
#include <mg/mg.h>
}

namespace mgpy {

// A handle: holds one reference on its value (mg_value_retain) and the value's serial, so a
// value released by a checkpoint restore is detected instead of dereferenced.
struct ValueObject {
    PyObject_HEAD mg_value *v;
    uint64_t serial;
};

extern PyTypeObject ValueType;
extern PyObject *StaleValueError; // raised when a handle's value was released

// The process-wide graph every Python Value lives in (autofree on). Each call also selects the
// calling thread's checkpoint domain (mg_graph_set_domain): every Python thread has its own
// while it lives (up to 255 at a time; further threads share domain 0), so a thread's
// checkpoint() releases only the Values that thread created inside it.
mg_graph *graph();

// Registers the Value type and the exception in module `m`; returns 0 or -1 with an exception.
int init_value_type(PyObject *m);

// Entries in the table of Value labels (for tests: it is swept as it grows).
size_t label_count();

inline bool is_value(PyObject *o) { return PyObject_TypeCheck(o, &ValueType); }

// The live value behind a handle, or nullptr with StaleValueError set.
mg_value *live(ValueObject *h);

// A Value or a real number as a node: numbers become constant leaves. Returns nullptr with
// TypeError set for other objects (or StaleValueError). A number's __float__ may run Python code;
// callers that hold other nodes across this call must convert numbers first (as_number).
mg_value *as_node(PyObject *o);

// A real number (not a Value) as a double: false with TypeError set (or the exception its
// __float__ raised). May run Python code.
bool as_number(PyObject *o, double *out);

// A constant leaf: nullptr with the graph's error raised as a Python exception.
mg_value *constant(double x);

// Raises StaleValueError for a model (Neuron, Layer, MLP) whose parameters were released.
void set_stale_model_error();

// The canonical handle of a node (new reference): the existing Python object when one is alive,
// so `a in c._prev` holds by identity as in micrograd. NULL raises the graph's last error.
PyObject *wrap(mg_value *v);

// The same for a node whose serial was read before any Python code could run: allocating the
// handle may run Python code (a garbage-collection pass calls finalizers), which may release the
// node; then StaleValueError is raised instead of wrapping whatever reused the slot. Wrapping
// several nodes: read all serials first.
PyObject *wrap_serial(mg_value *v, uint64_t serial);

// Raises the Python exception for the graph's last error (MemoryError for ENOMEM).
PyObject *raise_graph_error(const char *what);

} // namespace mgpy
