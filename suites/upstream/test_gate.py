"""`miles-harness gate` end to end on the tree pytest was given (``--miles-src``): a bug
seeded in a copy of the tree (one line of upstream's fully-async buffer, the
``buffer_capacity_off_by_one`` mutant of ``fixtures/upstream_mutants.py``) is a new
violation against the clean tree; the same bug in both trees is old, not new; a base
given as a git ref is exported, compared and removed. Each gate run starts one process
per tree, so the tests are in the slow tier (``process``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from fixtures.upstream_mutants import UPSTREAM_MUTANTS
from harness import cli
from harness.upstream import seams, source
from harness.upstream.exit_codes import Exit
from harness.upstream.patching import PatchDoesNotApply, patched_text

pytestmark = pytest.mark.process

CASE = "fa-group-small-buffer"  # the buffer meets its capacity here: the off-by-one holds one group too many
CASES = ["--scenario", CASE, "--scenario", "sync", "--fault-seeds", "0"]


@pytest.fixture
def tree(pytestconfig) -> Path:
    """The tree pytest was given (not imported here: the gate runs each tree in its own
    process); skipped, with the reason, when it cannot run the fully-async driver."""
    path, how = source.find_miles_src(pytestconfig.getoption("--miles-src", default=None))
    if path is None or not (path / source.MARKER).is_file():
        pytest.skip(how)
    report = seams.probe(path)
    if report.missing_for("fully-async"):
        pytest.skip(
            f"the seeded bug shows only in the fully-async driver, which {how} cannot run: "
            f"{report.refusal('fully-async')}"
        )
    return path


def _copy(tree: Path, dest: Path, *, seeded: bool) -> Path:
    shutil.copytree(tree / "miles", dest / "miles")
    for name in ("train.py", "train_async.py"):
        shutil.copy(tree / name, dest / name)
    if seeded:
        mutant = next(m for m in UPSTREAM_MUTANTS if m.name == "buffer_capacity_off_by_one")
        for p in mutant.patches:
            try:
                text = patched_text(mutant, p, dest)
            except PatchDoesNotApply as exc:
                pytest.skip(f"the seeded bug's line is not in this tree: {exc}")
            (dest / p.path).write_text(text)
    return dest


def _gate(head: Path, base: str, out: Path, capsys) -> tuple[int, dict[str, dict], str]:
    rc = cli.main(["gate", "--miles-src", str(head), "--base", base, "--out", str(out), *CASES])
    text = capsys.readouterr().out
    doc = json.loads((out / "gate.json").read_text())
    return rc, {c["name"]: c for c in doc["cases"]}, text


def test_a_bug_seeded_in_a_copy_is_new_and_the_same_bug_in_both_trees_is_old(tree, tmp_path, capsys):
    head = _copy(tree, tmp_path / "head", seeded=True)
    rc, cases, out = _gate(head, str(tree), tmp_path / "new", capsys)
    assert rc == 1, out
    assert cases[CASE]["verdict"] == "new_violation" and "buffer_capacity" in cases[CASE]["new"], cases[CASE]
    assert cases["sync"]["verdict"] == "unchanged", cases["sync"]
    assert f"{CASE}: new violation: buffer_capacity: " in out and "reproduce: miles-harness diff-upstream" in out
    summary = (tmp_path / "new" / "summary.md").read_text()
    assert summary.startswith("## Miles async gate: FAILED") and "| new violation | 1 |" in summary
    assert (tmp_path / "new" / "head.log").is_file() and (tmp_path / "new" / "base.log").is_file()

    base = _copy(tree, tmp_path / "base", seeded=True)
    with (base / "miles" / "__init__.py").open("a") as f:
        f.write("# BASE differs from HEAD in this comment alone\n")  # identical trees would run no case
    rc, cases, out = _gate(head, str(base), tmp_path / "old", capsys)
    assert rc == 0, out
    assert cases[CASE]["verdict"] == "unchanged" and "buffer_capacity" in cases[CASE]["old"], cases[CASE]
    assert not cases[CASE]["new"]


def test_a_base_given_as_a_git_ref_is_exported_compared_and_removed(tree, tmp_path, capsys, monkeypatch):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = _copy(tree, tmp_path / "repo", seeded=False)
    env = ["-c", "user.name=gate-test", "-c", "user.email=gate-test@localhost", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "-A"], [*env, "commit", "-q", "-m", "base"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True, capture_output=True)
    _copy(tree, tmp_path / "seeded", seeded=True)
    rel = "miles/rollout/fully_async_data_buffer.py"
    shutil.copy(tmp_path / "seeded" / rel, repo / rel)  # the pull request: the bug, uncommitted on HEAD's tree
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    rc, cases, out = _gate(repo, "HEAD", tmp_path / "out", capsys)
    assert rc == 1, out
    assert cases[CASE]["verdict"] == "new_violation" and cases["sync"]["verdict"] == "unchanged"
    assert "BASE: HEAD (" in out
    assert list(scratch.iterdir()) == []  # the exported base tree is gone


def test_a_base_that_is_neither_a_tree_nor_a_ref_is_a_usage_error(tree, tmp_path, capsys):
    head = _copy(tree, tmp_path / "head", seeded=False)
    assert cli.main(["gate", "--miles-src", str(head), "--base", "no-such-ref", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--base no-such-ref" in err and "is in no git checkout" in err and "Fix:" in err


def test_a_ref_resolves_only_in_the_repository_whose_root_is_the_tree(tree, tmp_path, capsys):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    outer = tmp_path / "outer"
    _copy(tree, outer / "pr", seeded=False)
    env = ["-c", "user.name=gate-test", "-c", "user.email=gate-test@localhost", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "-A"], [*env, "commit", "-q", "-m", "another project"]):
        subprocess.run(["git", "-C", str(outer), *cmd], check=True, capture_output=True)
    assert cli.main(["gate", "--miles-src", str(outer / "pr"), "--base", "HEAD", *CASES]) == 2
    err = capsys.readouterr().err
    assert f"is not the root of a git checkout (it is inside {outer.resolve()})" in err and "Fix:" in err


def _edit_driver(head: Path, old: str, new: str) -> None:
    path = head / "train_async.py"
    text = path.read_text()
    if old not in text:
        pytest.skip(f"train_async.py of this tree has no line {old!r} to edit")
    path.write_text(text.replace(old, new, 1))


def test_a_driver_that_dies_at_start_up_did_not_start_and_one_that_fails_to_import_is_named(
    tree, tmp_path, capsys, monkeypatch
):
    head = _copy(tree, tmp_path / "dies", seeded=False)
    _edit_driver(head, "async def train(args):\n", "async def train(args):\n    raise RuntimeError('dies')\n")
    monkeypatch.chdir(tmp_path)  # a relative --out is the caller's, not the workers'
    rc = cli.main(["gate", "--miles-src", "dies", "--base", str(tree), "--out", "rel", "--scenario", "one-step-k1"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "one-step-k1: did not start: HEAD's run ended before its first generate call: RuntimeError: dies" in out
    assert "at train_async.py:L" in out and "every invariant holds" not in out
    assert json.loads((tmp_path / "rel" / "gate.json").read_text())["exit"] == 1

    broken = _copy(tree, tmp_path / "broken", seeded=False)
    _edit_driver(broken, "async def train(args):\n", "undefined_at_import()\n\n\nasync def train(args):\n")
    rc = cli.main(["gate", "--miles-src", str(broken), "--base", str(tree), "--scenario", "one-step-k1"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "HEAD does not import: train_async.py:L" in out and "NameError" in out


def test_a_case_both_trees_fail_to_start_identically_is_neither_started_and_unchecked(tree, tmp_path, capsys):
    """HEAD and BASE both die in ``train_async.py`` before the first generate call, with the
    same error: the one-step case ran nothing on either tree, so it is no pass (once it
    read ``unchanged`` and the gate exited 0); the sync case beside it is compared."""
    dies = ("async def train(args):\n", "async def train(args):\n    raise RuntimeError('dies')\n")
    base = _copy(tree, tmp_path / "base", seeded=False)
    _edit_driver(base, *dies)
    head = _copy(tree, tmp_path / "head", seeded=False)
    _edit_driver(head, *dies)
    with (head / "miles" / "__init__.py").open("a") as f:
        f.write("# HEAD differs from BASE in this comment alone\n")  # identical trees would run no case
    args = ["gate", "--miles-src", str(head), "--base", str(base), "--scenario", "sync", "--scenario", "one-step-k1"]
    assert cli.main([*args, "--out", str(tmp_path / "out")]) == Exit.UNCHECKED
    out = capsys.readouterr().out
    said = "NEITHER STARTED in 1 case(s) (one-step-k1): neither tree's run started, nothing was checked: both raise"
    assert said in out and "RuntimeError: dies" in out, out
    assert "1 neither started" in out and "1 unchanged" in out
    assert "exit 4: nothing new is violated, but in 1 case(s) neither tree's run started (unchecked)" in out
    doc = json.loads((tmp_path / "out" / "gate.json").read_text())
    assert doc["exit"] == 4 and doc["counts"] == {"unchanged": 1, "neither_started": 1}
    assert (tmp_path / "out" / "summary.md").read_text().startswith("## Miles async gate: UNCHECKED")

    assert cli.main([*args, "--accept-unrun"]) == Exit.OK
    assert "1 case(s) started on neither tree: accepted with --accept-unrun" in capsys.readouterr().out
    assert cli.main(["gate", "--miles-src", str(head), "--base", str(base), "--scenario", "one-step-k1"]) == 3


UNCALLED = """

