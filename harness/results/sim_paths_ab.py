"""The simulator's speed path against its reference loop, side by side in one run.

``$MILES_HARNESS_SIM_SPEED`` picks the loop (``harness.sim.vtime``): ``plain`` is asyncio's
own loop on a virtual clock (``harness.sim.vtime_plain``); ``fast`` adds the tricks of
``harness.sim.vtime_fast`` (a larger garbage-collector threshold while the loop runs). Each
variant runs the ``sim_speed`` scenario of ``sim_ab`` in a fresh process.

Rounds run every variant once, in an order rotated each round, so that load on a shared
host falls on each alike; the report gives every run's samples per CPU-second, each
variant's median and range, and each one's median over ``plain``'s (the gain of its
tricks). With ``--instructions`` (needs valgrind) it also counts machine instructions per
simulated sample of each variant under cachegrind (``sim_instructions``: the difference
between a short and a long run), which do not move with the host's load.

The committed ``results/bench/sim_paths_ab.json`` was made when the speed path also
rewrote CPython 3.11's ``BaseEventLoop._run_once`` (variant ``loop``: 1.078x samples per
CPU-second, its runs' range overlapping the plain loop's; 1.102x in instructions); under
the 10% a trick must gain side by side, it was removed (variant ``plain+gc`` is the
speed path kept).

    python -m harness.results.sim_paths_ab [--rounds 5] [--steps 300] [--instructions [--short 2 --long 6]] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from harness.results.schema import git_info, machine_info, utc_now
from harness.results.sim_ab import CHILD, ROOT, B, N, write_report
from harness.results.sim_instructions import VALGRIND, parse_cachegrind, per_sample

VARIANTS: dict[str, tuple[str, str]] = {  # name: (MILES_HARNESS_SIM_SPEED, lines run before the scenario)
    "plain": ("plain", ""),
    "fast": ("fast", ""),
}


def _env(variant: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "MILES_HARNESS_SIM_SPEED": VARIANTS[variant][0]}


def _rate(variant: str, steps: int) -> tuple[float, int, int]:
    out = subprocess.run(
        [sys.executable, "-c", VARIANTS[variant][1] + CHILD, str(steps)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env(variant),
    )
    if out.returncode != 0:
        raise SystemExit(f"the simulation ({variant}) failed:\n{out.stderr[-2000:]}")
    rate, requests, tokens = out.stdout.split()
    return float(rate), int(requests), int(tokens)


def _instructions(variant: str, steps: int) -> dict[str, int]:
    env = {**_env(variant), "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run(
        VALGRIND + [sys.executable, "-c", VARIANTS[variant][1] + CHILD, str(steps)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    if out.returncode != 0:
        raise SystemExit(f"the simulation ({variant}) under cachegrind failed:\n{out.stderr[-2000:]}")
    return parse_cachegrind(out.stderr)


def compare(rounds: int, steps: int, instructions: bool, short: int = 2, long: int = 6) -> dict[str, object]:
    if rounds < 1 or steps < 1:
        raise SystemExit(f"--rounds {rounds} --steps {steps}: both must be >= 1; fix: e.g. --rounds 5 --steps 300")
    names = list(VARIANTS)
    rates: dict[str, list[float]] = {v: [] for v in names}
    work: dict[str, set[tuple[int, int]]] = {v: set() for v in names}
    for r in range(rounds):
        for v in names[r % len(names) :] + names[: r % len(names)]:
            rate, requests, tokens = _rate(v, steps)
            rates[v].append(rate)
            work[v].add((requests, tokens))
    med = {v: statistics.median(x) for v, x in rates.items()}
    print({v: round(m) for v, m in med.items()}, flush=True)  # before the slower cachegrind counts
    report: dict[str, object] = {
        "bench": "sim_paths_ab",
        "steps": steps,
        "B": B,
        "n": N,
        "rounds": rounds,
        "created_utc": utc_now(),
        "machine": machine_info(),
        "git": git_info(),
        "python": sys.version.split()[0],
        "same_work": len(set().union(*work.values())) == 1,
        "samples_per_cpu_s": {v: [round(x) for x in xs] for v, xs in rates.items()},
        "median": {v: round(m) for v, m in med.items()},
        "range": {v: [round(min(xs)), round(max(xs))] for v, xs in rates.items()},
        "gain_over_plain": {v: round(med[v] / med["plain"], 3) for v in names if v != "plain"},
    }
    if instructions:
        with ThreadPoolExecutor(max_workers=2) as pool:
            jobs = {(v, s): pool.submit(_instructions, v, s) for v in names for s in (short, long)}
            counts = {key: job.result() for key, job in jobs.items()}
        per = {v: per_sample(counts[(v, short)], counts[(v, long)], long - short) for v in names}
        report["instructions_per_sample"] = {v: per[v]["instructions"] for v in names}
        report["instruction_ratio_plain_over"] = {
            v: round(per["plain"]["instructions"] / per[v]["instructions"], 3) for v in names if v != "plain"
        }
        report["cachegrind_steps"] = [short, long]
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--instructions", action="store_true", help="also count instructions per sample (valgrind)")
    p.add_argument("--short", type=int, default=2, help="steps of the short cachegrind run")
    p.add_argument("--long", type=int, default=6, help="steps of the long cachegrind run")
    p.add_argument("--out", default="results/bench/sim_paths_ab.json")
    args = p.parse_args(argv)
    if args.instructions and not 0 < args.short < args.long:
        raise SystemExit(
            f"--short {args.short} --long {args.long}: need 0 < short < long; fix: e.g. --short 2 --long 6"
        )
    report = compare(args.rounds, args.steps, args.instructions, args.short, args.long)
    shown = ("median", "range", "gain_over_plain") + (("instructions_per_sample",) if args.instructions else ())
    write_report(report, args.out, shown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
