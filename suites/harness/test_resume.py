"""Runs that stop and resume (``harness.lives``) and the resume sweep's fast subset:
upstream's semantics (the core's default) lose what upstream's save may lose (it saves the
data source's cursor alone, ``miles/rollout/data_source.py:L124-L137``, while
``generate(N+1)`` runs, ``train_async.py:L78-L105``), the
exactly-once extension loses and duplicates nothing, a seeded fix of the one-step resume
passes the exactly-once check, and single-life traces are untouched by the resume checkers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.checking.invariants import check_report
from harness.checking.invariants.resume import resume_report
from harness.cli import main
from harness.commands.resume_sweep import hosts_of
from harness.lives import Stop, StopPoint, run_lives
from harness.lives.core import CoreHost
from harness.lives.sweep import FAST, cases, run_case, settings, sweep
from harness.sim.run_scenario import simulate
from miles_async_core.errors import ConfigError

try:
    from fixtures.mutants import resume as seeded
except ModuleNotFoundError:  # pytest run from elsewhere than the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from fixtures.mutants import resume as seeded

RESUME_CHECKS = {"resume_exactly_once", "resume_rollout_once", "resume_versions"}


def test_exactly_once_extension_loses_and_duplicates_nothing_on_the_fast_sweep() -> None:
    rows = [r for r in sweep(cases(True, only=FAST)) if r.refused is None]
    assert rows and all(r.reached and r.error is None for r in rows)
    bad = [
        (r.case.name, r.lost, r.duplicated, r.failed_checks)
        for r in rows
        if r.lost or r.duplicated or set(r.failed_checks) & RESUME_CHECKS
    ]
    assert not bad, bad


def test_upstream_semantics_lose_the_look_ahead_and_restart_versions() -> None:
    one_step = {r.case.stops[0].at: r for r in sweep(cases(False, only=["one-step/retract"])) if len(r.case.stops) == 1}
    row = one_step["after_save"]
    assert row.lost > 0 and set(row.mechanisms) == {"look_ahead"}, row
    assert "resume_versions" in row.failed_checks  # the updater's in-memory counter starts again
    half = one_step["between_saves"]  # no data source state: the cursor starts over
    assert half.duplicated > 0 and "resume_exactly_once" in half.failed_checks
    sync = {r.case.stops[0].at: r for r in sweep(cases(False, only=["sync"])) if len(r.case.stops) == 1}
    assert sync["after_save"].lost == 0 and sync["after_save"].duplicated == 0


def test_the_seeded_one_step_fix_passes_the_exactly_once_check() -> None:
    """The cursor snapshotted when rollout N's generation ends, saved with N (the repair
    upstream pull request #2661 proposes): no one-step stop loses or duplicates a group. The
    crash between the model's and the data source's save is left out: the fix saves the
    same files in the same order, so that half-written checkpoint still loads no cursor."""
    scenario = dict(settings(False))["one-step/retract"]
    for case in cases(False, only=["one-step/retract"]):
        if case.stops[0].at in (Stop.BETWEEN_SAVES, Stop.MID_DATA_SAVE):
            continue
        with seeded.snapshot_cursor_at_generate_end() as variant:
            result = run_lives(case.scenario, case.stops, CoreHost(**variant))
        report = resume_report(result.events, scenario.config)
        assert result.error is None and report is not None
        assert not report.lost and not report.duplicated, (case.name, report.to_dict())
    broken = run_case(cases(False, only=["one-step/retract"])[0])
    assert broken.lost > 0  # the same stop without the fix loses the look-ahead


def test_resume_checkers_do_not_apply_to_a_single_life_trace() -> None:
    scenario = dict(settings(False))["one-step/retract"]
    result = simulate(scenario)
    report = check_report(result.events, scenario.config)
    assert RESUME_CHECKS <= set(report["not_applicable"]) and not RESUME_CHECKS & set(report["checkers"])
    assert not any(e.kind == "taken" and "source_index" in e.fields for e in result.events)


def test_a_crash_between_the_model_and_the_data_source_leaves_a_half_written_checkpoint() -> None:
    scenario = dict(settings(False))["sync"]
    events = run_lives(scenario, [StopPoint(Stop.BETWEEN_SAVES, 3)], CoreHost()).events
    saved = [(e["rollout_id"], e["part"]) for e in events if e.kind == "checkpoint_saved" and e["life"] == 0]
    assert saved[-1] == (3, "model")
    loaded = [(e["rollout_id"], e["part"]) for e in events if e.kind == "checkpoint_loaded"]
    assert loaded == [(3, "model")]


def test_cli_resume_sweep_writes_its_table(tmp_path: Path, capsys) -> None:
    out = tmp_path / "sweep.json"
    assert main(["resume-sweep", "--exactly-once", "--setting", "sync", "--json", str(out)]) == 0
    assert "sync" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["summary"][0]["lost"] == 0 and doc["summary"][0]["duplicated"] == 0


def test_check_trace_runs_the_resume_checkers_on_a_stored_trace_with_lives(tmp_path: Path, capsys) -> None:
    from harness.trace import config_path, write_jsonl

    case = next(c for c in cases(False, only=["one-step/retract"]) if c.label == "after_save@1")
    trace = tmp_path / "lives.jsonl"
    write_jsonl(run_lives(case.scenario, case.stops, CoreHost()).events, trace)
    config_path(trace).write_text(json.dumps({"config": case.scenario.config.to_dict(), "complete": True}))
    assert main(["check-trace", str(trace)]) == 1
    out = capsys.readouterr().out
    assert "resume_exactly_once                FAIL" in out and "resume_rollout_once                PASS" in out
    assert "look_ahead when the checkpoint's cursor was saved" in out


def test_exactly_once_holds_across_three_stops_in_one_run() -> None:
    """A run stopped three times (a crash mid-step before its second save, a crash between a
    model's and a data source's save, a planned exit) and resumed each time."""
    stops = [
        StopPoint(Stop.MID_TRAIN, 2),
        StopPoint(Stop.BETWEEN_SAVES, 5),
        StopPoint(Stop.PLANNED_EXIT, 6),
    ]
    for name, scenario in settings(True):
        if name not in FAST:
            continue
        result = run_lives(scenario, stops, CoreHost())
        report = resume_report(result.events, scenario.config)
        assert result.error is None and all(result.reached) and report is not None
        assert len(report.resumes) == 3 and not report.lost and not report.duplicated, (name, report.to_dict())
        assert not check_report(result.events, scenario.config)["violations"], name


def test_a_stop_spelled_as_before_names_its_new_name_and_a_bad_one_the_allowed_ones() -> None:
    for old, new in (("save_boundary", "after_save"), ("between_model_and_data_source", "between_saves")):
        with pytest.raises(ConfigError, match=f"is now '{new}'"):
            StopPoint(old, 3)
    with pytest.raises(ConfigError, match="not one of after_save, between_saves, mid_data_save"):
        StopPoint("sometime", 3)
    with pytest.raises(ConfigError, match="rollout_id must be >= 0"):
        StopPoint(Stop.MID_TRAIN, -1)
    assert (
        StopPoint("mid_update", 4) == StopPoint(Stop.MID_UPDATE, 4) and StopPoint(Stop.PLANNED_EXIT, 4).how == "planned"
    )


def test_a_crash_inside_the_data_sources_save_fails_the_resume_unless_the_extension_skips_the_torn_checkpoint() -> None:
    """``mid_data_save`` on the core: the model's part of rollout 5 written, the data source's
    torn; upstream's semantics load the newest model and fail on its data part (as
    ``torch.load`` does on a half-written file); the exactly-once extension loads the last
    complete checkpoint (3) and loses nothing."""
    [case] = [c for c in cases(False, only=["one-step/retract"]) if c.label == "mid_data_save@5"]
    result = run_lives(case.scenario, case.stops, CoreHost())
    assert result.ended[0] == "crash:mid_data_save@5" and result.ended[1].startswith("error:TornCheckpoint")
    row = run_case(case)
    assert row.resume_failed and row.error is None and row.resumes[0].lost is None
    [safe] = [c for c in cases(True, only=["one-step/retract"]) if c.label == "mid_data_save@5"]
    result = run_lives(safe.scenario, safe.stops, CoreHost())
    report = resume_report(result.events, safe.scenario.config)
    assert result.error is None and report is not None and report.resumes[0].loaded_rollout_id == 3
    assert not report.lost and not report.duplicated


def test_the_sweep_resumes_three_times_in_one_run_and_counts_each_resume_at_its_stop() -> None:
    [case] = [c for c in cases(False, only=["one-step/retract"]) if len(c.stops) == 3]
    row = run_case(case)
    assert [r.at for r in row.resumes] == ["after_save"] * 3 and row.reached and row.error is None
    assert all(r.lost and set(row.mechanisms) == {"look_ahead"} for r in row.resumes)
    assert sum(r.lost or 0 for r in row.resumes) == row.lost


def test_resume_sweep_host_names_are_checked() -> None:
    for bad in ("both", "core,core", ""):
        with pytest.raises(ConfigError, match="--host"):
            hosts_of(bad)
