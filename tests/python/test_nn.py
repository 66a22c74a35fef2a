"""nn classes against micrograd 0.1.0: same init, same forward, same training, same API."""

from __future__ import annotations

import pickle
import random

import micrograd.nn as ref_nn
import numpy as np
import pytest
from micrograd.engine import Value as RefValue

from micrograd_c.engine import Value
from micrograd_c.nn import MLP, Layer, Module, Neuron

from conftest import close


def both(seed, cls_ours, cls_ref, *args, **kwargs):
    random.seed(seed)
    ours = cls_ours(*args, **kwargs)
    random.seed(seed)
    ref = cls_ref(*args, **kwargs)
    return ours, ref


def test_same_seed_same_parameters_as_micrograd():
    ours, ref = both(1337, MLP, ref_nn.MLP, 2, [16, 16, 1])
    assert len(ours.parameters()) == len(ref.parameters()) == 337
    assert [p.data for p in ours.parameters()] == [float(p.data) for p in ref.parameters()]


def test_reprs_and_structure_match_micrograd():
    ours, ref = both(0, MLP, ref_nn.MLP, 3, [4, 2])
    assert repr(ours) == repr(ref)
    assert repr(ours.layers[0]) == repr(ref.layers[0])
    assert repr(ours.layers[1].neurons[0]) == repr(ref.layers[1].neurons[0]) == "LinearNeuron(4)"
    assert len(ours.layers) == 2 and len(ours.layers[0].neurons) == 4
    n = ours.layers[0].neurons[1]
    assert len(n.w) == 3 and isinstance(n.b, Value) and n.nonlin is True
    assert ours.layers[1].neurons[0].nonlin is False
    assert isinstance(ours, Module)


def test_forward_matches_micrograd_bitwise():
    ours, ref = both(5, MLP, ref_nn.MLP, 3, [8, 8, 2])
    x = [0.5, -1.25, 2.0]
    out, rout = ours(x), ref(x)
    assert [o.data for o in out] == [float(r.data) for r in rout]
    xv = [Value(v) for v in x]
    assert [o.data for o in ours(xv)] == [o.data for o in out]


def test_layer_of_one_neuron_returns_a_bare_value():
    random.seed(1)
    assert isinstance(Layer(3, 1)([1.0, 2.0, 3.0]), Value)
    assert isinstance(MLP(3, [4, 1])([1.0, 2.0, 3.0]), Value)
    assert isinstance(Layer(3, 2)([1.0, 2.0, 3.0]), list)


def test_standalone_neuron_and_layer_match_micrograd():
    ours, ref = both(9, Neuron, ref_nn.Neuron, 4)
    x = [0.1, -0.2, 0.3, 0.9]
    assert ours(x).data == ref(x).data
    ours, ref = both(9, Neuron, ref_nn.Neuron, 4, nonlin=False)
    assert ours(x).data == ref(x).data and repr(ours) == repr(ref)
    ours, ref = both(9, Layer, ref_nn.Layer, 4, 3)
    assert [o.data for o in ours(x)] == [float(r.data) for r in ref(x)]


def test_writes_to_parameters_take_effect():
    random.seed(2)
    m = MLP(2, [3, 1])
    x = [1.0, -1.0]
    before = m(x).data
    n = m.layers[1].neurons[0]
    n.b.data += 1.0
    assert close(m(x).data, before + 1.0)
    m.layers[0].neurons[0].w[0].data = 100.0
    assert m.parameters()[0].data == 100.0
    n.nonlin = True  # toggling the nonlinearity reaches C too
    m.layers[1].neurons[0].b.data = -1000.0
    assert m(x).data == 0.0


def test_backward_and_zero_grad_match_micrograd():
    ours, ref = both(11, MLP, ref_nn.MLP, 3, [5, 1])
    x = [0.3, -0.7, 1.1]
    lo, lr = (ours(x) - 0.5) ** 2, (ref(x) - 0.5) ** 2
    lo.backward()
    lr.backward()
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert close(p.grad, float(q.grad))
    ours.zero_grad()
    assert all(p.grad == 0.0 for p in ours.parameters())


def test_training_steps_match_micrograd():
    random.seed(3)
    X = [[random.uniform(-1, 1), random.uniform(-1, 1)] for _ in range(20)]
    Y = [1 if a * b > 0 else -1 for a, b in X]
    ours, ref = both(4, MLP, ref_nn.MLP, 2, [8, 8, 1])
    for model, V in ((ours, Value), (ref, RefValue)):
        for _ in range(5):
            scores = [model([V(a), V(b)]) for a, b in X]
            loss = sum((1 + -y * s).relu() for y, s in zip(Y, scores)) * (1.0 / len(X))
            model.zero_grad()
            loss.backward()
            for p in model.parameters():
                p.data -= 0.5 * p.grad
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert close(p.data, float(q.data))


