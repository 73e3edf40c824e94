"""The controller-executor shape of upstream's orchestration (``harness.upstream.leaves_refactor``):
its leaves, what ``doctor`` says of a tree of that shape, and seeded bugs in the refactor's
``RolloutExecutor``, ``InferenceController`` and weight-update orchestration, each named by
an invariant checker. The leaf and doctor tests import no Miles (the probes read files);
the seeded bugs run the CLI on a copy of the tip in a process of their own."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import cli
from harness.upstream import leaves, leaves_refactor, orchestration, seams, source, vray
from harness.upstream.leaves_refactor import SimCommandActor
from harness.sim.vtime import run_virtual

TIP = source.REPO_ROOT.parent / "shared" / "third_party" / "miles-pr2542-688cf82b9"


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    vray.reset()
    yield
    vray.reset()


class Manager:
    """An async actor whose ``init`` starts workers over virtual time, as
    ``RayWorkerManager.init`` starts its cells."""

    def __init__(self) -> None:
        self.started: list[str] = []

    async def init(self, names: list[str]) -> int:
        for name in names:
            await asyncio.sleep(1.0)
            self.started.append(name)
        return len(self.started)

    def get_started(self) -> list[str]:
        return list(self.started)


def test_the_engine_process_leaf_starts_nothing_and_names_a_member_it_lacks():
    actor = SimCommandActor()
    actor.run(cmd="sim-engine --port=20000", envs={})
    assert actor.cmd == "sim-engine --port=20000"
    assert actor._get_free_port_block(start_port=20000, count=3) == 20000
    with pytest.raises(Exception, match="kill_subprocess"):
        actor.kill_subprocess()


def test_doctor_runs_the_refactored_tree_under_upstreams_orchestration_and_lists_its_leaves(capsys):
    if not (TIP / source.MARKER).is_file():
        pytest.skip(f"the refactored tree is not at {TIP}")
    assert cli.main(["doctor", "--miles-src", str(TIP)]) == 0
    out = capsys.readouterr().out
    assert (
        "orchestration shape: controller-executor" in out
        and "hosted: upstream's own orchestration over the leaves" in out
    )
    for leaf in leaves_refactor.LEAVES:
        assert f"  {leaf.name:<20} {leaf.boundary}" in out
    assert not leaves_refactor.UNHOSTED and "not faked yet" not in out
    report = seams.probe(TIP)
    assert report.missing_for("sync") == []


# --------------------------------------------------------------------------- seeded bugs on the refactored shape
#
# One line of the tip changed in a copy of its tree (``miles/`` and the drivers: what
# ``source.is_miles_tree`` needs), run by the CLI in a process of its own (one tree per
# process): an invariant checker on upstream's trace names each bug; the unchanged copy
# holds every invariant, so each test can fail.

SEEDED = {
    # RolloutExecutor._get_rollout_data hands the trainer one group fewer (the batch filled with a copy of the first)
    "the_executor_returns_one_group_fewer": (
        "miles/ray/rollout/rollout_executor.py",
        "            data = data.samples\n",
        "            data = data.samples[:-1] + data.samples[:1]\n",
        ("conservation", "trained_batch_shape"),
    ),
    # InferenceController.start_update_weights hands the trainer none of the engines to update
    "the_controller_hands_the_trainer_no_engines": (
        "miles/ray/rollout/inference_controller.py",
        "            rollout_engines=srv.api_clients,\n",
        "            rollout_engines=srv.api_clients[:0],\n",
        ("batch_single_version", "version_steps"),
    ),
    # TrainRayActor's constructor keeps the next rank for its own: the train actor leaf runs over the
    # tree's own class, so rank 0's shard goes untrained and the run ends early
    "the_train_actor_constructor_takes_the_next_rank": (
        "miles/ray/train_actor.py",
        "        self._rank = rank\n",
        "        self._rank = rank + 1\n",
        ("version_steps",),
    ),
    # update_weights reports the version before the one the engines now serve to the rollout executor
    "update_weights_reports_the_previous_version": (
        "miles/ray/placement_group.py",
        "await rollout_executor.set_weight_version(weight_version, trainer_model_id=trainer_model_id)",
        "await rollout_executor.set_weight_version(weight_version - 1, trainer_model_id=trainer_model_id)",
        ("version_steps",),
    ),
}


def _tree_copy(dest: Path, file: str | None = None, old: str = "", new: str = "") -> Path:
    shutil.copytree(TIP / "miles", dest / "miles", ignore=shutil.ignore_patterns("__pycache__"))
    for driver in source.DRIVER_FILES:
        shutil.copy2(TIP / driver, dest / driver)
    if file is not None:
        path = dest / file
        text = path.read_text()
        assert text.count(old) == 1, f"the seeded line is not once in {file}: the tip changed; reseed"
        path.write_text(text.replace(old, new))
    assert source.is_miles_tree(dest)
    return dest


def _cli(*argv: str) -> subprocess.CompletedProcess:
    """``miles-harness ARGV`` in a process of its own, from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=source.REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(source.REPO_ROOT)},
    )


