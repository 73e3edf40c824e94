"""Simulation speed: 1,000 fully-async steps with B = 64, n = 8 on virtual time.

Reports CPU seconds and simulated samples per second (trace off, as a user running a
long sweep would). Prints a table and then one JSON line for scripts. No wall-clock
assertion: the acceptance figure (under 20 s of CPU) is read from the report.
"""

from __future__ import annotations

import json
import time

import pytest

from harness.sim.scenario import Scenario
from harness.sim.trainer import SimTrainerConfig
from harness.sim.simulate import simulate
from miles_async_core.config import AsyncConfig

STEPS, B, N = 1000, 64, 8


@pytest.mark.bench
def test_simulation_speed_1000_fully_async_steps_b64_n8():
    scenario = Scenario(config=AsyncConfig(rollout_batch_size=B, n_samples_per_prompt=N, fully_async=True,
                                           num_rollout=STEPS), trainer=SimTrainerConfig(step_base_s=5.0))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = simulate(scenario, trace=False)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    assert result.error is None
    assert len(result.history) == STEPS
    trained = sum(len(r["age_versions"]) for r in result.history) * N
    assert trained == STEPS * B * N
    report = {"bench": "sim_speed", "steps": STEPS, "B": B, "n": N, "cpu_s": round(cpu_s, 3),
              "wall_s": round(wall_s, 3), "simulated_s": round(result.wall_s, 1),
              "samples_trained": trained, "requests": result.engine_stats["requests"],
              "samples_per_cpu_s": round(result.engine_stats["requests"] / cpu_s),
              "simulated_tokens": result.engine_stats["tokens"]}
    print(f"\n{'steps':>8} {'cpu_s':>8} {'samples/cpu-s':>14} {'simulated_s':>12}")
    print(f"{STEPS:>8} {cpu_s:>8.2f} {report['samples_per_cpu_s']:>14} {result.wall_s:>12.1f}")
    print(json.dumps(report))
