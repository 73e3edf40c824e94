"""Lives on upstream Miles' own drivers (``harness.upstream.lives``) and the resume sweep's
accounting (``harness.upstream.resume_sweep``), on the tree ``--miles-src`` names.

What is asserted is what holds whatever upstream does, or what upstream's code says it
must do (spec section 11), not a count frozen from a run: a life starts where the trainer's
checkpoint says; the sync driver saves after training with nothing of the next rollout
started (``train.py:L95-L127``), so a resume there loses and repeats nothing; every group
the accounting calls lost was taken before the save that the resume loaded and was held
where that save says; a data-source state that was never written makes the next life
start from the first prompt again (``data_source.py:L146-L149``), which the accounting
sees as groups trained twice; a half-written state file fails the resume.
"""

from __future__ import annotations

import pytest

from harness.upstream.lives import (
    CHECKPOINT_LOADED,
    CHECKPOINT_SAVED,
    LIFE_END,
    LIFE_START,
    Stop,
    run_lives,
)
from harness.upstream.resume_sweep import SETTINGS, account
from miles_async_core import events as ev

SAVE_INTERVAL, NUM_ROLLOUT = 2, 6


def _setting(name):
    return next(s for s in SETTINGS if s.name == name)


def _run(name, stops, miles_src):
    return run_lives(_setting(name).scenario(NUM_ROLLOUT, 0), stops, save_interval=SAVE_INTERVAL)


def test_a_resumed_life_starts_where_the_trainer_checkpoint_says(miles_src):
    res = _run("one-step", [Stop(after=1)], miles_src)
    assert res.ended == ["crash:save@1", "completed"] and res.error is None
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
    assert end0["how"] == "crash" and not any(e.kind == ev.RUN_END and e["life"] == 0 for e in res.events)


def test_sync_resume_neither_loses_nor_repeats(miles_src):
    res = _run("sync", [Stop(after=1, at="mid_generation")], miles_src)
    acc = account(res)
    assert acc["resumes"][0]["data_state_found"]
    assert (acc["lost"], acc["duplicated"]) == (0, 0)
    # every rollout's batch is a distinct prompt, each trained once where the model kept it
    assert acc["trained_groups"] == NUM_ROLLOUT * res.scenario.config.rollout_batch_size
    assert acc["checks"]["resume_exactly_once"] == 0 and acc["checks"]["resume_rollout_once"] == 0


def test_every_lost_group_was_held_at_the_loaded_save(miles_src):
    res = _run("one-step+over-sampling+partial", [Stop(after=1)], miles_src)
    acc = account(res)
    [resume] = acc["resumes"]
    save = next(
        e
        for e in res.events
        if e.kind == CHECKPOINT_SAVED
        and e["part"] == "data_source"
        and e["life"] == 0
        and e["rollout_id"] == resume["loaded_rollout_id"]
    )
    held = {gi for gis in save["held"].values() for gi in gis}
    source = {
        e["group_index"]: (e["source_index"], e["epoch"]) for e in res.events if e.kind == ev.TAKEN and e["life"] == 0
    }
    assert resume["lost"] > 0 and sum(resume["mechanisms"].values()) == resume["lost"]
    # two observations agree: the accounting (from the trace) and what the runner saw upstream hold
    assert set(map(tuple, resume["lost_groups"])) <= {source[gi] for gi in held}


def test_a_missing_data_state_restarts_the_prompts_and_trains_groups_twice(miles_src):
    res = _run("sync", [Stop(after=1, at="between_saves")], miles_src)
    acc = account(res)
    [resume] = acc["resumes"]
    assert resume["loaded_rollout_id"] == 1 and not resume["data_state_found"]
    assert resume["duplicated"] > 0 and acc["checks"]["resume_exactly_once"] >= resume["duplicated"]


def test_a_half_written_state_file_fails_the_resume(miles_src):
    res = _run("one-step", [Stop(after=1, at="mid_data_save")], miles_src)
    acc = account(res)
    assert res.ended[0] == "crash:mid_data_save@1" and res.ended[1].startswith("error:")
    assert next(e for e in res.events if e.kind == LIFE_END and e["life"] == 1)["at"].startswith("error")
    assert acc["resume_failed"] and acc["resumes"][0]["lost"] is None


def test_upstream_and_the_core_lose_and_repeat_the_same_groups_on_one_setting(miles_src):
    """The sweep's upstream host against its core host on one setting, case by case: the
    core mirrors upstream's resume semantics by default, so upstream's losses and
    duplicates are the core's (the differential across lives)."""
    from harness.sim.resume_sweep import cases, core_host, run_case
    from harness.upstream.lives import upstream_host

    host = upstream_host(str(miles_src))
    todo = [
        c
        for c in cases(only=["one-step/retract"])
        if c.stops[0].at in ("save_boundary", "mid_train", "between_model_and_data_source")
    ]
    assert len(todo) >= 3, [c.name for c in cases(only=["one-step/retract"])]  # the setting and its stops exist
    for case in todo:
        up, core = run_case(case, host), run_case(case, core_host)
        assert up.reached and up.error is None, (case.name, up.error)
        assert (up.lost, up.duplicated, up.mechanisms) == (core.lost, core.duplicated, core.mechanisms), case.name


def test_the_cli_runs_the_upstream_host_and_refuses_what_upstream_refuses(miles_src, capsys):
    import argparse

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
    assert out.splitlines()[0].startswith("host: upstream (upstream Miles' drivers")
    assert out.splitlines()[1].startswith("setting") and "\nsync " in out
    assert "fully-async/abort/drop: not run" in out and "upstream (arguments.py)" in out


def test_exactly_once_is_refused_on_upstream_naming_the_flag():
    from harness.commands.resume_sweep import host_of
    from miles_async_core.errors import ConfigError

    with pytest.raises(ConfigError, match="--exactly-once"):
        host_of("upstream", None, exactly_once=True)


@pytest.mark.parametrize("bad", [{"after": -1}, {"after": 1, "at": "sometime"}, {"after": 1, "nth": 0}])
def test_a_bad_stop_is_refused_naming_the_field(bad):
    from miles_async_core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"Stop\.(after|at|nth)"):
        Stop(**bad)
