"""The fully-async data buffer as seen in the trace (upstream's `fully_async_data_buffer.py`).

Reconstructs the queue from ``put_accepted`` (+1), ``got`` and ``stale_rejected`` (-1)
and checks it against every reported ``queue_size`` and the capacity
``C = int(factor * B)``; checks FIFO order, the fate of aborted and dynamic-filter
rejects, and that every stale reject goes to the unused handler exactly once.
"""

from __future__ import annotations

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from harness.checking.invariants.base import Violation, invariant, is_fully_async, lifecycle, violation, walk_groups
from harness.trace import Event


@invariant("buffer_capacity", applies=is_fully_async)
def check_buffer_capacity(events: list[Event], config: AsyncConfig) -> list[Violation]:
    """Queue size never above C, put_blocked only at C, reported sizes match the trace."""
    name, cap, size, out = "buffer_capacity", config.capacity, 0, []
    for pos, e in enumerate(events):
        if e.kind == ev.PUT_ACCEPTED:
            size += 1
        elif e.kind in (ev.GOT, ev.STALE_REJECTED):
            size -= 1
        elif e.kind == ev.PUT_BLOCKED and e["queue_size"] != cap:
            out.append(violation(name, f"put_blocked at queue_size={e['queue_size']}, capacity is {cap}", events, pos))
            continue
        else:
            continue
        if size > cap or size < 0:
            out.append(violation(name, f"queue holds {size} groups after {e.kind}; capacity is {cap}", events, pos))
        reported = e.fields.get("queue_size")
        if reported is not None and reported != size:
            out.append(violation(name, f"{e.kind} reports queue_size={reported}, the trace says {size}", events, pos))
    return out


@invariant("buffer_fifo", applies=is_fully_async)
def check_buffer_fifo(events: list[Event], config: AsyncConfig) -> list[Violation]:
    """Groups leave the buffer (returned or stale-rejected) in the order they were accepted."""
    queue: list[int] = []
    out = []
    for pos, e in enumerate(events):
        if e.kind == ev.PUT_ACCEPTED:
            queue.append(e["group_index"])
        elif e.kind in (ev.GOT, ev.STALE_REJECTED):
            gi = e["group_index"]
            if not queue or queue[0] != gi:
                out.append(
                    violation(
                        "buffer_fifo",
                        f"{e.kind} group {gi}, but the oldest accepted group is "
                        f"{queue[0] if queue else None} (queue {queue[:8]})",
                        events,
                        pos,
                    )
                )
            if gi in queue:
                queue.remove(gi)
    return out


def _handler_calls_until_retake(events: list[Event], pos: int, gi: int) -> list[Event]:
    calls = []
    for e in events[pos + 1 :]:
        if e.kind == ev.TAKEN and e["group_index"] == gi:
            break
        if e.kind == ev.HANDLER and e["group_index"] == gi:
            calls.append(e)
    return calls


@invariant("aborted_never_stored", applies=is_fully_async)
def check_aborted_never_stored(events: list[Event], config: AsyncConfig) -> list[Violation]:
    """A group with an ABORTED sample is rejected, never stored, and handed to the handler once."""
    name, out = "aborted_never_stored", []
    for pos, e, members, finished in walk_groups(events):
        if e.kind in (ev.PUT_ACCEPTED, ev.PUT_REJECTED):
            gi = e["group_index"]
            aborted = [i for i in members.get(gi, ()) if i in finished and finished[i]["status"] == "aborted"]
            if e.kind == ev.PUT_ACCEPTED and aborted:
                out.append(
                    violation(
                        name,
                        f"group {gi} stored with ABORTED samples {aborted}",
                        events,
                        pos,
                        context=lifecycle(events, gi, pos),
                    )
                )
            if e.kind == ev.PUT_REJECTED and e["reason"] == "aborted":
                if not aborted:
                    out.append(
                        violation(
                            name,
                            f"group {gi} rejected as aborted but no sample is ABORTED",
                            events,
                            pos,
                            context=lifecycle(events, gi, pos),
                        )
                    )
                calls = _handler_calls_until_retake(events, pos, gi)
                if len(calls) != 1 or calls[0]["cause"] != "aborted":
                    out.append(
                        violation(
                            name,
                            f"aborted group {gi} reached the unused handler {len(calls)} times "
                            f"(causes {[c['cause'] for c in calls]}), expected once with cause=aborted",
                            events,
                            pos,
                            context=lifecycle(events, gi),
                        )
                    )
    return out


