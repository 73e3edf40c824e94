"""The in-process Ray of the virtual-time host (``harness.upstream.vray``): actors, calls,
refs, resources and placement groups, faults, and the modules that stand in for ``ray``.
Async behaviour runs on the virtual-time loop (``run_virtual``), so sleeps cost no real time.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from harness.sim.vtime import run_virtual
from harness.upstream import vray
from harness.upstream.vray import (
    ActorDiedError,
    ActorHandle,
    GetTimeoutError,
    NodeAffinitySchedulingStrategy,
    ObjectRef,
    PlacementGroupSchedulingStrategy,
    RayActorError,
    VRayBlockingGet,
    VRayError,
    VRayNoLoop,
    VRayUnschedulable,
)


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    vray.reset()
    yield
    vray.reset()


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.n = start

    def add(self, k: int) -> int:
        self.n += k
        return self.n

    def fail(self) -> None:
        raise ValueError("counter failed")


class Sleeper:
    """An async actor: its coroutine calls overlap."""

    def __init__(self) -> None:
        self.log: list[str] = []

    async def nap(self, name: str, seconds: float) -> float:
        self.log.append(f"{name} start")
        await asyncio.sleep(seconds)
        self.log.append(f"{name} end")
        return asyncio.get_running_loop().time()

    def now(self) -> list[str]:
        return list(self.log)


class GpuReporter:
    def where(self) -> tuple[str, list[int]]:
        return vray.get_node_ip_address(), vray.get_gpu_ids()

    async def where_later(self) -> list[int]:
        await asyncio.sleep(1)
        return vray.get_gpu_ids()


def in_bundle(pg: vray.PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)


# -- remote, options, ray.method


def test_remote_wraps_classes_and_functions_with_and_without_options() -> None:
    bare = vray.remote(Counter)
    with_options = vray.remote(num_gpus=1)(Counter)
    runtime_env = vray.remote(num_gpus=1, runtime_env={"env_vars": {"A": "1"}})(Counter)
    double = vray.remote(lambda x: 2 * x)

    handles = [bare.remote(1), with_options.remote(2), runtime_env.remote(3)]
    assert all(isinstance(h, ActorHandle) for h in handles)
    assert [vray.get(h.add.remote(10)) for h in handles] == [11, 12, 13]
    assert [info.options for info in vray.actors()] == [
        {},
        {"num_gpus": 1},
        {"num_gpus": 1, "runtime_env": {"env_vars": {"A": "1"}}},
    ]
    assert vray.get(double.remote(21)) == 42


def test_options_override_the_decorator_options_and_keep_the_others() -> None:
    Actor = vray.remote(num_gpus=1, max_concurrency=4)(Counter)
    Actor.options(num_gpus=0.5, name="c").remote()
    assert vray.actors()[0].options == {"num_gpus": 0.5, "max_concurrency": 4, "name": "c"}


@pytest.mark.parametrize(
    "make",
    [
        lambda: vray.remote(num_gpu=1),
        lambda: vray.remote(Counter).options(gpus=1),
        lambda: vray.remote(len).options(lifetime_x=1),
        lambda: vray.remote(Counter).remote().add.options(concurrency="x"),
        lambda: vray.method(group="x"),
    ],
)
def test_an_unknown_option_name_raises_type_error_naming_it(make: Any) -> None:
    with pytest.raises(TypeError, match=r"invalid Ray option '(num_gpu|gpus|lifetime_x|concurrency|group)'"):
        make()


def test_remote_rejects_positional_options() -> None:
    with pytest.raises(TypeError, match="keyword options only"):
        vray.remote(Counter, Counter)


def test_ray_method_records_its_options_and_leaves_the_method_callable() -> None:
    class Grouped:
        @vray.method(concurrency_group="io")
        def ping(self) -> str:
            return "pong"

        @vray.method
        def pong(self) -> str:
            return "ping"

    handle = vray.remote(Grouped).remote()
    assert Grouped.ping.__ray_method_options__ == {"concurrency_group": "io"}
    assert vray.get([handle.ping.remote(), handle.pong.remote()]) == ["pong", "ping"]


def test_actor_classes_methods_and_remote_functions_cannot_be_called_directly() -> None:
    Actor = vray.remote(Counter)
    with pytest.raises(TypeError, match=r"Counter\.remote\(\)"):
        Actor()
    with pytest.raises(TypeError, match=r"add\.remote\(\)"):
        Actor.remote().add(1)
    with pytest.raises(TypeError, match=r"\.remote\(\)"):
        vray.remote(len)([1])


def test_num_returns_other_than_one_is_refused_as_not_modelled() -> None:
    with pytest.raises(VRayError, match="num_returns=2"):
        vray.remote(num_returns=2)(len)


# -- actors: construction, names, handles


def test_outside_a_running_loop_the_constructor_runs_at_remote() -> None:
    built: list[int] = []

    class Recorder:
        def __init__(self, k: int) -> None:
            built.append(k)

    vray.remote(Recorder).remote(7)
    assert built == [7]


def test_on_a_running_loop_the_constructor_runs_after_remote_returns_once_nothing_else_is_ready() -> None:
    # Ray: .remote() returns at once and the constructor runs in the actor's process once it is
    # up; vray runs it once every step ready at the current instant has run, at no virtual time
    log: list[str] = []

    class Recorder:
        def __init__(self) -> None:
            log.append(f"constructor at t={asyncio.get_running_loop().time():g}")

        def ping(self) -> str:
            log.append("ping")
            return "pong"

    async def other() -> None:
        log.append("other step 1")
        await asyncio.sleep(0)
        log.append("other step 2")

    async def main() -> str:
        sibling = asyncio.ensure_future(other())
        handle = vray.remote(Recorder).remote()
        log.append("remote returned")
        ref = handle.ping.remote()  # queued behind the constructor
        assert repr(ref) == "ObjectRef(Recorder.ping, pending)"
        await sibling
        return await ref

    assert run_virtual(main()) == "pong"
    assert log == ["remote returned", "other step 1", "other step 2", "constructor at t=0", "ping"]


def test_a_constructor_that_blocks_on_its_creator_sees_what_the_creator_did_after_creating_it() -> None:
    # the worker manager's pattern: a worker's constructor asks the manager, with a blocking
    # get, for state the manager sets only after the worker's creation returned
    class Manager:
        def __init__(self) -> None:
            self.addrs: dict[str, str] | None = None
            self.workers: list[ActorHandle] = []

        async def start(self) -> None:
            me = vray.get_runtime_context().current_actor
            self.workers.append(vray.remote(Worker).remote(me))
            await asyncio.sleep(0)
            self.addrs = {"worker": "127.0.0.1:1"}

        def get_addrs(self) -> dict[str, str]:
            assert self.addrs is not None, "asked before the addresses were allocated"
            return self.addrs

        def worker(self) -> ActorHandle:
            return self.workers[0]

    class Worker:
        def __init__(self, manager: ActorHandle) -> None:
            self.addrs = vray.get(manager.get_addrs.remote())

        def seen(self) -> dict[str, str]:
            return self.addrs

    async def main() -> dict[str, str]:
        manager = vray.remote(Manager).remote()
        await manager.start.remote()
        worker = await manager.worker.remote()
        return await worker.seen.remote()

    assert run_virtual(main()) == {"worker": "127.0.0.1:1"}


def test_calls_made_before_the_constructor_ran_run_after_it_in_submission_order() -> None:
    async def main() -> list[Any]:
        counter = vray.remote(Counter).remote(10)
        sleeper = vray.remote(Sleeper).remote()
        refs = [
            counter.add.remote(1),
            counter.add.remote(2),
            sleeper.nap.remote("a", 1),
            counter.__ray_ready__.remote(),
        ]
        assert all(not r._done for r in refs)
        return [await r for r in refs]

    assert run_virtual(main()) == [11, 13, 1.0, True]


def test_an_actor_killed_before_its_constructor_ran_never_constructs_and_fails_its_queued_calls() -> None:
    built: list[str] = []

    class Recorder:
        def __init__(self) -> None:
            built.append("built")

        def ping(self) -> str:
            return "pong"

    async def main() -> None:
        handle = vray.remote(Recorder).remote()
        ref = handle.ping.remote()
        vray.kill(handle)
        with pytest.raises(ActorDiedError, match="killed by ray.kill; Recorder.ping did not run"):
            await ref
        await asyncio.sleep(1)

    run_virtual(main())
    assert built == []


def test_a_constructor_that_raises_leaves_a_dead_handle_whose_calls_raise_ray_actor_error_chaining_the_cause() -> None:
    class Broken:
        def __init__(self) -> None:
            raise KeyError("no config")

        def ping(self) -> str:
            return "pong"

    handle = vray.remote(Broken).options(name="broken").remote()
    ref = handle.ping.remote()
    with pytest.raises(RayActorError, match="constructor raised KeyError") as caught:
        vray.get(ref)
    assert isinstance(caught.value, ActorDiedError)
    assert isinstance(caught.value.__cause__, KeyError)
    assert vray.actors() == []
    with pytest.raises(ValueError, match="Failed to look up actor"):
        vray.get_actor("broken")


def test_named_actors_are_found_by_name_and_a_second_with_the_same_name_is_refused() -> None:
    Actor = vray.remote(Counter)
    first = Actor.options(name="counter").remote(1)
    assert vray.get_actor("counter") is first
    with pytest.raises(ValueError, match="already taken"):
        Actor.options(name="counter").remote(2)
    again = Actor.options(name="counter", get_if_exists=True).remote(99)
    assert again is first
    assert vray.get(again.add.remote(0)) == 1  # the constructor did not run again
    other = Actor.options(name="counter", namespace="elsewhere").remote(5)
    assert vray.get_actor("counter", namespace="elsewhere") is other is not first
    with pytest.raises(ValueError, match="Failed to look up actor with name 'nobody'"):
        vray.get_actor("nobody")


def test_a_killed_named_actor_frees_its_name() -> None:
    Actor = vray.remote(Counter)
    vray.kill(Actor.options(name="c").remote())
    with pytest.raises(ValueError, match="Failed to look up"):
        vray.get_actor("c")
    assert vray.get(Actor.options(name="c").remote(3).add.remote(0)) == 3


def test_a_missing_member_raises_attribute_error_naming_the_class_and_member() -> None:
    handle = vray.remote(Counter).remote()
    with pytest.raises(AttributeError, match="actor class 'Counter' has no method 'subtract'"):
        handle.subtract  # noqa: B018
    with pytest.raises(AttributeError, match="has no method 'n'"):  # data attributes are not methods
        handle.n  # noqa: B018
    assert not hasattr(handle, "__deepcopy_unknown__")


def test_ray_ready_resolves_true_for_a_live_actor_and_raises_for_a_dead_one() -> None:
    handle = vray.remote(Counter).remote()
    assert vray.get(handle.__ray_ready__.remote()) is True
    vray.kill(handle)
    with pytest.raises(RayActorError):
        vray.get(handle.__ray_ready__.remote())


def test_handles_passed_as_arguments_stay_usable_and_copies_are_the_same_handle() -> None:
    class Forwarder:
        def __init__(self, target: ActorHandle) -> None:
            self.target = target

        def forward(self, k: int) -> int:
            return vray.get(self.target.add.remote(k))

    counter = vray.remote(Counter).remote(0)
    forwarder = vray.remote(Forwarder).remote(counter)
    assert vray.get(forwarder.forward.remote(5)) == 5
    assert vray.get(counter.add.remote(0)) == 5
    assert copy.deepcopy({"h": counter})["h"] is counter
    assert copy.copy(counter) is counter


# -- calls: sync actors, async actors, remote functions


def test_a_sync_actor_runs_a_call_made_during_another_of_its_calls_after_that_one_finishes() -> None:
    log: list[str] = []

    class Reentrant:
        def outer(self, me: ActorHandle) -> str:
            log.append("outer start")
            inner = me.inner.remote()
            log.append(f"inner queued: {inner._done}")
            with pytest.raises(VRayBlockingGet, match="test_vray.py"):
                vray.get(inner)  # Ray deadlocks here too: the actor's one thread is busy
            log.append("outer end")
            return "outer"

        def inner(self) -> str:
            log.append("inner")
            return "inner"

    handle = vray.remote(Reentrant).remote()
    ref = handle.outer.remote(handle)
    assert log == ["outer start", "inner queued: False", "outer end", "inner"]
    assert vray.get(ref) == "outer"


def test_sync_actor_calls_run_eagerly_outside_any_loop_in_submission_order() -> None:
    handle = vray.remote(Counter).remote()
    refs = [handle.add.remote(k) for k in (1, 2, 3)]
    assert all(ref._done for ref in refs)
    assert vray.get(refs) == [1, 3, 6]


def test_async_actor_coroutine_calls_run_concurrently_on_the_loop() -> None:
    async def main() -> tuple[list[float], list[str]]:
        handle = vray.remote(Sleeper).remote()
        ends = await asyncio.gather(handle.nap.remote("a", 3), handle.nap.remote("b", 5))
        return list(ends), vray.get(handle.now.remote())

    ends, log = run_virtual(main())
    assert ends == [3.0, 5.0]  # overlapping, not 3 then 8
    assert log == ["a start", "b start", "a end", "b end"]


def test_a_plain_method_of_an_async_actor_runs_at_remote_while_a_coroutine_call_is_suspended() -> None:
    async def main() -> list[str]:
        handle = vray.remote(Sleeper).remote()
        slow = handle.nap.remote("a", 10)
        await asyncio.sleep(1)
        log = vray.get(handle.now.remote())  # done at once: no blocking get
        await slow
        return log

    assert run_virtual(main()) == ["a start"]


def test_a_plain_call_an_async_actor_makes_to_itself_from_a_plain_method_runs_after_that_method() -> None:
    log: list[str] = []

    class Mixed:
        async def tick(self) -> None:
            await asyncio.sleep(1)

        def outer(self, me: ActorHandle) -> None:
            ref = me.inner.remote()
            log.append(f"inner done during outer: {ref._done}")

        def inner(self) -> None:
            log.append("inner")

    handle = vray.remote(Mixed).remote()
    handle.outer.remote(handle)
    assert log == ["inner done during outer: False", "inner"]


def test_a_coroutine_call_runs_up_to_its_first_await_at_remote_in_a_task_of_its_own() -> None:
    log: list[Any] = []

    class Async:
        async def work(self, caller: asyncio.Task) -> str:
            log.append(("started in its own task", asyncio.current_task() is not caller))
            await asyncio.sleep(1)
            log.append("resumed")
            return "worked"

        async def at_once(self) -> int:
            log.append("at once")
            return 7

    async def main() -> tuple[str, int]:
        handle = vray.remote(Async).remote()
        await handle.__ray_ready__.remote()
        me = asyncio.current_task()
        assert me is not None
        ref = handle.work.remote(me)
        log.append("remote returned")
        quick = handle.at_once.remote()
        assert quick._done  # it ran to its end inside .remote()
        return await ref, await quick

    assert run_virtual(main()) == ("worked", 7)
    assert log == [("started in its own task", True), "remote returned", "at once", "resumed"]


def test_a_coroutine_call_cancelled_before_its_first_await_fails_its_ref() -> None:
    class Quitter:
        async def quit(self) -> None:
            raise asyncio.CancelledError("gave up")

    async def main() -> None:
        handle = vray.remote(Quitter).remote()
        await handle.__ray_ready__.remote()
        ref = handle.quit.remote()
        assert ref._done
        with pytest.raises(vray.TaskCancelledError, match=r"Quitter\.quit was cancelled"):
            await ref

    run_virtual(main())


class _Gated:
    """An actor whose ``wait`` call stays pending until ``open`` is called."""

    def __init__(self) -> None:
        self.gate: asyncio.Future[None] | None = None

    async def wait(self) -> str:
        self.gate = asyncio.get_running_loop().create_future()
        await self.gate
        return "returned"

    def open(self) -> None:
        assert self.gate is not None
        self.gate.set_result(None)  # the call's task is ready from here


def test_a_return_reaches_the_caller_awaiting_it_before_anything_else_ready() -> None:
    """As a direct call's caller resumes when the callee returns: the call's last step and
    the caller's next one run back to back, ahead of work that became ready in between."""
    log: list[str] = []

    async def bystander() -> None:
        log.append("bystander")

    async def main() -> None:
        handle = vray.remote(_Gated).remote()
        await handle.__ray_ready__.remote()
        ref = handle.wait.remote()

        async def caller() -> None:
            log.append(await ref)

        waiting = asyncio.ensure_future(caller())
        await asyncio.sleep(0)  # the caller waits on the ref
        vray.get(handle.open.remote())
        asyncio.ensure_future(bystander())  # ready after the call's task, before the caller
        await waiting

    run_virtual(main())
    assert log == ["returned", "bystander"]