def _diff_one_step(tree: Path) -> str:
    out = _cli("diff-upstream", "--miles-src", str(tree), "--scenario", "one-step-k1")
    return out.stdout + out.stderr


@pytest.mark.slow
@pytest.mark.process
def test_the_unchanged_tip_holds_every_invariant_on_one_step(tmp_path):
    if not (TIP / source.MARKER).is_file():
        pytest.skip(f"the refactored tree is not at {TIP}")
    out = _diff_one_step(_tree_copy(tmp_path / "tip"))
    assert "upstream on its own trace: every invariant holds" in out, out[-3000:]
    assert "0 breaking an invariant" in out and "0 harness errors" in out


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.parametrize("bug", sorted(SEEDED))
def test_a_seeded_bug_in_the_refactored_orchestration_is_caught_by_name(bug, tmp_path):
    if not (TIP / source.MARKER).is_file():
        pytest.skip(f"the refactored tree is not at {TIP}")
    file, old, new, checkers = SEEDED[bug]
    out = _diff_one_step(_tree_copy(tmp_path / bug, file, old, new))
    assert "1 breaking an invariant on upstream's trace" in out and "0 harness errors" in out, out[-3000:]
    [breaks] = [line for line in out.splitlines() if "upstream on its own trace: breaks" in line]
    named = {part.strip().split(" ")[0] for part in breaks.split("breaks", 1)[1].split(",")}
    assert set(checkers) <= named, f"{bug}: named {sorted(named)}, expected {checkers}"


