"""Trace invariant checkers (spec §9), one module per family.

``check_all(events, config, complete=True)`` runs every registered checker that applies
to ``config`` and returns their violations; ``complete=False`` keeps only the checkers
that hold on the prefix of a run that failed or was cancelled (conservation is then
relaxed to ``conservation_prefix``: nothing ends twice, nothing trained untaken).
``ALL_CHECKS`` maps invariant name -> ``Check`` (function, applicability, spec items).
"""

from __future__ import annotations

from miles_async_core.config import AsyncConfig
from harness.checking.invariants import buffer, colocate, concurrency, conservation, metrics, pause, staleness, versions
from harness.checking.invariants.base import REGISTRY, Check, Violation, format_event
from harness.trace import Event

ALL_CHECKS: dict[str, Check] = {c.name: c for c in REGISTRY}


def applicable(config: AsyncConfig, *, complete: bool = True) -> list[Check]:
    return [c for c in REGISTRY if c.applies(config) and (complete or not c.needs_complete_run)]


def check_all(events: list[Event], config: AsyncConfig, *, complete: bool = True) -> list[Violation]:
    out: list[Violation] = []
    for check in applicable(config, complete=complete):
        out.extend(check.fn(events, config))
    return out


def format_violations(violations: list[Violation], *, limit: int = 5) -> str:
    shown = [v.format() for v in violations[:limit]]
    if len(violations) > limit:
        shown.append(f"... and {len(violations) - limit} more violations "
                     f"({sorted({v.invariant for v in violations[limit:]})})")
    return "\n\n".join(shown)


__all__ = ["ALL_CHECKS", "Check", "Violation", "applicable", "check_all", "format_event", "format_violations",
           "buffer", "colocate", "concurrency", "conservation", "metrics", "pause", "staleness", "versions"]