def test_gather_waits_on_a_ref_through_its_own_future_and_resumes_a_step_after_the_return() -> None:
    """``gather`` (``ensure_future``) takes a ref's per-await future, not a task awaiting the
    ref: the gathering caller resumes one loop step after the return (gather's own
    callback, as over any future), not two."""
    steps: list[Any] = []

    async def ticker() -> None:
        for i in range(4):
            steps.append(i)
            await asyncio.sleep(0)

    async def main() -> None:
        handle = vray.remote(_Gated).remote()
        await handle.__ray_ready__.remote()
        ref = handle.wait.remote()

        async def caller() -> None:
            steps.append(tuple(await asyncio.gather(ref)))

        waiting = asyncio.ensure_future(caller())
        await asyncio.sleep(0)  # the caller waits in gather
        wrappers = [t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__name__", "") == "_wrap_awaitable"]
        assert wrappers == []
        vray.get(handle.open.remote())
        ticking = asyncio.ensure_future(ticker())
        await asyncio.gather(waiting, ticking)

    run_virtual(main())
    assert steps == [0, ("returned",), 1, 2, 3]


def test_awaiting_a_ref_that_is_already_done_does_not_suspend_the_caller() -> None:
    async def main() -> tuple[int, list[str]]:
        handle = vray.remote(Counter).remote()
        await handle.__ray_ready__.remote()
        ran: list[str] = []
        asyncio.get_running_loop().call_soon(ran.append, "other")
        value = await handle.add.remote(2)  # a plain call: done at .remote()
        return value, list(ran)  # a copy: the loop runs "other" once main() has returned

    assert run_virtual(main()) == (2, [])


def test_a_coroutine_method_called_outside_a_running_loop_raises_a_clear_error() -> None:
    handle = vray.remote(Sleeper).remote()
    with pytest.raises(VRayNoLoop, match=r"Sleeper\.nap\.remote\(\) at .*test_vray\.py.*inside run_virtual"):
        handle.nap.remote("a", 1)


def test_remote_functions_run_sync_bodies_at_remote_and_coroutines_as_tasks() -> None:
    calls: list[int] = []

    @vray.remote
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    @vray.remote(num_cpus=0.001)
    async def later(x: int) -> float:
        await asyncio.sleep(x)
        return asyncio.get_running_loop().time()

    ref = square.remote(4)
    assert calls == [4] and vray.get(ref) == 16

    async def main() -> list[float]:
        return await asyncio.gather(later.remote(2), later.options(num_cpus=1).remote(1))

    assert run_virtual(main()) == [2.0, 1.0]


def test_a_remote_error_is_raised_as_the_original_exception_by_get_and_await() -> None:
    handle = vray.remote(Counter).remote()
    with pytest.raises(ValueError, match="counter failed"):
        vray.get(handle.fail.remote())

    class Async:
        async def boom(self) -> None:
            raise LookupError("async boom")

    async def main() -> None:
        await vray.remote(Async).remote().boom.remote()

    with pytest.raises(LookupError, match="async boom"):
        run_virtual(main())


def test_top_level_ref_arguments_are_passed_as_their_values() -> None:
    handle = vray.remote(Counter).remote()
    assert vray.get(handle.add.remote(vray.put(5))) == 5

    class Async:
        async def double(self, x: int) -> int:
            return 2 * x

    async def main() -> int:
        slow = vray.remote(Sleeper).remote().nap.remote("a", 2)  # pending when passed
        return await vray.remote(Async).remote().double.remote(slow)

    assert run_virtual(main()) == 4.0


def test_a_pending_ref_argument_to_a_call_that_runs_at_remote_is_refused() -> None:
    async def main() -> None:
        slow = vray.remote(Sleeper).remote().nap.remote("a", 2)
        vray.remote(Counter).remote().add.remote(slow)

    with pytest.raises(VRayError, match=r"argument ObjectRef\(Sleeper\.nap, pending\) is not done"):
        run_virtual(main())


# -- refs: await, get, wait, put


def test_refs_are_awaitable_in_gather_and_wait_for_and_give_futures() -> None:
    async def main() -> tuple[Any, ...]:
        handle = vray.remote(Sleeper).remote()
        direct = await handle.nap.remote("a", 1)
        gathered = await asyncio.gather(handle.nap.remote("b", 1), vray.put("x"))
        fut = handle.nap.remote("c", 2).future()
        assert isinstance(fut, asyncio.Future)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(handle.nap.remote("d", 10), timeout=1)
        waited = await fut, asyncio.get_running_loop().time()
        await asyncio.sleep(10)  # the timed-out await did not cancel the call itself, as in Ray
        assert vray.get(handle.now.remote())[-1] == "d end"
        return direct, gathered, waited

    assert run_virtual(main()) == (1.0, [2.0, "x"], (4.0, 4.0))


def test_a_blocking_get_inside_the_loop_waits_while_the_work_runs_in_virtual_time() -> None:
    async def main() -> tuple[float, float]:
        ref = vray.remote(Sleeper).remote().nap.remote("a", 3)
        value = vray.get(ref)  # as Ray's caller thread blocks, the call goes on meanwhile
        return value, asyncio.get_running_loop().time()

    assert run_virtual(main()) == (3.0, 3.0)


def test_a_blocking_get_on_work_that_waits_for_the_caller_raises_naming_the_caller() -> None:
    class Waiter:
        async def wait(self, gate: asyncio.Future) -> None:
            await gate

    async def main() -> None:
        gate = asyncio.get_running_loop().create_future()
        ref = vray.remote(Waiter).remote().wait.remote(gate)
        vray.get(ref)  # the gate opens only after the get: it can never finish
        gate.set_result(None)

    with pytest.raises(VRayBlockingGet, match=r"ray\.get at .*test_vray\.py:\d+ waits for ObjectRef\(Waiter\.wait"):
        run_virtual(main())


def test_get_with_a_timeout_on_a_pending_ref_raises_get_timeout_error() -> None:
    async def main() -> None:
        ref = vray.remote(Sleeper).remote().nap.remote("a", 1)
        with pytest.raises(GetTimeoutError):
            vray.get(ref, timeout=5)
        with pytest.raises(TimeoutError):  # GetTimeoutError is a TimeoutError, as in Ray
            vray.get([vray.put(1), ref], timeout=0)
        assert await ref == 1.0

    run_virtual(main())


def test_get_takes_a_ref_or_a_list_of_refs_only() -> None:
    assert vray.get(vray.put(3)) == 3
    assert vray.get([vray.put(1), vray.put(2)]) == [1, 2]
    with pytest.raises(ValueError, match="an ObjectRef or a list"):
        vray.get((vray.put(1),))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="an ObjectRef or a list"):
        vray.get([1])  # type: ignore[list-item]


