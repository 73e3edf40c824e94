"""`miles-harness doctor` and the seam registry (``harness.upstream.seams``): every seam
is probed in the tree's source, a tree without a required seam is refused with the seam
and its file named (exit 3), and the commands facing upstream refuse it too (exit 2)
before anything runs. The probes read files only: these tests import nothing of Miles."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness import cli
from harness.upstream import seams, source


@pytest.fixture
def tree(pytestconfig, request) -> Path:
    """The tree pytest was given (read, not imported); a refused tree fails the tests that
    derive trees from it, naming the seam, as the rest of the tier does."""
    path, how = source.find_miles_src(pytestconfig.getoption("--miles-src", default=None))
    if path is None or not (path / source.MARKER).is_file():
        pytest.skip(how)
    report = seams.probe(path)
    if report.verdict == "refused" and request.function.__name__ != "test_doctor_prints_every_seam_and_a_verdict":
        pytest.fail(f"upstream Miles ({how}) refused: {report.refusal()}", pytrace=False)
    return path


def _copy(tree: Path, dest: Path) -> Path:
    """The parts of a tree the probes read (the ``miles`` package and the drivers)."""
    shutil.copytree(tree / "miles", dest / "miles")
    for name in ("train.py", "train_async.py"):
        shutil.copy(tree / name, dest / name)
    return dest


def test_doctor_prints_every_seam_and_a_verdict(tree, capsys):
    rc = cli.main(["doctor", "--miles-src", str(tree)])
    out = capsys.readouterr().out
    report = seams.probe(tree)
    assert rc == (3 if report.verdict == "refused" else 0), out
    assert f"orchestration shape: {report.shape}" in out
    for s in seams.SEAMS:
        # a seam of the tree's shape with its file; one of the other shape by name
        assert s.name in out and (s.file in out or report.shape not in s.shapes)
    assert f"verdict: {report.verdict}" in out
    for d in seams.DRIVERS:
        assert f"  {d}" in out


def test_a_tree_without_the_scheduler_factory_is_refused_naming_seam_and_file(tree, tmp_path, capsys):
    copy = _copy(tree, tmp_path / "miles-cut")
    f = copy / "miles" / "rollout" / "submission_scheduler.py"
    text = f.read_text()
    assert "def make_submission_scheduler" in text
    f.write_text(text[: text.index("def make_submission_scheduler")])
    report = seams.probe(copy)
    assert report.verdict == "refused" and report.runnable == ()
    assert {s.name for s in report.missing_for("one-step")} == {"make_submission_scheduler(one-step)"}
    assert cli.main(["doctor", "--miles-src", str(copy)]) == 3
    out = capsys.readouterr().out
    assert "make_submission_scheduler(fully-async)  MISSING" in out
    assert "miles/rollout/inference_rollout/inference_rollout_train.py" in out
    # the upstream-facing commands refuse it before importing anything, exit 2, naming it
    assert cli.main(["diff-upstream", "--miles-src", str(copy), "--scenario", "sync"]) == 2
    err = capsys.readouterr().err
    assert "seam make_submission_scheduler(one-step) missing in" in err and "inference_rollout_train.py" in err


def test_a_seam_with_a_fallback_is_not_needed_while_the_fallback_is_there(tree, tmp_path):
    """Without the lifecycle announcement in ``generate_and_rm`` the runner wraps
    ``generate_and_rm`` itself; without both, every driver is refused."""
    copy = _copy(tree, tmp_path / "miles-nosink")
    common = copy / seams.COMMON
    text = common.read_text().replace(".gen_start(", ".gen_start_renamed(")
    common.write_text(text)
    report = seams.probe(copy)
    assert not report.found("lifecycle_sink") and report.found("generate_and_rm")
    assert not report.missing_for("sync")
    common.write_text(text.replace("def generate_and_rm(", "def generate_and_rm_renamed("))
    seams._parse.cache_clear()
    report = seams.probe(copy)
    assert report.verdict == "refused"
    assert {s.name for s in report.missing_for("sync")} >= {"lifecycle_sink", "generate_and_rm"}


def test_a_field_and_a_private_attribute_are_probed(tree, tmp_path):
    copy = _copy(tree, tmp_path / "miles-fields")
    base = copy / seams.BASE_TYPES
    base.write_text(base.read_text().replace("    weight_version: int | None = None\n", "", 1))
    fully = copy / seams.FULLY_MOD
    fully.write_text(fully.read_text().replace("self._handle_unused", "self._handle_spare"))
    seams._parse.cache_clear()
    report = seams.probe(copy)
    assert {s.name for s in report.missing_for("fully-async")} >= {"weight_version_source", "unused_samples_handler"}
    assert report.runnable == ("sync", "one-step") and report.verdict == "runs partly"


def test_a_missing_tree_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["doctor", "--miles-src", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--miles-src" in err and "not a Miles tree" in err and "Fix:" in err


def test_a_tree_without_the_fully_async_module_is_still_a_miles_tree_and_doctor_says_which_drivers_run(
    tree, tmp_path, capsys
):
    """Older Miles kept the fully-async rollout under ``examples/``: sync and one-step are
    judged there, fully-async is not run, naming the module."""
    old = _copy(tree, tmp_path / "old")
    (old / "examples").mkdir()
    (old / source.FULLY_ASYNC_MODULE).rename(old / "examples" / "fully_async_rollout.py")
    rc = cli.main(["doctor", "--miles-src", str(old)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "verdict: runs partly" in out
    assert f"fully-async  NOT RUN: this tree has no {source.FULLY_ASYNC_MODULE}" in out
    assert "  sync         runs" in out and "  one-step     runs" in out


TIP = source.REPO_ROOT.parent / "shared" / "third_party" / "miles-pr2542-688cf82b9"


def test_a_tree_whose_drivers_call_create_rollout_components_is_probed_as_the_controller_executor_shape(capsys):
    """The refactored drivers are ``async def train(args)`` over ``create_rollout_components``:
    the driver seams are found (an ``async def`` is a module-level ``train``), the shape is
    named, and the rollout-manager shape's seams are not asked of it."""
    if not (TIP / source.MARKER).is_file():
        pytest.skip(f"the refactored tree is not at {TIP}")
    report = seams.probe(TIP)
    assert report.shape == seams.CONTROLLER_EXECUTOR
    assert report.found("train_async.py") and report.found("train.py")
    for d in seams.DRIVERS:
        names = {s.name for s in report.missing_for(d)}
        assert not names & {"rollout_manager", "engine_actor", "train_async.py", "train.py"}, names
    cli.main(["doctor", "--miles-src", str(TIP)])
    out = capsys.readouterr().out
    assert "orchestration shape: controller-executor (the drivers call `create_rollout_components`" in out
    assert (
        "(not probed on the controller-executor shape: rollout_manager, engine_actor, train_actor, engine_launch)"
        in out
    )


def test_a_driver_calling_neither_entry_point_is_refused_saying_what_was_found_and_what_was_not(tree, tmp_path):
    copy = _copy(tree, tmp_path / "miles-noentry")
    for name in ("train.py", "train_async.py"):
        f = copy / name
        text = f.read_text()
        f.write_text(
            text.replace("create_rollout_manager", "make_manager").replace("create_rollout_components", "make_parts")
        )
    seams._parse.cache_clear()
    report = seams.probe(copy)
    assert report.shape is None and report.verdict == "refused"
    text = str(report.refusal("sync"))
    assert "seam train.py missing" in text
    assert "`create_rollout_manager` (rollout-manager) not found" in text
    assert "`create_rollout_components` (controller-executor) not found" in text
    assert "train` found" in text  # the module-level train is there: it is not what is missing
