"""Upstream's own orchestration under the harness: the driver, ``create_placement_groups`` / ``create_rollout_manager`` / ``create_training_models``,
the ``RolloutManager`` actor and the train actor group run as upstream wrote them over the
leaves of ``harness.upstream.leaves`` on the in-process Ray.

Every test needs an upstream Miles tree (the ``miles_src`` fixture skips without one,
saying why).
"""

from __future__ import annotations

import pytest

from harness.upstream import leaves, vray
from harness.upstream.diff import case_named, run_case

# one case per driver, and one with the nested generate function (a compact rollout whose
# siblings upstream's manager checks before training)
HOSTED = ("sync", "one-step-k1", "one-step-k2", "one-step-over-sampling", "fa-group-k2", "one-step-nested")


@pytest.mark.parametrize("name", HOSTED)
def test_upstream_orchestration_matches_the_core_and_holds_every_invariant(miles_src, name):
    from harness.checking.invariants import check_all, format_violations

    report = run_case(case_named(name))
    assert report.identical, report.format()
    up = report.upstream_result
    assert up.error is None, repr(up.error)
    violations = check_all(up.events, up.scenario.config)
    assert not violations, format_violations(violations)


# fully-async cases where a weight update's pause takes effect at the engine step that also
# finishes a request: the update (load, resume) and the worker's reaction to the request
# (its next group) fall on one virtual instant, in the order a direct call gives them only
# if a Ray call and its return cost what a direct call costs (harness.upstream.vray)
SAME_INSTANT = (
    "fa-retract-sample",
    "fa-in_place-sample",
    "fa-sample-staleness1-retry",
    "fa-sample-fast-trainer",
    "fa-group-abort-storm-retry",
    "fa-group-request-fails",
    "fa-pairwise-00",
)


@pytest.mark.parametrize("name", SAME_INSTANT)
def test_a_weight_update_and_a_finished_request_at_one_engine_step_run_in_the_cores_order(miles_src, name):
    report = run_case(case_named(name))
    assert report.identical, report.format()


def test_upstream_rollout_manager_and_train_actors_are_hosted_on_the_in_process_ray(miles_src, monkeypatch):
    seen: list[list[str]] = []
    reset = vray.reset

    def spy(*a, **k):
        seen.append(sorted({info.class_name for info in vray.actors()}))
        return reset(*a, **k)

    monkeypatch.setattr(vray, "reset", spy)
    run_case(case_named("one-step-k1"))
    after_run = seen[-1]  # the actors alive when the run ended, before the cluster is reset
    assert "RolloutManager" in after_run
    assert "SimTrainActor" in after_run and "SimEngineActor" in after_run
    assert vray.actors() == [], "the cluster is fresh after a run"


def test_a_bug_seeded_in_upstreams_rollout_manager_changes_what_the_harness_observes(miles_src, monkeypatch):
    """A seeded bug in upstream's orchestration layer: ``RolloutManager.set_weight_version``
    drops the version, so the rollout function is passed none (``rollout_manager.py:L226``).
    The harness runs that layer as written, so it sees it."""
    from miles.ray.rollout.rollout_manager import RolloutManager

    cls = RolloutManager._cls  # the class vray hosts (upstream decorates it with @ray.remote)
    monkeypatch.setattr(cls, "set_weight_version", lambda self, weight_version: None)
    hosted = run_case(case_named("one-step-k2"))
    assert not hosted.identical
    versions = [fields[1] for _, fields in hosted.upstream["generate"]]
    assert set(versions) == {None}, versions


def test_every_leaf_names_its_boundary_and_why_it_is_faked():
    names = [leaf.name for leaf in leaves.LEAVES]
    assert len(names) == len(set(names))
    for leaf in leaves.LEAVES:
        assert leaf.boundary and leaf.why, leaf
    assert {"ray", "sglang_engine", "train_actor"} <= set(names)


def test_a_member_upstream_reads_on_a_leaf_fake_is_a_harness_error_naming_it():
    from harness.upstream.leaf_fakes import LeafMissing

    engine = object.__new__(leaves.SimEngineActor)
    with pytest.raises(LeafMissing, match="sglang_engine.*no member `load_lora_adapter_from_tensors`"):
        engine.load_lora_adapter_from_tensors  # noqa: B018 - the read is the test


def test_a_method_upstream_calls_on_a_leaf_actor_that_lacks_it_is_a_harness_error_naming_it_and_the_line(
    miles_src, monkeypatch
):
    """``engine.init.remote(...)`` (``server_group.py``) on an engine leaf without ``init``: the
    in-process Ray's handle raises the leaf's ``LeafMissing``, so the run is a harness error
    naming the member and upstream's line, not an upstream run that died of an AttributeError."""
    from harness.upstream import source
    from harness.upstream.harness_errors import HarnessError
    from harness.upstream.judge import check_leaves

    monkeypatch.delattr(leaves.SimEngineActor, "init")
    with pytest.raises(HarnessError, match=r"sglang_engine\.init.*server_group\.py:L\d+"):
        report = run_case(case_named("one-step-k1"))
        check_leaves(report.upstream_result, source.active())


def test_the_train_actor_leaf_resumes_from_the_checkpoint_it_wrote(tmp_path):
    assert leaves.read_checkpoint(str(tmp_path)) is None
    leaves.write_checkpoint(str(tmp_path), 3, {"optimizer_step": 4, "lr_step": 4, "version": 4})
    loaded = leaves.read_checkpoint(str(tmp_path))
    assert loaded == {"rollout_id": 3, "optimizer_step": 4, "lr_step": 4, "version": 4}


