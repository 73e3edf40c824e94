"""Simulator speed side by side: the ``sim_speed`` scenario at a base commit and at HEAD.

The CPU time of one simulation on a shared host moves by a third between hours with
nothing changed, so a speed-up is measured against the code it replaces in the same
sitting: the base commit is checked out into a temporary git worktree, and each pair runs
the scenario once with each checkout, in fresh processes, alternating which goes first
(A B, B A, ...). The report gives every run's samples per CPU-second, each side's median,
the ratio of the medians and each pair's ratio.

    python -m harness.results.sim_ab --base REV [--pairs 3] [--steps 1000] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from harness.results.schema import git_info, machine_info, utc_now

ROOT = Path(__file__).resolve().parents[2]
B, N = 64, 8
# the scenario of suites/bench/test_sim_speed.py, run in a child whose PYTHONPATH picks the checkout
CHILD = f"""
import gc, sys, time
from harness.sim.scenario import Scenario
try:
    from harness.sim.run_scenario import simulate
except ImportError:  # a base commit from before the module took this name
    from harness.sim.simulate import simulate
from harness.sim.trainer import SimTrainerConfig
from miles_async_core.config import AsyncConfig
steps = int(sys.argv[1])
scenario = Scenario(config=AsyncConfig(rollout_batch_size={B}, n_samples_per_prompt={N}, fully_async=True,
                                       num_rollout=steps), trainer=SimTrainerConfig(step_base_s=5.0))
gc.collect()
cpu0 = time.process_time()
result = simulate(scenario, trace=False)
cpu = time.process_time() - cpu0
assert result.error is None and len(result.history) == steps
print(steps * {B} * {N} / cpu, result.engine_stats["requests"], result.engine_stats["tokens"])
"""


def rate_at(checkout: Path, steps: int) -> tuple[float, int, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(steps)],
        cwd=checkout,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(checkout)},
    )
    if out.returncode != 0:
        raise SystemExit(f"the simulation at {checkout} failed:\n{out.stderr[-2000:]}")
    rate, requests, tokens = out.stdout.split()
    return float(rate), int(requests), int(tokens)


def resolve(base: str) -> str:
    """The full commit of ``--base``, or SystemExit naming the flag."""
    out = subprocess.run(["git", "rev-parse", base], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"--base {base!r}: not a commit of this repository; fix: give a commit, e.g. HEAD~3")
    return out.stdout.strip()


@contextlib.contextmanager
def checkout(commit: str) -> Iterator[Path]:
    """``commit`` checked out in a temporary git worktree, removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        wt = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(wt), commit], cwd=ROOT, check=True)
        try:
            yield wt
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=ROOT, check=False)


def compare(base: str, pairs: int, steps: int) -> dict:
    if pairs < 1 or steps < 1:
        raise SystemExit(f"--pairs {pairs} --steps {steps}: both must be >= 1; fix: e.g. --pairs 3 --steps 1000")
    base_commit = resolve(base)
    rates: dict[str, list[float]] = {"base": [], "head": []}
    work: dict[str, set] = {"base": set(), "head": set()}
    with checkout(base_commit) as wt:
        for i in range(pairs):
            order = [("base", wt), ("head", ROOT)] if i % 2 == 0 else [("head", ROOT), ("base", wt)]
            for side, tree in order:
                rate, requests, tokens = rate_at(tree, steps)
                rates[side].append(rate)
                work[side].add((requests, tokens))
    med = {side: statistics.median(v) for side, v in rates.items()}
    git = git_info()
    return {
        "bench": "sim_speed_ab",
        "steps": steps,
        "B": B,
        "n": N,
        "pairs": pairs,
        "base_commit": base_commit,
        "head_commit": git["commit"] if git else None,
        "git_dirty": git["dirty"] if git else None,
        "created_utc": utc_now(),
        "machine": machine_info(),
        # the same simulation on both sides: requests served and tokens decoded
        "same_work": work["base"] == work["head"] and len(work["base"]) == 1,
        "samples_per_cpu_s": {side: [round(r) for r in v] for side, v in rates.items()},
        "median": {side: round(m) for side, m in med.items()},
        "ratio_head_over_base": round(med["head"] / med["base"], 3),
        "pair_ratios": [round(h / b, 3) for b, h in zip(rates["base"], rates["head"])],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the commit to compare HEAD with")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--out", default="results/bench/sim_speed_ab.json")
    args = p.parse_args(argv)
    report = compare(args.base, args.pairs, args.steps)
    write_report(report, args.out, ("median", "ratio_head_over_base", "pair_ratios", "same_work"))
    return 0


def write_report(report: dict, out: str, shown: tuple[str, ...]) -> None:
    """Write ``report`` to ``out`` (relative to the repository) and print its ``shown`` keys."""
    path = ROOT / out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(json.dumps({k: report[k] for k in shown}))


if __name__ == "__main__":
    raise SystemExit(main())
