"""`miles-harness diff-upstream`: runs named matrix cases, prints identical or the first
divergence, exits 1 on an unexpected result and 2 when the harness could not run
faithfully (no Miles tree, a missing seam, a leaf fake failing inside upstream's code).
Every call passes the active tree (``--miles-src``), so the tier runs on whatever tree
pytest was given."""

from __future__ import annotations

import dataclasses

import pytest

from harness import cli
from harness.upstream import diff, source

# a deliberate harness extension switched on: it parts from upstream by design
EXT = "fa-group-staleness0-retry+max-retries0"


def _fully_async_refused() -> str | None:
    return source.refused_reason(diff.case_named(EXT).scenario().config)


def test_prints_identical_and_known_divergence(miles_src, capsys):
    rc = cli.main(["diff-upstream", "--miles-src", str(miles_src), "--scenario", "sync", "--scenario", EXT])
    out = capsys.readouterr().out
    assert "sync: identical" in out
    if _fully_async_refused():  # the tree lacks a fully-async seam: said, and exit 2, never a divergence
        assert rc == 2, out
        assert f"{EXT}: NOT RUN: missing seam" in out and "1 not run (missing seam)" in out
        assert "UNEXPECTED" not in out
        return
    assert rc == 0, out
    assert f"{EXT}: first divergence in 'recycles' at item 0 (known: EXT async_max_retries" in out
    assert "2 cases" in out and "0 unexpected" in out


def test_an_unexpected_divergence_fails(miles_src, capsys, monkeypatch):
    if _fully_async_refused():
        pytest.skip(
            f"the diverging extension case is fully-async, which this tree cannot run: {_fully_async_refused()}"
        )
    case = diff.case_named(EXT)
    monkeypatch.setattr(diff, "case_named", lambda name: dataclasses.replace(case, known=None))
    rc = cli.main(["diff-upstream", "--miles-src", str(miles_src), "--scenario", EXT])
    assert rc == 1
    assert "UNEXPECTED: a divergence no known name explains" in capsys.readouterr().out


def test_an_identical_case_listed_as_divergent_fails(miles_src, capsys, monkeypatch):
    case = diff.case_named("sync")
    monkeypatch.setattr(diff, "case_named", lambda name: dataclasses.replace(case, known="made-up: for this test"))
    assert cli.main(["diff-upstream", "--miles-src", str(miles_src), "--scenario", "sync"]) == 1
    assert "UNEXPECTED: identical, but listed as made-up" in capsys.readouterr().out


def test_a_seam_failing_inside_upstream_is_a_harness_error_not_a_divergence(miles_src, capsys, monkeypatch):
    """The sink stops announcing samples (as on a tree whose ``generate_and_rm`` does not
    call it, before the runner learnt to wrap it): each /generate raises ``LeafCalled``
    inside upstream's group tasks, which upstream logs as its own task errors. The command
    reports a harness error naming the seam and exits 2; no divergence is claimed."""
    from harness.upstream import host

    monkeypatch.setattr(host.LifecycleSink, "gen_start", lambda self, sample: None)
    rc = cli.main(["diff-upstream", "--miles-src", str(miles_src), "--scenario", "one-step-k1"])
    out = capsys.readouterr().out
    assert rc == 2, out
    assert "one-step-k1: HARNESS ERROR (not an upstream finding)" in out
    assert "lifecycle_sink" in out or "generate_and_rm" in out
    assert "UNEXPECTED" not in out and "first divergence" not in out


def test_unknown_case_and_missing_tree_are_usage_errors(miles_src, tmp_path, capsys):
    assert cli.main(["diff-upstream", "--miles-src", str(miles_src), "--scenario", "no-such-case"]) == 2
    assert "no case 'no-such-case'" in capsys.readouterr().err
    assert cli.main(["diff-upstream", "--miles-src", str(tmp_path)]) == 2


def test_upstreams_log_is_kept_per_case_and_printed_only_with_v(miles_src, tmp_path, capsys):
    """A case with injected request failures: upstream logs each failed group with its
    traceback. By default the terminal shows the verdict and the judgement; the log file
    holds upstream's log under the case; ``-v`` prints it too."""
    case = "one-step-request-fails-with-finish"
    if source.refused_reason(diff.case_named(case).scenario().config):
        pytest.skip(f"this tree cannot run {case}: {source.refused_reason(diff.case_named(case).scenario().config)}")
    log = tmp_path / "upstream.log"
    rc = cli.main(["diff-upstream", "--miles-src", str(miles_src), "--scenario", case, "--log", str(log)])
    out = capsys.readouterr().out
    kept = log.read_text()
    assert f"===== {case}" in kept and "EngineRequestError" in kept
    assert "Traceback" not in out and f"upstream's log, per case: {log}" in out
    if rc == 0:  # identical to the core and every invariant holds: nothing of upstream's log on the terminal
        assert "EngineRequestError" not in out
    assert cli.main(["diff-upstream", "--miles-src", str(miles_src), "--scenario", case, "--log", str(log), "-v"]) == rc
    assert f"upstream's log for {case}:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["diff-upstream", "--list"],
        ["gate", "--base", "x"],
        ["resume-sweep", "--host", "upstream"],
    ],
    ids=["diff-upstream", "gate", "resume-sweep"],
)
def test_the_removed_stand_ins_are_refused_naming_the_flag_and_the_fix(argv, capsys):
    """``--orchestration stand-ins`` exits 2 with one line naming the flag, the value, that
    the stand-ins were removed and what runs; ``--orchestration upstream`` still parses."""
    assert cli.main([*argv, "--orchestration", "stand-ins"]) == 2
    [line] = [x for x in capsys.readouterr().err.splitlines() if "error:" in x]
    assert "argument --orchestration: 'stand-ins': the harness' stand-ins were removed" in line
    assert "upstream's own orchestration" in line and "Fix: drop the flag" in line


def test_the_fault_sweep_refuses_the_removed_stand_ins_too(capsys):
    from harness.upstream import fault_sweep

    with pytest.raises(SystemExit) as exc:
        fault_sweep.main(["--orchestration", "stand-ins", "replay", "1"])
    assert exc.value.code == 2
    assert "the harness' stand-ins were removed" in capsys.readouterr().err
