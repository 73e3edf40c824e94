"""Drain metrics against the trace (`fully_async_data_buffer.py`
``get_metrics`` and this core's handler counters).

The window of drain ``M`` is every event after the previous ``drain_end`` up to this
drain's ``drain_end``. In it: ``aborted_groups_filtered`` = ``put_rejected`` with
reason ``aborted``; ``stale_groups_filtered`` = ``stale_rejected``; ``avg/max_staleness``
over the non-None staleness of every group popped (``got`` and ``stale_rejected``,
as upstream's code computes them and `buffer.py` decides), absent when none; ``queue_size`` = the queue the trace
holds at the drain's end; ``handler_dropped`` / ``handler_retried`` / ``handler_retry_cap``
= ``dropped(handler_drop:*)`` / ``recycled`` / ``dropped(retry_cap:*)``, checked when the
drain reports them (upstream Miles, run by ``harness.upstream.runner``, has no such counters).
"""

from __future__ import annotations

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from harness.checking.invariants.base import Violation, invariant, is_fully_async, violation
from harness.trace import Event

P = "rollout/fully_async/"


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


@invariant("drain_metrics", applies=is_fully_async)
def check_drain_metrics(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out = "drain_metrics", []
    queue = 0
    counts = {"aborted": 0, "stale": 0, "dropped": 0, "retried": 0, "retry_cap": 0}
    popped: list[int] = []
    expect: dict[str, float | None] | None = None
    for pos, e in enumerate(events):
        k = e.kind
        if k == ev.PUT_ACCEPTED:
            queue += 1
        elif k in (ev.GOT, ev.STALE_REJECTED):
            queue -= 1
            if e["staleness"] is not None:
                popped.append(e["staleness"])
            counts["stale"] += k == ev.STALE_REJECTED
        elif k == ev.PUT_REJECTED and e["reason"] == "aborted":
            counts["aborted"] += 1
        elif k == ev.RECYCLED:
            counts["retried"] += 1
        elif k == ev.DROPPED:
            reason = str(e["reason"])
            counts["dropped"] += reason.startswith("handler_drop")
            counts["retry_cap"] += reason.startswith("retry_cap")
        elif k == ev.DRAIN_END:
            expect = {
                P + "queue_size": float(queue),
                P + "aborted_groups_filtered": float(counts["aborted"]),
                P + "stale_groups_filtered": float(counts["stale"]),
                P + "avg_staleness": sum(popped) / len(popped) if popped else None,
                P + "max_staleness": float(max(popped)) if popped else None,
                P + "handler_dropped": float(counts["dropped"]),
                P + "handler_retried": float(counts["retried"]),
                P + "handler_retry_cap": float(counts["retry_cap"]),
            }
            counts = dict.fromkeys(counts, 0)
            popped = []
        elif k == ev.METRICS and expect is not None:
            m = e["metrics"]
            if not any(key.startswith(P + "handler_") for key in m):
                # The handler counters are this core's extension; upstream Miles reports
                # none (a trace of upstream's code, harness.upstream.runner), so none is checked.
                expect = {key: want for key, want in expect.items() if not key.startswith(P + "handler_")}
            bad = {key: (m.get(key), want) for key, want in expect.items() if not _close(m.get(key), want)}
            if bad:
                detail = ", ".join(
                    f"{key.removeprefix(P)}: reported {got}, trace says {want}" for key, (got, want) in bad.items()
                )
                out.append(
                    violation(
                        name,
                        f"rollout_id={e['rollout_id']} metrics disagree with the trace window: {detail}",
                        events,
                        pos,
                    )
                )
            expect = None
    return out
