"""Shared pieces of the trace invariant checkers: ``Violation``, the registry, and the
indexes every checker builds from a trace.

Contract: a checker is ``check_<name>(events, config) -> list[Violation]``; it reads the
trace only (never the objects that produced it), never raises on a well-formed trace
(``events.EVENT_FIELDS``), and reports each failure with the slice of trace around it so
a person can read what happened (``Violation.format()``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from harness.trace import Event

CONTEXT_EVENTS = 10


@dataclass(frozen=True, kw_only=True)
class Violation:
    invariant: str
    message: str
    events: list[Event] = field(default_factory=list)

    def format(self, *, max_events: int = 40) -> str:
        lines = [f"[{self.invariant}] {self.message}"]
        shown = self.events[-max_events:]
        if len(self.events) > len(shown):
            lines.append(f"  ... {len(self.events) - len(shown)} earlier events not shown")
        lines += ["  " + format_event(e) for e in shown]
        return "\n".join(lines)


def format_event(e: Event) -> str:
    parts = []
    for key, value in e.fields.items():
        if key == "metrics" and isinstance(value, dict):
            value = {k.rsplit("/", 1)[-1]: v for k, v in value.items() if "fully_async" in k}
        parts.append(f"{key}={value}")
    return f"t={e.t:9.3f}s  #{e.seq:<5d} {e.kind:<16s} " + " ".join(parts)


def window(events: list[Event], pos: int, before: int = CONTEXT_EVENTS) -> list[Event]:
    """The offending event at ``pos`` and up to ``before`` events before it."""
    return events[max(0, pos - before) : pos + 1]


def lifecycle(events: list[Event], group_index: int, upto: int | None = None) -> list[Event]:
    """Every event that names ``group_index`` (or one of its samples), up to position ``upto``."""
    idx = sample_indices(events).get(group_index, set())
    end = len(events) if upto is None else upto + 1
    out = []
    for e in events[:end]:
        gi = e.fields.get("group_index")
        if gi == group_index or e.fields.get("index") in idx or group_index in (e.fields.get("group_indices") or ()):
            out.append(e)
    return out


def sample_indices(events: list[Event]) -> dict[int, set[int]]:
    """group_index -> sample indices, from ``taken`` events."""
    out: dict[int, set[int]] = {}
    for e in events:
        if e.kind == ev.TAKEN:
            out.setdefault(e["group_index"], set()).update(e["indices"])
    return out


def oldest_weight_version(fin: Event) -> int | None:
    numeric = [int(v) for v in fin["weight_versions"] if str(v).isdigit()]
    return min(numeric) if numeric else None


class GenerateCalls:
    """What each ``finished`` event's generate call added to its sample. Under one-step or
    sync ``--partial-rollout`` a group pending at a rollout's end is handed back as it is and
    a later call extends its samples' tokens and ``weight_versions``
    (``inference_rollout_train.py:L40-L53`` in radixark/miles); otherwise every call starts
    afresh (a retried sample is reset first), so it added everything its event shows."""

    def __init__(self, config: AsyncConfig) -> None:
        self.carry = bool(getattr(config, "partial_rollout", False)) and not config.fully_async
        self._last: dict[int, tuple[int, list]] = {}  # index -> (response_length, weight_versions)

    def added(self, fin: Event) -> tuple[list, list, list]:
        """(token runs, ``weight_versions`` entries) this call added, and the entries before it."""
        runs, wv = [list(r) for r in fin["token_versions"]], list(fin["weight_versions"])
        prev = self._last.get(fin["index"]) if self.carry else None
        if self.carry:
            self._last[fin["index"]] = (fin["response_length"], wv)
        if prev is None:
            return runs, wv, []
        skip, new_runs = prev[0], []
        for version, kv, count in runs:
            take = count - min(skip, count)
            skip -= count - take
            if take:
                new_runs.append([version, kv, take])
        return new_runs, wv[len(prev[1]) :], wv[: len(prev[1])]


def effective_pause_mode(config: AsyncConfig) -> str:
    """The mode the updater really uses: FSDP always retracts (`update_weight_utils.py:L74`)."""
    return "retract" if config.train_backend == "fsdp" else config.pause_generation_mode


def is_fully_async(config: AsyncConfig) -> bool:
    return bool(config.fully_async)


Checker = Callable[[list[Event], AsyncConfig], list[Violation]]


@dataclass(frozen=True)
class Check:
    name: str
    fn: Checker
    applies: Callable[[AsyncConfig], bool]
    needs_complete_run: bool  # False: holds on the prefix of a run that failed or was cancelled
    # None: applies to every trace of a config it applies to; else applies only where this
    # returns True (the resume checkers: only to a trace with lives)
    applies_to_trace: Callable[[list[Event]], bool] | None = None

    def applies_to(self, config: AsyncConfig, events: list[Event] | None) -> bool:
        """Applies to ``config`` and, if it asks, to ``events`` (``None``: a trace without lives)."""
        if not self.applies(config):
            return False
        return self.applies_to_trace is None or (events is not None and self.applies_to_trace(events))


REGISTRY: list[Check] = []


def invariant(
    name: str,
    *,
    applies: Callable[[AsyncConfig], bool] = lambda c: True,
    complete_only: bool = False,
    applies_to_trace: Callable[[list[Event]], bool] | None = None,
) -> Callable[[Checker], Checker]:
    """Register ``fn`` under ``name``; ``Violation.invariant`` must be that name."""

    def wrap(fn: Checker) -> Checker:
        assert all(c.name != name for c in REGISTRY), f"duplicate invariant {name}"
        REGISTRY.append(Check(name, fn, applies, complete_only, applies_to_trace))
        fn.invariant_name = name  # type: ignore[attr-defined]
        return fn

    return wrap


def violation(
    name: str,
    message: str,
    events: list[Event],
    pos: int,
    *,
    context: list[Event] | None = None,
) -> Violation:
    return Violation(invariant=name, message=message, events=context if context is not None else window(events, pos))


def walk_groups(events: list[Event]):
    """Yield (pos, event, members, finished) with the current sample state at each event.

    ``members[g]``: the samples of group ``g`` as taken, plus every sample a generate
    function added to one of its trajectories since (``trajectory_sample``: a nested group,
    ``miles_async_core/generate.py``), as upstream's buffer flattens a nested group one
    level for its status and staleness checks (``fully_async_data_buffer.py:L28-L43``).
    A new take starts the group afresh."""
    members: dict[int, list[int]] = {}
    finished: dict[int, Event] = {}
    for pos, e in enumerate(events):
        k = e.kind
        if k == ev.TAKEN:
            members[e["group_index"]] = list(e["indices"])
        elif k == ev.FINISHED:
            finished[e["index"]] = e
        elif k == ev.TRAJECTORY_SAMPLE:
            group = members.get(e["group_index"])
            if group is not None and e["trajectory"] in group and e["index"] not in group:
                group.append(e["index"])
        yield pos, e, members, finished
