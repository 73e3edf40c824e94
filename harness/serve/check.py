"""``check_served``: every applicable trace invariant on a served run, and the order of
its weight-update calls (read by ``server.RunningServer.check`` and ``/harness/check``).
``write_served_trace``: the trace file ``serve --trace`` writes, with the config
``check-trace`` reads next to it (``harness.trace.config_path``), so that
``miles-harness check-trace TRACE`` gives the verdict ``check_served`` gives."""

from __future__ import annotations

import json
from pathlib import Path
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


def served_pause_mode(events: list[Any]) -> str:
    """The pause mode a served trace was driven with: the one mode of its explicit
    ``engine_pause`` events (the client's ``/pause_generation``), else ``retract``, the
    mode the server applies to a weight update without a pause (its implicit pauses) and
    ``check_served``'s default."""
    from miles_async_core import events as ev

    modes = {e["mode"] for e in events if e.kind == ev.ENGINE_PAUSE and not e.get("implicit")}
    return modes.pop() if len(modes) == 1 else "retract"


def write_served_trace(engine: ServedEngine, path: str | Path) -> dict[str, Any]:
    """Write the served trace (JSONL), ``PATH.requests.json`` (the HTTP request log) and
    ``PATH.config.json``: the config ``check_served`` checks under (the pause mode the
    client used, everything else Miles' defaults), ``complete`` false (a server never sees
    its client's run end, so the checks are those that hold on a prefix, as
    ``check_served``'s default). Miles flags after ``--`` on ``check-trace`` override its
    fields (a fully-async client: ``-- --fully-async``). Returns the stored config document."""
    from miles_async_core.config import AsyncConfig
    from harness.trace import config_path, write_jsonl

    with engine.sink.lock:
        events = list(engine.trace.events)
    write_jsonl(events, path)
    Path(f"{path}.requests.json").write_text(json.dumps(list(engine.request_log), indent=1))
    doc = {
        "source": "serve",
        "config": AsyncConfig(pause_generation_mode=served_pause_mode(events)).to_dict(),
        "complete": False,
    }
    config_path(path).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc
