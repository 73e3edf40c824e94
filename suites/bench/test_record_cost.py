"""What the recorder costs: its share of a training step, and bytes per trained sample.

Upstream's ``train_async.py`` loop on the CPU servers (``harness.record.served_run``, the
fully-async retract run: the mode that records the most events per step), run side by
side in one process with and without the recorder, alternating, ``ROUNDS`` each:

* **step time** with and without (the run's wall time over its steps, medians): the
  difference is within the run-to-run noise of a real-time run here, so it is reported,
  not asserted;
* **the recorder's own time**: every event's write (JSON encoding, the line-buffered
  write and flush) timed inside the recorded runs, per step, over the recorded step time:
  the recorder's share of a step (target: at most 2 %). Wall time inside the write counts
  waiting for the GIL behind the servers and the trainer, which share this process here
  (not so in a Miles deployment); the emitting thread's CPU time and one event's cost
  measured alone (times the events per step) are reported next to it;
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
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.results.schema import git_info, machine_info, utc_now

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 3
STEPS = 4


def _isolated_emit_cost(writer, n: int = 2000) -> float:
    """Seconds per event written by one thread with nothing else running: a ``got`` event
    as the buffer writes it (median of 5 batches)."""
    rec = writer.ProcessRecord(tempfile.mkdtemp(prefix="record-cost-emit-"), "bench")
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(n):
            writer.ProcessRecord.emit(rec, "got", group_index=i, staleness=1, current_version=3, queue_size=2)
        times.append((time.perf_counter() - t0) / n)
    rec.close()
    return statistics.median(times)


def test_recorder_share_of_step_time_and_bytes_per_sample(miles_src, monkeypatch):
    import torch

    from harness.record import writer
    from harness.record.served_run import run_recorded
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
    rows = []
    for r in range(ROUNDS):
        plain = run_upstream_e2e(cfg, miles_src=str(miles_src))
        spent[0] = spent[1] = 0.0
        directory = Path(tempfile.mkdtemp(prefix="record-cost-"))
        rec = run_recorded(cfg, directory, miles_src=str(miles_src))
        assert plain.steps_trained == STEPS and rec.e2e.steps_trained == STEPS, (plain.error, rec.e2e.error)
        samples = sum(e.fields.get("samples", 0) for e in rec.merged.events if e.kind == "trained")
        framework = sum(p.stat().st_size for p in directory.glob("rollout-*.jsonl"))
        rows.append({"round": r, "step_s_without": plain.wall_s / STEPS, "step_s_with": rec.e2e.wall_s / STEPS,
                     "recorder_s_per_step": spent[0] / STEPS, "recorder_cpu_s_per_step": spent[1] / STEPS,
                     "framework_events": sum(1 for p in directory.glob("rollout-*.jsonl")
                                             for _ in p.open()) - 1,
                     "samples_trained": samples, "framework_bytes": framework,
                     "all_bytes": rec.merged.bytes_total})
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "round"}
    per_event = _isolated_emit_cost(writer)
    doc = {
        "schema_version": 1, "bench": "record_cost", "utc": utc_now(), "git": git_info(), "machine": machine_info(),
        "python": platform.python_version(), "torch": torch.__version__,
        "command": "MILES_HARNESS_WRITE_RESULTS=1 pytest -m bench suites/bench/test_record_cost.py",
        "config": {"run": cfg.name, "steps": STEPS, "rounds": ROUNDS, "servers": cfg.servers,
                   "rollout_batch_size": cfg.rollout_batch_size, "n_samples_per_prompt": cfg.n_samples_per_prompt},
        "samples": rows,
        "median_step_s_without": med["step_s_without"], "median_step_s_with": med["step_s_with"],
        "step_time_ratio_with_over_without": med["step_s_with"] / med["step_s_without"],
        "recorder_share_of_step": med["recorder_s_per_step"] / med["step_s_with"],
        "recorder_cpu_share_of_step": med["recorder_cpu_s_per_step"] / med["step_s_with"],
        "isolated_emit_s": per_event,
        "isolated_share_of_step": per_event * med["framework_events"] / STEPS / med["step_s_with"],
        "framework_bytes_per_trained_sample": med["framework_bytes"] / med["samples_trained"],
        "all_bytes_per_trained_sample": med["all_bytes"] / med["samples_trained"],
    }
    print(f"\nrecorder cost ({cfg.name}, {STEPS} steps, {ROUNDS} rounds each side)")
    print(f"  step time without {doc['median_step_s_without']:.3f} s, with {doc['median_step_s_with']:.3f} s "
          f"(ratio {doc['step_time_ratio_with_over_without']:.3f})")
    print(f"  recorder's own time: {med['recorder_s_per_step'] * 1e3:.2f} ms/step wall = "
          f"{100 * doc['recorder_share_of_step']:.3f} % of a step; its thread's CPU time "
          f"{100 * doc['recorder_cpu_share_of_step']:.3f} %")
    print(f"  one event written alone: {per_event * 1e6:.1f} us; x {med['framework_events'] / STEPS:.0f} events/step "
          f"= {100 * doc['isolated_share_of_step']:.3f} % of a step")
    print(f"  bytes per trained sample: framework {doc['framework_bytes_per_trained_sample']:.0f}, "
          f"with server traces {doc['all_bytes_per_trained_sample']:.0f}")
    if os.environ.get("MILES_HARNESS_WRITE_RESULTS") == "1":
        out = ROOT / "results" / "bench" / "record_cost.json"
        out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc))