class _Engine:
    """What the HTTP leaf drives: the calls it makes, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.weight_version = 0

    async def pause_generation(self, mode: str) -> None:
        self.calls.append(("pause", mode))

    async def update_weights(self, version: int, weights: object) -> None:
        self.calls.append(("load", version, weights))
        self.weight_version = version

    async def continue_generation(self) -> None:
        self.calls.append(("continue",))


class _Run:
    def __init__(self) -> None:
        self.engine = _Engine()
        self.loaded: list[int] = []

    def engine_loaded(self, version: int) -> None:
        self.loaded.append(version)


def test_the_engine_http_leaf_serves_a_weight_update_on_the_engine_and_names_an_endpoint_it_lacks():
    run = _Run()
    client = leaves_refactor.SimHttpClient(run)

    async def update() -> None:
        url = "http://127.0.0.1:20004"
        await client.post(f"{url}/pause_generation", json={"mode": "in_place"})
        assert (await client.get(f"{url}/flush_cache")).status_code == 200
        await client.post(
            f"{url}/update_weights_from_tensor", json={"serialized_named_tensors": ["w"], "weight_version": "3"}
        )
        await client.post(f"{url}/continue_generation", json={})
        assert (await client.get(f"{url}/model_info")).json() == {"weight_version": "3"}
        for path in ("/release_memory_occupation", "/resume_memory_occupation"):  # colocate's offload
            assert (await client.post(f"{url}{path}", json={"tags": None})).status_code == 200
        checked = await client.post(f"{url}/weights_checker", json={"action": "checksum"})
        assert checked.json()["success"] is True and len(checked.json()["ranks"]) == 1
        with pytest.raises(Exception, match="POST /load_lora_adapter"):
            await client.post(f"{url}/load_lora_adapter", json={})

    run_virtual(update())
    assert run.engine.calls == [("pause", "in_place"), ("load", 3, "w"), ("continue",)]
    assert run.loaded == [3]


def test_the_weights_checker_leaf_passes_only_a_load_that_puts_back_the_snapshot():
    """``--check-weight-update-equal``: snapshot the launch weights, reset them, and the first
    update must load the same weights again; a load of other weights, or none, fails compare."""

    async def check(loads: list[object]) -> int:
        client = leaves_refactor.SimHttpClient(_Run())
        url = "http://127.0.0.1:20004"
        for action in ("snapshot", "reset_tensors"):
            assert (await client.post(f"{url}/weights_checker", json={"action": action})).status_code == 200
        for weights in loads:
            await client.post(f"{url}/pause_generation", json={"mode": "abort"})
            payload = {"serialized_named_tensors": [weights], "weight_version": "1"}
            await client.post(f"{url}/update_weights_from_tensor", json=payload)
        return (await client.post(f"{url}/weights_checker", json={"action": "compare"})).status_code

    assert run_virtual(check([0])) == 200  # the trainer's weights at step 0 are the launch checkpoint's
    assert run_virtual(check([])) == 400  # no update after the reset
    assert run_virtual(check([3])) == 400  # an update of other weights


def test_the_clock_leaf_reads_the_virtual_time_loop():
    clock = leaves_refactor.VirtualClock()

    async def wait() -> tuple[float, float]:
        start = clock.monotonic()
        await asyncio.sleep(310.0)
        return start, clock.monotonic()

    start, end = run_virtual(wait())
    assert end - start == pytest.approx(310.0) and clock.sleep is time.sleep


class _BareCellTrainActor(leaves_refactor.SimCellTrainActor):
    """The train actor leaf without a run behind it: only its process-level members."""

    def __init__(self) -> None:
        pass


def test_the_train_actor_leaf_kill_self_kills_its_actor_so_the_call_and_later_ones_fail_as_ray_reports_a_dead_actor():
    async def main() -> None:
        handle = vray.remote(_BareCellTrainActor).options(name="trainer-0").remote()
        assert await handle.__ray_ready__.remote() is True
        with pytest.raises(vray.ActorDiedError, match="kill_self: its process exited"):
            await handle.kill_self.remote()
        with pytest.raises(vray.RayActorError):
            await handle.get_train_parallel_config.remote()

    run_virtual(main())
    assert vray.actors() == []


def test_the_train_actor_leaf_answers_the_worker_managers_node_probes_for_the_one_node():
    async def main() -> tuple[str, int, bool]:
        handle = vray.remote(_BareCellTrainActor).remote()
        return (
            await handle._get_node_ip.remote(),
            await handle._get_free_port_block.remote(start_port=20000, count=2),
            await handle._is_port_available.remote(port=20000),
        )

    assert run_virtual(main()) == ("127.0.0.1", 20000, True)


def test_the_background_loop_leaf_runs_the_coroutine_on_the_one_loop_while_its_sync_caller_blocks():
    """``async_utils.run`` from a sync actor method (the fully-async rollout's ``dispose``):
    the coroutine can await a task made earlier on the same loop (the worker it closes),
    virtual time passes while the caller blocks, and its value comes back."""
    events: list[str] = []

    async def worker() -> None:
        try:
            await asyncio.sleep(1000.0)
        finally:
            events.append("worker cancelled")

    class Rollout:
        def __init__(self) -> None:
            self.worker = asyncio.get_running_loop().create_task(worker())

        async def aclose(self) -> float:
            self.worker.cancel()
            await asyncio.gather(self.worker, return_exceptions=True)
            await asyncio.sleep(2.0)
            return asyncio.get_running_loop().time()

        def dispose(self) -> float:
            return leaves.run_on_loop(self.aclose())

    async def main() -> tuple[float, float]:
        rollout = Rollout()
        await asyncio.sleep(0)
        start = asyncio.get_running_loop().time()
        return start, rollout.dispose()

    start, closed_at = run_virtual(main())
    assert closed_at - start == pytest.approx(2.0) and events == ["worker cancelled"]


def test_a_hosted_run_starts_with_none_of_upstreams_per_process_singletons(monkeypatch):
    """Each run (each life of a resume) is a process of its own: upstream's audit event
    logger, set by the first ``configure_logger`` of a process and kept for good, is reset
    with upstream's own setter; a module the tree has not imported is left alone."""
    [(name, setter)] = orchestration.PROCESS_SINGLETONS
    fake = types.ModuleType(name)
    fake.logger = "the previous run's logger, in its removed checkpoint folder"

    def set_event_logger(value: object) -> None:
        fake.logger = value

    setattr(fake, setter, set_event_logger)
    monkeypatch.setitem(sys.modules, name, fake)
    orchestration.fresh_process_singletons()
    assert fake.logger is None
    monkeypatch.delitem(sys.modules, name)
    orchestration.fresh_process_singletons()  # not imported: nothing to reset


@pytest.mark.slow
@pytest.mark.process
def test_every_resume_case_runs_on_the_tip_and_a_fully_async_run_ends_as_upstream_closes_it():
    """The resume sweep's cases one after another in one process (each life a fresh event
    logger, else every case after the first writes into the first one's removed folder), and
    fully async through the rollout's close at the driver's end (``dispose``): no resume fails
    but those the half-written state file makes fail, and a fully-async run ends without an
    error, holding every invariant (conservation included)."""
    if not (TIP / source.MARKER).is_file():
        pytest.skip(f"the refactored tree is not at {TIP}")
    sweep = _cli("resume-sweep", "--host", "upstream", "--miles-src", str(TIP), "--fast")
    # a row: setting, host, resumes, ...
    rows = [p[0] for p in map(str.split, sweep.stdout.splitlines()) if p[1:2] == ["upstream"] and p[2].isdigit()]
    assert rows == ["sync", "one-step/retract", "fully-async/retract/retry"], sweep.stdout[-3000:]
    # the only failed resume is the one the stop makes fail: a half-written state file (torch.load)
    failed = [line for line in sweep.stdout.splitlines() if "resume failed" in line]
    assert failed and all("mid_data_save" in line and "PytorchStreamReader" in line for line in failed), failed
    diff = _cli("diff-upstream", "--miles-src", str(TIP), "--scenario", "fa-retract-group")
    out = diff.stdout + diff.stderr
    assert "upstream on its own trace: every invariant holds" in out and "'RuntimeError'" not in out, out[-3000:]


def test_the_api_server_leaf_builds_upstreams_app_over_its_registry_and_binds_no_port():
    """``--api-server-port``: upstream's ``_start_api_server_raw`` would start uvicorn on the
    port; the leaf builds the app with the module's own ``_create_api_app`` and listens nowhere."""
    namespace: dict = {"_create_api_app": lambda registry: ("app", registry)}
    exec("def _start_api_server_raw(registry, port):\n    raise AssertionError('bound port', port)", namespace)
    start = leaves.api_server_unbound(namespace["_start_api_server_raw"])
    assert start("the registry", 1) == ("app", "the registry")
    assert "api_server_socket" in {leaf.name for leaf in leaves.LEAVES}
