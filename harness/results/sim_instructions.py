"""Simulator cost side by side in counts that do not move with the host's load: machine
instructions and last-level cache misses per simulated sample, at a base commit and at HEAD.

CPU seconds on a shared host move by a third between hours with the code unchanged
(``sim_ab``), so a change of a few percent cannot be seen in them. Valgrind's cachegrind
counts every instruction the process executes, the C work behind each bytecode included,
and simulates its data accesses against one last-level cache (512 KiB, 8-way, 64 B lines:
the L2 of the AMD EPYC host the counts were first made on; fixed, so that counts made on
other hosts compare). The ``sim_speed`` scenario runs at ``--short`` and ``--long``
steps; the difference over ``(long - short) * B * n`` samples is the steady state per
sample, without imports and set-up. Instructions repeat to about 0.01% between runs of the
same code; misses to about 0.5%. The run is single-threaded (``OPENBLAS_NUM_THREADS=1``:
an idle OpenBLAS thread otherwise adds a varying count) with a fixed hash seed.

    python -m harness.results.sim_instructions --base REV [--short 8] [--long 40] [--out FILE]

Needs valgrind (``apt install valgrind``); about 2 minutes per checkout, two at a time.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.results.schema import git_info, machine_info, utc_now
from harness.results.sim_ab import CHILD, B, N, ROOT, checkout, resolve, write_report

LAST_LEVEL = "524288,8,64"  # size in bytes, associativity, line size
VALGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--LL={LAST_LEVEL}", "--cachegrind-out-file=/dev/null"]


def parse_cachegrind(stderr: str) -> dict[str, int]:
    """``{"instructions", "ll_misses"}`` from cachegrind's summary (``I   refs:`` and
    ``LL misses:``, data and instructions together)."""
    found = {}
    for key, pattern in (("instructions", r"I\s+refs:\s+([\d,]+)"), ("ll_misses", r"LL misses:\s+([\d,]+)")):
        m = re.search(pattern, stderr)
        if m is None:
            raise ValueError(f"cachegrind printed no {pattern!r} line; its output ends:\n{stderr[-1500:]}")
        found[key] = int(m.group(1).replace(",", ""))
    return found


def per_sample(short: dict[str, int], long: dict[str, int], steps: int) -> dict[str, float]:
    """What ``steps`` more steps (``B * n`` samples each) cost, per sample."""
    samples = steps * B * N
    return {key: round((long[key] - short[key]) / samples, 1) for key in ("instructions", "ll_misses")}


def count_at(tree: Path, steps: int) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run(
        VALGRIND + [sys.executable, "-c", CHILD, str(steps)], cwd=tree, capture_output=True, text=True, env=env
    )
    if out.returncode != 0:
        raise SystemExit(f"the simulation under cachegrind at {tree} failed:\n{out.stderr[-2000:]}")
    return parse_cachegrind(out.stderr)


def compare(base: str, short: int, long: int) -> dict:
    if not 0 < short < long:
        raise SystemExit(
            f"--short {short} --long {long}: need 0 < short < long (the count is their difference); "
            "fix: e.g. --short 8 --long 40"
        )
    base_commit = resolve(base)
    if shutil.which("valgrind") is None:
        raise SystemExit(
            "valgrind is not on PATH: this count runs the simulation under cachegrind; "
            "fix: install valgrind (apt install valgrind)"
        )
    with checkout(base_commit) as wt, ThreadPoolExecutor(max_workers=2) as pool:
        jobs = {
            (side, steps): pool.submit(count_at, tree, steps)
            for side, tree in (("base", wt), ("head", ROOT))
            for steps in (short, long)
        }
        counts = {key: job.result() for key, job in jobs.items()}
    sides = {side: per_sample(counts[(side, short)], counts[(side, long)], long - short) for side in ("base", "head")}
    git = git_info()
    version = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "bench": "sim_instructions",
        "short_steps": short,
        "long_steps": long,
        "B": B,
        "n": N,
        "last_level_cache": LAST_LEVEL,
        "valgrind": version,
        "python": sys.version.split()[0],
        "base_commit": base_commit,
        "head_commit": git["commit"] if git else None,
        "git_dirty": git["dirty"] if git else None,
        "created_utc": utc_now(),
        "machine": machine_info(),
        "per_sample": sides,
        "ratio_head_over_base": {
            key: round(sides["head"][key] / sides["base"][key], 3) for key in ("instructions", "ll_misses")
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the commit to compare HEAD with")
    p.add_argument("--short", type=int, default=8)
    p.add_argument("--long", type=int, default=40)
    p.add_argument("--out", default="results/bench/sim_instructions.json")
    args = p.parse_args(argv)
    report = compare(args.base, args.short, args.long)
    write_report(report, args.out, ("per_sample", "ratio_head_over_base"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
