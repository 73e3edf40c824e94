"""Throughput and liveness: bugs that lose no sample and break no bound, only time.

* ``one_step_overlap``: ``train_async.py`` launches the generate of rollout N+1 before it
  trains rollout N (``train_async.py:L79-L81``: "Start the next rollout early"), in
  one-step and fully-async runs alike. For every ``trained`` of rollout N with
  N + 1 < ``num_rollout``, a ``generate_start`` of rollout N+1 comes earlier in the trace.
  Holds on a prefix: the launch precedes the step it overlaps.

* ``no_idle_slot``: the fully-async worker keeps every submission slot busy
  (``fully_async_rollout.py:L128-L136``). One *scheduling step* of the worker is one turn
  of its loop: its wait returns the finished group tasks, it puts each into the buffer
  (a put may block while the buffer is full), then it pulls and submits new groups while
  the scheduler has room (``submission_scheduler.py``; G = ``--async-max-concurrent-samples``
  // n, or B), and waits again. Nothing in that turn after the wait yields to another
  task unless a put blocks, so it ends with no room left. In the trace a group counts
  against the budget from its ``taken`` until it is released: with group granularity
  when its put completes (``put_accepted`` / ``put_rejected``: the scheduler counts a
  finished task as pending until the worker's wait hands it back), with sample
  granularity at its ``group_done`` (the scheduler's sample counter drops in each
  sample's done callback, all of which run before the group task ends, so counting the
  whole group until then never counts fewer samples than the scheduler does: the check
  is sound, and lenient). No room means G groups counted. For two consecutive put
  completions p1, p2 where p2's group finished (``group_done``) after p1, p1 ended a
  scheduling step: between p1 and p2, G groups must have been counted at some point, or
  a slot stayed idle for a whole step. While the buffer is full the put has not
  completed, so a full buffer is never blamed; pauses for weight updates do not stop the
  worker; the data sources cycle their prompts (a source that ran dry would kill the
  worker at ``[prompt_group] = samples``); a dead worker makes no further puts.

* ``dead_worker_surfaces``: a dead fully-async worker fails the drain at once
  (``fully_async_rollout.py:L140-L159``: the drain waits on the buffer *and* the worker,
  and checks the worker first). The worker dies on the first group task that failed
  (``group_done`` with ``ok=False``: ``task.result()`` raises in its loop), once it has
  put the groups its wait returned before that one. The trace shows when that task
  failed, not the loop step in which the worker read it: a get the worker's last put woke
  may still complete in the same scheduling instant (virtual time), and the drain may end
  with it. After that instant the drain in progress (or the next to start) does not end
  (no ``drain_end``) and gets at most one group: the get it created before it saw the
  worker (upstream's ``asyncio.wait`` yields once even when the worker is already done,
  and a get on a non-empty buffer completes in that yield; the group is then dropped),
  and the run ends (``run_end``, or the
  trace's last event) within ``DEAD_WORKER_BOUND_S`` of the later of the death, that
  drain's start and the end of the training step or weight update in progress then (the
  driver reads the failed generate when that step is over). A run that ends earlier
  for another reason, or whose worker dies after the last drain, is not judged. Worker
  deaths are injected in simulated (virtual-time) runs only.
"""

from __future__ import annotations

from harness.checking.invariants.base import (
    Violation,
    invariant,
    is_fully_async,
    violation,
)
from harness.trace import Event
from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig

DEAD_WORKER_BOUND_S = 1.0  # seconds (virtual or real) from the point the drain must fail to the run's end
_PUT_DONE = (ev.PUT_ACCEPTED, ev.PUT_REJECTED)


def _async_driver(config: AsyncConfig) -> bool:
    return config.driver == "train_async"


