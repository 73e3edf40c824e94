"""A deterministic profile of the simulator: Python bytecodes executed per simulated sample.

CPU time on a shared host moves from run to run with nothing changed, so a
change of the simulator's speed of a few percent cannot be seen in it. The number of
bytecodes the interpreter executes for the same seeded simulation does not depend on the
host's load (it moved by 0.2% between checkouts here: garbage-collector callbacks, such as
a weak set's, run at other moments); it is what an optimisation of the Python code
changes, and the profile says where they go.
(It does not see the C work behind a bytecode, an allocation or a dict lookup: on CPython
3.11 the evaluation loop is about half of the simulator's instructions, the rest a flat
tail of such C work.)

``bytecode_profile(run, short, long, samples_per_step)`` runs ``run(steps)`` with a
tracer that counts every bytecode (``frame.f_trace_opcodes``) and every Python call, for
``short`` and for ``long`` steps, and keeps the difference: the steady state per sample,
without imports, warm-up and the run's set-up. Counting costs about 30 times the run's
own time, so short runs are enough.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable

Key = tuple[str, str, int]  # (file, function, first line)


def _where(filename: str) -> str:
    """A file as its path from the project root (the folder above ``harness``), else its name."""
    parts = Path(filename).parts
    for root in ("harness", "miles_async_core", "fixtures"):
        if root in parts:
            return "/".join(parts[parts.index(root) :])
    return Path(filename).name


def _count(run: Callable[[int], Any], steps: int) -> tuple[Counter, Counter]:
    """(bytecodes, calls) per function of one ``run(steps)``."""
    ops: Counter = Counter()
    calls: Counter = Counter()

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        key = (code.co_filename, code.co_name, code.co_firstlineno)
        if event == "opcode":
            ops[key] += 1
        elif event == "call":
            calls[key] += 1
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
        return tracer

    before, before_threads = sys.gettrace(), threading.gettrace()
    sys.settrace(tracer)
    threading.settrace(tracer)  # threads the run starts (the simulator starts none)
    try:
        run(steps)
    finally:
        sys.settrace(before)
        threading.settrace(before_threads)
    return ops, calls


def bytecode_profile(
    run: Callable[[int], Any], short: int, long: int, samples_per_step: int, top: int = 25
) -> dict[str, Any]:
    """Bytecodes and Python calls per sample, in all and for the ``top`` functions by
    bytecodes: ``run(long)`` minus ``run(short)``, over ``(long - short) * samples_per_step``."""
    if not 0 < short < long:
        raise ValueError(f"short={short}, long={long}: need 0 < short < long (the profile is their difference)")
    # a first traced run, not counted: CPython 3.12 and 3.13 count a function's first traced
    # calls differently (its code is instrumented then), 3.11 counts it the same
    _count(run, short)
    ops_s, calls_s = _count(run, short)
    ops_l, calls_l = _count(run, long)
    n = (long - short) * samples_per_step
    rows = {}
    for key in set(ops_l) | set(calls_l):
        ops, calls = ops_l[key] - ops_s[key], calls_l[key] - calls_s[key]
        if ops or calls:
            rows[key] = (ops / n, calls / n)
    ranked = sorted(rows.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return {
        "short_steps": short,
        "long_steps": long,
        "samples_per_step": samples_per_step,
        "bytecodes_per_sample": sum(o for o, _ in rows.values()),
        "python_calls_per_sample": sum(c for _, c in rows.values()),
        "python": sys.version.split()[0],
        "functions": [
            {
                "function": f"{_where(f)}:{name}:{line}",
                "bytecodes_per_sample": round(o, 2),
                "calls_per_sample": round(c, 3),
            }
            for (f, name, line), (o, c) in ranked[:top]
        ],
    }
