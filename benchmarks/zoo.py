"""Model families written op by op, as a micrograd user writes them: lists of Values, Python loops.

Every builder takes the input placeholders ``x`` (784 pixel values of a 28x28 image, row-major)
and returns ``(logits, params)``: the 10 class scores and the parameters in a fixed order. The
benchmark (``models.py``) and the tests (``tests/python/test_reroll.py``) freeze these graphs,
and ``torch_model`` builds the same model in PyTorch (same parameters, same order) for the
reference rows. Weights are drawn from ``random.uniform`` scaled by 1/sqrt(fan-in), so training
does not diverge.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from micrograd_c.engine import Value

Params = list[Value]


def _w(fan_in: int, params: Params) -> Value:
    v = Value(random.uniform(-1.0, 1.0) / math.sqrt(fan_in))
    params.append(v)
    return v


def _b(params: Params) -> Value:
    v = Value(0.0)
    params.append(v)
    return v


def _matrix(rows: int, cols: int, fan_in: int, params: Params) -> list[list[Value]]:
    return [[_w(fan_in, params) for _ in range(cols)] for _ in range(rows)]


def _dense(x: Sequence[Any], W: list[list[Value]], b: list[Value]) -> list[Value]:
    """micrograd's Neuron: sum((wi*xi for ...), b) per output."""
    return [sum((wi * xi for wi, xi in zip(row, x)), bj) for row, bj in zip(W, b)]


# ---- MLP ------------------------------------------------------------------------------------


def mlp(
    x: Sequence[Value], hidden: Sequence[int] = (50,), nout: int = 10
) -> tuple[list[Value], Params]:
    """MLP(784, [hidden..., 10]) with ReLU, written as micrograd's nn.py computes it."""
    params: Params = []
    h: Sequence[Any] = x
    sizes = list(hidden) + [nout]
    for li, n in enumerate(sizes):
        W = _matrix(n, len(h), len(h), params)
        b = [_b(params) for _ in range(n)]
        out = _dense(h, W, b)
        h = [o.relu() for o in out] if li + 1 < len(sizes) else out
    return list(h), params


# ---- CNN ------------------------------------------------------------------------------------


def _conv(
    img: list[list[list[Any]]],
    cout: int,
    k: int,
    stride: int,
    pad: int,
    params: Params,
    pad_with_zeros: bool = False,
) -> list[list[list[Value]]]:
    """img[c][i][j] -> out[co][i][j]: b + sum over (ci, a, b) of w * x, skipping the padding
    (or multiplying it as constant zeros with ``pad_with_zeros``)."""
    cin, H, W = len(img), len(img[0]), len(img[0][0])
    fan = cin * k * k
    w = [
        [[[_w(fan, params) for _ in range(k)] for _ in range(k)] for _ in range(cin)]
        for _ in range(cout)
    ]
    bias = [_b(params) for _ in range(cout)]
    Ho, Wo = (H + 2 * pad - k) // stride + 1, (W + 2 * pad - k) // stride + 1
    out = []
    for co in range(cout):
        plane = []
        for i in range(Ho):
            row = []
            for j in range(Wo):
                s: Any = bias[co]
                for ci in range(cin):
                    for a in range(k):
                        for bb in range(k):
                            ii, jj = i * stride + a - pad, j * stride + bb - pad
                            if 0 <= ii < H and 0 <= jj < W:
                                s = s + w[co][ci][a][bb] * img[ci][ii][jj]
                            elif pad_with_zeros:
                                s = s + w[co][ci][a][bb] * 0.0
                row.append(s)
            plane.append(row)
        out.append(plane)
    return out


def _pool(img: list[list[list[Value]]], kind: str) -> list[list[list[Value]]]:
    """2x2 pooling, stride 2: max (Value.max) or average ((a + b + c + d) * 0.25)."""
    out = []
    for plane in img:
        H, W = len(plane) // 2, len(plane[0]) // 2
        rows = []
        for i in range(H):
            row = []
            for j in range(W):
                a, b = plane[2 * i][2 * j], plane[2 * i][2 * j + 1]
                c, d = plane[2 * i + 1][2 * j], plane[2 * i + 1][2 * j + 1]
                row.append(a.max(b).max(c).max(d) if kind == "max" else (a + b + c + d) * 0.25)
            rows.append(row)
        out.append(rows)
    return out


