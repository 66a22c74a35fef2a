"""What ``micrograd-c train`` draws: the decision boundary of a 2-D dataset (as micrograd's demo
draws it), otherwise the training curve and the held-out accuracy. Needs matplotlib
(``pip install 'micrograd-c[plot]'``): without it, :func:`plot` raises ``ImportError``."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np

from .data import Data


def plot(
    path: str,
    data: Data,
    predict: Callable[[np.ndarray], np.ndarray],
    history: Sequence[tuple[float, float]],
    curve: Sequence[tuple[float, float]] = (),
) -> str:
    """Write the plot as PNG to ``path``; returns its absolute path.

    For a dataset of two features and two classes, the decision boundary of ``predict`` (the
    model's outputs for rows of features) over the training points; otherwise the loss ``curve``
    (``(epoch as a fraction, mean loss)`` points, so one epoch is a line, not a dot; ``history``'s
    losses without one) and the held-out accuracy after each epoch of ``history``
    (``(loss, accuracy)`` per epoch).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    if data.nin == 2 and data.classes == 0:
        X, y = data.Xtr, data.ytr
        h = 0.02
        x_min, x_max = X[:, 0].min() - 1, X[:, 0].max() + 1
        y_min, y_max = X[:, 1].min() - 1, X[:, 1].max() + 1
        xx, yy = np.meshgrid(np.arange(x_min, x_max, h), np.arange(y_min, y_max, h))
        grid = np.c_[xx.ravel(), yy.ravel()]
        Z = (predict(grid)[:, 0] > 0).reshape(xx.shape)
        ax.contourf(xx, yy, Z, cmap="Spectral", alpha=0.8)
        ax.scatter(X[:, 0], X[:, 1], c=y, s=40, cmap="Spectral", edgecolors="k")
        ax.set_xlim(xx.min(), xx.max())
        ax.set_ylim(yy.min(), yy.max())
        ax.set_title(f"{data.name}: decision boundary, accuracy {history[-1][1]:.2f}")
    else:
        pts = list(curve) or [(i + 1.0, h_[0]) for i, h_ in enumerate(history)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label="training loss")
        ax.set_xlabel("epoch")
        ax.set_ylabel("mean training loss")
        ax2 = ax.twinx()
        accs = [h_[1] for h_ in history]
        ax2.plot(range(1, len(accs) + 1), accs, marker="s", color="tab:green", label="accuracy")
        ax2.set_ylabel("held-out accuracy (after each epoch)")
        ax.set_title(f"{data.name}: training")
    fig.tight_layout()
    if not os.path.splitext(path)[1]:
        path += ".png"  # what savefig does without an extension: say the file it writes
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return os.path.abspath(path)


__all__ = ["plot"]
