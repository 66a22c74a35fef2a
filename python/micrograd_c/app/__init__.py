"""The micrograd-c application: the ``micrograd-c`` command and what it is made of.

The library (``micrograd_c`` and its compiler) never imports this package. Modules:

- :mod:`.data`: the datasets the command trains on, split as it splits them;
- :mod:`.trainer`: a training loop over any backend, with Ctrl-C handling, usable from Python;
- :mod:`.plots`: the decision boundary and the training curve;
- :mod:`.bench`: ``micrograd-c bench``'s engines and table;
- :mod:`.parser`: the command line;
- :mod:`.commands`: ``train``, ``eval``, ``export-c``, ``bench`` and :func:`main`.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run the ``micrograd-c`` command; returns the exit status (see :mod:`.commands`)."""
    from .commands import main as run

    return run(argv)


__all__ = ["main"]
