"""The ray layout on this machine: 1 vs 2 engines, Ray vs the process (split) layout, and
the two ways to broadcast weights, as ratios from one run each on the same work.

Work: the main job's default model and task (tiny model d_model 256, 4 layers, copy
task, B = 16 prompts x n = 8 samples, engine batch 16), one-step mode, ``STEPS`` steps,
the same seed for every run. Runs, in this order: ``split`` (one engine process),
``ray`` with 1 engine, ``ray`` with 2 engines broadcasting by one ``ray.put``
(``put_once``), ``ray`` with 2 engines passing the weights to each engine's call
(``per_engine``). Then the broadcast alone, on two paused engines of the same model:
``BROADCAST_ROUNDS`` updates each way, alternating which goes first, median seconds
from the ``ray.put`` (or the first call) to the last engine's load reply. Each run's
``run_s`` is the driver's timed window (Ray start-up, actor start-up and model builds
are before it and reported apart); rollout tokens/s is the
engines' decode-step tokens over the measurement window. Expect contention: on a
2-core machine two engine processes, the trainer and the driver share two cores, so a
second engine cannot double rollout throughput and may not help at all; the ratios say
how much it does here, not what Ray does on a cluster.

Prints a table and one JSON document on its last line; with
``MILES_HARNESS_WRITE_RESULTS=1`` the document is written to
``results/bench/ray_layout.json``. Asserts only that every run finished with every checker
passing and that the ratios are finite.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import statistics
from pathlib import Path

import pytest

from harness.backends.ray_engine import BROADCASTS, RayEngineGroup
from harness.backends.tasks import get_task
from harness.main_job.job import run_mode
from harness.main_job.layouts import build_model_factory
from harness.main_job.spec import RunSpec
from harness.measure.engines import per_engine_rows
from harness.results.schema import git_info, machine_info, utc_now
from miles_async_core.config import AsyncConfig

ROOT = Path(__file__).resolve().parents[2]
STEPS = 5
MODE = "one-step"
BASE = AsyncConfig(rollout_batch_size=16, n_samples_per_prompt=8)
RUNS = {  # name -> RunSpec overrides
    "split": {"layout": "split"},
    "ray_1_engine": {"layout": "ray", "num_engines": 1},
    "ray_2_engines_put_once": {"layout": "ray", "num_engines": 2, "broadcast": "put_once"},
    "ray_2_engines_per_engine": {"layout": "ray", "num_engines": 2, "broadcast": "per_engine"},
}


def measure(name: str, overrides: dict) -> dict:
    spec = RunSpec(steps=STEPS, gap_decomposition=False, repeats=1, **overrides)
    r = run_mode(MODE, BASE, spec)
    assert r.error is None, (name, r.error)
    assert r.checks["passed"], (name, r.checks["violations"][:3])
    engines = per_engine_rows(r.events, r.window)
    tokens = sum(len(e["indices"]) for e in r.events if e.kind == "decode_step" and r.window[0] <= e.t <= r.window[1])
    wall = r.overlap["wall_s"]
    row = {
        "run_s": r.run_s,
        "wall_s": wall,
        "step_s": wall / len(r.history),
        "rollout_tokens": tokens,
        "rollout_tokens_per_s": tokens / wall,
        "rollout_busy_s": r.overlap["rollout_busy_s"],
        "both_busy_fraction": r.overlap["both_busy_fraction"],
        "per_engine": engines,
    }
    if r.engine_stats is not None:
        sync = r.engine_stats["sync_s"][1:]  # the first update also warms the object store
        row["startup"] = r.engine_stats["startup"]
        row["broadcast"] = r.engine_stats["broadcast"]
        row["update_total_s_median"] = statistics.median(s["total_s"] for s in sync)
        row["update_put_s_median"] = statistics.median(s["put_s"] for s in sync)
        row["update_load_s_max_median"] = statistics.median(s["load_s_max"] for s in sync)
    else:
        row["update_total_s_median"] = statistics.median(s["pack_s"] + s["load_s"] for s in r.engine_sync[1:])
    return row


BROADCAST_ROUNDS = 8


def broadcast_times(rounds: int = BROADCAST_ROUNDS) -> tuple[dict[str, list[float]], int]:
    """Seconds per weight update to two paused engines, by broadcast method, alternating;
    and the model's parameter count."""
    spec = RunSpec()
    task = get_task(spec.task, **spec.task_kwargs())
    build = build_model_factory(spec, task)
    weights = build().weights_copy()
    group = RayEngineGroup(build, num_engines=2, max_running=spec.max_running, eos_token_id=task.eos_token_id)
    times: dict[str, list[float]] = {b: [] for b in BROADCASTS}

    async def go() -> None:
        await group.pause_generation("retract")
        version = 0
        for r in range(rounds + 1):  # round 0 warms both paths up and is not kept
            for method in BROADCASTS if r % 2 else BROADCASTS[::-1]:
                group.broadcast = method
                version += 1
                await group.update_weights(version, weights)
                if r:
                    times[method].append(group.sync_s[-1]["total_s"])

    try:
        asyncio.run(go())
    finally:
        group.close()
    return times, sum(int(v.numel()) for v in weights.values())


