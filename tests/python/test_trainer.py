"""The trainer of micrograd_c.app, used from Python without the micrograd-c command."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest

from micrograd_c.app.data import load_data
from micrograd_c.app.trainer import TrainConfig, Trainer
from micrograd_c.nn import MLP


def _moons_model(seed: int = 0) -> MLP:
    random.seed(seed)
    return MLP(2, [16, 16, 1])


def _moons_config(**kw) -> TrainConfig:
    base = dict(loss="hinge", l2=1e-4, epochs=5, lr=0.1, batch_size=10, backend="tape")
    base.update(kw)
    return TrainConfig(**base)


def test_the_module_docstring_example_runs_without_the_command():
    """The example of trainer.py's docstring (the tape backend, fewer epochs) in a fresh
    interpreter: it trains, and neither the command's modules nor argparse are imported."""
    code = (
        "import random, sys, json\n"
        "from micrograd_c.nn import MLP\n"
        "from micrograd_c.app.data import load_data\n"
        "from micrograd_c.app.trainer import TrainConfig, Trainer\n"
        "data = load_data('moons')\n"
        "random.seed(0)\n"
        "model = MLP(data.nin, [16, 16, 1])\n"
        "result = Trainer(model, data, TrainConfig(loss='hinge', l2=1e-4, epochs=10, lr=0.1,\n"
        "                                          batch_size=10, backend='tape')).fit()\n"
        "print(json.dumps([result.history, sorted(sys.modules)]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    history, modules = json.loads(r.stdout.splitlines()[-1])
    assert len(history) == 10
    assert history[-1][0] < history[0][0]  # the loss goes down
    assert not [m for m in modules if m in ("micrograd_c.app.commands", "micrograd_c.app.parser")]
    assert "argparse" not in modules


@pytest.mark.parametrize("backend", ["eager", "tape"])
def test_fit_trains_the_model_it_was_given(backend):
    data = load_data("moons")
    model = _moons_model()
    before = [p.data for p in model.parameters()]
    seen = []
    trainer = Trainer(model, data, _moons_config(backend=backend, epochs=3))
    result = trainer.fit(on_epoch=lambda e, loss, acc: seen.append((e, loss, acc)))
    assert [e for e, _, _ in seen] == [0, 1, 2]
    assert result.history == [(loss, acc) for _, loss, acc in seen]
    assert not result.interrupted and result.seconds > 0 and result.curve
    assert all(np.isfinite(loss) and 0.0 <= acc <= 1.0 for loss, acc in result.history)
    after = [p.data for p in model.parameters()]
    assert after != before  # written back into the model's Values
    # predictions come from the trained parameters, whatever the backend
    out = trainer.predict(data.Xte[:5])
    assert out.shape == (5, 1)
    fresh = [model([float(a) for a in row]).data for row in data.Xte[:5]]
    np.testing.assert_allclose(out[:, 0], fresh, rtol=0, atol=1e-12)


def test_the_tape_and_eager_backends_train_the_same_model():
    data = load_data("moons")
    runs = []
    for backend in ("eager", "tape"):
        model = _moons_model()
        Trainer(model, data, _moons_config(backend=backend, epochs=2)).fit()
        runs.append(np.array([p.data for p in model.parameters()]))
    np.testing.assert_allclose(runs[0], runs[1], rtol=0, atol=1e-9)


@pytest.mark.parametrize("backend", ["eager", "tape"])
def test_ctrl_c_ends_training_with_the_last_completed_epoch(backend):
    data = load_data("moons")
    model = _moons_model()

    def on_epoch(epoch, loss, acc):
        if epoch == 1:
            raise KeyboardInterrupt

    trainer = Trainer(model, data, _moons_config(backend=backend, epochs=10))
    result = trainer.fit(on_epoch=on_epoch)
    assert result.interrupted and len(result.history) == 2
    # the model holds the parameters of the last completed step, written back for the tape
    reference = _moons_model()
    Trainer(reference, data, _moons_config(backend=backend, epochs=2)).fit()
    assert [p.data for p in model.parameters()] == [p.data for p in reference.parameters()]


def test_a_loss_that_does_not_fit_the_data_is_refused_before_training():
    data = load_data("moons")
    with pytest.raises(ValueError, match="xent needs a classification dataset"):
        Trainer(_moons_model(), data, _moons_config(loss="xent"))
    with pytest.raises(ValueError, match="unknown backend"):
        Trainer(_moons_model(), data, _moons_config(backend="gpu"))
    from micrograd_c.app.trainer import check_loss

    with pytest.raises(ValueError, match="mse needs a dataset with one output"):
        check_loss("mse", 10)
    with pytest.raises(ValueError, match="hinge needs a two-class dataset"):
        check_loss("hinge", 10)
    check_loss("mse", 0)


def test_float32_storage_is_compiled_code_and_float32_data():
    """float32 storage needs compiled code: other backends are refused before anything is built;
    load_data gives float32 features when asked (MNIST at half the memory)."""
    data = load_data("xor", dtype=np.float32)
    assert data.Xtr.dtype == np.float32 and data.Xtr.flags.c_contiguous
    assert np.array_equal(data.Xtr, load_data("xor").Xtr.astype(np.float32))
    random.seed(0)
    for backend in ("tape", "eager"):
        with pytest.raises(ValueError, match="float32 storage is compiled code"):
            Trainer(MLP(2, [4, 1]), data, TrainConfig(backend=backend, float32=True))
