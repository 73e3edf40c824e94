"""The simulator's speed tricks, each against its plain version, side by side in one run.

Each trick group has its plain version kept as a patch, ``harness/results/tricks/<name>.diff``,
against HEAD: applied (``git apply``) to a temporary export of HEAD (``git archive``), it
replaces the group's speed-shaped code with the plain code it stands for. A trick stays
only where HEAD runs at least ``KEEP_RATIO`` times as many samples per CPU-second as its
plain version; otherwise the plain code replaces it and its patch goes.

Rounds run HEAD and every plain version once each, in fresh processes, in an order
rotated each round, so that load on a shared host falls on each alike; the report gives
every run's samples per CPU-second (the ``sim_speed`` scenario of ``sim_ab``), each
variant's median and range, each round's ratio HEAD over plain, and the ratio of the
medians (the trick's gain). With ``--instructions`` (needs valgrind) it also counts
machine instructions per simulated sample of each variant under cachegrind
(``sim_instructions``), which do not move with the host's load. Every variant's traces
(the golden scenario, each cross-Python run, and the measured scenario at a few steps)
must be the same bytes as HEAD's.

    python -m harness.results.sim_tricks_ab [--rounds 5] [--steps 200] [--instructions [--short 2 --long 6]] [--out FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.results.schema import git_info, machine_info, utc_now
from harness.results.sim_ab import ROOT, B, N, rate_at, write_report
from harness.results.sim_instructions import count_at, per_sample

TRICKS = ROOT / "harness/results/tricks"
KEEP_RATIO = 1.10  # the side-by-side gain a speed trick must show to stay
TREE = ("harness", "miles_async_core", "fixtures")  # what a simulation imports and reads
TRACE_STEPS = 4  # the measured scenario's traced run: 2048 samples, across two blocks of draws

# The SHA-256 of each pinned trace (as fixtures.golden_runs lists them) and of the measured
# scenario's, run in a child whose PYTHONPATH picks the tree.
DIGEST_CHILD = f"""
import hashlib, json, sys, tempfile
from pathlib import Path
from fixtures.golden_runs import CROSS_PYTHON_RUNS, GOLDEN_SCENARIO, cross_python_scenario
from harness.sim.faults import run_with_faults
from harness.sim.run_scenario import simulate
from harness.sim.scenario import Scenario, load_scenario
from harness.sim.trainer import SimTrainerConfig
from harness.trace import write_jsonl
from miles_async_core.config import AsyncConfig
steps = int(sys.argv[1])
runs = {{"golden": lambda: simulate(load_scenario(GOLDEN_SCENARIO)).events}}
for name in CROSS_PYTHON_RUNS:
    runs[name] = lambda name=name: run_with_faults(*cross_python_scenario(name)).events
if steps:
    scenario = Scenario(config=AsyncConfig(rollout_batch_size={B}, n_samples_per_prompt={N}, fully_async=True,
                                           num_rollout=steps), trainer=SimTrainerConfig(step_base_s=5.0))
    runs["sim_speed"] = lambda: simulate(scenario).events
out = {{}}
with tempfile.TemporaryDirectory() as tmp:
    for name, run in runs.items():
        path = Path(tmp) / "trace.jsonl"
        write_jsonl(run(), path)
        out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
