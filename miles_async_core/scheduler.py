"""Submission schedulers (`miles/rollout/submission_scheduler.py`).

``GroupLevelSubmission``: ``has_capacity <=> pending_groups < group_budget``.
``SampleBackfillSubmission(n)``: counts samples in flight; admits a new group iff
``samples_in_flight + n <= group_budget * n``; with no pending group it resets a
non-zero count to 0 (upstream's self-healing).

The schedulers are pure state machines (they own no task). ``Progress`` replaces
``asyncio.wait(FIRST_COMPLETED)`` over every active task with an O(1) completion
queue: group tasks and sample completions both signal it, and
``wait_for_progress`` returns ``(done, pending)`` with ``done ∪ pending`` equal to the
active set and never an internal waiter. It may return an empty
``done`` when only samples finished, as upstream does. A sample completion wakes the
waiter two loop hops later, as upstream's Event -> waiter task -> ``asyncio.wait``
relay does (``submission_scheduler.py:L57-L63``), so a group whose last sample just
finished is in the same ``done`` and is put before anything is submitted again.

``done`` is what has finished when the waiter resumes, as ``asyncio.wait``'s (it collects
``f.done()`` after its waiter wakes, `asyncio/tasks.py` ``_wait``): a task whose body
ended after the task that woke the waiter but before the waiter runs is in it, though its
done-callback has not run yet. A group task reports its end from its own last step
(``ended``, through ``rollout.submit_group``); its done-callback, a step later, would miss
it (a group whose request failed would come out two steps behind a finished group).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

logger = logging.getLogger(__name__)


class GroupLevelSubmission:
    granularity = "group"
    sample_done_callback: Callable[..., Any] | None = None

    def has_capacity(self, *, pending_groups: int, group_budget: int) -> bool:
        return pending_groups < group_budget

    def on_submit(self, groups: list[list[Any]]) -> None:
        return None


class SampleBackfillSubmission:
    granularity = "sample"

    def __init__(self, n_samples_per_prompt: int) -> None:
        self.n = n_samples_per_prompt
        self.samples_in_flight = 0
        self.progress: Progress | None = None  # set by Progress so sample completions wake waiters

    def has_capacity(self, *, pending_groups: int, group_budget: int) -> bool:
        if pending_groups == 0 and self.samples_in_flight != 0:
            logger.warning("samples_in_flight=%d with no pending groups; resetting to 0", self.samples_in_flight)
            self.samples_in_flight = 0
        if self.samples_in_flight + self.n <= group_budget * self.n:
            return True
        if self.progress is not None:
            self.progress.sample_signal = False  # only later completions wake the waiter
        return False

    def on_submit(self, groups: list[list[Any]]) -> None:
        self.samples_in_flight += sum(map(len, groups))

    def sample_done_callback(self, _fut: Any = None) -> None:
        self.samples_in_flight -= 1
        if self.progress is not None:
            self.progress.signal_sample()


def make_submission_scheduler(
    granularity: str | None, n: int, *, default: str
) -> GroupLevelSubmission | SampleBackfillSubmission:
    g = granularity or default
    if g == "group":
        return GroupLevelSubmission()
    assert g == "sample", f"unknown submission granularity: {g}"
    return SampleBackfillSubmission(n)


class Progress:
    """Completion queue for group tasks plus the sample-level wake-up of a scheduler."""

    def __init__(self, scheduler: Any) -> None:
        self._done: list[asyncio.Future[Any]] = []  # their done-callback ran
        self._ended: list[asyncio.Future[Any]] = []  # their body ended (``ended``), callback maybe not yet
        self._returned_early: set[asyncio.Future[Any]] = set()  # returned before their done-callback ran
        self._waiter: asyncio.Future[Any] | None = None
        self.sample_signal = False
        self._relay = False
        if isinstance(scheduler, SampleBackfillSubmission):
            scheduler.progress = self

    def track(self, task: asyncio.Future[Any]) -> None:
        task.add_done_callback(self._on_task_done)

    def ended(self, task: asyncio.Future[Any]) -> None:
        """``task``'s body is ending: it is done in this loop step, before any waiter runs."""
        self._ended.append(task)

    def _on_task_done(self, task: asyncio.Future[Any]) -> None:
        if task in self._returned_early:
            # already returned as done: asyncio.wait removed its callback (a no-op) too
            self._returned_early.discard(task)
            return
        self._done.append(task)
        self._wake()

    def signal_sample(self) -> None:
        self.sample_signal = True
        waiter = self._waiter
        if waiter is not None and not self._relay and not waiter.done():
            # upstream's sample credit reaches the worker through an Event, the task
            # waiting on it and asyncio.wait's completion callback: two loop hops after
            # this callback, the same as a finished group's task completion, so both land
            # in one wake-up (submission_scheduler.py:L57-L63)
            self._relay = True
            waiter.get_loop().call_soon(self._relay_hop, waiter)  # the running loop, without its lookup

    def _relay_hop(self, waiter: asyncio.Future[Any]) -> None:
        waiter.get_loop().call_soon(self._relay_wake, waiter)

    def _relay_wake(self, waiter: asyncio.Future[Any]) -> None:
        self._relay = False
        if not waiter.done():
            waiter.set_result(None)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait_for_progress(self, active: set[Any]) -> tuple[set[Any], set[Any]]:
        if not self._done and not self.sample_signal:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self.sample_signal = False
        done = {t for t in self._done if t in active}
        if self._ended:
            early = {t for t in self._ended if t in active and t not in done}
            self._returned_early |= early
            done |= early
            self._ended = []
        self._done = []
        active.difference_update(done)
        return done, active
