"""Trace invariant checkers, one module per family.

``check_all(events, config, complete=True)`` runs every registered checker that applies
to ``config`` and returns their violations; ``complete=False`` keeps only the checkers
that hold on the prefix of a run that failed or was cancelled (conservation is then
relaxed to ``conservation_prefix``: nothing ends twice, nothing trained untaken).
``ALL_CHECKS`` maps invariant name -> ``Check`` (function, applicability, whether it needs a complete run).
``check_report`` runs them and returns the JSON-able verdict ``miles-harness run``
stores per mode and ``miles-harness check-trace`` prints. A checker may also ask about the
trace itself (``Check.applies_to_trace``): the resume checkers (``resume``) apply only to
a trace with lives; ``applicable(config)`` without ``events`` leaves them out.
"""

from __future__ import annotations

import dataclasses

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig

# Each module registers its checkers on import; this order is the order they run and report in.
from harness.checking.invariants import (
    buffer_checks,
    colocate,
    concurrency,
    conservation,
    multi_engine_checks,
    metrics,
    pause,
    resume,
    staleness_checks,
    throughput,
    versions,
)
from harness.checking.invariants.base import REGISTRY, Check, Violation, format_event
from harness.trace import Event

ALL_CHECKS: dict[str, Check] = {c.name: c for c in REGISTRY}


def applicable(config: AsyncConfig, *, complete: bool = True, events: list[Event] | None = None) -> list[Check]:
    return [c for c in REGISTRY if c.applies_to(config, events) and (complete or not c.needs_complete_run)]


def check_all(events: list[Event], config: AsyncConfig, *, complete: bool = True) -> list[Violation]:
    if resume.has_lives(events):
        return _check_lives(events, config, complete=complete)
    out: list[Violation] = []
    for check in applicable(config, complete=complete, events=events):
        out.extend(check.fn(events, config))
    return out


def _check_lives(events: list[Event], config: AsyncConfig, *, complete: bool) -> list[Violation]:
    """A trace with lives: every single-life checker on each life's own events (a life that
    ended before --num-rollout is a prefix: only the checkers that hold on one; a planned
    exit leaves its look-ahead in memory), then the resume checkers on
    the whole trace."""
    out: list[Violation] = []
    for life in resume.split_lives(events):
        end = next((e for e in life if e.kind == ev.LIFE_END), None)
        start = next((e for e in life if e.kind == ev.LIFE_START), None)
        whole = complete and end is not None and end["how"] == "completed"
        own = config if start is None else dataclasses.replace(config, start_rollout_id=start["start_rollout_id"])
        for check in applicable(own, complete=whole):
            out.extend(check.fn(life, own))
    for check in applicable(config, complete=complete, events=events):
        if check.applies_to_trace is not None:
            out.extend(check.fn(events, config))
    return out


def check_report(events: list[Event], config: AsyncConfig, *, complete: bool = True, max_stored: int = 100) -> dict:
    """Every applicable checker on ``events``: ``{"complete", "passed", "checkers":
    {name: violation count} (every checker run, 0 = pass), "not_applicable": [names],
    "violations": [{"invariant", "message"}] (the first ``max_stored``),
    "violations_total"}``. ``_violations`` keeps the ``Violation`` objects for printing
    (not JSON; drop it before writing)."""
    checks = applicable(config, complete=complete, events=events)
    violations = check_all(events, config, complete=complete)
    counts = {c.name: 0 for c in checks}
    for v in violations:
        counts[v.invariant] = counts.get(v.invariant, 0) + 1
    run = {c.name for c in checks}
    return {
        "complete": complete,
        "passed": not violations,
        "checkers": counts,
        "not_applicable": [name for name in ALL_CHECKS if name not in run],
        "violations": [{"invariant": v.invariant, "message": v.message} for v in violations[:max_stored]],
        "violations_total": len(violations),
        "_violations": violations,
    }


def format_violations(violations: list[Violation], *, limit: int = 5) -> str:
    shown = [v.format() for v in violations[:limit]]
    if len(violations) > limit:
        shown.append(
            f"... and {len(violations) - limit} more violations ({sorted({v.invariant for v in violations[limit:]})})"
        )
    return "\n\n".join(shown)


__all__ = [
    "ALL_CHECKS",
    "Check",
    "Violation",
    "applicable",
    "check_all",
    "check_report",
    "format_event",
    "format_violations",
    "buffer_checks",
    "colocate",
    "concurrency",
    "conservation",
    "metrics",
    "multi_engine_checks",
    "pause",
    "resume",
    "staleness_checks",
    "throughput",
    "versions",
]