print(json.dumps(out))
"""


def tricks() -> list[str]:
    """The trick groups that have a plain version: the names of ``harness/results/tricks/*.diff``."""
    return sorted(p.stem for p in TRICKS.glob("*.diff"))


def export(dest: Path, rev: str | None = None) -> Path:
    """The simulator's files (``TREE``) at commit ``rev`` (``git archive``), or as the working
    tree has them when ``rev`` is None, under ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    if rev is None:
        for top in TREE:
            shutil.copytree(ROOT / top, dest / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        return dest
    out = subprocess.run(["git", "archive", "--format=tar", rev, *TREE], cwd=ROOT, capture_output=True)
    if out.returncode != 0:
        raise SystemExit(f"git archive {rev} failed: {out.stderr.decode()[-500:]}")
    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def apply_plain(tree: Path, name: str, diffs: Path = TRICKS) -> Path:
    """Apply ``<diffs>/<name>.diff`` to ``tree`` (an ``export``): the trick's plain version."""
    diff = diffs / f"{name}.diff"
    out = subprocess.run(["git", "apply", str(diff)], cwd=tree, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(
            f"{diff.relative_to(ROOT) if diff.is_relative_to(ROOT) else diff}: does not apply to the code "
            f"({out.stderr.strip()[-800:]}); fix: remake it as the plain version against HEAD "
            "(edit the files, `git diff > harness/results/tricks/<name>.diff`, restore them)"
        )
    return tree


def trace_digests(tree: Path, steps: int = TRACE_STEPS) -> dict[str, str]:
    """``{run: sha256 of its JSONL trace}`` for the pinned runs and, with ``steps``, the measured scenario."""
    out = subprocess.run(
        [sys.executable, "-c", DIGEST_CHILD, str(steps)],
        cwd=tree,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    if out.returncode != 0:
        raise SystemExit(f"the traced runs at {tree} failed:\n{out.stderr[-2000:]}")
    digests: dict[str, str] = json.loads(out.stdout)
    return digests


def stored_digests(root: Path = ROOT) -> dict[str, str]:
    """The pinned traces' SHA-256 as ``fixtures/golden`` stores them."""
    golden = hashlib.sha256((root / "fixtures/golden/fully_async_trace.jsonl").read_bytes()).hexdigest()
    cross = json.loads((root / "fixtures/golden/cross_python_traces.json").read_text())
    return {"golden": golden, **{name: str(d["sha256"]) for name, d in cross.items()}}


def compare(rounds: int, steps: int, instructions: bool, short: int = 2, long: int = 6) -> dict[str, object]:
    if rounds < 1 or steps < 1:
        raise SystemExit(f"--rounds {rounds} --steps {steps}: both must be >= 1; fix: e.g. --rounds 5 --steps 200")
    if instructions and shutil.which("valgrind") is None:
        raise SystemExit(
            "--instructions: valgrind is not on PATH; fix: install it (apt install valgrind) or drop the flag"
        )
    names = tricks()
    if not names:
        raise SystemExit(f"no plain versions in {TRICKS.relative_to(ROOT)}/*.diff: every trick was removed")
    variants = ["head", *(f"plain:{n}" for n in names)]
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"head": export(Path(tmp) / "head", "HEAD")}
        for n in names:
            trees[f"plain:{n}"] = apply_plain(export(Path(tmp) / n, "HEAD"), n)
        digests = {v: trace_digests(tree) for v, tree in trees.items()}
        rates: dict[str, list[float]] = {v: [] for v in variants}
        work: dict[str, set[tuple[int, int]]] = {v: set() for v in variants}
        for r in range(rounds):
            for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
                rate, requests, tokens = rate_at(trees[v], steps)
                rates[v].append(rate)
                work[v].add((requests, tokens))
        med = {v: statistics.median(x) for v, x in rates.items()}
        print({v: round(m) for v, m in med.items()}, flush=True)  # before the slower cachegrind counts
        counts: dict[tuple[str, int], dict[str, int]] = {}
        if instructions:
            with ThreadPoolExecutor(max_workers=2) as pool:
                jobs = {(v, s): pool.submit(count_at, trees[v], s) for v in variants for s in (short, long)}
                counts = {key: job.result() for key, job in jobs.items()}
    stored = stored_digests()
    gains = {n: round(med["head"] / med[f"plain:{n}"], 3) for n in names}
    same_trace = {n: digests[f"plain:{n}"] == digests["head"] for n in names}
    report: dict[str, object] = {
        "bench": "sim_tricks_ab",
        "steps": steps,
        "B": B,
        "n": N,
        "rounds": rounds,
        "keep_ratio": KEEP_RATIO,
        "created_utc": utc_now(),
        "machine": machine_info(),
        "git": git_info(),
        "python": sys.version.split()[0],
        # the same simulation everywhere: requests served and tokens decoded
        "same_work": len(set().union(*work.values())) == 1,
        # every traced run of each plain version gives HEAD's bytes, and HEAD the stored ones
        "same_trace": same_trace,
        "head_traces_as_stored": all(digests["head"][k] == d for k, d in stored.items()),
        "traced_runs": sorted(digests["head"]),
        "samples_per_cpu_s": {v: [round(x) for x in xs] for v, xs in rates.items()},
        "median": {v: round(m) for v, m in med.items()},
        "range": {v: [round(min(xs)), round(max(xs))] for v, xs in rates.items()},
        "round_ratios_head_over_plain": {
            n: [round(h / p, 3) for h, p in zip(rates["head"], rates[f"plain:{n}"])] for n in names
        },
        "gain_over_plain": gains,
        "keep": {n: gains[n] >= KEEP_RATIO for n in names},
    }
    if instructions:
        per = {v: per_sample(counts[(v, short)], counts[(v, long)], long - short) for v in variants}
        report["instructions_per_sample"] = {v: per[v]["instructions"] for v in variants}
        report["instruction_ratio_plain_over_head"] = {
            n: round(per[f"plain:{n}"]["instructions"] / per["head"]["instructions"], 3) for n in names
        }
        report["cachegrind_steps"] = [short, long]
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--instructions", action="store_true", help="also count instructions per sample (valgrind)")
    p.add_argument("--short", type=int, default=2, help="steps of the short cachegrind run")
    p.add_argument("--long", type=int, default=6, help="steps of the long cachegrind run")
    p.add_argument("--out", default="results/bench/sim_tricks_ab.json")
    args = p.parse_args(argv)
    if args.instructions and not 0 < args.short < args.long:
        raise SystemExit(
            f"--short {args.short} --long {args.long}: need 0 < short < long; fix: e.g. --short 2 --long 6"
        )
    report = compare(args.rounds, args.steps, args.instructions, args.short, args.long)
    shown = ("median", "gain_over_plain", "keep", "same_trace", "same_work")
    write_report(report, args.out, shown + (("instruction_ratio_plain_over_head",) if args.instructions else ()))
    if report["same_trace"] != dict.fromkeys(tricks(), True) or report["head_traces_as_stored"] is not True:
        print("a plain version's traces differ from HEAD's, or HEAD's from the stored ones", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