def gate_test_helper_no_case_calls(samples):
    total = 0
    for group in samples:
        total += len(group)
    return total
"""


def test_a_changed_function_no_case_runs_is_unchecked_unless_accepted_and_a_changed_line_that_runs_is_counted(
    tree, tmp_path, capsys
):
    head = _copy(tree, tmp_path / "head", seeded=False)
    path = head / "miles" / "rollout" / "data_source.py"
    text = path.read_text()
    header = "    def get_samples(self, num_samples):\n"
    if header not in text:
        pytest.skip(f"miles/rollout/data_source.py of this tree has no line {header.strip()!r} to edit")
    text = text.replace(header, header + "        num_samples = int(num_samples)\n", 1)
    path.write_text(text + UNCALLED)
    ran = text.splitlines().index("        num_samples = int(num_samples)") + 1
    first = len(text.splitlines()) + 3  # the `def` line after the two blank lines
    args = ["gate", "--miles-src", str(head), "--base", str(tree), "--scenario", "sync", "--fault-seeds", "0"]

    assert cli.main([*args, "--out", str(tmp_path / "out")]) == Exit.UNCHECKED
    out = capsys.readouterr().out
    expected = f"  miles/rollout/data_source.py: L{ran} ran in 1 case; L{first}-L{first + 4} never ran"
    assert expected in out.splitlines(), out
    assert "UNCHECKED: 1 changed hunk(s) of the async code in 1 file(s) never ran in any case" in out
    assert out.splitlines()[-2].startswith("exit 4: nothing new is violated, but changed lines of the async code")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert summary.startswith("## Miles async gate: UNCHECKED")
    assert summary.index("diff coverage:") < summary.index("| verdict | cases |")
    doc = json.loads((tmp_path / "out" / "gate.json").read_text())
    assert doc["exit"] == 4 and doc["coverage"]["unchecked"] == 1

    assert cli.main([*args, "--accept-unrun"]) == Exit.OK
    out = capsys.readouterr().out
    assert "  accepted with --accept-unrun" in out and "exit 0: nothing new is violated" in out


def test_a_flag_the_pull_request_adds_gets_a_case_with_it_set_on_head_while_base_runs_it_without(
    tree, tmp_path, capsys
):
    head = _copy(tree, tmp_path / "head", seeded=False)
    args_py, source_py = head / "miles/utils/arguments.py", head / "miles/rollout/data_source.py"
    anchor, header = '"--rollout-shuffle",', "    def get_samples(self, num_samples):\n"
    if anchor not in args_py.read_text() or header not in source_py.read_text():
        pytest.skip(f"this tree has no {anchor} flag or no {header.strip()!r} to hang the new flag on")
    flag = '"--gate-test-flag", action="store_true", help="read by the data source")\n            parser.add_argument('
    args_py.write_text(args_py.read_text().replace(anchor, f"{flag}\n                {anchor}", 1))
    reads = "        if getattr(self.args, 'gate_test_flag', False):\n            raise RuntimeError('gate-test-flag read')\n"
    source_py.write_text(source_py.read_text().replace(header, header + reads, 1))
    args = ["gate", "--miles-src", str(head), "--base", str(tree), "--scenario", "sync", "--fault-seeds", "0"]
    assert cli.main([*args, "--out", str(tmp_path / "out")]) == Exit.FINDING
    out = capsys.readouterr().out
    assert "  --gate-test-flag (new): set to true on HEAD; BASE, which lacks it, runs each case without it" in out, out
    # HEAD's run reads the flag and stops in the data source; BASE's, without it, runs to its end
    line = next(x for x in out.splitlines() if x.startswith("flag--gate-test-flag=true@sync: new violation: "))
    assert "run_error:RuntimeError: HEAD's run ended with RuntimeError: gate-test-flag read at " in line, line
    assert "reproduce: python -m harness.upstream.gate_run --tree" in line
    doc = json.loads((tmp_path / "out" / "gate.json").read_text())
    assert [f["flag"] for f in doc["flags"]] == ["--gate-test-flag"]


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    import os

    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env={**os.environ, **env})
    return out.stdout + out.stderr


def test_git_bisect_run_with_the_gate_finds_the_first_bad_step_of_a_stack(tree, tmp_path):
    """A stack of six steps on a copy of the tree, the bug seeded at step 3 and kept
    after it; ``git bisect run`` with ``gate --git-bisect`` against the clean base names
    step 3, in at most three gate runs (log2 of five candidates, rounded up)."""
    import sys

    repo = _copy(tree, tmp_path / "stack", seeded=False)
    base = _copy(tree, tmp_path / "base", seeded=False)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "step 0")
    mutant = next(m for m in UPSTREAM_MUTANTS if m.name == "buffer_capacity_off_by_one")
    for step in range(1, 6):
        if step == 3:
            for p in mutant.patches:
                (repo / p.path).write_text(patched_text(mutant, p, repo))
        with (repo / "miles" / "__init__.py").open("a") as f:
            f.write(f"# step {step}\n")
        _git(repo, "commit", "-qam", f"step {step}")
    steps = _git(repo, "log", "--format=%H %s").split("\n")
    first_bad = next(line.split()[0] for line in steps if line.endswith("step 3"))
    _git(repo, "bisect", "start", "HEAD", "HEAD~5")
    cmd = [sys.executable, "-m", "harness.cli", "gate", "--miles-src", str(repo), "--base", str(base)]
    cmd += ["--scenario", CASE, "--fault-seeds", "0", "--git-bisect"]
    out = _git(repo, "bisect", "run", *cmd)
    runs = out.count("git bisect: ")
    assert f"{first_bad} is the first bad commit" in out, out[-3000:]
    assert 1 <= runs <= 3, runs
