"""Lives on upstream Miles' own drivers (``harness.upstream.lives.UpstreamHost``) and the one
resume sweep (``harness.lives.sweep``) on it, on the tree ``--miles-src`` names.

What is asserted is what holds whatever upstream does, or what upstream's code says it
must do (spec section 11), not a count frozen from a run: a life starts where the trainer's
checkpoint says; the sync driver saves after training with nothing of the next rollout
started (``train.py:L95-L127``), so a resume there loses and repeats nothing; every group
the accounting calls lost was taken before the save that the resume loaded and was held
where that save says; a data-source state that was never written makes the next life
start from the first prompt again (``data_source.py:L146-L149``), which the accounting
sees as groups trained twice; a half-written state file fails the resume; and the core's
host and upstream's give the same table row for the same cases.
"""

from __future__ import annotations

import argparse

import pytest

from harness.checking.invariants.resume import resume_report
from harness.lives import Stop, StopPoint, run_lives
from harness.lives.sweep import cases, run_case, settings
from harness.upstream.lives import CHECKPOINT_LOADED, CHECKPOINT_SAVED, LIFE_END, LIFE_START, UpstreamHost
from miles_async_core import events as ev


def _run(name, stops):
    return run_lives(dict(settings())[name], stops, UpstreamHost())


def test_a_resumed_life_starts_where_the_trainer_checkpoint_says(miles_src):
    res = _run("one-step/retract", [StopPoint(Stop.AFTER_SAVE, 1)])
    assert res.ended == ["crash:after_save@1", "completed"] and res.error is None and res.reached == [True]
    assert all("life" in e.fields for e in res.events)
    assert [e["life"] for e in res.events if e.kind == LIFE_START] == [0, 1]
    life1 = [e for e in res.events if e["life"] == 1]
    model = next(e for e in life1 if e.kind == CHECKPOINT_LOADED and e["part"] == "model")
    saved = next(e for e in res.events if e.kind == CHECKPOINT_SAVED and e["part"] == "model" and e["life"] == 0)
    assert model["rollout_id"] == 1 and model["optimizer_step"] == saved["optimizer_step"]
    data = next(e for e in life1 if e.kind == CHECKPOINT_LOADED and e["part"] == "data_source")
    assert data["rollout_id"] == model["rollout_id"]
    start = next(e for e in life1 if e.kind == LIFE_START)
    assert start["start_rollout_id"] == 2 and start["loaded_version"] == saved["version"]
    # Megatron's start_rollout_id = loaded + 1, and training goes on from the saved step
    assert min(e["rollout_id"] for e in life1 if e.kind == ev.GENERATE_START) == 2
    first = next(e for e in life1 if e.kind == ev.TRAINED)
    assert first["rollout_id"] == 2 and first["optimizer_step"] == saved["optimizer_step"]
    # the restored cursor: the first group the resumed life takes is the saved cursor's
    taken = next(e for e in life1 if e.kind == ev.TAKEN)
    assert taken["source_index"] == data["state"]["sample_offset"]
    # nothing the crashed life would have recorded after the crash is in the trace
    end0 = next(e for e in res.events if e.kind == LIFE_END and e["life"] == 0)
    assert (end0["how"], end0["at"]) == ("crash", "after_save")
    assert not any(e.kind == ev.RUN_END and e["life"] == 0 for e in res.events)


def test_sync_resume_neither_loses_nor_repeats(miles_src):
    res = _run("sync", [StopPoint(Stop.MID_GENERATION, 5)])
    report = resume_report(res.events, res.scenario.config)
    assert res.reached == [True] and report is not None
    assert any(e.kind == CHECKPOINT_LOADED and e["part"] == "data_source" for e in res.events)
    assert (len(report.lost), len(report.duplicated)) == (0, 0)
    # every rollout's batch is a distinct prompt, each trained once where the model kept it
    cfg = res.scenario.config
    assert len(report.trained) == cfg.num_rollout * cfg.rollout_batch_size