@pytest.mark.bench
def test_ray_layout_engines_and_broadcast_ratios(ray_cluster, capsys) -> None:
    rows = {name: measure(name, o) for name, o in RUNS.items()}
    broadcast, n_params = broadcast_times()
    two, one, split = rows["ray_2_engines_put_once"], rows["ray_1_engine"], rows["split"]
    ratios = {
        "two_over_one_engine_step_time": two["step_s"] / one["step_s"],
        "two_over_one_engine_rollout_tokens_per_s": two["rollout_tokens_per_s"] / one["rollout_tokens_per_s"],
        "ray_1_engine_over_split_step_time": one["step_s"] / split["step_s"],
        "ray_2_engines_over_split_step_time": two["step_s"] / split["step_s"],
        "per_engine_over_put_once_update_time_in_runs": (
            rows["ray_2_engines_per_engine"]["update_total_s_median"] / two["update_total_s_median"]
        ),
        "per_engine_over_put_once_broadcast_alone": (
            statistics.median(broadcast["per_engine"]) / statistics.median(broadcast["put_once"])
        ),
    }
    assert all(math.isfinite(v) and v > 0 for v in ratios.values()), ratios
    doc = {
        "schema_version": 1,
        "bench": "ray_layout",
        "machine": {**machine_info(), "platform": platform.platform(), "python": platform.python_version()},
        "git": git_info(),
        "recorded_utc": utc_now(),
        "config": {
            "mode": MODE,
            "steps": STEPS,
            "rollout_batch_size": BASE.rollout_batch_size,
            "n_samples_per_prompt": BASE.n_samples_per_prompt,
            "spec": {
                k: v
                for k, v in vars(RunSpec(steps=STEPS)).items()
                if k in ("model", "task", "tiny_d_model", "tiny_layers", "max_running", "threads", "seed")
            },
            "runs": RUNS,
            "cluster": ray_cluster,
        },
        "rows": rows,
        "ratios": ratios,
        "broadcast_alone": {
            "engines": 2,
            "parameters": n_params,
            "rounds": BROADCAST_ROUNDS,
            "seconds": broadcast,
            "median_s": {k: statistics.median(v) for k, v in broadcast.items()},
        },
        "note": "one run each on a shared 2-core machine: engines, trainer and driver contend for two cores",
    }
    if os.environ.get("MILES_HARNESS_WRITE_RESULTS") == "1":
        out = ROOT / "results" / "bench" / "ray_layout.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    with capsys.disabled():
        print(f"\n{'run':<26}{'step s':>8}{'rollout tok/s':>14}{'update s':>10}{'both busy':>10}")
        for name, r in rows.items():
            print(
                f"{name:<26}{r['step_s']:>8.3f}{r['rollout_tokens_per_s']:>14.0f}"
                f"{r['update_total_s_median']:>10.4f}{r['both_busy_fraction']:>10.1%}"
            )
        print(
            "broadcast alone, 2 engines, median s: "
            + ", ".join(f"{k} {statistics.median(v):.4f}" for k, v in broadcast.items())
        )
        for k, v in ratios.items():
            print(f"{k} = {v:.2f}")
        print(json.dumps(doc))
