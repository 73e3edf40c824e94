"""`miles-harness check-trace`: a trace `simulate` wrote passes every checker; a doctored
one fails naming the invariant; bad input is exit 2 with a message naming the file."""

from __future__ import annotations

import json
import shutil

import pytest

from harness.cli import main as cli
from harness.trace import config_path


@pytest.fixture
def trace(tmp_path, capsys):
    path = tmp_path / "trace.jsonl"
    assert cli(["simulate", "--trace", str(path), "--num-rollout", "4"]) == 0
    capsys.readouterr()
    assert config_path(path).exists()
    return path


def _check(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli(["check-trace", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_trace_simulate_wrote_passes_every_checker(trace, capsys):
    rc, out, _ = _check(capsys, trace)
    assert rc == 0, out
    assert "conservation" in out and "FAIL" not in out
    lines = [x for x in out.splitlines() if x.rstrip().endswith("PASS")]
    assert len(lines) >= 10
    assert f"OK: {len(lines)} checkers passed" in out


def test_a_doctored_trace_fails_naming_the_invariant(trace, tmp_path, capsys):
    lines = trace.read_text().splitlines()
    first_taken = next(i for i, x in enumerate(lines) if json.loads(x)["kind"] == "taken")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines[:first_taken] + lines[first_taken + 1 :]) + "\n")
    shutil.copy(config_path(trace), config_path(bad))
    rc, out, _ = _check(capsys, bad)
    assert rc == 1
    status = {x.split()[0]: x.split()[1] for x in out.splitlines() if x.split()[1:2] in (["PASS"], ["FAIL"])}
    assert status["conservation"] == "FAIL" and status["buffer_capacity"] == "PASS"
    assert "[conservation]" in out and "FAILED:" in out


def test_miles_flags_are_the_config_when_no_config_file_is_stored(trace, tmp_path, capsys):
    bare = tmp_path / "bare.jsonl"
    shutil.copy(trace, bare)
    rc, _, err = _check(capsys, bare)
    assert rc == 2 and str(config_path(bare)) in err and "-- <miles args>" in err
    # the default scenario's command line: the trace passes under it
    miles = [
        "train_async.py",
        "--fully-async",
        "--rollout-batch-size",
        "16",
        "--n-samples-per-prompt",
        "4",
        "--max-weight-staleness",
        "2",
        "--async-unused-samples-handler",
        "retry",
        "--num-rollout",
        "4",
    ]
    rc, out, _ = _check(capsys, bare, "--", *miles)
    assert rc == 0 and "config: the Miles flags given" in out
    rc, out, _ = _check(capsys, bare, "--", *miles[:1], *miles[2:])  # not --fully-async: a one-step run's rules
    assert rc == 1 and "FAIL" in out


@pytest.mark.parametrize(
    "content,needle",
    [
        ("not json\n", "line 1: not JSON"),
        ('{"seq": 0, "t": 0.0}\n', "lacks seq/t/kind"),
        ('{"seq": 0, "t": 0.0, "kind": "teleported"}\n', "unknown event kind 'teleported'"),
        ('{"seq": 0, "t": 0.0, "kind": "taken"}\n', "lacks fields"),
        ("", "no events"),
    ],
)
def test_bad_traces_are_exit_2_naming_the_file_and_line(tmp_path, capsys, content, needle):
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    rc, _, err = _check(capsys, path)
    assert rc == 2 and needle in err and str(path) in err and "Fix:" in err and "Traceback" not in err


def test_a_missing_trace_or_a_broken_config_file_is_exit_2(trace, tmp_path, capsys):
    rc, _, err = _check(capsys, tmp_path / "none.jsonl")
    assert rc == 2 and "none.jsonl: cannot read it" in err
    config_path(trace).write_text("{")
    rc, _, err = _check(capsys, trace)
    assert rc == 2 and str(config_path(trace)) in err and "Fix:" in err


def test_an_option_after_the_trace_is_the_harness_option_in_either_order(trace, capsys):
    rc_after, out_after, _ = _check(capsys, trace, "--incomplete")
    rc_before, out_before, _ = _check(capsys, "--incomplete", trace)
    assert rc_after == rc_before == 0
    assert "checked as a prefix of a failed run" in out_after
    assert out_after == out_before
