"""Colocation (spec §2, `--colocate`): the engine and the trainer share GPUs, so the
engine's ``generating`` phase and the trainer's ``training`` phase never overlap."""

from __future__ import annotations

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from harness.checking.invariants.base import Violation, invariant, violation
from harness.trace import Event


@invariant("colocate_exclusive", applies=lambda c: c.colocate)
def check_colocate_exclusive(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out = "colocate_exclusive", []
    open_phases: set[tuple[str, str]] = set()
    for pos, e in enumerate(events):
        if e.kind not in (ev.PHASE_START, ev.PHASE_END):
            continue
        key = (e["side"], e["phase"])
        if e.kind == ev.PHASE_END:
            open_phases.discard(key)
            continue
        open_phases.add(key)
        if {("rollout", "generating"), ("train", "training")} <= open_phases:
            out.append(violation(name, "rollout generating and train training overlap under --colocate",
                                 events, pos))
    return out
