"""What the recorder costs: the step time with it over the step time without, its CPU
time per step, and bytes per trained sample.

Upstream's ``train_async.py`` loop on the CPU servers (``harness.record.served_run``, the
fully-async retract run: the mode that records the most events per step), run side by
side in one process with and without the recorder, ``ROUNDS`` pairs (after one run not
counted, which pays for the process's imports and first calls), the order inside a pair
alternating (with first, then without first) so that a drift of the host's load falls on
both sides:

* **step time ratio** (with / without) per pair, the step time being the steady one:
  from the first training step's end to the last's, per step (the servers' start, the
  first rollout and the teardown, the same on both sides, are outside it); the median,
  quartiles and range of the per-pair ratios (target: median at most 1.02), and the
  median ratio of whole-run wall times next to it. A real-time run's step time varies by
  tens of percent from run to run on a shared host, so the spread says how far the
  median can be trusted;
* **the recorder's CPU time**: the emitting thread's CPU time inside every event's write
  (JSON encoding and the one ``os.write``), per step, over the recorded step time, and one
  event's cost measured alone (times the events per step). The wall time inside the
  writes is reported too: it counts waiting for the GIL after the system call behind the
  servers and the trainer, which share this process here (in a Miles deployment the
  engines run in their own processes), and that wait is not lost time for the run (the
  other threads run meanwhile): the step time ratio says what it costs;
* **bytes per trained sample**: the framework's record (the rollout process's file) and
  the whole directory (with the two servers' traces) over the samples trained.

Prints a table, then one JSON document on the last line; with
``MILES_HARNESS_WRITE_RESULTS=1`` the document is also written to
``results/bench/record_cost.json``. Asserts only that both sides trained every step.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.results.schema import git_info, machine_info, utc_now

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]
# pairs with and without: 12 for the committed figure, 3 when the bench only has to run (the slow tier)
ROUNDS = int(
    os.environ.get(
        "MILES_HARNESS_RECORD_COST_PAIRS", "12" if os.environ.get("MILES_HARNESS_WRITE_RESULTS") == "1" else "3"
    )
)
STEPS = 5


def _isolated_emit_cost(writer, emit, n: int = 2000) -> float:
    """Seconds per event written by one thread with nothing else running: a ``got`` event
    as the buffer writes it (median of 5 batches)."""
    rec = writer.ProcessRecord(tempfile.mkdtemp(prefix="record-cost-emit-"), "bench")
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(n):
            emit(rec, "got", group_index=i, staleness=1, current_version=3, queue_size=2)
        times.append((time.perf_counter() - t0) / n)
    rec.close()
    return statistics.median(times)


def test_recorder_share_of_step_time_and_bytes_per_sample(miles_src, monkeypatch):
    import torch

    from harness.record import writer
    from harness.record.served_run import run_recorded
    from harness.serve import upstream_e2e
    from harness.serve.upstream_e2e import STANDARD_RUNS, E2EConfig, run_upstream_e2e

    torch.set_num_threads(1)
    cfg = E2EConfig(**{**asdict(STANDARD_RUNS[1]), "steps": STEPS})
    spent = [0.0, 0.0]  # wall seconds inside emit, CPU seconds of the emitting thread inside emit
    real_emit = writer.ProcessRecord.emit

    def timed_emit(self, kind, /, **fields):
        t0, c0 = time.perf_counter(), time.thread_time()
        real_emit(self, kind, **fields)
        spent[0] += time.perf_counter() - t0
        spent[1] += time.thread_time() - c0

    monkeypatch.setattr(writer.ProcessRecord, "emit", timed_emit)
    ends: list[float] = []  # when each training step of the current run ended
    real_train = upstream_e2e._Run.train_shard

    async def timed_train(self, rollout_id, data):
        await real_train(self, rollout_id, data)
        ends.append(time.monotonic())

    monkeypatch.setattr(upstream_e2e._Run, "train_shard", timed_train)

    def step_s() -> float:
        """The steady step time: from the first step's end to the last's, per step (the
        servers' start, the first rollout and the teardown are outside it)."""
        out = (ends[-1] - ends[0]) / (len(ends) - 1)
        ends.clear()
        return out

    # the first run in a process pays for imports and first calls: one run before the pairs, not counted
    assert run_upstream_e2e(cfg, miles_src=str(miles_src)).steps_trained == STEPS
    ends.clear()
    rows = []
    for r in range(ROUNDS):
        row: dict = {"round": r, "recorded_first": r % 2 == 0}
        for side in ("with", "without") if r % 2 == 0 else ("without", "with"):
            if side == "without":
                plain = run_upstream_e2e(cfg, miles_src=str(miles_src))
                assert plain.steps_trained == STEPS, plain.error
                row.update(step_s_without=step_s(), run_s_without=plain.wall_s)
                continue
            spent[0] = spent[1] = 0.0
            directory = Path(tempfile.mkdtemp(prefix="record-cost-"))
            rec = run_recorded(cfg, directory, miles_src=str(miles_src))
            assert rec.e2e.steps_trained == STEPS, rec.e2e.error
            framework = sorted(directory.glob("rollout-*.jsonl"))
            row.update(
                step_s_with=step_s(),
                run_s_with=rec.e2e.wall_s,
                recorder_wall_s_per_step=spent[0] / STEPS,
                recorder_cpu_s_per_step=spent[1] / STEPS,
                framework_events=sum(1 for p in framework for _ in p.open()) - len(framework),
                samples_trained=sum(e.fields.get("samples", 0) for e in rec.merged.events if e.kind == "trained"),
                framework_bytes=sum(p.stat().st_size for p in framework),
                all_bytes=rec.merged.bytes_total,
            )
            shutil.rmtree(directory, ignore_errors=True)
        row["ratio"] = row["step_s_with"] / row["step_s_without"]
        row["run_ratio"] = row["run_s_with"] / row["run_s_without"]
        rows.append(row)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k not in ("round", "recorded_first")}
    ratios = [r["ratio"] for r in rows]
    per_event = _isolated_emit_cost(writer, real_emit)
    cpu_share = statistics.median(r["recorder_cpu_s_per_step"] / r["step_s_with"] for r in rows)
    doc = {
        "schema_version": 2,
        "bench": "record_cost",
        "utc": utc_now(),
        "git": git_info(),
        "machine": machine_info(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "command": "MILES_HARNESS_WRITE_RESULTS=1 pytest -m bench suites/bench/test_record_cost.py",
        "config": {
            "run": cfg.name,
            "steps": STEPS,
            "pairs": ROUNDS,
            "servers": cfg.servers,
            "rollout_batch_size": cfg.rollout_batch_size,
            "n_samples_per_prompt": cfg.n_samples_per_prompt,
        },
        "samples": rows,
        "median_step_s_without": med["step_s_without"],
        "median_step_s_with": med["step_s_with"],
        "step_time_ratio_median": statistics.median(ratios),
        "step_time_ratio_min": min(ratios),
        "step_time_ratio_max": max(ratios),
        "step_time_ratio_quartiles": statistics.quantiles(ratios, n=4),
        "run_time_ratio_median": statistics.median(r["run_ratio"] for r in rows),
        "recorder_cpu_share_of_step": cpu_share,
        "recorder_wall_share_of_step": statistics.median(
            r["recorder_wall_s_per_step"] / r["step_s_with"] for r in rows
        ),
        "framework_events_per_step": med["framework_events"] / STEPS,
        "isolated_emit_s": per_event,
        "isolated_share_of_step": per_event * med["framework_events"] / STEPS / med["step_s_with"],
        "framework_bytes_per_trained_sample": med["framework_bytes"] / med["samples_trained"],
        "all_bytes_per_trained_sample": med["all_bytes"] / med["samples_trained"],
    }
    print(f"\nrecorder cost ({cfg.name}, {STEPS} steps, {ROUNDS} pairs, order alternating)")
    print("  per-pair step time ratio with/without: " + " ".join(f"{x:.3f}" for x in ratios))
    print(
        f"  median {doc['step_time_ratio_median']:.3f}, quartiles "
        f"{' / '.join(f'{q:.3f}' for q in doc['step_time_ratio_quartiles'])}, range {min(ratios):.3f} .. "
        f"{max(ratios):.3f} (step time without {doc['median_step_s_without']:.3f} s, with "
        f"{doc['median_step_s_with']:.3f} s); whole runs: median ratio {doc['run_time_ratio_median']:.3f}"
    )
    print(
        f"  recorder's CPU time: {med['recorder_cpu_s_per_step'] * 1e3:.2f} ms/step = {100 * cpu_share:.3f} % of a "
        f"step; wall time inside the writes (GIL waits included) {100 * doc['recorder_wall_share_of_step']:.2f} %"
    )
    print(
        f"  one event written alone: {per_event * 1e6:.1f} us; x {doc['framework_events_per_step']:.0f} events/step "
        f"= {100 * doc['isolated_share_of_step']:.3f} % of a step"
    )
    print(
        f"  bytes per trained sample: framework {doc['framework_bytes_per_trained_sample']:.0f}, "
        f"with server traces {doc['all_bytes_per_trained_sample']:.0f}"
    )
    if os.environ.get("MILES_HARNESS_WRITE_RESULTS") == "1":
        out = ROOT / "results" / "bench" / "record_cost.json"
        out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc))