def _relu3(img: list[list[list[Value]]]) -> list[list[list[Value]]]:
    return [[[v.relu() for v in row] for row in plane] for plane in img]


def cnn(
    x: Sequence[Value],
    convs: Sequence[tuple[int, int, int, int]] = ((4, 3, 1, 0),),
    pool: str = "max",
    pad_with_zeros: bool = False,
) -> tuple[list[Value], Params]:
    """conv (channels, kernel, stride, padding) + relu [+ 2x2 pool after the last conv]
    + dense 10."""
    params: Params = []
    img: list[list[list[Any]]] = [[list(x[i * 28 : (i + 1) * 28]) for i in range(28)]]
    for li, (c, k, s, p) in enumerate(convs):
        img = _relu3(_conv(img, c, k, s, p, params, pad_with_zeros))
        if li + 1 == len(convs) and pool != "none":
            img = _pool(img, pool)
    flat = [v for plane in img for row in plane for v in row]
    W = _matrix(10, len(flat), len(flat), params)
    b = [_b(params) for _ in range(10)]
    return _dense(flat, W, b), params


# ---- RNN ------------------------------------------------------------------------------------


def elman(x: Sequence[Value], hidden: int = 16, steps: int = 28) -> tuple[list[Value], Params]:
    """h_t = tanh(b + Wx x_t + Wh h_{t-1}) over the rows of the image, then dense 10 on h_T."""
    params: Params = []
    n = len(x) // steps
    Wx = _matrix(hidden, n, n + hidden, params)
    Wh = _matrix(hidden, hidden, n + hidden, params)
    bh = [_b(params) for _ in range(hidden)]
    h: list[Value] | None = None
    for t in range(steps):
        xt = x[t * n : (t + 1) * n]
        nh = []
        for j in range(hidden):
            s: Any = bh[j]
            for i in range(n):
                s = s + Wx[j][i] * xt[i]
            if h is not None:
                for k in range(hidden):
                    s = s + Wh[j][k] * h[k]
            nh.append(s.tanh())
        h = nh
    assert h is not None
    Wy = _matrix(10, hidden, hidden, params)
    by = [_b(params) for _ in range(10)]
    return _dense(h, Wy, by), params


def gru(x: Sequence[Value], hidden: int = 16, steps: int = 28) -> tuple[list[Value], Params]:
    """A GRU cell (PyTorch's equations) over the rows of the image, then dense 10 on h_T:
    z = sigmoid(Wz x + bz + Uz h), r = sigmoid(Wr x + br + Ur h),
    n = tanh(Wn x + bn + r * (Un h + cn)), h' = (1 - z) * n + z * h."""
    params: Params = []
    n = len(x) // steps
    fan = n + hidden
    Wz, Wr, Wn = (_matrix(hidden, n, fan, params) for _ in range(3))
    Uz, Ur, Un = (_matrix(hidden, hidden, fan, params) for _ in range(3))
    bz, br, bn, cn = ([_b(params) for _ in range(hidden)] for _ in range(4))
    h: list[Any] = [0.0] * hidden
    for t in range(steps):
        xt = x[t * n : (t + 1) * n]
        nh = []
        for j in range(hidden):
            z = (
                sum((w * xi for w, xi in zip(Wz[j], xt)), bz[j])
                + sum((u * hk for u, hk in zip(Uz[j], h)), 0.0)
            ).sigmoid()
            r = (
                sum((w * xi for w, xi in zip(Wr[j], xt)), br[j])
                + sum((u * hk for u, hk in zip(Ur[j], h)), 0.0)
            ).sigmoid()
            c = (
                sum((w * xi for w, xi in zip(Wn[j], xt)), bn[j])
                + r * sum((u * hk for u, hk in zip(Un[j], h)), cn[j])
            ).tanh()
            nh.append((1 - z) * c + z * h[j])
        h = nh
    Wy = _matrix(10, hidden, hidden, params)
    by = [_b(params) for _ in range(10)]
    return _dense(h, Wy, by), params


