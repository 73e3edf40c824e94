"""A record directory holding two lives of one run (``harness.record.merge.split_lives``):
process files written by the recorder's own writer (no Miles: fast tier)."""

from __future__ import annotations

from pathlib import Path

from harness.record.merge import merge_dir, split_lives, verdict
from harness.record.writer import ProcessRecord
from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig

CONFIG = AsyncConfig(rollout_batch_size=1, n_samples_per_prompt=1, num_rollout=2)


def _record(directory: Path, role: str, pid: int) -> ProcessRecord:
    rec = ProcessRecord(directory, role)
    rec.pid = pid  # one test process stands for each life's process
    rec.path = directory / f"{role}-host-{pid}.jsonl"
    return rec


def _take(rec: ProcessRecord, gi: int, source: int) -> None:
    rec.emit(ev.TAKEN, group_index=gi, indices=[gi], recycled=False, call=gi + 1, source_index=source, epoch=0)


def _two_lives(directory: Path) -> None:
    """Life 0 trains rollout 0 (source 0), takes source 1 for rollout 1 (the look-ahead),
    saves the cursor past it and is killed; life 1 loads that checkpoint, starts at rollout 1
    and takes source 2: source 1 is never trained."""
    life0 = _record(directory, "rollout", 1001)
    _take(life0, 0, 0)
    _take(life0, 1, 1)
    life0.emit(ev.TRAINED, rollout_id=0, group_indices=[0], trainer_version=1, samples=1)
    life0.emit(ev.CHECKPOINT_SAVED, rollout_id=0, part="data_source", state={"sample_offset": 2})
    life0.close()
    server1 = _record(directory, "server-0", 1002)  # a server of life 1 starts before its rollout manager
    server1.emit(ev.ENGINE_VERSION, version=1)
    server1.close()
    life1 = _record(directory, "rollout", 1002)
    life1.emit(ev.CHECKPOINT_LOADED, rollout_id=0, part="model", inferred=True)
    life1.emit(ev.CHECKPOINT_LOADED, rollout_id=0, part="data_source", state={"sample_offset": 2})
    _take(life1, 2, 2)
    life1.emit(ev.TRAINED, rollout_id=1, group_indices=[2], trainer_version=1, samples=1)
    life1.close()


def test_two_rollout_processes_are_two_lives_and_the_resume_checkers_see_the_loss(tmp_path):
    _two_lives(tmp_path)
    merged = merge_dir(tmp_path)
    starts = [e for e in merged.events if e.kind == ev.LIFE_START]
    assert [(e["life"], e["start_rollout_id"]) for e in starts] == [(0, 0), (1, 1)]
    assert all("life" in e.fields for e in merged.events)
    ends = [e for e in merged.events if e.kind == ev.LIFE_END]
    assert [(e["life"], e["how"]) for e in ends] == [(0, "crash"), (1, "completed")]
    assert {p["file"]: p["life"] for p in merged.processes}["server-0-host-1002.jsonl"] == 1
    result = verdict(merged, CONFIG, complete=True)
    assert result["lives"] == 2
    [lost] = result["violations"]["resume_exactly_once"]
    assert "source group 1 " in lost.message
    assert result["ran"]["resume_rollout_once"] == 0


def test_one_rollout_process_is_one_life_and_the_trace_has_no_life_fields(tmp_path):
    rec = _record(tmp_path, "rollout", 7)
    _take(rec, 0, 0)
    rec.emit(ev.TRAINED, rollout_id=0, group_indices=[0], trainer_version=1, samples=1)
    rec.close()
    files = merge_dir(tmp_path)
    assert not any(e.kind in (ev.LIFE_START, ev.LIFE_END) or "life" in e.fields for e in files.events)
    assert "lives" not in verdict(files, CONFIG, complete=True)


def test_split_lives_assigns_each_file_to_the_life_running_when_it_started(tmp_path):
    _two_lives(tmp_path)
    from harness.record.merge import read_dir

    lives = split_lives(read_dir(tmp_path, incomplete=False))
    assert [sorted(pf.path.name for pf in life) for life in lives] == [
        ["rollout-host-1001.jsonl"],
        ["rollout-host-1002.jsonl", "server-0-host-1002.jsonl"],
    ]