@invariant("filter_rejects_not_handled", applies=is_fully_async)
def check_filter_rejects_not_handled(events: list[Event], config: AsyncConfig) -> list[Violation]:
    """A dynamic-filter reject is never stored and never handed to the unused handler."""
    out = []
    for pos, e in enumerate(events):
        if e.kind == ev.PUT_REJECTED and str(e["reason"]).startswith("dynamic_filter"):
            gi = e["group_index"]
            calls = _handler_calls_until_retake(events, pos, gi)
            stored = [x for x in events[pos + 1 :] if x.kind == ev.PUT_ACCEPTED and x["group_index"] == gi]
            if calls or stored:
                out.append(
                    violation(
                        "filter_rejects_not_handled",
                        f"dynamic-filter reject of group {gi} was {'handed to the handler' if calls else 'stored'}",
                        events,
                        pos,
                        context=lifecycle(events, gi),
                    )
                )
    return out


@invariant("stale_rejects_handled", applies=is_fully_async)
def check_stale_rejects_handled(events: list[Event], config: AsyncConfig) -> list[Violation]:
    """Every stale reject exceeds the bound and reaches the handler exactly once; the
    handler's decision is carried out (drop -> dropped, retry -> recycled or retry_cap)."""
    name, out, s_max = "stale_rejects_handled", [], config.max_weight_staleness
    for pos, e in enumerate(events):
        if e.kind == ev.STALE_REJECTED:
            gi = e["group_index"]
            if s_max is None or e["staleness"] is None or e["staleness"] <= s_max:
                out.append(
                    violation(
                        name,
                        f"group {gi} rejected as stale with staleness={e['staleness']} (max_weight_staleness={s_max})",
                        events,
                        pos,
                    )
                )
            calls = _handler_calls_until_retake(events, pos, gi)
            if len(calls) != 1 or calls[0]["cause"] != "stale":
                out.append(
                    violation(
                        name,
                        f"stale group {gi} reached the unused handler {len(calls)} times "
                        f"(causes {[c['cause'] for c in calls]}), expected once with cause=stale",
                        events,
                        pos,
                        context=lifecycle(events, gi),
                    )
                )
        elif e.kind == ev.HANDLER:
            gi = e["group_index"]
            follow = next(
                (x for x in events[pos + 1 :] if x.kind in (ev.DROPPED, ev.RECYCLED) and x["group_index"] == gi), None
            )
            if follow is None:
                ok = False
            elif e["handler"] == "drop":
                ok = follow.kind == ev.DROPPED and follow["reason"].startswith("handler_drop")
            else:
                ok = follow.kind == ev.RECYCLED or follow["reason"].startswith("retry_cap")
            if not ok:
                out.append(
                    violation(
                        name,
                        f"handler={e['handler']} for group {gi} was followed by {follow.kind if follow else 'nothing'}",
                        events,
                        pos,
                        context=lifecycle(events, gi),
                    )
                )
    return out


@invariant("drain_shape", applies=is_fully_async)
def check_drain_shape(events: list[Event], config: AsyncConfig) -> list[Violation]:
    """A drain returns exactly B groups, all read with the drain's single current_version,
    and ends with one metrics report."""
    name, out = "drain_shape", []
    start: Event | None = None
    got = 0
    for pos, e in enumerate(events):
        if e.kind == ev.DRAIN_START:
            start, got = e, 0
        elif e.kind in (ev.GOT, ev.STALE_REJECTED):
            if start is None:
                out.append(violation(name, f"{e.kind} outside a drain", events, pos))
                continue
            if e["current_version"] != start["current_version"]:
                out.append(
                    violation(
                        name,
                        f"{e.kind} of group {e['group_index']} used current_version="
                        f"{e['current_version']}, the drain started with {start['current_version']}",
                        events,
                        pos,
                    )
                )
            got += e.kind == ev.GOT
        elif e.kind == ev.DRAIN_END:
            if got != config.rollout_batch_size:
                out.append(
                    violation(
                        name,
                        f"drain rollout_id={e['rollout_id']} returned {got} groups, "
                        f"expected B={config.rollout_batch_size}",
                        events,
                        pos,
                    )
                )
            start = None
    return out
