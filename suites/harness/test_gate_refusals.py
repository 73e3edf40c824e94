"""What ``miles-harness gate`` decides before any case runs, on small trees built here
(nothing of upstream is imported, no process is started): identical trees, a pull request
that does not compile, a tree the harness can run no driver of, a directory that is no
Miles tree; and that a crash of the harness is exit 2, never 1 (a finding)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from harness import cli
from harness.upstream import gate_preflight
from harness.upstream.exit_codes import Exit

DRIVER = "def train(args):\n    return create_rollout_manager(args)\n"


def tree(root: Path, *, driver: str = DRIVER, extra: str = "x = 1\n") -> Path:
    """A tree with a ``miles`` package and both drivers, and no seam the harness needs."""
    (root / "miles" / "rollout").mkdir(parents=True)
    (root / "miles" / "__init__.py").write_text("")
    (root / "miles" / "rollout" / "extra.py").write_text(extra)
    for name in ("train.py", "train_async.py"):
        (root / name).write_text(driver)
    return root


def gate(head: Path, base: Path, *more: str) -> int:
    return cli.main(["gate", "--miles-src", str(head), "--base", str(base), "--scenario", "sync", *more])


def test_identical_trees_are_said_to_be_identical_and_run_nothing(tmp_path, capsys):
    head, base = tree(tmp_path / "head"), tree(tmp_path / "base")
    assert gate(head, base) == Exit.OK
    assert "HEAD and BASE are identical (4 files under miles/ and the drivers): no case run" in capsys.readouterr().out


def test_a_pull_request_that_does_not_compile_is_a_finding_naming_file_and_line(tmp_path, capsys):
    head = tree(tmp_path / "head", extra="x = 1\ny = f(\n")
    base = tree(tmp_path / "base")
    assert gate(head, base, "--out", str(tmp_path / "out")) == Exit.FINDING
    out = capsys.readouterr().out
    assert "HEAD does not compile: miles/rollout/extra.py:L2: SyntaxError: '(' was never closed" in out
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["summary.md"]
    # the same error on BASE is old: not the pull request's
    both = gate_preflight.new_compile_errors(head, tree(tmp_path / "old", extra="y = f(\n"))
    assert both == []


def test_a_refusal_is_decided_before_any_case_in_readable_lines_and_leaves_only_the_summary(
    tmp_path, capsys, monkeypatch
):
    head, base = tree(tmp_path / "head", extra="x = 2\n"), tree(tmp_path / "base")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    assert gate(head, base) == Exit.REFUSED
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(line.startswith("REFUSED (exit 3): --miles-src ") for line in lines), out
    assert "the harness can run none of the drivers the cases need (sync)" in out
    assert max(len(line) for line in lines) < 300, out
    seams = [line for line in lines if line.startswith("  - ")]
    assert seams and len(seams) == len(set(seams)), out  # each missing seam once
    assert "miles-harness doctor --miles-src" in out
    assert list(scratch.iterdir()) == []  # no --out: nothing left behind
    assert gate(head, base, "--out", str(tmp_path / "out")) == Exit.REFUSED
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["summary.md"]


def test_a_directory_that_is_no_miles_tree_is_a_usage_error_naming_the_flag(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert gate(tmp_path / "empty", tree(tmp_path / "base")) == Exit.USAGE
    err = capsys.readouterr().err
    assert "--miles-src" in err and "not a Miles tree" in err and "Fix:" in err


def test_a_crash_of_the_harness_is_exit_2_never_1(monkeypatch, capsys):
    import harness.commands.gate as command

    def crash(args):
        raise KeyError("a bug of the harness")

    monkeypatch.setattr(command, "main", crash)
    assert cli.main(["gate", "--base", "x"]) == Exit.HARNESS_ERROR
    assert "harness error (exit 2): the harness crashed" in capsys.readouterr().err


def test_a_crash_in_a_command_that_does_not_face_upstream_still_raises(monkeypatch):
    import harness.commands.compare as command

    monkeypatch.setattr(command, "main", lambda args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli.main(["compare", "a.json", "b.json"])