def test_wait_returns_what_is_ready_now_and_blocks_nowhere() -> None:
    async def main() -> None:
        handle = vray.remote(Sleeper).remote()
        done, slow, slower = vray.put(0), handle.nap.remote("a", 1), handle.nap.remote("b", 2)
        assert vray.wait([slow, done, slower], timeout=0) == ([done], [slow, slower])
        assert vray.wait([slow, done], num_returns=2, timeout=3) == ([done], [slow])
        with pytest.raises(VRayBlockingGet, match=r"ray\.wait at .*test_vray\.py"):
            vray.wait([slow, done], num_returns=2)
        await slow
        assert vray.wait([slower, slow, done], num_returns=2) == ([slow, done], [slower])

    run_virtual(main())


def test_put_gives_a_done_ref_of_the_value_itself() -> None:
    value = {"k": [1]}
    ref = vray.put(value)
    assert isinstance(ref, ObjectRef) and ref._done
    assert vray.get(ref) is value


# -- resources and placement groups


def test_a_placement_group_reserves_its_bundles_and_a_group_that_does_not_fit_is_refused() -> None:
    vray.reset(num_gpus=4, num_cpus=8)
    pg = vray.placement_group([{"GPU": 1, "CPU": 1}] * 3, strategy="PACK")
    assert vray.get(pg.ready()) is pg
    assert pg.bundle_count == 3 and pg.bundle_specs == [{"GPU": 1, "CPU": 1}] * 3
    with pytest.raises(VRayUnschedulable, match=r"asks \{'GPU': 2, 'CPU': 2\}.*'GPU': 1\.0.*pending forever"):
        vray.placement_group([{"GPU": 1, "CPU": 1}] * 2)
    vray.remove_placement_group(pg)
    assert vray.placement_group([{"GPU": 1, "CPU": 1}] * 4).bundle_count == 4


