"""Where upstream Miles holds each group it took, as a pure state machine.

Conservation (every taken group is trained, dropped, rejected or recycled) is checked on
the trace; this machine is how a host of upstream's code (``harness.upstream.host``) knows
which groups are still *pending* at the run's end and which upstream *lost* (held by
nothing: a dropped group task, a group its worker never put). The host feeds it what it
observes upstream do; the machine does no I/O and knows nothing of asyncio: a group task is
an opaque key, whether it has finished is passed in (``unaccounted``), and ``now`` (the
host's clock) only dates the messages.

A group is *live* from ``taken`` until it is ``trained`` (returned by a rollout for
training) or ``dropped``; ``recycled`` keeps it live, back in the data source. While live,
upstream holds it in one of: the data source or the fully-async buffer (``queued``, which
the host reads from upstream's objects), a group task (from its creation,
``task_created``: ``fully_async_rollout.py:L133`` creates one right after a put, and a
drain can return before it first runs), the worker's hands between a wait that returned
its task (``worker_woke``) and its ``put_started``, a publish task the worker handed it to
(``publish_created`` .. ``put_started``: the two-wave worker of the controller-executor
trees puts each finished group from a task of its own, ``fully_async_rollout.py:L173``,
``:L209-L210`` of the refactor's tip, and waits on it with its group tasks), or a put in
progress (``put_started`` .. ``put_ended``). A live group in none of them is declared lost with
why; a lost group seen again (``seen``) proves the accounting missed a holder, recorded in
``problems`` (the host raises ``RunnerAccountingError`` for them after the run).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable
from typing import Generic, TypeVar

LIVE = "live"
RECYCLED = "recycled"

TaskT = TypeVar("TaskT", bound=Hashable)  # a group task as the host knows it (an asyncio.Task)


class GroupAccounting(Generic[TaskT]):
    """One run's accounting. ``fully_async``: the fully-async worker holds a group task
    until a wait of its returns it (``fully_async_rollout.py:L132-L136``); otherwise
    (one-step, sync) a group task holds its group until it finishes."""

    def __init__(self, *, fully_async: bool) -> None:
        self.fully_async = fully_async
        self.live: dict[int, str] = {}  # group index -> LIVE | RECYCLED
        self.task_group: dict[TaskT, int] = {}  # group task -> its group
        self.returned_tasks: set[TaskT] = set()  # returned by a wait of the worker
        self.held: set[int] = set()  # returned by the worker's wait, not yet put
        self.publishing: dict[TaskT, int] = {}  # publish task -> its group, until its put starts
        self.putting: set[int] = set()  # inside a put
        self.lost: set[int] = set()  # live, but held by nothing: never listed as pending
        self.lost_why: dict[int, str] = {}  # group -> when and why it was declared lost
        self.problems: list[str] = []  # a lost group seen again

    # --- a group's life ----------------------------------------------------------------
    def taken(self, gi: int, now: float) -> None:
        """``get_samples`` handed ``gi`` out (fresh, or recycled before)."""
        self.seen(gi, "taken from the data source", now)
        self.live[gi] = LIVE

    def recycled(self, gi: int, now: float) -> None:
        """``add_samples`` put ``gi`` back into the data source: still live."""
        self.seen(gi, "recycled to the data source", now)
        self.live[gi] = RECYCLED

    def dropped(self, gi: int) -> None:
        """Upstream discarded ``gi`` (the drop handler, a dynamic-filter reject, a group the
        one-step rollout did not return): no longer live."""
        self.live.pop(gi, None)

    def trained(self, gis: Iterable[int], rollout_id: int, now: float) -> None:
        """A rollout returned ``gis`` for training: no longer live."""
        gis = sorted(set(gis))
        for gi in gis:
            self.seen(gi, f"returned by rollout {rollout_id} for training", now)
        for gi in gis:
            self.live.pop(gi, None)

    def not_returned(self, taken: Iterable[int], returned: Collection[int], running: Collection[int]) -> list[int]:
        """The one-step rollout's end: of the groups it ``taken``, those it did not return,
        whose group task no longer runs and that were not recycled are discarded by design
        (failed groups, the pending ones at the abort without ``--partial-rollout``,
        finished ones beyond the batch). Returns them, in ``taken`` order, as dropped."""
        out = []
        for gi in taken:
            if gi not in returned and gi not in running and self.live.get(gi) == LIVE:
                self.live.pop(gi)
                out.append(gi)
        return out

    # --- where upstream holds it ---------------------------------------------------------
    def task_created(self, task: TaskT, gi: int, now: float) -> None:
        """``task`` holds ``gi`` from its creation, not from its first step."""
        self.seen(gi, "a group task was created for it", now)
        self.task_group[task] = gi

    def task_started(self, task: TaskT, gi: int) -> None:
        """A group task's first step: it holds ``gi`` (already known when the host saw it
        created). No sighting: a task the worker forgot still runs."""
        self.task_group[task] = gi

    def worker_waits(self, pendings: Collection[TaskT], now: float) -> None:
        """The fully-async worker is back at its wait: every group its last wait returned
        must have gone to ``put`` (``fully_async_rollout.py:L134-L136``) or, on the two-wave
        worker, to a publish task (L164-L173 of the refactor's tip); every group task it
        created and was not handed back must be among ``pendings`` (its ``active`` set,
        L132-L134), and so must every publish task whose put has not started (the tip's
        ``_publishing``, L159): a task it forgot is a group lost."""
        self._declare_lost(self.held, "returned by the worker's wait and not put before its next wait", now)
        self.held = set()
        forgotten = {gi for t, gi in self.task_group.items() if t not in pendings and t not in self.returned_tasks}
        self._declare_lost(forgotten, "its group task is not among those the worker waits on", now)
        unpublished = {gi for t, gi in self.publishing.items() if t not in pendings}
        self._declare_lost(
            unpublished, "its publish task, its put not begun, is not among those the worker waits on", now
        )
        self.publishing = {t: gi for t, gi in self.publishing.items() if t in pendings}

    def worker_woke(self, done: Iterable[TaskT], now: float) -> None:
        """A wait of the worker returned ``done``: their groups are in its hands."""
        for task in done:
            self.returned_tasks.add(task)
            gi = self.task_group.get(task)
            if gi is not None:
                self.seen(gi, "the worker's wait returned its group task", now)
                self.held.add(gi)

    def publish_created(self, task: TaskT, gi: int, now: float) -> None:
        """The two-wave worker handed ``gi`` to ``task``, a publish task that puts it
        (``_submit_publish(task.result())``, ``fully_async_rollout.py:L173``, ``:L209-L210``
        of the refactor's tip): the task holds it from its creation until its put starts.
        The worker read the group task's result, so that task is in its hands (the wait
        that returned it may be one the host does not follow, L160-L161)."""
        self.seen(gi, "handed to a publish task", now)
        self.returned_tasks |= {t for t, g in self.task_group.items() if g == gi}
        self.held.discard(gi)
        self.publishing[task] = gi

    def put_started(self, gi: int, now: float) -> None:
        self.seen(gi, "put to the buffer", now)
        self.held.discard(gi)
        self.publishing = {t: g for t, g in self.publishing.items() if g != gi}
        self.putting.add(gi)

    def put_ended(self, gi: int) -> None:
        self.putting.discard(gi)

    # --- the accounting after a rollout ---------------------------------------------------
    def holders(self, queued: set[int], finished: Collection[TaskT]) -> set[int]:
        """The groups upstream holds now: ``queued`` in its data source or buffer, in a
        group task the fully-async worker has not been handed yet (created, running, or
        ``finished`` since its last wake-up) or, one-step, not yet ``finished``, handed to
        the worker and not yet put, in a publish task whose put has not started, or inside
        a put."""
        out = set(queued)
        if self.fully_async:
            out |= {gi for t, gi in self.task_group.items() if t not in self.returned_tasks}
        else:
            out |= self.running(finished)
        return out | self.held | set(self.publishing.values()) | self.putting

    def unaccounted(self, queued: set[int], finished: Collection[TaskT], now: float) -> set[int]:
        """Conservation after a rollout: a live group upstream no longer holds is lost
        (returned; left out of ``pending``, so the conservation checker reports it). A lost
        group ``queued`` again is a sighting (``problems``)."""
        for gi in self.lost & queued:
            self.seen(gi, "queued in the data source or the buffer", now)
        missing = {gi for gi in self.live if gi not in self.lost} - self.holders(queued, finished)
        self._declare_lost(missing, "held by nothing after a rollout", now)
        return missing

    def running(self, finished: Collection[TaskT]) -> set[int]:
        """The groups whose task has not ``finished``."""
        return {gi for t, gi in self.task_group.items() if t not in finished}

    def pending(self) -> list[int]:
        """The live groups not lost: what ``run_end`` lists as still pending."""
        return sorted(gi for gi in self.live if gi not in self.lost)

    # --- the accounting's self-check: a lost group is gone for good --------------------
    def _declare_lost(self, groups: set[int], why: str, now: float) -> None:
        for gi in groups - self.lost:
            self.lost_why[gi] = f"t={now:g}: {why}"
        self.lost |= groups

    def seen(self, gi: int, where: str, now: float) -> None:
        """``gi`` is in upstream's hands (``where``). If it was declared lost, the
        declaration was wrong (a group held by nothing cannot come back): recorded in
        ``problems``, not raised (the caller is upstream's code, which may catch it)."""
        if gi in self.lost:
            self.problems.append(
                f"group {gi} declared lost ({self.lost_why.get(gi, '?')}) and then at t={now:g}: {where}"
            )

    def take_problems(self) -> list[str]:
        """The problems so far, and none after."""
        out, self.problems = self.problems, []
        return out


__all__ = ["LIVE", "RECYCLED", "GroupAccounting"]
