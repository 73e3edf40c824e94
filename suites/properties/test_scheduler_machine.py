"""Submission schedulers and ``Progress`` under random completions (upstream's
``submission_scheduler.py``).

A state machine plays the rollout worker's part: it asks ``has_capacity`` with the
driver's pending count and a budget, submits groups through the real
``generate_and_rm_group`` (each sample a future the machine resolves, fails or
cancels), and waits with ``Progress.wait_for_progress``. A shadow count of samples in
flight is kept from the machine's own completion callbacks, independently of the
scheduler's ``sample_done_callback``.
"""

from __future__ import annotations

import asyncio

import pytest

import hypothesis.strategies as st
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from harness.sim.vtime import VirtualTimeLoop
from miles_async_core.rollout import generate_and_rm_group
from miles_async_core.scheduler import (
    GroupLevelSubmission,
    Progress,
    SampleBackfillSubmission,
    make_submission_scheduler,
)
from miles_async_core.types import Sample, SamplingParams, Status


def run_until_quiet(loop: asyncio.AbstractEventLoop) -> None:
    for _ in range(10_000):
        loop.call_soon(loop.stop)
        loop.run_forever()
        if not loop._ready:  # noqa: SLF001 - asyncio's ready queue is the quiescence signal
            return
    raise AssertionError("the loop never went quiet")


class FutureEngine:
    """``generate`` returns a future the machine settles; counts every sample completion."""

    def __init__(self, machine: SchedulerMachine) -> None:
        self.machine = machine

    def generate(self, sample: Sample, sampling: SamplingParams) -> asyncio.Future:
        fut = self.machine.loop.create_future()
        fut.sample = sample  # type: ignore[attr-defined]
        fut.add_done_callback(self.machine.on_sample_done)
        self.machine.sample_futures.append(fut)
        return fut


