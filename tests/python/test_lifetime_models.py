"""Models and variadic readers against released values: every path ends in a clear error.

A model created inside ``checkpoint()`` outlives the restore that releases its parameters, and
new Values reuse their slots; a variadic reader calls back into Python (``__float__``) while it
collects its operands, and the callback can release them. Neither may compute with, write into or
release another Value.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import micrograd_c as mc
from micrograd_c import _core
from micrograd_c.engine import StaleValueError, Value
from micrograd_c.nn import MLP, Layer, Neuron


def test_model_created_inside_a_checkpoint_is_stale_after_it():
    with mc.checkpoint():
        model = MLP(2, [3, 1])
        neuron = Neuron(3)
        layer = Layer(2, 2)
        params = model.parameters()
    # new Values reuse the released slots, variadic nodes among them
    others = [Value(float(i)) for i in range(300)]
    sums = [mc.vsum(others[i : i + 5]) for i in range(0, 100, 5)]
    uses = [
        lambda: model([1.0, 2.0]),
        lambda: neuron([1.0, 2.0, 3.0]),
        lambda: layer([1.0, 2.0]),
        lambda: model.layers[0]([1.0, 2.0]),
        lambda: model.layers[0].neurons[0]([1.0, 2.0]),
        lambda: params[0].data,
        lambda: model.state_dict(),
        lambda: model.load_state_dict(
            {k: np.zeros_like(v) for k, v in MLP(2, [3, 1]).state_dict().items()}
        ),
        lambda: model._c.get_data(),
        lambda: model._c.get_grad(),
        lambda: model._c.set_data(np.zeros(13)),
        lambda: model._c.params(),
        lambda: neuron._c.get_data(),
        lambda: layer._c.set_data(np.zeros(6)),
    ]
    for i, use in enumerate(uses):
        with pytest.raises(StaleValueError, match="checkpoint"):
            use()
        assert [o.data for o in others] == [float(k) for k in range(300)], i
    with pytest.raises(StaleValueError):
        model.zero_grad()
    model = neuron = layer = params = None  # drops the models (the lambdas share these variables)
    gc.collect()
    # dropping the models released nothing else
    assert all(o._alive for o in others) and all(s._alive for s in sums)
    assert [o.data for o in others] == [float(k) for k in range(300)]
    assert [s.data for s in sums] == [float(sum(range(i, i + 5))) for i in range(0, 100, 5)]
    sums[3].backward()
    assert [o.grad for o in others[15:20]] == [1.0] * 5


def test_stale_model_and_a_variadic_node_in_its_slots_do_not_crash():
    # the old failure was a SIGSEGV in backward (a released operand array): run it apart
    script = textwrap.dedent("""
        import micrograd_c as mc
        from micrograd_c.engine import StaleValueError, Value
        from micrograd_c.nn import MLP
        with mc.checkpoint():
            model = MLP(2, [4, 4, 1])
        xs = [Value(1.0) for _ in range(30)]
        sums = [mc.vsum(xs[i:i + 3]) for i in range(0, 30, 3)]
        dots = [mc.dot(xs[i:i + 2], xs[i + 2:i + 4]) for i in range(0, 26, 2)]
        try:
            out = model([1.0, 2.0])
            out.backward()
            print("no error")
        except StaleValueError:
            print("stale")
        del model
        print(all(x._alive for x in xs), sum(s.data for s in sums), sum(d.data for d in dots))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["stale", "True", "30.0", "26.0"]


def test_model_created_before_the_checkpoint_is_untouched():
    model = MLP(2, [3, 1])
    before = model.state_dict()
    with mc.checkpoint():
        model([1.0, -1.0]).backward()
    assert all(p._alive for p in model.parameters())
    assert all(np.array_equal(before[k], v) for k, v in model.state_dict().items())


# ---- variadic readers and number callbacks (__float__) --------------------------------------


class Releaser:
    """A number whose ``__float__`` runs ``action`` on call number ``on`` (1-based)."""

    def __init__(self, value: float, action, on: int = 1) -> None:
        self.value, self.action, self.on, self.calls = value, action, on, 0

    def __float__(self) -> float:
        self.calls += 1
        if self.calls == self.on:
            self.action()
        return self.value


@pytest.mark.parametrize("reader", ["vsum", "dot", "mse", "mlp", "neuron"])
def test_variadic_readers_hold_their_operands(reader):
    junk = []

    def drop_and_reuse():
        del vals[:2]  # the list held the only handles: their nodes are freed...
        gc.collect()
        junk.extend(Value(100.0) for _ in range(64))  # ...and new Values take their slots

    vals = [Value(1.0), Value(2.0), Releaser(3.0, drop_and_reuse)]
    ones = [Value(1.0), Value(1.0), Value(1.0)]
    if reader == "vsum":
        y = mc.vsum(vals).data
    elif reader == "dot":
        y = mc.dot(vals, ones).data
    elif reader == "mse":
        y = mc.mse(vals, [0.0, 0.0, 0.0]).data * 3
    elif reader == "mlp":
        model = MLP(3, [1])
        model.load_state_dict({"layers.0.weight": np.ones((1, 3)), "layers.0.bias": np.zeros(1)})
        y = model(vals).data
    else:
        n = Neuron(3, nonlin=False)
        n._c.set_data([1.0, 1.0, 1.0, 0.0])
        y = n(vals).data
    expected = {"mse": 1.0 + 4.0 + 9.0}.get(reader, 6.0)
    assert y == expected  # the sequence as it was when the call started
    assert all(j.data == 100.0 for j in junk)


def test_binary_op_reads_a_number_once_and_resolves_values_after():
    token = _core.checkpoint_save()
    a = Value(1.5)
    junk = []

    def release_a():
        _core.checkpoint_restore(token)
        junk.extend(Value(100.0) for _ in range(8))

    # the callback runs on the second conversion: there must not be one
    k = Releaser(2.0, release_a, on=2)
    y = a * k
    assert y.data == 3.0 and k.calls == 1
    # a callback that releases the operand first is a clear error, not a computation on junk
    b = Value(1.5)
    token = _core.checkpoint_save()
    c = b + 1.0
    k = Releaser(2.0, release_a)
    with pytest.raises(StaleValueError):
        c * k
    with pytest.raises(StaleValueError):
        k * c
    assert all(j.data == 100.0 for j in junk)


def test_writes_convert_the_number_before_resolving_the_value():
    for attr in ("data", "grad"):
        token = _core.checkpoint_save()
        a = Value(1.5)
        junk = []

        def release_a(token=token, junk=junk):
            _core.checkpoint_restore(token)
            junk.extend(Value(100.0) for _ in range(8))  # takes a's slot

        with pytest.raises(StaleValueError):
            setattr(a, attr, Releaser(2.0, release_a))
        assert all(j.data == 100.0 and j.grad == 0.0 for j in junk)