# --------------------------------------------------------------------------- seeded bugs in the layer


def _orchestration_mutants(run: str) -> list:
    from fixtures.upstream_orchestration_mutants import ORCHESTRATION_MUTANTS

    return [pytest.param(m.mutant, id=m.mutant.name) for m in ORCHESTRATION_MUTANTS if m.run == run]


@pytest.mark.parametrize("mutant", _orchestration_mutants("matrix"))
def test_a_bug_seeded_in_the_orchestration_layer_is_caught_by_name_when_upstream_runs_it(miles_src, mutant):
    from harness.upstream.patching import first_catch

    # by name: the checkers on upstream's own run, not the differential against the core
    catch = first_catch(mutant, differential=False)
    assert catch.case is not None, f"{mutant.name}: no case caught it"
    assert mutant.expected & set(catch.caught_by), (mutant.name, catch.case, catch.caught_by)


def _resume_failures(mutant=None) -> set[str]:
    """The checkers that fail on every stop after a save of the sync setting, resumed by
    upstream's own save and load (``harness.upstream.lives``)."""
    from contextlib import nullcontext

    from harness.lives.sweep import cases, run_case
    from harness.upstream.lives import upstream_host
    from harness.upstream.patching import applied

    host = upstream_host()
    todo = [c for c in cases(only=["sync"]) if len(c.stops) == 1 and c.stops[0].at == "after_save"]
    assert todo, "the sync setting has stops at a save"
    with applied(mutant) if mutant is not None else nullcontext():
        rows = [run_case(c, host) for c in todo]
    return {check for row in rows for check in row.failed_checks}


@pytest.mark.parametrize("mutant", _orchestration_mutants("resume"))
def test_a_bug_seeded_in_upstreams_save_or_load_is_caught_by_the_resume_checkers(miles_src, mutant):
    clean = _resume_failures()
    seeded = _resume_failures(mutant)
    assert mutant.expected <= seeded - clean, (mutant.name, sorted(clean), sorted(seeded))


def test_miles_background_loop_is_the_virtual_time_loop_so_a_submitted_coroutine_settles_there():
    """The rollout-thread leaf's ``get_async_loop``: a coroutine submitted to Miles'
    background loop with ``run_coroutine_threadsafe`` and awaited through ``wrap_future``
    (as #2289's ``RolloutManager._submit_lifecycle_coroutine`` does) runs on the one
    virtual-time loop, at the instant it was submitted: no real thread, no deadlock."""
    import asyncio

    from harness.sim.vtime import run_virtual

    async def lifecycle_call() -> float:
        await asyncio.sleep(2.0)
        return asyncio.get_running_loop().time()

    async def main() -> tuple[float, bool]:
        background = leaves.background_loop_on_loop()
        done = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(lifecycle_call(), background.loop))
        return await done, background.loop is asyncio.get_running_loop()

    assert run_virtual(main()) == (2.0, True)
    assert "get_async_loop" in {r.attr for r in leaves.rollout_rebinds("rollout_manager", object, None, None)}


def test_the_memory_saver_hook_the_train_process_preloads_is_a_leaf():
    """``--offload-train`` with Megatron reads the hook's path from ``torch_memory_saver``
    and, for the disk target, checks the library names its disk backend
    (``miles/ray/train/actor_factory.py:L44-L53``)."""
    mods = leaves.trainer_backend_modules()
    path = mods["torch_memory_saver.utils"].get_binary_path_from_package("torch_memory_saver_hook_mode_preload")
    assert b"TMS_INIT_ENABLE_DISK_BACKUP" in path.read_bytes()
    assert mods["torch_memory_saver"].utils is mods["torch_memory_saver.utils"]


def test_the_rollout_thread_starts_a_loop_step_after_its_caller_and_outlives_a_cancelled_caller():
    """``asyncio.to_thread(call_rollout_function, ...)`` as the leaf runs it: the rollout
    coroutine's first step runs a loop step after the caller's (the hand-off to a thread
    suspends the caller first), and cancelling the caller does not cancel it: a thread
    cannot be cancelled, and Miles' ``call_rollout_function`` blocks it until the rollout
    ends."""
    import asyncio

    from harness.sim.vtime import run_virtual

    seen: list[tuple[str, float]] = []

    async def rollout() -> str:
        seen.append(("start", asyncio.get_running_loop().time()))
        await asyncio.sleep(5.0)
        seen.append(("end", asyncio.get_running_loop().time()))
        return "data"

    async def main() -> tuple[bool, list, list]:
        caller = asyncio.ensure_future(leaves.OnLoopAsyncio.to_thread(rollout))
        await asyncio.sleep(0)  # the caller's first step: it hands the call to the thread
        in_the_callers_step = list(seen)
        await asyncio.sleep(0)  # the thread's first step
        after_the_hand_off = list(seen)
        await asyncio.sleep(1.0)
        caller.cancel()
        await asyncio.sleep(10.0)
        return caller.cancelled(), in_the_callers_step, after_the_hand_off

    cancelled, in_the_callers_step, after_the_hand_off = run_virtual(main())
    assert cancelled and in_the_callers_step == [] and after_the_hand_off == [("start", 0.0)]
    assert seen == [("start", 0.0), ("end", 5.0)]

    async def inline() -> str:
        return await leaves.OnLoopAsyncio.to_thread(rollout)

    assert run_virtual(inline()) == "data"
