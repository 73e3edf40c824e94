"""Merging a record directory (``harness.record.merge``) and ``check-trace --merge``, on
process files written by the recorder's own writer (no Miles, no HTTP: fast tier)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from miles_async_core.errors import ConfigError
from harness.record.merge import merge_dir, verdict
from harness.record.writer import ProcessRecord

CONFIG = AsyncConfig(rollout_batch_size=1, n_samples_per_prompt=2, num_rollout=1)


def _one_step_run(directory: Path, *, train_twice: bool = False) -> None:
    """A one-step rollout of one group of two samples, as the wrappers record it."""
    rec = ProcessRecord(directory, "rollout")
    rec.emit(ev.SET_WEIGHT_VERSION, version=1)
    rec.emit(ev.GENERATE_START, rollout_id=0, version=1)
    rec.emit(ev.TAKEN, group_index=0, indices=[0, 1], recycled=False, call=1)
    for i in (0, 1):
        rec.emit("generate_begin", index=i, group_index=0)
    for i in (0, 1):
        rec.emit(
            "generate_call",
            index=i,
            group_index=0,
            start_mono=0.0,
            start_wall=0.0,
            added_tokens=3,
            response_length=3,
            status="completed",
            weight_versions=["1"],
            added_versions=["1"],
            evaluation=False,
        )
    rec.emit(ev.GROUP_DONE, group_index=0, ok=True)
    rec.emit(ev.GENERATE_END, rollout_id=0)
    for _ in range(2 if train_twice else 1):
        rec.emit(ev.TRAINED, rollout_id=0, group_indices=[0], trainer_version=1, samples=2)
    rec.close()


def test_merge_orders_events_and_lists_checkers_lacking_their_kinds(tmp_path):
    _one_step_run(tmp_path)
    merged = merge_dir(tmp_path)
    kinds = [e.kind for e in merged.events]
    assert kinds.index(ev.TAKEN) < kinds.index(ev.SUBMITTED) < kinds.index(ev.FINISHED) < kinds.index(ev.TRAINED)
    result = verdict(merged, CONFIG, complete=True)
    assert result["passed"] and "conservation_prefix" in result["ran"]
    # without a server file there are no engine events: those checkers say what they lack
    assert result["lacking"]["token_versions"] == [ev.DECODE_STEP, ev.ENGINE_VERSION]
    assert ev.ENGINE_PAUSE in result["lacking"]["no_generation_while_paused"]


def test_a_group_trained_twice_is_caught_by_name(tmp_path):
    _one_step_run(tmp_path, train_twice=True)
    result = verdict(merge_dir(tmp_path), CONFIG, complete=True)
    assert result["ran"]["conservation_prefix"] >= 1 and not result["passed"]


def test_a_truncated_last_line_needs_incomplete_and_is_reported(tmp_path):
    _one_step_run(tmp_path)
    path = next(tmp_path.glob("rollout-*.jsonl"))
    text = path.read_text()
    path.write_text(text[: len(text) - 10])  # the last event cut short, as a kill leaves it
    with pytest.raises(ConfigError, match="--incomplete"):
        merge_dir(tmp_path)
    merged = merge_dir(tmp_path, incomplete=True)
    assert merged.truncated == [path.name]
    assert ev.TRAINED not in {e.kind for e in merged.events}


def test_a_bad_line_inside_a_file_is_an_error_naming_file_and_line(tmp_path):
    _one_step_run(tmp_path)
    path = next(tmp_path.glob("rollout-*.jsonl"))
    lines = path.read_text().splitlines()
    lines[2] = "{not json"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"line 3"):
        merge_dir(tmp_path, incomplete=True)


def test_a_line_without_numeric_clocks_is_an_error_naming_file_and_line(tmp_path):
    _one_step_run(tmp_path)
    path = next(tmp_path.glob("rollout-*.jsonl"))
    lines = path.read_text().splitlines()
    lines[2] = json.dumps({**json.loads(lines[2]), "mono": "late"})
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"line 3: .*numeric mono/wall"):
        merge_dir(tmp_path)


def test_a_generate_call_field_of_the_wrong_type_is_an_error_naming_it(tmp_path):
    _one_step_run(tmp_path)
    path = next(tmp_path.glob("rollout-*.jsonl"))
    lines = path.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if json.loads(line)["kind"] == "generate_call")
    lines[n] = json.dumps({**json.loads(lines[n]), "weight_versions": "1"})
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        ConfigError, match=rf"line {n + 1}: generate_call field 'weight_versions' is '1'\. Allowed: a list"
    ):
        merge_dir(tmp_path)


def test_processes_are_aligned_on_the_wall_clock(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    # two processes whose monotonic clocks differ by 1000 s; b's take happens 1 s after a's start
    a.write_text(
        "\n".join(
            json.dumps(d)
            for d in [
                {"kind": "process", "pid": 1, "role": "rollout", "host": "h", "mono": 5.0, "wall": 100.0},
                {"kind": ev.GENERATE_START, "rollout_id": 0, "version": 1, "mono": 5.0, "wall": 100.0},
                {"kind": ev.GENERATE_END, "rollout_id": 0, "mono": 7.0, "wall": 102.0},
            ]
        )
        + "\n"
    )
    b.write_text(
        "\n".join(
            json.dumps(d)
            for d in [
                {"kind": "process", "pid": 2, "role": "trainer", "host": "h2", "mono": 1000.0, "wall": 100.0},
                {
                    "kind": ev.TRAINED,
                    "rollout_id": 0,
                    "group_indices": [],
                    "trainer_version": 1,
                    "mono": 1001.0,
                    "wall": 101.0,
                },
            ]
        )
        + "\n"
    )
    kinds = [e.kind for e in merge_dir(tmp_path).events]
    assert kinds == [ev.GENERATE_START, ev.TRAINED, ev.GENERATE_END]


def test_check_trace_merge_cli_exit_codes(tmp_path, capsys):
    from harness.cli import main

    good, bad = tmp_path / "good", tmp_path / "bad"
    _one_step_run(good)
    _one_step_run(bad, train_twice=True)
    flags = ["--", "--rollout-batch-size", "1", "--n-samples-per-prompt", "2", "--num-rollout", "1"]
    assert main(["check-trace", "--merge", str(good), *flags]) == 0
    out = capsys.readouterr().out
    assert "NOT APPLICABLE: the trace has no decode_step" in out and (good / "merged.jsonl").exists()
    assert main(["check-trace", "--merge", str(bad), *flags]) == 1
    assert "conservation_prefix" in capsys.readouterr().out
    # the whole Miles command line after --, its program first (as run_gpu_checks.sh passes $MILES_CMD)
    assert main(["check-trace", "--merge", str(good), "--", "python3", "train_async.py", *flags[1:]]) == 0
    assert "config: the Miles flags given" in capsys.readouterr().out


def test_every_checker_declares_the_event_kinds_it_reads():
    """A checker the merge does not know would run on a record that lacks its inputs and
    pass without having read anything: each must name its kinds in ``REQUIRES``."""
    from harness.checking.invariants import ALL_CHECKS
    from harness.record.merge import REQUIRES

    assert sorted(set(ALL_CHECKS) - set(REQUIRES)) == []
    assert all(set(kinds) <= set(ev.EVENT_FIELDS) for kinds in REQUIRES.values())


def _lines(path: Path, role: str, rows: list[dict]) -> None:
    head = {"kind": "process", "pid": 1, "role": role, "host": "h", "mono": 0.0, "wall": 1000.0}
    path.write_text("".join(json.dumps(d) + "\n" for d in [head, *[dict(r, wall=r["mono"] + 1000.0) for r in rows]]))


def _call(index, t0, t1, digest=None):
    return [
        {"kind": "generate_begin", "index": index, "group_index": 0, "mono": t0},
        {
            "kind": "generate_call",
            "index": index,
            "group_index": 0,
            "start_mono": t0,
            "start_wall": t0 + 1000.0,
            "added_tokens": 4,
            "response_length": 4,
            "status": "completed",
            "weight_versions": ["1"],
            "added_versions": ["1"],
            "evaluation": False,
            "tokens_digest": digest,
            "mono": t1,
        },
    ]


def _request(index, t0, t1, *, version=1, digest=None):
    done = {
        "kind": "finished",
        "index": index,
        "group_index": index,
        "status": "completed",
        "response_length": 4,
        "token_versions": [[version, version, 4]],
        "weight_versions": [str(version)],
        "mono": t1,
    }
    return [
        {"kind": "submitted", "index": index, "group_index": index, "version": version, "mono": t0},
        {"kind": "admitted", "index": index, "version": version, "prefix_tokens": 2, "mono": t0},
        {"kind": "decode_step", "indices": [index], "version": version, "dur_s": 0.01, "mono": t1},
        {**done, **({"tokens_digest": digest} if digest else {})},
    ]


def test_server_requests_join_the_calls_they_answered(tmp_path):
    # two calls of the same shape overlap, and their requests went to different servers;
    # each answer reaches its caller just after the server finishes it: request 7 on
    # server 0 (ends 2.00) is sample 1's (call ends 2.01), request 4 on server 1 (ends
    # 1.96) sample 0's (call ends 1.97), though sample 0's call is also in request 7's window
    _lines(
        tmp_path / "rollout.jsonl",
        "rollout",
        [
            {"kind": ev.TAKEN, "group_index": 0, "indices": [0, 1], "recycled": False, "call": 1, "mono": 0.5},
            *_call(0, 1.0, 1.97),
            *_call(1, 1.1, 2.01),
        ],
    )
    _lines(
        tmp_path / "server0.jsonl",
        "server-0",
        [{"kind": ev.ENGINE_VERSION, "version": 1, "mono": 0.1}, *_request(7, 1.2, 2.0), *_request(3, 3.0, 3.1)],
    )  # a health check: answers no recorded call
    _lines(
        tmp_path / "server1.jsonl",
        "server-1",
        [{"kind": ev.ENGINE_VERSION, "version": 1, "mono": 0.1}, *_request(4, 1.05, 1.96)],
    )
    merged = merge_dir(tmp_path)
    assert merged.join == {"joined": 2, "exact": 0, "ambiguous": 0, "server_requests_unjoined": 1, "calls_unjoined": 0}
    finished = [(e["index"], e["engine"]) for e in merged.events if e.kind == ev.FINISHED]
    assert finished == [(0, 1), (1, 0)]
    assert [(e["indices"], e["engine"]) for e in merged.events if e.kind == ev.DECODE_STEP] == [([0], 1), ([1], 0)]
    submitted = [(e["index"], e["engine"]) for e in merged.events if e.kind == ev.SUBMITTED]
    assert submitted == [(0, 1), (1, 0)]  # the recorder's submissions, with the engine each went to


def test_requests_are_joined_in_the_order_they_ended_on_every_server(tmp_path):
    # request 2 on server 1 ended first (1.995) and its answer reached sample 1 (call ends
    # 2.001); request 5 on server 0 ended at 2.00 and answered sample 0 (call ends 2.02).
    # Taken server by server, request 5 would take sample 1's call (the one ending soonest
    # after it) and leave request 2, submitted before sample 0's call began, with none
    _lines(tmp_path / "rollout.jsonl", "rollout", [*_call(1, 0.98, 2.001), *_call(0, 1.15, 2.02)])
    _lines(tmp_path / "server0.jsonl", "server-0", [*_request(5, 1.2, 2.0)])
    _lines(tmp_path / "server1.jsonl", "server-1", [*_request(2, 1.0, 1.995)])
    merged = merge_dir(tmp_path)
    assert merged.join["joined"] == 2 and merged.join["calls_unjoined"] == 0
    assert [(e["index"], e["engine"]) for e in merged.events if e.kind == ev.FINISHED] == [(1, 1), (0, 0)]


def test_a_request_joins_the_call_with_its_tokens_digest_before_any_timing(tmp_path):
    # same shape, overlapping; by timing request 7 (ends 2.00) would take sample 0's call
    # (ends 2.005), but its tokens are sample 1's; samples 2 and 3 got the same tokens
    # (one digest): timing tells them apart
    _lines(
        tmp_path / "rollout.jsonl",
        "rollout",
        [
            *_call(0, 1.0, 2.005, "d-zero"),
            *_call(1, 1.0, 2.02, "d-one"),
            *_call(2, 3.0, 3.52, "d-same"),
            *_call(3, 3.0, 3.41, "d-same"),
        ],
    )
    _lines(
        tmp_path / "server0.jsonl",
        "server-0",
        [
            *_request(7, 1.1, 2.0, digest="d-one"),
            *_request(8, 1.1, 2.01, digest="d-zero"),
            *_request(9, 3.1, 3.4, digest="d-same"),
            *_request(10, 3.1, 3.5, digest="d-same"),
        ],
    )
    merged = merge_dir(tmp_path)
    assert merged.join == {"joined": 4, "exact": 4, "ambiguous": 1, "server_requests_unjoined": 0, "calls_unjoined": 0}
    assert [e["index"] for e in merged.events if e.kind == ev.FINISHED] == [1, 0, 3, 2]
    # a request whose digest names no call is not joined by timing to a call that has another
    _lines(tmp_path / "server0.jsonl", "server-0", [*_request(7, 1.1, 2.0, digest="d-other")])
    _lines(tmp_path / "rollout.jsonl", "rollout", [*_call(1, 1.0, 2.02, "d-one")])
    assert merge_dir(tmp_path).join["server_requests_unjoined"] == 1


def test_several_servers_carry_engine_and_an_update_counts_when_all_loaded(tmp_path):
    _lines(tmp_path / "rollout.jsonl", "rollout", [{"kind": ev.SET_WEIGHT_VERSION, "version": 1, "mono": 0.5}])
    _lines(
        tmp_path / "s0.jsonl",
        "server-0",
        [
            {"kind": ev.ENGINE_PAUSE, "mode": "retract", "in_flight": 0, "mono": 0.1},
            {"kind": ev.ENGINE_VERSION, "version": 1, "mono": 0.2},
        ],
    )
    _lines(tmp_path / "s1.jsonl", "server-1", [{"kind": ev.ENGINE_VERSION, "version": 1, "mono": 0.3}])
    events = merge_dir(tmp_path).events
    assert [(e.kind, e.get("engine")) for e in events] == [
        (ev.ENGINE_PAUSE, 0),
        (ev.ENGINE_LOADED, 0),
        (ev.ENGINE_LOADED, 1),
        (ev.ENGINE_VERSION, None),
        (ev.SET_WEIGHT_VERSION, None),
    ]


@pytest.mark.parametrize(("error", "steps", "exit_code"), [(None, 4, 0), ("RuntimeError: boom", 0, 1), (None, 2, 1)])
def test_mutant_runs_counts_a_clean_run_as_clean_only_when_it_trained_every_step(monkeypatch, error, steps, exit_code):
    """A clean run that stopped early shows no violation because little ran: not clean."""
    from harness.record import mutant_runs

    def clean(base, *, steps: int, miles_src=None):
        return {
            "run": base.name,
            "error": error,
            "steps_trained": trained,
            "checkers": {"conservation_prefix": 0},
            "lacking": {},
        }

    trained = steps
    monkeypatch.setattr(mutant_runs, "run_clean", clean)
    monkeypatch.setattr(
        mutant_runs, "run_case", lambda name, **_: {"caught": True, "checkers_failed": ["x"], "expected": []}
    )
    monkeypatch.setattr(mutant_runs, "REAL_TIME_CASES", {"one": None})
    monkeypatch.setattr(mutant_runs, "ORCHESTRATION_CASES", {})
    assert mutant_runs.main(["--steps", "4"]) == exit_code
