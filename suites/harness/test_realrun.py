"""The real layouts: true overlap on split, none on colocate, and clear failures.

Small runs of the tiny model (a few seconds each). No wall-clock thresholds: overlap is
asserted as a structural property (the phases intersect, or they never do)."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import signal

import pytest

from harness.cli import main as cli
from harness.main_job.job import run_mode
from harness.main_job.rows import summarize_mode
from harness.main_job.spec import RunSpec
from miles_async_core.config import AsyncConfig

pytestmark = pytest.mark.model  # real runs of the main job: torch engines, trainers, processes

BASE = AsyncConfig(rollout_batch_size=4, n_samples_per_prompt=4)
SPEC = RunSpec(steps=4, tiny_d_model=32, tiny_layers=1, max_running=16)


def test_split_one_step_truly_overlaps_rollout_and_training():
    r = run_mode("one-step", BASE, SPEC)
    assert r.error is None
    assert len(r.history) == 4
    assert r.overlap["both_busy_s"] > 0.0
    ages = sorted({a for h in r.history for a in h["age_versions"]})
    assert ages == [0, 1]


def test_colocate_never_generates_while_training():
    base = AsyncConfig(rollout_batch_size=4, n_samples_per_prompt=4, allow_async_colocate=True)
    r = run_mode("fully-async", base, RunSpec(**{**SPEC.__dict__, "layout": "colocate"}))
    assert r.error is None and len(r.history) == 4
    assert r.overlap["both_busy_fraction"] < 0.01


@pytest.mark.timeout(120)  # a driver that retried a dead engine forever once looped here until OOM
def test_a_killed_engine_process_fails_the_run_clearly_and_keeps_finished_steps(caplog):
    state = {"n": 0}

    def kill_after_two(metrics):
        state["n"] += 1
        if state["n"] == 2:
            for child in multiprocessing.active_children():
                if child.name == "miles-engine":
                    os.kill(child.pid, signal.SIGKILL)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        r = run_mode("one-step", BASE, RunSpec(**{**SPEC.__dict__, "steps": 8}), on_step=kill_after_two)
        gc.collect()
    assert r.error is not None and "engine process exited" in r.error
    # every failed sibling group is collected, none left to be logged by the collector
    assert [m.getMessage() for m in caplog.records if m.name == "asyncio"] == []
    assert 2 <= len(r.history) < 8
    row = summarize_mode(r, None)
    assert row.steps == len(r.history) and row.error == r.error


def test_a_worker_error_from_after_the_last_drain_reaches_the_row(monkeypatch):
    import harness.main_job.job as realrun

    real_run = realrun.run

    async def run_then_worker_dies(ctx):
        history = await real_run(ctx)
        ctx.worker_error = RuntimeError("worker died late")  # what drivers.run records in that case
        return history

    monkeypatch.setattr(realrun, "run", run_then_worker_dies)
    r = run_mode("fully-async", BASE, SPEC)
    row = summarize_mode(r, None)
    assert r.error is None and row.error is None
    assert row.worker_error == "RuntimeError: worker died late"


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--layout", "colocate", "--modes", "one-step"], "--colocate"),
        (["--model", "/nonexistent/model-dir"], "--model"),
        (["--task", "poetry"], "--task"),
        (["--layout", "mesh"], "--layout"),
        (["--modes", "sync,turbo"], "--modes"),
    ],
)
def test_bad_main_job_input_is_a_clear_error_not_a_traceback(argv, needle, capsys, tmp_path):
    rc = cli(["run", "--steps", "2", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err


def test_the_main_job_records_telemetry_exactly_as_far_as_this_machine_has_nvml(tmp_path, capsys):
    """Where NVML works (a GPU machine) the run carries telemetry samples and never says
    'no telemetry'; elsewhere it says so exactly once, with the probe's reason."""
    import json

    from harness.measure.telemetry import nvml_status

    has_nvml, reason = nvml_status()
    rc = cli(
        [
            "run",
            "--steps",
            "2",
            "--repeats",
            "1",
            "--modes",
            "sync",
            "--d-model",
            "32",
            "--layers",
            "1",
            "--no-plots",
            "--out",
            str(tmp_path),
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0
    said = (captured.out + captured.err).count("no telemetry:")
    doc = json.loads((tmp_path / "results.json").read_text())
    telemetry = doc["extra"]["telemetry"]
    assert doc["benchmarks"]["sync/step_s"]["stats"]["n"] == 2
    if has_nvml:
        assert said == 0, captured.err
        assert telemetry["available"] is True and telemetry["gpus"] >= 1
        assert telemetry["samples"] >= 1  # the sampler reads once as it starts
    else:
        assert said == 1
        assert telemetry["available"] is False and telemetry["reason"] == reason


@pytest.mark.parametrize("mode,copies", [("sync", 1), ("one-step", 2)])
def test_a_real_run_ends_with_run_end_passes_every_checker_and_replays_the_gap_exactly(mode, copies):
    from harness.checking.invariants import applicable

    r = run_mode(mode, BASE, SPEC)
    assert r.error is None and len(r.history) == 4
    assert [e.kind for e in r.events].count("run_end") == 1
    assert r.checks["complete"] and r.checks["passed"], r.checks["violations"]
    assert set(r.checks["checkers"]) == {c.name for c in applicable(r.config)}
    assert "conservation" in r.checks["checkers"]
    # the gap comes from replaying the recorded batches after the run: bit for bit the trained weights,
    # holding one weight copy per version a later step still needs (not steps + 2)
    assert r.gap_summary["replay_exact"] is True and r.gap_summary["replay_max_abs_diff"] == 0.0
    assert r.gap_summary["weight_copies_held"] == copies
    assert all("gap/total_abs_mean" in h for h in r.history)
    assert r.chance_level == 0.25 and 0.0 < r.run_s
    # the recording's own time inside the timed window is measured call by call on every measured run
    assert r.self_cost["calls"] >= len(r.events) - 1 and 0.0 < r.self_cost["in_run_s"] < r.run_s
    assert r.run_cpu_s > 0  # this process and the engine process over t0 .. t1


def test_an_unmeasured_run_records_nothing_the_harness_computes_for_itself():
    r = run_mode("one-step", BASE, SPEC, measure=False)
    assert r.error is None and len(r.history) == 4 and r.run_s > 0
    assert r.events == [] and r.checks is None and r.gap_summary is None and r.self_cost is None
    assert not any("gap/total_abs_mean" in h or "age_versions" in h for h in r.history)


def test_the_loss_table_of_a_real_run_sums_to_its_gap_from_the_ideal():
    sync, one = run_mode("sync", BASE, SPEC, gap=False), run_mode("one-step", BASE, SPEC, gap=False)
    row = summarize_mode(one, sync)
    losses = row.losses
    assert losses["overlap_efficiency"] == pytest.approx(row.overlap_efficiency, rel=1e-9)
    assert sum(losses["parts_s"].values()) == pytest.approx(losses["gap_s"], abs=1e-9)
    assert sum(losses["parts_points"].values()) == pytest.approx(1 - row.overlap_efficiency, abs=1e-9)
    assert losses["sync"]["W"] > 0 and losses["sync"]["P"] > 0  # the split engine pauses, loads, resumes


SMALL = ["--steps", "3", "--d-model", "32", "--layers", "1", "--no-plots", "--no-gap"]


def test_the_run_command_checks_every_repeat_stores_the_verdicts_and_prints_chance(tmp_path, capsys):
    import json

    rc = cli(
        [
            "run",
            *SMALL,
            "--modes",
            "sync,one-step",
            "--repeats",
            "2",
            "--out",
            str(tmp_path),
            "--",
            "--rollout-batch-size",
            "4",
            "--n-samples-per-prompt",
            "4",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads((tmp_path / "results.json").read_text())
    checks = doc["extra"]["checks"]
    assert set(checks) == {"sync", "one-step"} and all(
        len(v) == 2 and all(c["passed"] for c in v) for v in checks.values()
    )
    assert all(len(v) == 2 for v in doc["extra"]["repeats"].values())
    one = doc["extra"]["table"]["one-step"]  # keyed by mode name
    assert one["repeats"] == 2 and one["chance_level"] == 0.25
    assert one["overlap_efficiency_min"] <= one["overlap_efficiency"] <= one["overlap_efficiency_max"]
    assert doc["benchmarks"]["one-step/overlap_efficiency"]["stats"]["n"] == 2
    assert "sync #2: PASS" in out and "one-step #2: PASS" in out and "chance" in out
    assert "where the overlap is lost" in out and "= measured - ideal" in out
    assert "the harness's recording inside the timed runs" in out and one["self_cost_share"] > 0
    assert "peak resident memory, GiB" in out
    for key in ("peak_rss_run_bytes", "peak_rss_after_run_bytes", "peak_rss_engine_process_bytes"):
        assert one[key] > 2**20, key  # this process's phases and the split layout's engine process


def test_a_trace_violation_fails_the_run_command_unless_violations_are_allowed(tmp_path, capsys, monkeypatch):
    """A main job whose trace has no RUN_END event fails ``conservation``."""
    import json

    import harness.main_job.job as job

    monkeypatch.setattr(job, "emit_run_end", lambda ctx: None)
    argv = [
        "run",
        *SMALL,
        "--modes",
        "sync",
        "--repeats",
        "1",
        "--",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "4",
    ]
    rc = cli([*argv[:-5], "--out", str(tmp_path / "strict"), *argv[-5:]])
    out = capsys.readouterr().out
    assert rc == 1
    assert "sync #1: FAIL" in out and "conservation (1)" in out and "no run_end event" in out
    assert "--allow-violations" in out
    doc = json.loads((tmp_path / "strict" / "results.json").read_text())
    [verdict] = doc["extra"]["checks"]["sync"]
    assert verdict["passed"] is False and verdict["violations"][0]["invariant"] == "conservation"
    rc = cli([*argv[:-5], "--allow-violations", "--out", str(tmp_path / "explore"), *argv[-5:]])
    out = capsys.readouterr().out
    assert rc == 0 and "warning: invariant violations in sync#1" in out


def test_the_speedup_is_against_the_sync_run_of_the_repeat_whichever_order_the_modes_ran(tmp_path, capsys):
    """``--modes fully-async,sync``: sync runs after the mode in each repeat, and the
    mode still gets its speedup (table, results file and the JSON last line)."""
    import json

    rc = cli(
        [
            "run",
            "--steps",
            "2",
            "--d-model",
            "32",
            "--layers",
            "1",
            "--no-plots",
            "--no-gap",
            "--modes",
            "fully-async,sync",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
            "--",
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    last = json.loads(out.strip().splitlines()[-1])
    assert last["exit_code"] == 0 and last["results"] == str(tmp_path / "results.json")
    speedup = last["modes"]["fully-async"]["speedup"]
    assert speedup is not None and speedup > 0 and last["modes"]["sync"]["speedup"] is None
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["extra"]["table"]["fully-async"]["speedup"] == speedup
    assert doc["benchmarks"]["fully-async/speedup"]["stats"]["n"] == 1
    header, row = [line for line in out.splitlines() if line.startswith(("mode ", "fully-async "))][:2]
    column = header.index("speedup")  # the table's columns are left-aligned under their headers
    assert row[column:].split()[0] == f"{speedup:.2f}"
