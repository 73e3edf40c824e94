"""``check_served``: every applicable trace invariant on a served run, and the order of
its weight-update calls (read by ``server.RunningServer.check`` and ``/harness/check``)."""

from __future__ import annotations

from typing import Any

from .order import check_update_order
from .served_engine import ServedEngine


def check_served(
    engine: ServedEngine, *, pause_generation_mode: str = "retract", fully_async: bool = False, complete: bool = False
) -> dict[str, Any]:
    """``violations`` (``check_all`` on the trace so far), ``update_order`` (problems in
    the request log's weight-update episodes) and ``events`` (how many were checked)."""
    from miles_async_core.config import AsyncConfig
    from harness.checking.invariants import check_all

    config = AsyncConfig(pause_generation_mode=pause_generation_mode, fully_async=fully_async)
    with engine.sink.lock:
        events = list(engine.trace.events)
    violations = check_all(events, config, complete=complete)
    return {
        "violations": [{"invariant": v.invariant, "message": v.message} for v in violations],
        "update_order": check_update_order(list(engine.request_log)),
        "events": len(events),
    }