def test_a_refused_placement_group_reserves_nothing() -> None:
    vray.reset(num_gpus=2, num_cpus=8)
    with pytest.raises(VRayUnschedulable, match="bundle 2 does not fit"):
        vray.placement_group([{"GPU": 1}] * 3)
    assert vray.placement_group([{"GPU": 1}] * 2).bundle_count == 2


def test_placement_group_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="non-empty list"):
        vray.placement_group([])
    with pytest.raises(ValueError, match="only zero or negative"):
        vray.placement_group([{"GPU": 0}])
    with pytest.raises(ValueError, match="strategy 'TIGHT'"):
        vray.placement_group([{"GPU": 1}], strategy="TIGHT")
    with pytest.raises(VRayUnschedulable, match="one node per bundle"):
        vray.placement_group([{"CPU": 1}] * 2, strategy="STRICT_SPREAD")


def test_an_actor_in_a_bundle_sees_that_bundles_gpu_and_the_node_ip() -> None:
    vray.reset(num_gpus=4, num_cpus=4)
    Info = vray.remote(num_gpus=1)(GpuReporter)
    pg = vray.placement_group([{"GPU": 1, "CPU": 1}] * 4)
    actors = [Info.options(scheduling_strategy=in_bundle(pg, i)).remote() for i in (2, 0, 3, 1)]
    assert vray.get([a.where.remote() for a in actors]) == [("127.0.0.1", [i]) for i in (2, 0, 3, 1)]
    assert vray.get_gpu_ids() == []  # the driver is no actor

    async def main() -> list[int]:
        return await actors[0].where_later.remote()  # the current actor is known inside tasks too

    assert run_virtual(main()) == [2]


