"""The controller-executor shape of upstream's orchestration (``harness.upstream.leaves_refactor``):
the leaf that lets the driver block on the worker manager in one thread, and what
``doctor`` says of a tree of that shape while the harness does not host it. Nothing here
imports Miles: the probes read files, and the leaf runs on vray alone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from harness import cli
from harness.sim.vtime import run_virtual
from harness.upstream import leaves_refactor, seams, source, vray
from harness.upstream.leaves_refactor import DrivingRay, SimCommandActor
from harness.upstream.vray import VRayBlockingGet

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


def test_a_blocking_get_from_the_driver_runs_the_loop_until_the_manager_has_started_its_workers():
    ray = DrivingRay(vray.modules()["ray"])

    async def driver() -> tuple[int, list[str], float]:
        manager = vray.remote(Manager).remote()
        n = ray.get(manager.init.remote(["executor", "controller", "trainer"]))  # blocks, as the driver's thread does
        return n, vray.get(manager.get_started.remote()), asyncio.get_running_loop().time()

    n, started, t = run_virtual(driver())
    assert (n, started, t) == (3, ["executor", "controller", "trainer"], 3.0)


def test_without_the_leaf_the_same_blocking_get_is_refused_by_vray_rather_than_deadlocking():
    async def driver() -> None:
        manager = vray.remote(Manager).remote()
        vray.get(manager.init.remote(["executor"]))

    with pytest.raises(VRayBlockingGet):
        run_virtual(driver())


def test_a_failure_inside_the_awaited_start_reaches_the_blocked_driver():
    class Broken(Manager):
        async def init(self, names: list[str]) -> int:
            await asyncio.sleep(1.0)
            raise RuntimeError("cell start failed")

    ray = DrivingRay(vray.modules()["ray"])

    async def driver() -> None:
        ray.get(vray.remote(Broken).remote().init.remote(["executor"]))

    with pytest.raises(RuntimeError, match="cell start failed"):
        run_virtual(driver())


def test_the_engine_process_leaf_starts_nothing_and_names_a_member_it_lacks():
    actor = SimCommandActor()
    actor.run(cmd="sim-engine --port=20000", envs={})
    assert actor.cmd == "sim-engine --port=20000"
    assert actor._get_free_port_block(start_port=20000, count=3) == 20000
    with pytest.raises(Exception, match="kill_subprocess"):
        actor.kill_subprocess()


def test_doctor_refuses_the_refactored_tree_naming_its_shape_and_each_leaf_not_faked_yet(capsys):
    if not (TIP / source.MARKER).is_file():
        pytest.skip(f"the refactored tree is not at {TIP}")
    assert cli.main(["doctor", "--miles-src", str(TIP)]) == 3
    out = capsys.readouterr().out
    assert "orchestration shape: controller-executor" in out
    assert "not faked yet on the controller-executor shape" in out
    unhosted = out.split("not faked yet on the controller-executor shape", 1)[1]
    for name, needs, stops in leaves_refactor.UNHOSTED:
        assert f"  {name:<20} needs: {needs}" in unhosted and f"without it: {stops}" in unhosted
    assert "doctor lists the leaves not faked yet" in out
    report = seams.probe(TIP)
    assert [s.name for s in report.missing_for("sync")] == ["shape controller-executor"]
