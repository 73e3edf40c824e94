"""Kill and resume in real time: upstream's ``train_async.py`` on the CPU servers with the
recorder, SIGKILLed after a checkpoint, resumed through upstream's own ``--load`` path
(``harness.record.resume_run``), then ``miles-harness check-trace --merge DIR`` joins the
two lives and runs every applicable checker, the resume checkers included.

What is asserted holds whatever upstream loses: the first life was killed and the second
finished; the merge joined two lives; the second starts at the killed life's last
checkpoint + 1 (Megatron's ``start_rollout_id``) with the data source's cursor restored;
each resume checker printed a verdict; and every group the accounting calls lost was
taken before the save the resume loaded (a loss the resume caused, not one of the run).
"""

from __future__ import annotations

import argparse
import json

import pytest

from miles_async_core import events as ev

pytestmark = [pytest.mark.slow, pytest.mark.process, pytest.mark.model, pytest.mark.http]


def test_a_killed_run_resumes_through_load_and_the_lives_are_checked(tmp_path, miles_src):
    from harness.checking.invariants.resume import resume_report
    from harness.record.merge import MERGED_NAME
    from harness.record.resume_run import kill_and_resume
    from harness.trace import read_jsonl

    ns = argparse.Namespace(
        record_dir=tmp_path / "rec",
        ckpt=tmp_path / "ckpt",
        miles_src=str(miles_src),
        steps=6,
        save_interval=2,
        fully_async=False,
        servers=1,
        train_extra_s=0.3,
        seed=0,
        kill_after=1,
    )
    out = kill_and_resume(ns)
    assert out["killed"] and out["life0_returncode"] == -9, out
    assert out["life1_returncode"] == 0, out["life1_stderr"]
    text = out["check_output"]
    assert out["check_returncode"] in (0, 1), out["check_stderr"]
    assert "lives: 2 joined" in text
    for name in ("resume_exactly_once", "resume_rollout_once", "resume_versions"):
        assert any(line.startswith(name) and ("PASS" in line or "FAIL" in line) for line in text.splitlines()), text

    events = read_jsonl(ns.record_dir / MERGED_NAME)
    starts = [e for e in events if e.kind == ev.LIFE_START]
    assert [e["life"] for e in starts] == [0, 1]
    saves = [e for e in events if e.kind == ev.CHECKPOINT_SAVED and e["part"] == "data_source" and e["life"] == 0]
    last = max(e["rollout_id"] for e in saves)
    assert starts[1]["start_rollout_id"] == last + 1
    loaded = next(e for e in events if e.kind == ev.CHECKPOINT_LOADED and e["part"] == "data_source")
    saved = next(e for e in saves if e["rollout_id"] == last)
    assert loaded["life"] == 1 and loaded["state"] == saved["state"]
    first_taken = next(e for e in events if e.kind == ev.TAKEN and e["life"] == 1)
    assert first_taken["source_index"] == saved["state"]["sample_offset"]

    config = json.loads((ns.record_dir / "merged.config.json").read_text())
    from miles_async_core.config import AsyncConfig

    report = resume_report(events, AsyncConfig.from_dict(config["config"]))
    save_pos = next(i for i, e in enumerate(events) if e is saved)
    taken_before = {(e["source_index"], e["epoch"]) for e in events[:save_pos] if e.kind == ev.TAKEN}
    assert {g.source for g in report.lost} <= taken_before


def _lost_at_resume(tmp_path, tree: str) -> int:
    from harness.record.merge import MERGED_NAME
    from harness.checking.invariants.resume import resume_report
    from harness.record.resume_run import kill_and_resume
    from harness.trace import read_jsonl

    ns = argparse.Namespace(
        record_dir=tmp_path / "rec",
        ckpt=tmp_path / "ckpt",
        miles_src=tree,
        steps=6,
        save_interval=2,
        fully_async=False,
        servers=1,
        train_extra_s=0.3,
        seed=0,
        kill_after=1,
    )
    out = kill_and_resume(ns)
    assert out["killed"] and out["life1_returncode"] == 0, out["life1_stderr"]
    report = resume_report(read_jsonl(ns.record_dir / MERGED_NAME))
    assert report is not None
    return len(report.lost)


def test_the_killed_run_tells_a_repaired_resume_from_a_broken_one_on_upstreams_own_save_and_load(tmp_path, miles_src):
    """Miles #2661 snapshots the data source when a rollout's generation returns and saves
    that snapshot: a one-step run killed after a checkpoint loses nothing on resume, where
    the pinned tree loses the look-ahead rollout's groups (the served run resumes through
    upstream's own ``save``, ``load`` and ``create_training_models``)."""
    from harness.upstream.source import REPO_ROOT

    pr2661 = REPO_ROOT.parent / "shared" / "third_party" / "miles-pr2661-01cdd291b"
    if not pr2661.is_dir():
        pytest.skip(f"the tree of Miles #2661 is not at {pr2661}")
    assert _lost_at_resume(tmp_path / "pr2661", str(pr2661)) == 0
    assert _lost_at_resume(tmp_path / "pinned", str(miles_src)) > 0
