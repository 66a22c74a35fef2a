"""micrograd's ``Module``, ``Neuron``, ``Layer`` and ``MLP``, built on libmg's C structs.

The classes keep micrograd's API and attributes (``MLP.layers``, ``Layer.neurons``, ``Neuron.w``,
``Neuron.b``, ``Neuron.nonlin``) and its initialisation: weights drawn with
``random.uniform(-1, 1)`` from Python's ``random`` module in micrograd's order, biases 0, so a
program seeded with ``random.seed(...)`` gets micrograd's model. A call runs in C: one
``DOT``-with-bias node plus the activation per neuron, computing exactly micrograd's
``sum((wi*xi for ...), b)``. Writes to ``w[i].data`` take effect (the Values *are* the model's
parameters); replacing an element of the ``w`` list does not.
"""

from __future__ import annotations

import operator
import os
import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import _core
from .engine import Value

Scalar = Value | float | int
Output = Value | list[Value]

#: Activations, from libmg's activation table.
ACTIVATIONS = tuple(_core.ACTIVATIONS)
_ACTIVATIONS = ACTIVATIONS


def _kind(activation: str) -> str:
    """micrograd's repr prefix: 'ReLU' / 'Linear', else the op symbol capitalised."""
    op = _core.ACTIVATION_OPS[ACTIVATIONS.index(activation)]
    sym = "Linear" if op < 0 else _core.OP_SYMBOLS[op]
    return sym[:1].upper() + sym[1:]


def _check_activation(activation: str) -> str:
    """``activation`` if it names a row of the activation table; a one-line error otherwise."""
    if not isinstance(activation, str):
        raise TypeError(f"activation must be a string, not {type(activation).__name__}")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; expected one of {_ACTIVATIONS}")
    return activation


def _index(x: Any, what: str, name: str) -> int:
    """``x`` as an int (anything with ``__index__``, as micrograd's ``range(nin)`` accepts); a
    one-line ``TypeError`` naming it otherwise."""
    try:
        return operator.index(x)
    except TypeError:
        raise TypeError(f"{what}: {name} must be an integer, not {type(x).__name__}") from None


def _count(x: Any, what: str, name: str) -> int:
    """``x`` as an int of at least 1; a one-line ``TypeError`` or ``ValueError`` otherwise."""
    n = _index(x, what, name)
    if n < 1:
        raise ValueError(f"{what}: {name} must be at least 1, got {n}")
    return n


def _draw(nin: int, nout: int) -> list[float]:
    """micrograd's init for one layer: per neuron, nin uniform(-1, 1) weights then a 0 bias."""
    flat: list[float] = []
    for _ in range(nout):
        flat.extend(random.uniform(-1, 1) for _ in range(nin))
        flat.append(0.0)
    return flat


class Module:
    """Base class: ``parameters()`` and ``zero_grad()``, as in micrograd."""

    def zero_grad(self) -> None:
        """Set the gradient of every parameter to 0."""
        for p in self.parameters():
            p.grad = 0

    def parameters(self) -> list[Value]:
        """Return the parameters (Values) of the module."""
        return []


