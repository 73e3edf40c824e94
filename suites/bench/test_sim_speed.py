"""Simulation speed: 1,000 fully-async steps with B = 64, n = 8 on virtual time.

Runs it ``REPEATS`` times and reports the median CPU seconds (``time.process_time``) with
every run's figure, and simulated samples per CPU-second (median, min and max)
(trace off, as a user running a long sweep would): ``samples_per_cpu_s`` is samples
trained (steps * B * n) per CPU-second; ``requests_per_cpu_s`` counts every generate
request the engine served (retries included). Prints a table and then one JSON line
last, for scripts. No floor is asserted (a host's speed varies too much for one; see
``results/README.md``): the test asserts only that every step trained B * n samples.

With ``MILES_HARNESS_WRITE_RESULTS=1`` the report (plus the git commit, a dirty flag
and the machine) is also written to ``results/bench/sim_speed.json``.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time
from pathlib import Path

import pytest

from harness.results.schema import git_info, machine_info, utc_now
from harness.sim.scenario import Scenario
from harness.sim.trainer import SimTrainerConfig
from harness.sim.run_scenario import simulate
from miles_async_core.config import AsyncConfig

STEPS, B, N = 1000, 64, 8
# make results runs the same simulation five times (CPU time on a shared host varies run to run);
# in the test suite once, as its assertions need
REPEATS = 5 if os.environ.get("MILES_HARNESS_WRITE_RESULTS") == "1" else 1
RESULT_PATH = Path(__file__).resolve().parents[2] / "results/bench/sim_speed.json"


def _write_result(report: dict) -> None:
    RESULT_PATH.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULT_PATH.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    tmp.replace(RESULT_PATH)


@pytest.mark.bench
def test_simulation_speed_1000_fully_async_steps_b64_n8():
    scenario = Scenario(
        config=AsyncConfig(rollout_batch_size=B, n_samples_per_prompt=N, fully_async=True, num_rollout=STEPS),
        trainer=SimTrainerConfig(step_base_s=5.0),
    )
    runs = []
    result = None
    for _ in range(REPEATS):
        result = None  # each run alone: the previous run's 512,000 samples would otherwise stay alive during it
        gc.collect()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        result = simulate(scenario, trace=False)
        runs.append((time.process_time() - cpu0, time.perf_counter() - wall0))
        assert result.error is None
        assert len(result.history) == STEPS
    trained = sum(len(r["age_versions"]) for r in result.history) * N
    assert trained == STEPS * B * N
    cpu_s, wall_s = statistics.median(c for c, _ in runs), statistics.median(w for _, w in runs)
    rates = [trained / c for c, _ in runs]
    requests = result.engine_stats["requests"]
    report = {
        "bench": "sim_speed",
        "steps": STEPS,
        "B": B,
        "n": N,
        "samples": trained,
        "repeats": REPEATS,
        "cpu_s": round(cpu_s, 3),
        "cpu_s_runs": [round(c, 3) for c, _ in runs],
        "wall_s": round(wall_s, 3),
        "samples_per_cpu_s": round(statistics.median(rates)),
        "samples_per_cpu_s_min": round(min(rates)),
        "samples_per_cpu_s_max": round(max(rates)),
        "requests": requests,
        "requests_per_cpu_s": round(requests / cpu_s),
        "simulated_s": round(result.wall_s, 1),
        "simulated_tokens": result.engine_stats["tokens"],
    }
    if os.environ.get("MILES_HARNESS_WRITE_RESULTS") == "1":
        git = git_info()
        report.update(
            created_utc=utc_now(),
            git_commit=git["commit"] if git else None,
            git_dirty=git["dirty"] if git else None,
            machine=machine_info(),
        )
        _write_result(report)
    print(f"\n{'steps':>6} {'B':>4} {'n':>3} {'samples':>9} {'cpu_s':>8} {'samples/cpu-s':>14} {'simulated_s':>12}")
    print(
        f"{STEPS:>6} {B:>4} {N:>3} {trained:>9} {cpu_s:>8.2f} {report['samples_per_cpu_s']:>14} "
        f"{result.wall_s:>12.1f}   (median of {REPEATS} runs; samples/cpu-s {report['samples_per_cpu_s_min']}-"
        f"{report['samples_per_cpu_s_max']})"
    )
    print(json.dumps(report, sort_keys=True))