def test_fractional_actors_share_a_bundle_until_it_is_full_and_the_error_names_the_bundle() -> None:
    pg = vray.placement_group([{"GPU": 1, "CPU": 1}, {"GPU": 1, "CPU": 1}])
    Actor = vray.remote(GpuReporter).options(num_gpus=0.4, num_cpus=0.4, scheduling_strategy=in_bundle(pg, 1))
    first, second = Actor.remote(), Actor.remote()
    assert vray.get(first.where.remote())[1] == vray.get(second.where.remote())[1] == [1]
    with pytest.raises(
        VRayUnschedulable,
        match=r"asks \{'CPU': 0\.4, 'GPU': 0\.4\} of bundle 1 of placement group .*'CPU': 0\.2.*'GPU': 0\.2",
    ):
        Actor.remote()
    vray.kill(first)
    assert vray.get(Actor.remote().where.remote())[1] == [1]


def test_bundle_index_minus_one_takes_the_first_bundle_that_fits() -> None:
    pg = vray.placement_group([{"GPU": 1}, {"GPU": 1}])
    Actor = vray.remote(GpuReporter).options(num_gpus=1, scheduling_strategy=in_bundle(pg, -1))
    assert [vray.get(Actor.remote().where.remote())[1] for _ in range(2)] == [[0], [1]]
    with pytest.raises(VRayUnschedulable, match="of placement group"):
        Actor.remote()
    with pytest.raises(ValueError, match="bundle_index 2 is out of range"):
        vray.remote(GpuReporter).options(scheduling_strategy=in_bundle(pg, 2)).remote()


