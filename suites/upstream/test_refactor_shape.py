"""The controller-executor shape of upstream's orchestration (``harness.upstream.leaves_refactor``):
the leaf that lets the driver block on the worker manager in one thread, and what
``doctor`` says of a tree of that shape while the harness does not host it. Nothing here
imports Miles: the probes read files, and the leaf runs on vray alone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from harness import cli
from harness.upstream import leaves_refactor, seams, source, vray
from harness.upstream.leaves_refactor import SimCommandActor

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
    assert "orchestration shape: controller-executor" in out and "hosted with --orchestration upstream" in out
    for leaf in leaves_refactor.LEAVES:
        assert f"  {leaf.name:<20} {leaf.boundary}" in out
    assert not leaves_refactor.UNHOSTED and "not faked yet" not in out
    report = seams.probe(TIP)
    assert report.missing_for("sync", "upstream") == []
    assert [s.name for s in report.missing_for("sync", "stand-ins")] == ["shape controller-executor"]
