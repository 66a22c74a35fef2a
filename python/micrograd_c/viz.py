"""Graph drawing, as in micrograd's demo notebook, without recursion."""

from __future__ import annotations

from typing import Any

from .engine import Value


def trace(root: Value) -> tuple[set[Value], set[tuple[Value, Value]]]:
    """Return the nodes and edges reachable from ``root`` (iteratively: any depth works)."""
    nodes: set[Value] = set()
    edges: set[tuple[Value, Value]] = set()
    stack: list[Value] = [root]
    while stack:
        v = stack.pop()
        if v in nodes:
            continue
        nodes.add(v)
        for child in v._prev:
            edges.add((child, v))
            stack.append(child)
    return nodes, edges


def _record_text(text: str) -> str:
    """``text`` escaped for a field of a DOT record label (braces, bars, angles, quotes, control
    characters)."""
    out = text.replace("\\", "\\\\")
    for ch in '{}|<>"':
        out = out.replace(ch, "\\" + ch)
    # control characters (newlines, NUL: a syntax error to dot) become spaces
    return "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in out)


def _dot_source(root: Value, rankdir: str) -> str:
    nodes, edges = trace(root)
    lines = ["digraph {", f"  rankdir={rankdir};"]
    for n in sorted(nodes, key=lambda v: v._id):
        uid = f"n{n._id}"
        name = _record_text(n.label)
        head = f"{name} | " if name else ""
        lines.append(
            f'  {uid} [shape=record, label="{{ {head}data {n.data:.4f} | grad {n.grad:.4f} }}"];'
        )
        if n._op:
            lines.append(f'  {uid}op [label="{n._op}"];')
            lines.append(f"  {uid}op -> {uid};")
    for a, b in sorted(edges, key=lambda e: (e[0]._id, e[1]._id)):
        lines.append(f"  n{a._id} -> n{b._id}op;")
    lines.append("}")
    return "\n".join(lines) + "\n"


def draw_dot(root: Value, format: str = "svg", rankdir: str = "LR") -> Any | str:
    """Draw the graph of ``root`` as micrograd's notebook does.

    Returns a ``graphviz.Digraph`` when the optional ``graphviz`` package is installed (render
    or display it in a notebook), and the DOT source text otherwise. Node names come from node
    ids, so the same graph gives the same text.
    """
    if rankdir not in ("LR", "TB"):
        raise ValueError("rankdir must be 'LR' or 'TB'")
    src = _dot_source(root, rankdir)
    try:
        import graphviz
    except ImportError:
        return src
    return graphviz.Source(src, format=format)


__all__ = ["draw_dot", "trace"]