def test_an_actor_outside_placement_groups_draws_gpus_from_the_node_and_kill_frees_them() -> None:
    vray.reset(num_gpus=2, num_cpus=4)
    Actor = vray.remote(num_gpus=1)(GpuReporter)
    a, b = Actor.remote(), Actor.remote()
    assert [vray.get(h.where.remote())[1] for h in (a, b)] == [[0], [1]]
    with pytest.raises(VRayUnschedulable, match=r"asks \{'GPU': 1\.0\} of the node, which has .*'GPU': 0\.0"):
        Actor.remote()
    vray.kill(a)
    assert vray.get(Actor.remote().where.remote())[1] == [0]
    with pytest.raises(ValueError, match="num_gpus=1.5"):
        vray.remote(num_gpus=1.5)(GpuReporter).remote()


def test_removing_a_placement_group_kills_its_actors() -> None:
    pg = vray.placement_group([{"GPU": 1}])
    handle = vray.remote(num_gpus=1)(GpuReporter).options(scheduling_strategy=in_bundle(pg, 0)).remote()
    vray.remove_placement_group(pg)
    with pytest.raises(RayActorError, match="placement group .* was removed"):
        vray.get(handle.where.remote())
    with pytest.raises(VRayUnschedulable, match="was removed"):
        vray.remote(GpuReporter).options(scheduling_strategy=in_bundle(pg, 0)).remote()


def test_hard_node_affinity_to_the_node_works_and_to_another_node_is_unschedulable() -> None:
    (node,) = vray.list_nodes(filters=[("is_head_node", "=", True)])
    Actor = vray.remote(Counter)
    assert (
        vray.get(
            Actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False))
            .remote(2)
            .add.remote(0)
        )
        == 2
    )
    with pytest.raises(VRayUnschedulable, match="no node 'elsewhere'"):
        Actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy("elsewhere", soft=False)).remote()


def test_nodes_list_nodes_and_the_runtime_context_describe_the_one_node() -> None:
    vray.reset(num_gpus=2, num_cpus=6, node_ip="10.0.0.7")
    (node,) = vray.nodes()
    assert node["Alive"] and node["NodeManagerAddress"] == "10.0.0.7"
    assert node["Resources"] == {"CPU": 6.0, "GPU": 2.0}
    (state,) = vray.list_nodes()
    assert state.is_head_node and state.node_id == node["NodeID"] == vray.get_runtime_context().get_node_id()
    assert vray.list_nodes(filters=[("is_head_node", "=", False)]) == []

    class Self:
        def me(self) -> ActorHandle:
            return vray.get_runtime_context().current_actor

        def my_id(self) -> str | None:
            return vray.get_runtime_context().get_actor_id()

    handle = vray.remote(Self).remote()
    assert vray.get(handle.me.remote()) is handle
    assert (
        vray.get(handle.my_id.remote()) == handle._vray_actor.id and vray.get_runtime_context().get_actor_id() is None
    )
    with pytest.raises(RuntimeError, match="only available in an actor"):
        vray.get_runtime_context().current_actor  # noqa: B018


# -- faults


def test_kill_actor_fails_in_flight_async_calls_cancels_them_and_fails_later_calls() -> None:
    cleaned: list[str] = []

    class Worker:
        async def work(self) -> str:
            try:
                await asyncio.sleep(100)
            finally:
                cleaned.append("cancelled")
            return "done"

    async def main() -> None:
        handle = vray.remote(Worker).remote()
        ref = handle.work.remote()
        await asyncio.sleep(1)
        vray.kill_actor(handle, cause="node lost")
        with pytest.raises(RayActorError, match="node lost"):
            vray.get(ref)  # failed at once, not pending
        with pytest.raises(RayActorError, match="node lost"):
            await ref
        with pytest.raises(ActorDiedError, match=r"node lost; Worker\.work did not run"):
            await handle.work.remote()
        await asyncio.sleep(0)
        assert cleaned == ["cancelled"]
        assert vray.actors() == []

    run_virtual(main())


def test_kill_actor_fails_the_queued_calls_of_a_sync_actor() -> None:
    results: list[Any] = []

    class Suicidal:
        def first(self, me: ActorHandle) -> str:
            results.append(me.second.remote())
            vray.kill_actor(me, cause="crash in first")
            return "first"

        def second(self) -> str:
            return "second"

    handle = vray.remote(Suicidal).remote()
    first = handle.first.remote(handle)
    for ref in (first, results[0]):  # the running call and the queued one
        with pytest.raises(RayActorError, match="crash in first"):
            vray.get(ref)


