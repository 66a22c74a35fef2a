"""What each nest function of generated code costs gcc, and how evenly the emitter splits them.

    python benchmarks/compile_costs.py [--families mlp,elman,...] [--rounds 3] [--cc gcc]

Generated training code is compiled as parts in parallel (``MG_PART``), and libmg's emitter
assigns the nest functions to the parts by estimated cost (``kernel_cost`` in libmg/src/emit.c).
This script measures the costs those estimates stand for. For every family of ``zoo.py`` it
emits the C source, compiles random subsets of its nest functions (each one in about half of
them, ``--rounds`` times as many compiles as functions, with the flags compile() uses) and fits
each function's CPU time (user + sys) by least squares. It prints, per function, the fitted
seconds with what the cost depends on (tile kind, whether its output is per-sample, blocks, the
nest's flags: B blocks, S split sums, T steps, X scatter, I tiles, P pre-step, D bands), then the
two parts' loads as the emitter split them against an even split. Figures are CPU seconds on
this machine; refit kernel_cost's weights from them when the kernels' text changes much.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import resource
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import zoo  # noqa: E402

import micrograd_c as mc  # noqa: E402
from micrograd_c import compiler  # noqa: E402
from micrograd_c.app.bench import cpu_model  # noqa: E402

# A letter per nest flag, by name; the flags' values are read from the source itself (the enum of
# nest_kernels.h it embeds), so a flag added there prints under its own name until it gets a letter.
FLAG_LETTERS = {
    "BLOCK": "B",
    "SPLIT": "S",
    "STEP": "T",
    "SCATTER": "X",
    "TILE": "I",
    "PRESTEP": "P",
    "BAND": "D",
}


def flag_letters(src: str) -> list[tuple[int, str]]:
    """(bit, letter) for every MGK_F_* flag the generated source defines."""
    found = re.findall(r"\bMGK_F_([A-Z0-9_]+) = (\d+)", src)
    if not found:
        raise SystemExit("compile_costs: no MGK_F_* flags in the generated source")
    return [(int(v), FLAG_LETTERS.get(name, f"[{name}]")) for name, v in found]


def source_of(name: str) -> str:
    """The training C of a zoo family at its benchmark size."""
    random.seed(0)
    x, y = mc.inputs(784), mc.inputs(1)
    logits, params = zoo.FAMILIES[name].build(x)
    loss = mc.cross_entropy(logits, y[0])
    prog = mc.compile(loss, inputs=x, targets=y, params=params, outputs=logits, backend="tape")
    return prog.c_source()


def cpu_seconds(cmd: list[str]) -> float:
    """The CPU time (user + sys) of the children ``cmd`` runs."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(name: str, tc: compiler.Toolchain, flags: list[str], rounds: int, work: str) -> None:
    src = source_of(name)
    bits = flag_letters(src)
    guards = re.findall(r"#if MG_HAS\((\d+), (\d+), \d+, \d+\)", src)
    part = {int(k): int(p) for k, p in guards}
    paths = dict(
        (int(k), [int(v) for v in a.split(", ")])
        for k, a in re.findall(
            r"MGK_NEST_PATH\(&mg_nests\[(\d+)\], \(const mgk_run \*\)r, ([^)]*)\)", src
        )
    )
    table = re.findall(
        r"/\* nest \d+ \*/\n\s*\{(\d+), (\d+), (\d+), (\d+), \d+, 0, [^,]+, \{([^}]*)\}", src
    )
    if not paths or len(table) != len(paths):
        print(f"{name}: no nest functions found in the source; skipped")
        return
    # each function behind SEL(k), selected on the command line; no program table
    sel = re.sub(r"#if MG_HAS\((\d+), \d+, \d+, \d+\)", r"#if SEL(\1)", src)
    sel = sel.replace("#if !defined(MG_PART) || MG_PART == 0", "#if 0")
    path = os.path.join(work, f"{name}.c")
    with open(path, "w") as f:
        f.write(sel)
    base = tc.command + flags + ["-fPIC", "-DMG_PART=0", "-DMG_NPARTS=2", "-w", "-c"]
    base += ["-o", os.path.join(work, f"{name}.o"), path]
    ks = sorted(paths)
    rng = random.Random(1)
    rows, ys = [], []
    for _ in range(rounds * len(ks) + 4):
        sub = [k for k in ks if rng.random() < 0.5]
        cond = "(" + "||".join(f"(k)=={k}" for k in sub) + ")" if sub else "0"
        rows.append([1.0] + [1.0 if k in sub else 0.0 for k in ks])
        ys.append(cpu_seconds(base + [f"-DSEL(k)={cond}"]))
    coef = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)[0]
    cost = dict(zip(ks, coef[1:]))
    print(f"\n{name}: {len(ks)} nest functions; a part's fixed cost {coef[0]:.3f} s")
    print("  fn   tile  per-sample  blocks  flags    n                          part  seconds")
    for k in ks:
        term, op, small, ps, tile, block, n3 = paths[k]
        flags_ = int(table[k][3])
        letters = "".join(c for b, c in bits if flags_ & b)
        print(
            f"  {k:3d}  {tile:4d}  {ps:10d}  {block:6d}  {letters:7s}  {table[k][4]:25s}  "
            f"{part[k]:4d}  {cost[k]:7.3f}"
        )
    loads = [sum(c for k, c in cost.items() if part[k] == p) for p in (0, 1)]
    print(
        f"  parts as emitted: {loads[0]:.2f} s and {loads[1]:.2f} s of fitted cost "
        f"(an even split: {sum(loads) / 2:.2f} s each)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--families", default=",".join(zoo.FAMILIES), help="comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="compiles per function (default 3)")
    ap.add_argument("--cc", default=None, help="the C compiler (default: what compile() finds)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    unknown = [f for f in args.families.split(",") if f not in zoo.FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown}; known: {', '.join(zoo.FAMILIES)}")
    tc = compiler.find_compiler(args.cc)
    flags = compiler.default_flags(tc)
    print(
        f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs; {tc.version}; flags {' '.join(flags)}"
    )
    with tempfile.TemporaryDirectory(prefix="mg-costs-") as work:
        for name in args.families.split(","):
            measure(name, tc, flags, args.rounds, work)


if __name__ == "__main__":
    main()