def test_every_lost_group_was_held_at_the_loaded_save(miles_src):
    res = _run("one-step/retract+os+partial", [StopPoint(Stop.AFTER_SAVE, 1)])
    report = resume_report(res.events, res.scenario.config)
    assert report is not None
    [resume] = report.resumes
    save = next(
        e
        for e in res.events
        if e.kind == CHECKPOINT_SAVED
        and e["part"] == "data_source"
        and e["life"] == 0
        and e["rollout_id"] == resume.loaded_rollout_id
    )
    held = {gi for gis in save["held"].values() for gi in gis}
    source = {
        e["group_index"]: (e["source_index"], e["epoch"]) for e in res.events if e.kind == ev.TAKEN and e["life"] == 0
    }
    assert resume.lost > 0 and sum(resume.mechanisms.values()) == resume.lost
    # two observations agree: the accounting (from the trace) and what the runner saw upstream hold
    assert {g.source for g in report.lost if g.life == 0} <= {source[gi] for gi in held}


def test_a_missing_data_state_restarts_the_prompts_and_trains_groups_twice(miles_src):
    [case] = [c for c in cases(only=["sync"]) if c.label == "between_saves@5"]
    row = run_case(case, UpstreamHost())
    [resume] = row.resumes
    assert row.reached and resume.at == "between_saves" and resume.duplicated and resume.duplicated > 0
    assert "resume_exactly_once" in row.failed_checks
    res = run_lives(case.scenario, case.stops, UpstreamHost())
    loaded = [(e["rollout_id"], e["part"]) for e in res.events if e.kind == CHECKPOINT_LOADED]
    assert loaded == [(5, "model")]  # the data source's state of 5 was never written


def test_a_half_written_state_file_fails_the_resume(miles_src):
    res = _run("one-step/retract", [StopPoint(Stop.MID_DATA_SAVE, 1)])
    assert res.ended[0] == "crash:mid_data_save@1" and res.ended[1].startswith("error:")
    assert next(e for e in res.events if e.kind == LIFE_END and e["life"] == 1)["at"].startswith("error")
    [case] = [c for c in cases(only=["one-step/retract"]) if c.label == "mid_data_save@5"]
    row = run_case(case, UpstreamHost())
    assert row.resume_failed and row.error is None and row.resumes[0].lost is None


def test_the_core_and_upstream_give_the_same_row_of_the_one_table(miles_src, capsys):
    """The sweep's two hosts on one setting: the core mirrors upstream's resume semantics by
    default, so each stop's cell (lost/duplicated per resume; ``failed``: the resume raised
    on a half-written state file), the mechanisms and the failing checkers are the same
    (the differential across lives)."""
    from harness.commands import resume_sweep as cli

    ns = argparse.Namespace(
        host="core,upstream", miles_src=None, exactly_once=False, fast=False, setting=["one-step/retract"], json=None
    )
    assert cli.main(ns) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("hosts: core (the core's drivers); upstream (upstream Miles' drivers")
    header, core, upstream = lines[1].split(), lines[2].split(), lines[3].split()
    assert header[:2] == ["setting", "host"] and (core[1], upstream[1]) == ("core", "upstream")
    assert core[header.index("mid_data_save")] == "failed" and core[2:] == upstream[2:]


def test_the_cli_runs_the_upstream_host_and_refuses_what_upstream_refuses(miles_src, capsys):
    from harness.commands import resume_sweep as cli

    ns = argparse.Namespace(
        host="upstream",
        miles_src=str(miles_src),
        exactly_once=False,
        fast=False,
        setting=["sync", "fully-async/abort/drop"],
        json=None,
    )
    assert cli.main(ns) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("hosts: upstream (upstream Miles' drivers")
    assert out.splitlines()[1].startswith("setting") and "\nsync " in out
    assert "fully-async/abort/drop: not run" in out and "upstream (arguments.py)" in out


def test_exactly_once_is_refused_on_upstream_naming_the_flag():
    from harness.commands.resume_sweep import hosts_of
    from miles_async_core.errors import ConfigError

    with pytest.raises(ConfigError, match="--exactly-once"):
        hosts_of("upstream", None, exactly_once=True)