def test_ray_kill_marks_the_actor_dead_for_later_calls() -> None:
    handle = vray.remote(Counter).remote()
    vray.kill(handle)
    with pytest.raises(RayActorError, match="killed by ray.kill"):
        vray.get(handle.add.remote(1))
    with pytest.raises(TypeError, match="ActorHandle"):
        vray.kill_actor("not a handle")  # type: ignore[arg-type]


# -- the pattern upstream relies on


def test_an_async_actor_can_ray_get_a_sync_method_of_another_async_actor_from_inside_a_coroutine() -> None:
    class Manager:
        def __init__(self) -> None:
            self.weight_version: int | None = None

        async def generate(self, rollout_id: int) -> str:
            await asyncio.sleep(1)
            return f"rollout {rollout_id} at weights {self.weight_version}"

        def set_weight_version(self, version: int) -> None:
            self.weight_version = version

    class Trainer:
        def __init__(self, manager: ActorHandle) -> None:
            self.manager = manager

        async def update_weights(self, version: int) -> None:
            await asyncio.sleep(1)
            vray.get(self.manager.set_weight_version.remote(version))  # a sync method runs at once

    async def main() -> list[str]:
        manager = vray.remote(Manager).options(num_cpus=1, num_gpus=0).remote()
        trainer = vray.remote(num_gpus=1)(Trainer).remote(manager)
        first = await manager.generate.remote(0)
        await trainer.update_weights.remote(3)
        return [first, await manager.generate.remote(1)]

    assert run_virtual(main()) == ["rollout 0 at weights None", "rollout 1 at weights 3"]


# -- lifecycle and the module stand-ins


def test_init_twice_raises_unless_asked_and_init_can_shape_the_node() -> None:
    assert not vray.is_initialized()
    vray.init(num_gpus=1, num_cpus=2)
    assert vray.is_initialized() and vray.nodes()[0]["Resources"] == {"CPU": 2.0, "GPU": 1.0}
    with pytest.raises(RuntimeError, match="ray.init twice"):
        vray.init()
    vray.init(ignore_reinit_error=True, namespace="ns")
    vray.remote(Counter).options(name="c").remote()
    assert vray.get_actor("c", namespace="ns") is vray.get_actor("c")
    with pytest.raises(VRayError, match="cannot be reshaped"):
        vray.init(ignore_reinit_error=True, num_gpus=4)


def test_shutdown_kills_every_actor_and_frees_every_placement_group() -> None:
    vray.reset(num_gpus=1)
    handle = vray.remote(Counter).remote()
    vray.placement_group([{"GPU": 1}])
    vray.shutdown()
    assert not vray.is_initialized() and vray.actors() == []
    with pytest.raises(RayActorError, match=r"ray\.shutdown"):
        vray.get(handle.add.remote(1))
    assert vray.placement_group([{"GPU": 1}]).bundle_count == 1


def test_reset_forgets_names_groups_and_the_node_shape() -> None:
    vray.reset(num_gpus=1)
    vray.remote(Counter).options(name="c").remote()
    vray.placement_group([{"GPU": 1}])
    cluster = vray.reset(num_gpus=3)
    assert cluster.num_gpus == 3 and vray.cluster() is cluster and vray.actors() == []
    with pytest.raises(ValueError):
        vray.get_actor("c")
    assert vray.placement_group([{"GPU": 1}] * 3).bundle_count == 3


def test_actors_lists_live_actors_with_name_options_and_placement() -> None:
    pg = vray.placement_group([{"GPU": 2}])
    vray.remote(Counter).options(name="plain").remote()
    vray.remote(num_gpus=2)(GpuReporter).options(scheduling_strategy=in_bundle(pg, 0)).remote()
    plain, placed = vray.actors()
    assert (plain.class_name, plain.name, plain.placement, plain.gpu_ids) == (
        "Counter",
        "plain",
        "node vray-node-0",
        [],
    )
    assert placed.class_name == "GpuReporter" and placed.name is None
    assert placed.placement == f"bundle 0 of placement group {pg.id}" and placed.gpu_ids == [0, 1]