def test_state_dict_has_pytorch_shapes_and_round_trips():
    random.seed(6)
    m = MLP(3, [4, 2])
    sd = m.state_dict()
    assert list(sd) == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"]
    assert sd["layers.0.weight"].shape == (4, 3) and sd["layers.1.bias"].shape == (2,)
    assert sd["layers.0.weight"][2, 1] == m.layers[0].neurons[2].w[1].data
    m2 = MLP(3, [4, 2])
    m2.load_state_dict(sd)
    x = [0.2, 0.4, -0.6]
    assert [o.data for o in m2(x)] == [o.data for o in m(x)]
    bad = dict(sd)
    bad["layers.0.weight"] = np.zeros((3, 4))
    with pytest.raises(ValueError, match=r"expected shape \(4, 3\)"):
        m2.load_state_dict(bad)
    with pytest.raises(KeyError):
        m2.load_state_dict({"layers.0.weight": sd["layers.0.weight"]})


def test_state_dict_matches_torch_linear():
    torch = pytest.importorskip("torch")
    random.seed(8)
    m = MLP(3, [4, 2])
    net = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)
    ).double()
    sd = m.state_dict()
    net.load_state_dict(
        {
            k.replace("layers.0", "0").replace("layers.1", "2"): torch.from_numpy(v)
            for k, v in sd.items()
        }
    )
    x = [0.2, 0.4, -0.6]
    assert np.allclose(
        net(torch.tensor(x, dtype=torch.float64)).detach().numpy(),
        [o.data for o in m(x)],
        rtol=1e-12,
        atol=0,
    )


def test_pickle_round_trip():
    random.seed(7)
    m = MLP(2, [3, 3, 1], activation="tanh")
    m.layers[0].neurons[1].nonlin = False
    m2 = pickle.loads(pickle.dumps(m))
    x = [0.3, -0.9]
    assert m2(x).data == m(x).data
    assert repr(m2) == repr(m)
    n = pickle.loads(pickle.dumps(m.layers[0].neurons[0]))
    assert n(x).data == m.layers[0].neurons[0](x).data
    layer = pickle.loads(pickle.dumps(m.layers[0]))
    assert [o.data for o in layer(x)] == [o.data for o in m.layers[0](x)]


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="at least one layer"):
        MLP(2, [])
    with pytest.raises(ValueError, match="at least one input"):
        MLP(0, [3])
    with pytest.raises(ValueError):
        MLP(2, [3, 0])
    with pytest.raises(ValueError, match="expected 2 inputs, got 3"):
        MLP(2, [3])([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="activation"):
        MLP(2, [3], activation="gelu")
    with pytest.raises(TypeError):
        MLP(2, [3])(["a", 1.0])


@pytest.mark.parametrize(
    "make, exc, words",
    [
        (lambda: MLP(2.5, [1]), TypeError, "nin must be an integer"),
        (lambda: MLP("2", [1]), TypeError, "nin must be an integer"),
        (lambda: MLP(2, [1.5]), TypeError, "layer widths must be integers"),
        (lambda: MLP(2, 3), TypeError, "nouts must be a sequence"),
        (lambda: MLP(-3, [1]), ValueError, "at least one input"),
        (lambda: MLP(2, [1], activation=5), TypeError, "activation must be a string"),
        (lambda: Neuron(-1), ValueError, "nin must be at least 1"),
        (lambda: Neuron(2.0), TypeError, "nin must be an integer"),
        (lambda: Neuron(None), TypeError, "nin must be an integer"),
        (lambda: Layer(2, 0), ValueError, "nout must be at least 1"),
        (lambda: Layer("a", 2), TypeError, "nin must be an integer"),
        (lambda: Layer(2, 2.5), TypeError, "nout must be an integer"),
        (lambda: MLP(2, [2**70]), ValueError, "too many"),
        (lambda: Neuron(2**64), ValueError, "too many"),
    ],
)
def test_wrong_arguments_are_one_line_errors(make, exc, words):
    with pytest.raises(exc) as e:
        make()
    msg = str(e.value)
    assert words in msg and "\n" not in msg and "incompatible function arguments" not in msg


def test_core_constructors_speak_micrograd_c():
    from micrograd_c import _core

    for make in (
        lambda: _core.MLP(2.5, [1], "relu"),
        lambda: _core.Neuron(-1, "relu"),
        lambda: _core.Layer(2, "x", "relu"),
        lambda: _core.MLP(2, [1], 5),
        lambda: _core.MLP(2, [1], "relu").layer("a"),
        lambda: _core.Neuron(2, "relu").__call__(5),
    ):
        with pytest.raises((TypeError, ValueError, IndexError)) as e:
            make()
        assert "\n" not in str(e.value) and "incompatible function arguments" not in str(e.value)
    n = Neuron(2)
    with pytest.raises(TypeError, match="activation must be a string"):
        n.activation = 3
    with pytest.raises(IndexError):
        _core.MLP(2, [1], "relu").layer(5)
