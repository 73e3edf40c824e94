"""The objects the harness puts in upstream's hands (``harness.upstream.ray_names``: the
rollout manager, the actor group, the eval dispatcher, the object store; the ``args``
namespace) say so when upstream reaches past them: ``doctor`` lists every member the
drivers use on each stand-in (``harness.upstream.stand_in_uses``) and refuses the drivers
that use one the stand-in lacks, naming it and the line; a run that reads one stops with
a harness error naming the member and the upstream file:line, never upstream's error."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from harness import cli
from harness.sim.engine import SimEngineConfig
from harness.sim.scenario import Scenario
from harness.sim.trainer import SimTrainerConfig
from harness.upstream import ray_names, seams, source
from harness.upstream.harness_errors import HarnessError, RunnerSeamError
from harness.upstream.stand_in_uses import uses
from miles_async_core.config import AsyncConfig


@pytest.fixture
def tree(pytestconfig) -> Path:
    """The tree pytest was given, read and not imported."""
    path, how = source.find_miles_src(pytestconfig.getoption("--miles-src", default=None))
    if path is None or not (path / source.MARKER).is_file():
        pytest.skip(how)
    return path


def _copy(tree: Path, dest: Path) -> Path:
    shutil.copytree(tree / "miles", dest / "miles")
    for name in ("train.py", "train_async.py"):
        shutil.copy(tree / name, dest / name)
    return dest


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_every_member_the_drivers_use_is_read_with_its_line(tree):
    found = {(u.role, u.member, u.file, u.line) for u in uses(tree)}
    line = _line_of(tree / "train_async.py", "rollout_manager.generate.remote(")
    assert ("rollout_manager", "generate", "train_async.py", line) in found
    line = _line_of(tree / "train.py", "rollout_manager.dispose.remote(")
    assert ("rollout_manager", "dispose", "train.py", line) in found
    # followed into a local helper: `save_training_model(actor_model, ...)` binds `model`
    assert any(r == "actor_model" and m == "save_model" and f == "train_async.py" for r, m, f, _ in found)
    roles = {r for r, *_ in found}
    assert {"rollout_manager", "actor_model", "object_store"} <= roles


def test_doctor_lists_each_member_found_on_a_tree_the_stand_ins_cover(tree, capsys):
    report = seams.probe(tree)
    missing = [p for p in report.probes if p.seam.name.startswith(seams.STAND_IN_PREFIX)]
    cli.main(["doctor", "--miles-src", str(tree)])
    out = capsys.readouterr().out
    assert "stand-ins: members the drivers use" in out
    for u in report.uses:
        assert f"{u.role}.{u.member}" in out
    if not missing:  # the pinned tree: every member found
        assert "MISSING" not in out.split("stand-ins:")[1].split("verdict:")[0]


def test_a_member_the_stand_in_lacks_is_a_missing_seam_naming_it_and_its_line(tree, tmp_path, capsys):
    """A driver that calls a rollout-manager member the stand-in does not have (as
    Miles PR #2289's ``train_async.py`` calls ``acquire_train_admission_hold``) is
    refused for the drivers that run that file, naming the member and the line."""
    copy = _copy(tree, tmp_path / "miles-hold")
    f = copy / "train_async.py"
    text = f.read_text()
    anchor = "    rollout_data_next_future = rollout_manager.generate.remote(args.start_rollout_id)\n"
    assert anchor in text
    f.write_text(text.replace(anchor, "    await rollout_manager.acquire_train_admission_hold.remote()\n" + anchor, 1))
    line = _line_of(f, "acquire_train_admission_hold")
    report = seams.probe(copy)
    name = "stand-in rollout_manager.acquire_train_admission_hold"
    assert {s.name for s in report.missing_for("one-step")} == {name}
    assert {s.name for s in report.missing_for("fully-async")} == {name}
    assert not report.missing_for("sync") and report.verdict == "runs partly"
    assert cli.main(["doctor", "--miles-src", str(copy)]) == 0
    out = capsys.readouterr().out
    assert f"rollout_manager.acquire_train_admission_hold  MISSING  train_async.py:L{line}" in out
    assert f"REFUSED: missing {name} (read at train_async.py:L{line} (.remote))" in out
    with pytest.raises(seams.SeamMissing, match=f"train_async.py:L{line}") as err:
        report.require("one-step")
    assert isinstance(err.value, HarnessError) and err.value.seams == [name]


GENERATE_ANCHOR = "    rollout_data_next_future = rollout_manager.generate.remote(args.start_rollout_id)\n"


def _with_read(tree: Path, dest: Path, block: str) -> Path:
    """A copy of ``tree`` whose ``train_async.py`` runs ``block`` (four-space indented)
    right before its first generate call."""
    copy = _copy(tree, dest)
    f = copy / "train_async.py"
    text = f.read_text()
    assert GENERATE_ANCHOR in text
    f.write_text(text.replace(GENERATE_ANCHOR, block + GENERATE_ANCHOR, 1))
    return copy


def test_a_member_read_only_under_a_flag_refuses_only_the_cases_that_set_it(tree, tmp_path):
    """A read of a member the stand-in lacks inside ``if args.FLAG == "gpu":`` (as Miles PR
    #2488 reads ``offload_kv`` under ``--colocate-memory-peak-device gpu``) leaves its
    drivers runnable; a case whose args make the test hold is refused, naming it."""
    import argparse

    block = '    if args.colocate_memory_peak_device == "gpu":\n        await rollout_manager.offload_kv.remote()\n'
    copy = _with_read(tree, tmp_path / "miles-guarded", block)
    report = seams.probe(copy)
    name = "stand-in rollout_manager.offload_kv"
    [use] = [u for u in report.uses if u.member == "offload_kv"]
    assert use.guard is not None and use.guard.flag == "colocate_memory_peak_device"
    for driver in seams.DRIVERS:
        assert not report.missing_for(driver, "stand-ins")
    assert report.verdict == "runs"
    gpu, cpu = (
        argparse.Namespace(colocate_memory_peak_device="gpu"),
        argparse.Namespace(colocate_memory_peak_device="cpu"),
    )
    assert [s.name for s in report.missing_for("one-step", "stand-ins", gpu)] == [name]
    assert [s.name for s in report.missing_for("fully-async", "stand-ins", gpu)] == [name]
    assert not report.missing_for("one-step", "stand-ins", cpu)
    assert not report.missing_for("sync", "stand-ins", gpu)  # train.py does not read it
    # args that lack the flag cannot rule the read out
    assert [s.name for s in report.missing_for("one-step", "stand-ins", argparse.Namespace())] == [name]
    with pytest.raises(seams.SeamMissing, match="offload_kv"):
        report.require("one-step", "stand-ins", gpu)


def test_the_same_member_read_outside_any_flag_refuses_the_driver(tree, tmp_path):
    block = (
        '    if args.colocate_memory_peak_device == "gpu":\n        await rollout_manager.offload_kv.remote()\n'
        "    await rollout_manager.offload_kv.remote()\n"
    )
    report = seams.probe(_with_read(tree, tmp_path / "miles-unguarded", block))
    name = "stand-in rollout_manager.offload_kv"
    assert [s.name for s in report.missing_for("one-step", "stand-ins")] == [name]
    assert [s.name for s in report.missing_for("fully-async", "stand-ins")] == [name]
    assert not report.missing_for("sync", "stand-ins")


@pytest.mark.parametrize(
    "test, guarded",
    [
        ("args.offload_kv_now", True),
        ("args.peak is not None", True),
        ('args.peak in ("gpu", "both")', True),
        ("self.args.peak == 2", True),
        ("not args.offload_kv_now", False),
        ("args.peak == other", False),
        ("args.peak and args.other", False),
        ("rollout_manager.ready", False),
    ],
)
def test_only_a_plain_flag_test_guards_a_read(tree, tmp_path, test, guarded):
    block = f"    if {test}:\n        await rollout_manager.offload_kv.remote()\n"
    report = seams.probe(_with_read(tree, tmp_path / "miles-test", block))
    [use] = [u for u in report.uses if u.member == "offload_kv"]
    assert (use.guard is not None) is guarded
    assert bool(report.missing_for("one-step", "stand-ins")) is not guarded


def test_a_case_that_sets_the_flag_is_not_run_and_the_others_run(tree, tmp_path):
    """At run time the case's own args decide: with ``--orchestration stand-ins`` the
    plain case runs and the flag case (``harness.upstream.flag_cases``) that sets the
    flag is not run, naming the member."""
    import json
    import subprocess

    block = "    if args.check_weight_update_equal:\n        await rollout_manager.offload_kv.remote()\n"
    copy = _with_read(tree, tmp_path / "miles-flag", block)
    spec = {"name": "flag:check", "scenario": "one-step-k1", "dest": "check_weight_update_equal", "value": True}
    out = tmp_path / "cases.json"
    cmd = [sys.executable, "-m", "harness.upstream.gate_run", "--tree", str(copy), "--out", str(out)]
    cmd += ["--log", str(tmp_path / "tree.log"), "--scenario", "one-step-k1", "--orchestration", "stand-ins"]
    cmd += ["--flag-case", json.dumps({**spec, "set": True})]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("MILES_SRC", None)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    records = {r["name"]: r for r in json.loads(out.read_text())["cases"]}
    assert records["one-step-k1"]["status"] == "ran"
    assert records["flag:check"]["status"] == "not_run"
    assert records["flag:check"]["seams"] == ["stand-in rollout_manager.offload_kv"]


def test_a_member_removed_by_hand_is_named_by_doctor(tree, monkeypatch, capsys):
    monkeypatch.delattr(ray_names.RolloutManagerStand, "dispose")
    assert "dispose" not in ray_names.members("rollout_manager")
    rc = cli.main(["doctor", "--miles-src", str(tree)])
    out = capsys.readouterr().out
    line = _line_of(tree / "train_async.py", "rollout_manager.dispose.remote(")
    assert "rollout_manager.dispose" in out and "MISSING  train.py:L" in out
    assert f"train_async.py:L{line}" in out
    # every driver disposes of the rollout manager: all refused, exit 3
    assert rc == 3 and "REFUSED: missing stand-in rollout_manager.dispose" in out


def _scenario(**cfg) -> Scenario:
    return Scenario(
        name="stand-in",
        config=AsyncConfig(rollout_batch_size=2, n_samples_per_prompt=2, num_rollout=2, seed=1, **cfg),
        engine=SimEngineConfig(seed=1),
        trainer=SimTrainerConfig(),
        max_new_tokens=16,
    )


@pytest.mark.parametrize(
    "cfg", [{}, {"fully_async": True}, {"driver": "train"}], ids=["one-step", "fully-async", "sync"]
)
def test_a_member_removed_by_hand_stops_the_run_with_a_harness_error_naming_it(miles_src, monkeypatch, cfg):
    """The stand-in itself says so at run time (what the static reading cannot see, or a
    tree the harness was told to run anyway): ``RunnerSeamError`` names the member and
    upstream's file:line, and the run records no upstream error of its own."""
    from harness.upstream.runner import run_upstream

    ok = run_upstream(_scenario(**cfg))  # unmutated: the same run ends normally
    assert ok.error is None and len(ok.history) == 2
    monkeypatch.delattr(ray_names.RolloutManagerStand, "dispose")
    driver = "train.py" if cfg.get("driver") == "train" else "train_async.py"
    line = _line_of(miles_src / driver, "rollout_manager.dispose.remote(")
    with pytest.raises(RunnerSeamError) as err:
        run_upstream(_scenario(**cfg))
    assert err.value.seams == ["stand-in rollout_manager.dispose"]
    assert f"`dispose`, which upstream reads at {driver}:L{line}" in str(err.value)


def test_an_argument_the_harness_did_not_set_is_a_harness_error_naming_it(miles_src, monkeypatch):
    """``args`` is the harness' too: a plain read of an argument it did not set is a
    harness error naming the argument and the line; ``getattr(args, name, default)``
    keeps upstream's default."""
    from harness.upstream import runner

    make = runner.upstream_args

    def without_seed(*a, **k):
        args = make(*a, **k)
        del args.rollout_seed
        assert getattr(args, "rollout_seed", "default") == "default" and not hasattr(args, "rollout_seed")
        return args

    monkeypatch.setattr(runner, "upstream_args", without_seed)
    with pytest.raises(RunnerSeamError) as err:
        runner.run_upstream(_scenario())
    assert err.value.seams == ["stand-in args.rollout_seed"]
    assert "upstream reads at miles/" in str(err.value)


PR_2289 = "miles-pr2289-d4a778fc7"  # Miles PR #2289 (trainer admission holds), beside the pinned tree


def test_pr_2289_tree_is_refused_naming_the_admission_hold_members(capsys):
    """On PR #2289's tree (``../shared/third_party``, README there) doctor names each
    member of the admission-hold protocol the stand-ins lack, with the line."""
    tree = source.DEFAULT_TREE.parent / PR_2289
    if not (tree / source.MARKER).is_file():
        pytest.skip(f"{PR_2289} is not beside the pinned tree ({source.DEFAULT_TREE.parent})")
    report = seams.probe(tree)
    missing = {s.name for s in report.missing_for("one-step")}
    for member in (
        "acquire_train_admission_hold",
        "wait_weight_update_admission",
        "record_train_weight_update",
        "release_train_admission_hold",
    ):
        assert f"stand-in rollout_manager.{member}" in missing
    assert report.missing_for("fully-async") == report.missing_for("one-step")
    assert not report.missing_for("sync")
    assert cli.main(["doctor", "--miles-src", str(tree)]) == 0
    out = capsys.readouterr().out
    line = _line_of(tree / "train_async.py", "rollout_manager.acquire_train_admission_hold.remote()")
    assert f"rollout_manager.acquire_train_admission_hold  MISSING  train_async.py:L{line}" in out


_FORCED_RUN = """
import sys
from pathlib import Path
from harness.upstream import seams, source
from harness.upstream.diff import case_named
from harness.upstream.harness_errors import RunnerSeamError
from harness.upstream.runner import run_upstream
source.activate(Path(sys.argv[1]))
report = source.report()  # the run is told to go on past doctor's refusal: the stand-in must say so itself
report.probes = [p for p in report.probes if not p.seam.name.startswith(seams.STAND_IN_PREFIX)]
try:
    run_upstream(case_named("one-step-k1").scenario())
except RunnerSeamError as exc:
    print("SEAMS", exc.seams)
    print("MESSAGE", exc)
"""


@pytest.mark.process
def test_pr_2289_run_past_the_refusal_stops_with_a_harness_error_naming_the_member():
    """Run on PR #2289's tree anyway (doctor's refusal lifted in a subprocess: one tree per
    process): the run stops with a harness error naming
    ``rollout_manager.acquire_train_admission_hold`` and its line, not upstream's error."""
    import subprocess

    tree = source.DEFAULT_TREE.parent / PR_2289
    if not (tree / source.MARKER).is_file():
        pytest.skip(f"{PR_2289} is not beside the pinned tree ({source.DEFAULT_TREE.parent})")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _FORCED_RUN, str(tree)],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    line = _line_of(tree / "train_async.py", "rollout_manager.acquire_train_admission_hold.remote()")
    assert "SEAMS ['stand-in rollout_manager.acquire_train_admission_hold']" in out.stdout, out.stdout + out.stderr
    assert f"reads at train_async.py:L{line}" in out.stdout
