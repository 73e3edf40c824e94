"""The order of one weight update, checked against the server's request log.

Miles' Megatron updater (``update_weight_from_distributed/mixin.py:L309-L331``) does, per update:
``pause_generation(mode)`` -> ``flush_cache`` unless mode is ``in_place`` ->
``begin_weight_update`` -> one or more transfers -> ``update_weight_version`` ->
``end_weight_update`` -> ``continue_generation``. The disk-delta path does
``pause(mode)`` -> flush unless ``in_place`` -> ``update_weights_from_disk`` -> continue.

``update_episodes(log)`` cuts the log into episodes (a successful pause to the next
successful continue) and ``check_update_order(log)`` returns one message per episode
that loads weights or sets a version and breaks the order (a pause that updates nothing
is not checked). Calls that do not change weights (generate, health, version
reads, refused flushes that are retried) are ignored; a refused control call counts as
not made.
"""

from __future__ import annotations

from typing import Any, Iterable

TRANSFERS = ("/update_weights_from_tensor", "/update_weights_from_disk", "/update_weights_from_distributed")
CONTROL = (
    "/pause_generation",
    "/continue_generation",
    "/flush_cache",
    "/begin_weight_update",
    "/end_weight_update",
    "/update_weight_version",
) + TRANSFERS


def _ok(entry: dict[str, Any]) -> bool:
    return entry.get("status") is not None and 200 <= int(entry["status"]) < 300


def update_episodes(log: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``[{"mode": ..., "calls": [path, ...], "closed": bool}]``, successful control calls only."""
    episodes: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for entry in log:
        path = entry.get("path")
        if path not in CONTROL or not _ok(entry):
            continue
        if path == "/pause_generation":
            body = entry.get("body") or {}
            current = {"mode": body.get("mode", "abort"), "calls": [path], "closed": False}
            episodes.append(current)
        elif current is not None:
            current["calls"].append(path)
            if path == "/continue_generation":
                current["closed"] = True
                current = None
        else:
            episodes.append({"mode": None, "calls": [path], "closed": False})
    return episodes


def _expected(mode: str, calls: list[str]) -> list[str]:
    flush = [] if mode == "in_place" else ["/flush_cache"]
    transfers = [c for c in calls if c in TRANSFERS] or ["/update_weights_from_tensor"]
    if calls[1:] and calls[-2:-1] == ["/update_weights_from_disk"] and "/begin_weight_update" not in calls:
        return ["/pause_generation", *flush, *transfers, "/continue_generation"]  # disk-delta path
    return [
        "/pause_generation",
        *flush,
        "/begin_weight_update",
        *transfers,
        "/update_weight_version",
        "/end_weight_update",
        "/continue_generation",
    ]


def check_update_order(log: Iterable[dict[str, Any]]) -> list[str]:
    problems = []
    for n, ep in enumerate(update_episodes(log)):
        calls = ep["calls"]
        if ep["mode"] is None:
            problems.append(f"episode {n}: {calls[0]} outside a pause (no /pause_generation before it)")
            continue
        if not ep["closed"]:
            problems.append(f"episode {n} (mode={ep['mode']}): never continued; calls {calls}")
            continue
        if ep["mode"] == "in_place" and "/flush_cache" in calls:
            problems.append(
                f"episode {n}: flush_cache after an in_place pause (SGLang refuses it with frozen requests)"
            )
            continue
        if not any(c in TRANSFERS or c == "/update_weight_version" for c in calls):
            continue  # a pause that updated nothing (e.g. around an evaluation) is not an update
        want = _expected(ep["mode"], calls)
        if calls != want:
            problems.append(f"episode {n} (mode={ep['mode']}): calls {calls}, expected {want}")
    return problems
