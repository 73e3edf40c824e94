"""The gate's contract between a tree's process (``harness.upstream.gate_run``) and the
verdicts (``harness.upstream.gate``): what running one case gives (``CaseRun``) and the
record of a case both sides read (``CaseRecord``, JSON between the two processes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict


@dataclass(frozen=True)
class CaseRun:
    """One case run on a tree, before it is judged."""

    result: Any  # the runner's result: events, history, error (``runner.UpstreamRunResult`` or the sweep's)
    config: Any  # the scenario's config, which the invariants are judged under
    end_s: float  # the run's virtual end
    findings: list[dict[str, str]] = field(default_factory=list)  # the fault sweep's other findings
    mode: str | None = None  # a drawn fault schedule's driver, as the fault sweep spells its finding kinds
    refusal: bool = False  # upstream refuses the case at start-up by design (``DiffCase.refused``)


class CaseRecord(TypedDict, total=False):
    """One case on one tree. ``name`` and ``status`` are always there; the rest by status."""

    name: str
    status: Literal["ran", "not_run", "harness_error"]
    # not_run / harness_error
    seams: list[str]  # the seams missing
    absent: list[str]  # the seams' files the tree does not have (an older tree)
    message: str
    # ran
    mode: str  # a drawn fault schedule's driver (``CaseRun.mode``): its bugs are compared per driver
    error: str | None  # the exception type the run ended with
    error_at: str | None  # ``FILE:LN`` of the tree it was raised at
    error_message: str
    started: bool  # at least one generate call: a run that did not start is no prefix to judge
    refusal: bool  # the case checks a start-up refusal (``CaseRun.refusal``): not starting is its point
    judgement: dict[str, Any]  # ``judge.Verdict.to_json``
    findings: list[dict[str, str]]  # ``kind``, ``sweep_kind``, ``message``
    observables: dict[str, Any]  # ``harness.upstream.observables.observables`` as JSON
    # every status
    seconds: float
    log: str  # the end of upstream's log for the case
    log_lines: int
    _full_log: str  # all of it, taken out before the record is written


__all__ = ["CaseRecord", "CaseRun"]