# ---- attention ------------------------------------------------------------------------------


def attention(x: Sequence[Value], tokens: int = 7, dim: int = 16) -> tuple[list[Value], Params]:
    """Self-attention over `tokens` strips of the image: embed (shared), q/k/v projections,
    softmax from exp and division, a residual, mean over tokens, dense 10."""
    params: Params = []
    n = len(x) // tokens
    We = _matrix(dim, n, n, params)
    be = [_b(params) for _ in range(dim)]
    Wq, Wk, Wv = (_matrix(dim, dim, dim, params) for _ in range(3))
    e = [_dense(x[t * n : (t + 1) * n], We, be) for t in range(tokens)]
    q = [[sum((w * ei for w, ei in zip(row, et)), 0.0) for row in Wq] for et in e]
    k = [[sum((w * ei for w, ei in zip(row, et)), 0.0) for row in Wk] for et in e]
    v = [[sum((w * ei for w, ei in zip(row, et)), 0.0) for row in Wv] for et in e]
    scale = 1.0 / math.sqrt(dim)
    out = []
    for i in range(tokens):
        s = [sum((qa * kb for qa, kb in zip(q[i], k[j])), 0.0) * scale for j in range(tokens)]
        ex = [si.exp() for si in s]
        tot = sum(ex, 0.0)
        a = [ej / tot for ej in ex]
        o = [sum((a[j] * v[j][d] for j in range(tokens)), 0.0) for d in range(dim)]
        out.append([od + ed for od, ed in zip(o, e[i])])
    pooled = [sum((out[t][d] for t in range(tokens)), 0.0) * (1.0 / tokens) for d in range(dim)]
    Wo = _matrix(10, dim, dim, params)
    bo = [_b(params) for _ in range(10)]
    return _dense(pooled, Wo, bo), params


# ---- the families ---------------------------------------------------------------------------


@dataclass
class Family:
    name: str
    build: Callable[[Sequence[Value]], tuple[list[Value], Params]]
    description: str
    torch_spec: dict[str, Any] = field(default_factory=dict)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            "mlp", lambda x: mlp(x), "MLP(784,[50,10]) op by op", {"kind": "mlp", "hidden": (50,)}
        ),
        Family(
            "cnn",
            lambda x: cnn(x),
            "conv3x3x4 + relu + maxpool2 + dense10",
            {"kind": "cnn", "convs": ((4, 3, 1, 0),), "pool": "max"},
        ),
        Family(
            "cnn5s2",
            lambda x: cnn(x, ((8, 5, 2, 2),), pool="avg"),
            "conv5x5x8 stride 2 pad 2 + relu + avgpool2 + dense10",
            {"kind": "cnn", "convs": ((8, 5, 2, 2),), "pool": "avg"},
        ),
        Family(
            "cnn2",
            lambda x: cnn(x, ((2, 3, 1, 1), (4, 3, 2, 0))),
            "conv3x3x2 pad 1 + relu + conv3x3x4 stride 2 + relu + maxpool2 + dense10",
            {"kind": "cnn", "convs": ((2, 3, 1, 1), (4, 3, 2, 0)), "pool": "max"},
        ),
        Family(
            "cnn48",
            lambda x: cnn(x, ((48, 3, 1, 1),)),
            "conv3x3x48 pad 1 + relu + maxpool2 + dense10 (~1M values)",
            {"kind": "cnn", "convs": ((48, 3, 1, 1),), "pool": "max"},
        ),
        Family(
            "elman",
            lambda x: elman(x),
            "Elman RNN, 16 tanh units, 28 steps",
            {"kind": "elman", "hidden": 16},
        ),
        Family(
            "gru", lambda x: gru(x), "GRU cell, 16 units, 28 steps", {"kind": "gru", "hidden": 16}
        ),
        Family(
            "attention",
            lambda x: attention(x),
            "self-attention, 7 tokens x 16, residual",
            {"kind": "attention", "tokens": 7, "dim": 16},
        ),
    ]
}