def test_modules_installed_as_ray_serve_upstreams_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    mods = vray.modules()
    assert sorted(mods) == sorted(
        ["ray", "ray.actor", "ray.util", "ray.util.placement_group", "ray.util.scheduling_strategies",
         "ray.exceptions", "ray.util.state", "ray._private", "ray._private.services", "ray._private.internal_api"]
    )  # fmt: skip
    for name in [n for n in sys.modules if n == "ray" or n.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    for name, module in mods.items():
        monkeypatch.setitem(sys.modules, name, module)

    ray = importlib.import_module("ray")
    from ray.actor import ActorHandle as ImportedHandle  # type: ignore[import-not-found,unused-ignore]
    from ray.exceptions import ActorDiedError as Died  # type: ignore[import-not-found,unused-ignore]
    from ray.exceptions import RayActorError as ActorError  # type: ignore[import-not-found,unused-ignore]
    from ray.util.placement_group import placement_group  # type: ignore[import-not-found,unused-ignore]
    from ray.util.scheduling_strategies import (  # type: ignore[import-not-found,unused-ignore]
        PlacementGroupSchedulingStrategy as Strategy,
    )
    from ray.util.state import list_nodes  # type: ignore[import-not-found,unused-ignore]

    assert ray.util.placement_group is placement_group is vray.placement_group  # the function, as in Ray
    assert ray.util.get_node_ip_address() == ray._private.services.get_node_ip_address() == "127.0.0.1"
    assert ray.exceptions.GetTimeoutError is GetTimeoutError and Died is ActorDiedError and ActorError is RayActorError
    assert list_nodes()[0].is_head_node and ray.ObjectRef is ObjectRef
    pg = placement_group([{"GPU": 1, "CPU": 1}])
    info = ray.remote(num_gpus=1)(GpuReporter).options(scheduling_strategy=Strategy(pg, 0)).remote()
    assert isinstance(info, ImportedHandle) and ray.get(info.where.remote()) == ("127.0.0.1", [0])
    with pytest.raises(ModuleNotFoundError, match="No module named 'ray.util.collective'"):
        importlib.import_module("ray.util.collective")


def test_a_killed_actor_takes_the_tasks_it_started_itself_with_it_and_others_keep_theirs() -> None:
    class Service:
        def __init__(self) -> None:
            self.ticks = 0

        async def start(self) -> None:
            asyncio.get_running_loop().create_task(self._loop())  # a background loop of its own

        async def _loop(self) -> None:
            while True:
                await asyncio.sleep(1)
                self.ticks += 1

        def count(self) -> int:
            return self.ticks

    async def main() -> tuple[int, int, bool]:
        doomed, kept = vray.remote(Service).remote(), vray.remote(Service).remote()
        await doomed.start.remote()
        await kept.start.remote()
        await asyncio.sleep(2.5)
        vray.kill_actor(doomed, cause="the test")
        await asyncio.sleep(0)
        alive = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        await asyncio.sleep(2)
        return len(alive), vray.get(kept.count.remote()), all("Service._loop" in repr(t) for t in alive)

    alive, kept_ticks, only_the_kept = run_virtual(main())
    assert alive == 1 and only_the_kept
    assert kept_ticks == 4


# --------------------------------------------------------------------------- real time (the served run)


@vray.remote
class _Engine:
    """A sync actor (no ``async def``): in real time its calls run on a thread of its own."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []

    def work(self, n: int, gate: Any = None) -> int:
        import threading

        if gate is not None:
            assert gate.wait(30), "the caller never opened the gate"
        self.calls.append((n, threading.current_thread().name))
        return n

    def made(self) -> list[tuple[int, str]]:
        return list(self.calls)


@vray.remote
class _Manager:
    async def version(self) -> int:
        return 7


def test_real_time_a_sync_actors_calls_run_in_order_on_its_own_thread_while_the_caller_goes_on():
    import threading

    vray.reset(real_time=True)
    gate = threading.Event()

    async def main() -> tuple[list[int], list[tuple[int, str]], bool]:
        e = _Engine.remote()
        refs = [e.work.remote(n, gate) for n in range(3)]
        await asyncio.sleep(0)  # the constructor runs; the calls reach the actor's thread
        waiting = not any(r._done for r in refs)  # blocked on the gate there, not on this loop
        gate.set()
        return list(await asyncio.gather(*refs)), await e.made.remote(), waiting

    values, made, waiting = asyncio.run(main())
    assert waiting and values == [0, 1, 2]
    assert [n for n, _ in made] == [0, 1, 2]
    assert all(name.startswith("vray-_Engine") for _, name in made)


def test_real_time_a_call_from_another_thread_is_handed_to_the_loop_and_ray_get_blocks_that_thread():
    vray.reset(real_time=True)

    async def main() -> tuple[int, int]:
        m = _Manager.remote()
        assert await m.version.remote() == 7  # the loop is the home loop from here on
        blocked = await asyncio.to_thread(lambda: vray.get(m.version.remote()))

        def on_its_own_loop() -> int:  # e.g. Miles' background loop awaiting a ref
            async def inner() -> int:
                return await m.version.remote()

            return asyncio.run(inner())

        return blocked, await asyncio.to_thread(on_its_own_loop)

    assert asyncio.run(main()) == (7, 7)


def test_real_time_a_kill_fails_the_call_running_on_the_actors_thread_and_those_after_it():
    import threading

    vray.reset(real_time=True)
    gate = threading.Event()

    async def main() -> list[BaseException | int]:
        e = _Engine.remote()
        assert await e.made.remote() == []
        running, queued = e.work.remote(1, gate), e.work.remote(2)
        vray.kill_actor(e)
        gate.set()
        return list(await asyncio.gather(running, queued, e.work.remote(3), return_exceptions=True))

    out = asyncio.run(main())
    assert all(isinstance(x, ActorDiedError) for x in out), out


def test_real_time_creating_an_actor_from_another_thread_is_refused_by_name():
    vray.reset(real_time=True)

    async def main() -> None:
        await _Manager.remote().version.remote()
        await asyncio.to_thread(_Engine.remote)

    with pytest.raises(VRayError, match=r"_Engine.remote\(\) at .* from a thread other than the loop's"):
        asyncio.run(main())


def test_real_time_ray_get_and_wait_block_for_real_up_to_their_timeout():
    import threading

    vray.reset(real_time=True)
    gate = threading.Event()

    async def main() -> None:
        e = _Engine.remote()
        assert await e.made.remote() == []
        slow = e.work.remote(1, gate)
        with pytest.raises(GetTimeoutError):  # nothing can finish it in no time: the timeout is what happens
            vray.get(slow, timeout=0)
        assert vray.wait([slow], timeout=0) == ([], [slow])
        gate.set()
        # a call that ends on the actor's thread while the caller waits: the waits see it
        assert vray.get(slow, timeout=30) == 1
        fast = e.work.remote(2)
        assert vray.wait([fast], num_returns=1, timeout=30) == ([fast], [])
        assert await asyncio.to_thread(lambda: vray.get(e.work.remote(3), timeout=30)) == 3

    asyncio.run(main())