class Neuron(Module):
    """``act(b + sum(w[i] * x[i]))`` with ReLU when ``nonlin`` (micrograd's default)."""

    def __init__(
        self,
        nin: int,
        nonlin: bool = True,
        *,
        activation: str | None = None,
        _c: _core.Neuron | None = None,
    ) -> None:
        if _c is None:
            nin = _count(nin, "Neuron", "nin")
            act = _check_activation(
                "relu" if nonlin else "linear" if activation is None else activation
            )
            _c = _core.Neuron(nin, act)
            _c.set_data(_draw(nin, 1))
        self._attach(_c)

    def _attach(self, c: _core.Neuron) -> None:
        """Makes this object the view of the C neuron ``c``."""
        self._c = c
        params = c.params()
        self.w: list[Value] = params[:-1]
        self.b: Value = params[-1]

    @property
    def nonlin(self) -> bool:
        """Whether the neuron applies its nonlinearity (writable, as in micrograd)."""
        return self._c.activation != "linear"

    @nonlin.setter
    def nonlin(self, on: bool) -> None:
        self._c.activation = "relu" if on else "linear"

    @property
    def activation(self) -> str:
        """The activation: 'relu', 'tanh', 'sigmoid' or 'linear' (writable)."""
        return self._c.activation

    @activation.setter
    def activation(self, name: str) -> None:
        self._c.activation = _check_activation(name)

    def __call__(self, x: Sequence[Scalar]) -> Value:
        return self._c(x)

    def parameters(self) -> list[Value]:
        return self.w + [self.b]

    def __repr__(self) -> str:
        return f"{_kind(self.activation)}Neuron({len(self.w)})"

    def __getstate__(self) -> dict[str, Any]:
        return {"nin": len(self.w), "activation": self.activation, "params": self._c.get_data()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        c = _core.Neuron(state["nin"], state["activation"])
        c.set_data(state["params"])
        self._attach(c)


class Layer(Module):
    """``nout`` neurons over the same inputs; a layer of one neuron returns a bare Value."""

    def __init__(
        self,
        nin: int,
        nout: int,
        nonlin: bool = True,
        *,
        activation: str | None = None,
        _c: _core.Layer | None = None,
    ) -> None:
        if _c is None:
            nin, nout = _count(nin, "Layer", "nin"), _count(nout, "Layer", "nout")
            act = _check_activation(
                "relu" if nonlin else "linear" if activation is None else activation
            )
            _c = _core.Layer(nin, nout, act)
            _c.set_data(_draw(nin, nout))
        self._attach(_c)

    def _attach(self, c: _core.Layer) -> None:
        """Makes this object the view of the C layer ``c`` (and its neurons)."""
        self._c = c
        self.neurons: list[Neuron] = [Neuron(c.nin, _c=c.neuron(i)) for i in range(c.nout)]

    def __call__(self, x: Sequence[Scalar]) -> Output:
        out = self._c(x)
        return out[0] if len(out) == 1 else out

    def parameters(self) -> list[Value]:
        return [p for n in self.neurons for p in n.parameters()]

    def __repr__(self) -> str:
        return f"Layer of [{', '.join(str(n) for n in self.neurons)}]"

    def __getstate__(self) -> dict[str, Any]:
        return {
            "nin": self._c.nin,
            "nout": self._c.nout,
            "activations": [n.activation for n in self.neurons],
            "params": self._c.get_data(),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        c = _core.Layer(state["nin"], state["nout"], "relu")
        c.set_data(state["params"])
        self._attach(c)
        for n, a in zip(self.neurons, state["activations"]):
            n.activation = a


class MLP(Module):
    """micrograd's multi-layer perceptron: ReLU hidden layers (or ``activation``), linear output.

    ``MLP(2, [16, 16, 1])`` has 337 parameters. Beyond micrograd: ``state_dict()`` and
    ``load_state_dict()`` with PyTorch ``nn.Linear`` shapes, ``save()`` and ``load()`` to and from
    a model file (:mod:`micrograd_c.modelfile`), and pickling.
    """

    def __init__(self, nin: int, nouts: Sequence[int], *, activation: str = "relu") -> None:
        if isinstance(nouts, (str, bytes)) or not hasattr(nouts, "__iter__"):
            raise TypeError(
                f"MLP: nouts must be a sequence of layer widths, not {type(nouts).__name__}"
            )
        for n in nouts:
            if not hasattr(type(n), "__index__"):
                raise TypeError(f"MLP: layer widths must be integers, not {type(n).__name__}")
        nouts = [operator.index(n) for n in nouts]
        nin = _index(nin, "MLP", "nin")
        if not nouts:
            raise ValueError("MLP needs at least one layer (nouts is empty)")
        if nin < 1:
            raise ValueError(f"MLP({nin}, {nouts}): an MLP needs at least one input")
        if any(n < 1 for n in nouts):
            raise ValueError(f"MLP({nin}, {nouts}): layer widths must be at least 1")
        sz = [nin] + nouts
        self._c = _core.MLP(nin, nouts, _check_activation(activation))
        flat: list[float] = []
        for i in range(len(nouts)):
            flat.extend(_draw(sz[i], sz[i + 1]))
        self._c.set_data(flat)
        self._build_views(sz)

    def _build_views(self, sz: list[int]) -> None:
        self.layers: list[Layer] = [
            Layer(sz[i], sz[i + 1], _c=self._c.layer(i)) for i in range(len(sz) - 1)
        ]

    def __call__(self, x: Sequence[Scalar]) -> Output:
        out = self._c(x)
        return out[0] if len(out) == 1 else out

    def parameters(self) -> list[Value]:
        return [p for layer in self.layers for p in layer.parameters()]

    def __repr__(self) -> str:
        return f"MLP of [{', '.join(str(layer) for layer in self.layers)}]"

    # ---- beyond micrograd -------------------------------------------------------------------

    @property
    def sizes(self) -> list[int]:
        """``[nin, nout_0, nout_1, ...]``."""
        return [self._c.nin] + [len(layer.neurons) for layer in self.layers]

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters as numpy arrays shaped as PyTorch's ``nn.Linear``.

        ``layers.{i}.weight`` has shape ``(out, in)``, ``layers.{i}.bias`` shape ``(out,)``.
        """
        flat = self._c.get_data()
        sz, out, k = self.sizes, {}, 0
        for i in range(len(sz) - 1):
            block = flat[k : k + sz[i + 1] * (sz[i] + 1)].reshape(sz[i + 1], sz[i] + 1)
            out[f"layers.{i}.weight"] = block[:, : sz[i]].copy()
            out[f"layers.{i}.bias"] = block[:, sz[i]].copy()
            k += block.size
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load parameters from :meth:`state_dict`'s format (numpy arrays or tensors).

        Raises ``KeyError`` for missing or unexpected keys and ``ValueError`` naming the
        expected shape when an array's shape differs.
        """
        sz = self.sizes
        expected = {f"layers.{i}.{kind}" for i in range(len(sz) - 1) for kind in ("weight", "bias")}
        missing, extra = expected - set(state), set(state) - expected
        if missing or extra:
            raise KeyError(
                f"state dict mismatch: missing {sorted(missing)}, unexpected {sorted(extra)}"
            )
        flat: list[np.ndarray] = []
        for i in range(len(sz) - 1):
            w = np.asarray(state[f"layers.{i}.weight"], dtype=np.float64)
            b = np.asarray(state[f"layers.{i}.bias"], dtype=np.float64)
            if w.shape != (sz[i + 1], sz[i]):
                raise ValueError(
                    f"layers.{i}.weight: expected shape {(sz[i + 1], sz[i])}, got {w.shape}"
                )
            if b.shape != (sz[i + 1],):
                raise ValueError(f"layers.{i}.bias: expected shape {(sz[i + 1],)}, got {b.shape}")
            flat.append(np.concatenate([w, b[:, None]], axis=1).ravel())
        self._c.set_data(np.concatenate(flat))

    def save(self, path: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None) -> None:
        """Write the model to ``path``, a versioned ``.npz`` model file read by :meth:`load`.

        ``metadata``, a JSON-serialisable mapping, is stored with it (``micrograd_c.modelfile.load``
        returns it). The file is replaced atomically. Raises ``ValueError`` when the format cannot
        hold the model (hidden neurons with different activations, a nonlinear output layer) and
        ``OSError`` when the file cannot be written. See :mod:`micrograd_c.modelfile`.
        """
        from . import modelfile

        modelfile.save(path, self, metadata)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MLP:
        """Read a model written by :meth:`save` (or ``micrograd-c train --save``).

        Files are untrusted: shapes and sizes are checked against the file before anything is
        allocated, and nothing is unpickled. Raises ``micrograd_c.modelfile.ModelFileError`` (a
        ``ValueError``) for a file that is not a readable model file, ``OSError`` when it cannot be
        opened.
        """
        from . import modelfile

        return modelfile.load(path)[0]

    def __getstate__(self) -> dict[str, Any]:
        return {
            "sizes": self.sizes,
            "activations": [[n.activation for n in layer.neurons] for layer in self.layers],
            "params": self._c.get_data(),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        sz = list(state["sizes"])
        self._c = _core.MLP(sz[0], sz[1:], "relu")
        self._c.set_data(state["params"])
        self._build_views(sz)
        for layer, acts in zip(self.layers, state["activations"]):
            for n, a in zip(layer.neurons, acts):
                n.activation = a


__all__ = ["Module", "Neuron", "Layer", "MLP", "ACTIVATIONS"]