class SchedulerMachine(RuleBasedStateMachine):
    make_scheduler = staticmethod(make_submission_scheduler)
    make_progress = Progress

    @initialize(granularity=st.sampled_from(["group", "sample"]), n_samples_per_prompt=st.integers(1, 4))
    def init_scheduler(self, granularity: str, n_samples_per_prompt: int) -> None:
        self.loop = VirtualTimeLoop()
        self.n = n_samples_per_prompt
        self.scheduler = self.make_scheduler(granularity, self.n, default="group")
        self.backfill = isinstance(self.scheduler, SampleBackfillSubmission)
        self.progress = self.make_progress(self.scheduler)
        self.engine = FutureEngine(self)
        self.active: set[asyncio.Task] = set()  # the driver's pending group tasks
        self.sample_futures: list[asyncio.Future] = []
        self.group_futures: dict[asyncio.Task, list[asyncio.Future]] = {}
        self.submitted = self.completed = self.leaked = 0
        self.next_index = 0
        self.wait_task: asyncio.Task | None = None
        self.wait_input: frozenset = frozenset()
        self.sample_signal = False  # shadow of "a sample finished since the waiter was armed"

    def teardown(self) -> None:
        if not hasattr(self, "loop"):
            return
        for t in [*self.active, *([self.wait_task] if self.wait_task else [])]:
            t.cancel()
        for f in self.sample_futures:
            f.cancel()
        run_until_quiet(self.loop)
        self.loop.close()

    def on_sample_done(self, fut: asyncio.Future) -> None:
        self.completed += 1
        if self.backfill:
            self.sample_signal = True

    # -- rules -----------------------------------------------------------------------------------

    @precondition(lambda self: self.wait_task is None)
    @rule(group_budget=st.integers(1, 4))
    def submit_while_capacity(self, group_budget: int) -> None:
        pending = len(self.active)
        if self.backfill and pending == 0:
            self.leaked = 0  # with nothing pending the count resyncs to 0 first
        expected = (
            self.submitted - self.completed + self.leaked + self.n <= group_budget * self.n
            if self.backfill
            else pending < group_budget
        )
        got = self.scheduler.has_capacity(pending_groups=pending, group_budget=group_budget)
        assert got == expected, (
            f"has_capacity(pending_groups={pending}, group_budget={group_budget}) = {got}; "
            f"expected {expected} (samples_in_flight={getattr(self.scheduler, 'samples_in_flight', None)})"
        )
        if not got:
            if self.backfill:
                self.sample_signal = False  # only later completions wake the waiter
            return
        group = [
            Sample(index=self.next_index + i, group_index=self.next_index, status=Status.PENDING) for i in range(self.n)
        ]
        self.next_index += self.n
        self.scheduler.on_submit([group])
        self.submitted += self.n
        before = len(self.sample_futures)
        task = self.loop.create_task(
            generate_and_rm_group(
                self.engine, group, SamplingParams(), sample_done_callback=self.scheduler.sample_done_callback
            )
        )
        self.progress.track(task)
        self.active.add(task)
        run_until_quiet(self.loop)
        self.group_futures[task] = self.sample_futures[before:]
        if self.backfill:  # never past the budget after a granted submission
            assert self.scheduler.samples_in_flight <= group_budget * self.n, (
                f"samples_in_flight {self.scheduler.samples_in_flight} > budget {group_budget} x n {self.n}"
            )

    @precondition(lambda self: any(not f.done() for f in self.sample_futures))
    @rule(pick=st.integers(0, 15), outcome=st.sampled_from(["ok", "error", "cancel"]))
    def finish_sample(self, pick: int, outcome: str) -> None:
        live = [f for f in self.sample_futures if not f.done()]
        fut = live[pick % len(live)]
        if outcome == "ok":
            fut.sample.status = Status.COMPLETED
            fut.set_result(fut.sample)
        elif outcome == "error":
            fut.set_exception(RuntimeError("engine error"))
        else:
            fut.cancel()
        run_until_quiet(self.loop)

    @precondition(lambda self: any(not t.done() for t in self.group_futures))
    @rule(pick=st.integers(0, 15))
    def finish_group(self, pick: int) -> None:
        live = [t for t in self.group_futures if not t.done()]
        for fut in self.group_futures[live[pick % len(live)]]:
            if not fut.done():
                fut.set_result(fut.sample)
        run_until_quiet(self.loop)

    @precondition(lambda self: self.wait_task is None)
    @rule()
    def wait_for_progress(self) -> None:
        self.wait_input = frozenset(self.active)
        self.wait_task = self.loop.create_task(self.progress.wait_for_progress(self.active))
        run_until_quiet(self.loop)

    @precondition(lambda self: self.wait_task is not None and not self.wait_task.done())
    @rule()
    def cancel_wait(self) -> None:
        # A driver torn down mid-wait: the waiter must not outlive the cancelled call.
        self.wait_task.cancel()
        run_until_quiet(self.loop)
        assert self.wait_task.cancelled()
        assert self.progress._waiter is None, "a cancelled wait_for_progress left its waiter armed"  # noqa: SLF001
        self.active = set(self.wait_input)  # a cancelled wait returns nothing; the driver's set is unchanged
        self.wait_task = None

    @precondition(lambda self: self.backfill)
    @rule(credits=st.integers(1, 3))
    def orphan_credits(self, credits: int) -> None:
        # Upstream's self-healing case: credits whose callback never came (a lost task).
        self.scheduler.samples_in_flight += credits
        self.leaked += credits

    # -- invariants ----------------------------------------------------------------------------------

    @invariant()
    def group_level_counts_groups_and_has_no_callback(self) -> None:
        if hasattr(self, "scheduler") and isinstance(self.scheduler, GroupLevelSubmission):
            assert self.scheduler.sample_done_callback is None

    @invariant()
    def samples_in_flight_is_submitted_minus_completed(self) -> None:
        if getattr(self, "backfill", False):
            sif = self.scheduler.samples_in_flight
            assert sif == self.submitted - self.completed + self.leaked, (
                f"samples_in_flight={sif}, submitted {self.submitted}, completed {self.completed}, "
                f"orphaned {self.leaked}"
            )
            assert sif >= 0

    @invariant()
    def a_finished_group_has_every_sample_done(self) -> None:
        for task, futs in getattr(self, "group_futures", {}).items():
            if task.done():
                assert all(f.done() for f in futs), "generate_and_rm_group finished with a sample still running"
                if not task.cancelled() and task.exception() is None:
                    assert all(not f.cancelled() and f.exception() is None for f in futs)

    @invariant()
    def wait_for_progress_returns_its_input_split_and_only_when_something_happened(self) -> None:
        if getattr(self, "wait_task", None) is None:
            return
        if not self.wait_task.done():
            finished = [t for t in self.wait_input if t.done()]
            assert not finished, f"wait_for_progress still waits although {len(finished)} group task(s) finished"
            assert not self.sample_signal, "wait_for_progress still waits although a sample finished"
            return
        done, pending = self.wait_task.result()
        assert done | pending == self.wait_input, "done ∪ pending differs from the input set"
        assert not done & pending
        assert all(t in self.wait_input for t in done | pending), "an internal waiter leaked out"
        assert all(t.done() for t in done)
        assert done or self.backfill, "group-level progress returned with nothing done"
        for t in done:
            if not t.cancelled():
                t.exception()  # retrieved: a failed group is the driver's to log
        self.active = pending
        self.wait_task = None
        self.sample_signal = False


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_backfill_resets_orphaned_credits_only_when_nothing_is_pending():
    s = SampleBackfillSubmission(2)
    s.samples_in_flight = 3
    assert s.has_capacity(pending_groups=1, group_budget=2) is False  # 3 + 2 > 4: kept while pending
    assert s.samples_in_flight == 3
    assert s.has_capacity(pending_groups=0, group_budget=2) is True
    assert s.samples_in_flight == 0


# ---- the machine fails on wrong schedulers -----------------------------------------------------


class NoResync(SampleBackfillSubmission):
    def has_capacity(self, *, pending_groups: int, group_budget: int) -> bool:
        return self.samples_in_flight + self.n <= group_budget * self.n


class StrictBudget(SampleBackfillSubmission):
    def has_capacity(self, *, pending_groups: int, group_budget: int) -> bool:
        if pending_groups == 0:
            self.samples_in_flight = 0
        return self.samples_in_flight + self.n < group_budget * self.n


class SampleCompletionsDoNotWake(Progress):
    def signal_sample(self) -> None:
        self.sample_signal = True  # forgets _wake(): a waiter sleeps through sample completions


def _backfill(cls):
    return lambda granularity, n, *, default: cls(n)


@pytest.mark.parametrize(
    "scheduler, progress, message",
    [
        (_backfill(NoResync), Progress, "has_capacity"),
        (_backfill(StrictBudget), Progress, "has_capacity"),
        (_backfill(SampleBackfillSubmission), SampleCompletionsDoNotWake, "a sample finished"),
    ],
    ids=["no-resync", "strict-budget", "sample-completions-do-not-wake"],
)
def test_scheduler_machine_catches_a_wrong_scheduler(scheduler, progress, message):
    machine = type(
        "SchedulerMachine", (SchedulerMachine,), {"make_scheduler": staticmethod(scheduler), "make_progress": progress}
    )
    with pytest.raises(AssertionError, match=message):
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=200,
                derandomize=True,
                database=None,
                deadline=None,
                report_multiple_bugs=False,
                phases=[Phase.generate, Phase.shrink],
            ),
        )