@invariant("one_step_overlap", applies=_async_driver)
def check_one_step_overlap(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out = "one_step_overlap", []
    launched: set[int] = set()
    last_launch = 0
    for pos, e in enumerate(events):
        if e.kind == ev.GENERATE_START:
            launched.add(e["rollout_id"])
            last_launch = pos
        elif e.kind == ev.TRAINED:
            n = e["rollout_id"]
            if n + 1 < config.num_rollout and n + 1 not in launched:
                out.append(
                    violation(
                        name,
                        f"rollout {n} trained before the generate of rollout {n + 1} started: "
                        "train_async launches the next rollout before training (one step ahead)",
                        events,
                        pos,
                        context=events[last_launch : pos + 1][-40:],
                    )
                )
    return out


@invariant("no_idle_slot", applies=is_fully_async)
def check_no_idle_slot(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out = "no_idle_slot", []
    budget = config.group_budget
    release = ev.GROUP_DONE if config.resolved_rollout_submission_granularity == "sample" else None
    counted: set[int] = set()  # taken, not yet released
    done_at: dict[int, int] = {}  # group -> position of its latest group_done
    last_put: int | None = None  # position of the latest put completion
    peak = 0  # most groups counted since last_put
    for pos, e in enumerate(events):
        k = e.kind
        if k == ev.RUN_END:
            break
        if k == ev.TAKEN:
            counted.add(e["group_index"])
            peak = max(peak, len(counted))
        elif k == ev.GROUP_DONE:
            done_at[e["group_index"]] = pos
            if release is not None:
                counted.discard(e["group_index"])
        elif k in _PUT_DONE:
            gi = e["group_index"]
            if last_put is not None and done_at.get(gi, -1) > last_put and peak < budget:
                out.append(
                    violation(
                        name,
                        f"the worker's scheduling step that ended at its put #{events[last_put].seq} left "
                        f"{budget - peak} of G={budget} group slot(s) idle: at most {peak} groups were in flight "
                        f"before group {gi}, which finished after that put, was put "
                        f"({config.resolved_rollout_submission_granularity} granularity)",
                        events,
                        pos,
                        context=events[last_put : pos + 1][-40:],
                    )
                )
            counted.discard(gi)
            last_put, peak = pos, len(counted)
    return out


def _death(events: list[Event]) -> int | None:
    """Position from which the fully-async worker is dead, or ``None`` if it never died:
    the first failed ``group_done``, moved past the puts of groups that finished before
    it (the worker puts those of its wait's batch first). ``None`` too when the worker
    goes on putting groups that finished after the failure (it did not die)."""
    fail = next((p for p, e in enumerate(events) if e.kind == ev.GROUP_DONE and not e["ok"]), None)
    if fail is None:
        return None
    done_before = {e["group_index"] for e in events[:fail] if e.kind == ev.GROUP_DONE}
    point = fail
    for p in range(fail + 1, len(events)):
        e = events[p]
        if e.kind in _PUT_DONE:
            if e["group_index"] not in done_before:
                return None
            point = p
    return point


def _train_phase(e: Event) -> bool:
    return (
        e.kind in (ev.PHASE_START, ev.PHASE_END)
        and e.get("side") == "train"
        and e.get("phase") in ("training", "weight_sync")
    )


def _ready(events: list[Event], start: int) -> float:
    """When the driver reads the failed generate: the end of the training step or weight
    update in progress at ``start``, or else of the first one starting after it (the
    driver may enter its step just after launching the drain), or ``start``'s time."""
    open_phases: set[str] = set()
    for e in events[: start + 1]:
        if _train_phase(e):
            (open_phases.add if e.kind == ev.PHASE_START else open_phases.discard)(e["phase"])
    t = events[start].t
    for e in events[start + 1 :]:
        if not _train_phase(e):
            continue
        if e.kind == ev.PHASE_START and not open_phases:
            open_phases.add(e["phase"])
        elif e.kind == ev.PHASE_END and e["phase"] in open_phases:
            open_phases.discard(e["phase"])
            t = max(t, e.t)
            if not open_phases:
                break
    return t


@invariant("dead_worker_surfaces", applies=is_fully_async)
def check_dead_worker_surfaces(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name = "dead_worker_surfaces"
    out: list[Violation] = []
    end = next((p for p, e in enumerate(events) if e.kind == ev.RUN_END), len(events) - 1)
    death = _death(events[: end + 1])
    if death is None:
        return out
    draining = None  # position of the drain_start of the drain in progress at the death, or the next one
    for p in range(death, -1, -1):
        if events[p].kind == ev.DRAIN_END:
            break
        if events[p].kind == ev.DRAIN_START:
            draining = p
            break
    if draining is None:
        draining = next((p for p in range(death + 1, end + 1) if events[p].kind == ev.DRAIN_START), None)
    if draining is None:
        return out  # the worker died after the last drain: nothing waits on it
    surface, t_death = max(death, draining), events[death].t
    # the drain in progress may end in the death's own instant (the worker's last put woke
    # its get): then the next drain to start is the one that must see the dead worker
    ended = next(
        (p for p in range(surface + 1, end + 1) if events[p].t <= t_death and events[p].kind == ev.DRAIN_END), None
    )
    if ended is not None:
        surface = next((p for p in range(ended + 1, end + 1) if events[p].kind == ev.DRAIN_START), -1)
        if surface < 0:
            return out  # that was the last drain: nothing waits on the worker
    gots = 0
    for p in range(surface + 1, end + 1):
        e = events[p]
        if e.t <= t_death or e.kind not in (ev.DRAIN_END, ev.GOT):
            continue
        gots += e.kind == ev.GOT
        if e.kind == ev.DRAIN_END or gots > 1:
            what = "ended" if e.kind == ev.DRAIN_END else f"got a second group ({e['group_index']}) from the buffer"
            out.append(
                violation(
                    name,
                    f"the drain {what} after the rollout worker died (at event "
                    f"#{events[death].seq}, t={t_death:g}s): a dead worker must fail the drain at once, "
                    "not after its backlog",
                    events,
                    p,
                    context=events[death : p + 1][-40:],
                )
            )
            return out
    limit = _ready(events, surface) + DEAD_WORKER_BOUND_S
    if events[end].t > limit:
        out.append(
            violation(
                name,
                f"the run ended at t={events[end].t:g}s, {events[end].t - limit + DEAD_WORKER_BOUND_S:g}s "
                f"after the drain could have seen the dead worker (bound {DEAD_WORKER_BOUND_S:g}s): the "
                "drain kept waiting on a worker that had died",
                events,
                end,
                context=events[death : end + 1][-40:],
            )
        )
    return out
