"""Colocation (`--colocate`): the engine and the trainer share GPUs.

* ``colocate_exclusive``: the engine's ``generating`` phase and the trainer's
  ``training`` phase never overlap (in trace order).
* ``colocate_no_decode_while_training``: measured from the engine itself: no decode
  step a real engine records (``decode_step``, the interval ``[t - dur_s, t]`` it
  stamped) overlaps a ``training`` interval of the trainer, by time. A wrapper that marks
  the rollout side idle when it pauses cannot hide an engine that keeps decoding.
  Traces without decode steps (the simulated engine) pass it vacuously."""

from __future__ import annotations

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from harness.checking.invariants.base import Violation, invariant, violation
from harness.measure.overlap import intervals
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
            out.append(violation(name, "rollout generating and train training overlap under --colocate", events, pos))
    return out


@invariant("colocate_no_decode_while_training", applies=lambda c: c.colocate)
def check_colocate_no_decode_while_training(events: list[Event], config: AsyncConfig) -> list[Violation]:
    name, out = "colocate_no_decode_while_training", list[Violation]()
    t_end = max((e.t for e in events), default=0.0)
    training = intervals(events, "train", "training", t_end)
    if not training:
        return out
    for pos, e in enumerate(events):
        if e.kind != ev.DECODE_STEP:
            continue
        a, b = e.t - e["dur_s"], e.t
        hit = next(((lo, hi) for lo, hi in training if a < hi and lo < b), None)
        if hit is not None:
            out.append(
                violation(
                    name,
                    f"the engine decoded samples {list(e['indices'])[:8]} (version {e['version']}) "
                    f"from t={a:.6f} to {b:.6f} s while the trainer trained ({hit[0]:.6f} to "
                    f"{hit[1]:.6f} s) under --colocate",
                    events,
                    pos,
                )
            )
    return out
