"""Upstream judged on its own trace: every applicable invariant checker, and whether a
run's failure is the harness' own.

``judge(result)`` runs ``harness.checking.invariants.check_report`` on the trace an
upstream run (``harness.upstream.runner.UpstreamRunResult``) recorded, with the run's own
config; a run that ended with an error is checked as a prefix (the checkers that need a
complete run are left out, conservation is relaxed to ``conservation_prefix``), as
``miles-harness check-trace --incomplete`` does. ``Judgement.verdict()`` is the sentence
a report prints: "every invariant holds (N checkers)" or which invariants it breaks.

``leaf_failure(exc)``: the run ended on an ``AttributeError`` raised on an object the
harness put in upstream's place (the lifecycle sink, the engine, an import fake, the
args): upstream called a member the fake lacks. That is the harness' blind spot,
never upstream's error; the message names the member, the fake and the upstream line
that called it. (The leaf fakes of ``harness.upstream.leaves`` and the args raise
``leaf_fakes.LeafMissing`` themselves, which stops the run with ``RunnerSeamError``;
this catches a plain ``AttributeError`` on any other object of the harness.)
"""

from __future__ import annotations

import argparse
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.upstream.harness_errors import HarnessError


@dataclass
class Judgement:
    """``checkers``: every checker run (name -> violation count); ``violations``: the
    first violations, ``{"invariant", "message"}``; ``complete``: judged as a complete run."""

    complete: bool
    checkers: dict[str, int]
    violations: list[dict[str, str]] = field(default_factory=list)
    violations_total: int = 0
    shown: list[Any] = field(default_factory=list, repr=False)  # Violation objects, for printing

    @property
    def broken(self) -> list[str]:
        """The invariants violated, in checker order."""
        return [name for name, n in self.checkers.items() if n]

    @property
    def holds(self) -> bool:
        return not self.broken

    def verdict(self) -> str:
        scope = "" if self.complete else " (checked as the prefix of a run that ended early)"
        if self.holds:
            return f"every invariant holds ({len(self.checkers)} checkers){scope}"
        return f"breaks {', '.join(f'{n} ({self.checkers[n]}x)' for n in self.broken)}{scope}"

    def to_json(self) -> dict[str, Any]:
        return {
            "complete": self.complete,
            "checkers": dict(self.checkers),
            "broken": self.broken,
            "violations": list(self.violations),
            "violations_total": self.violations_total,
        }


def judge(result: Any, config: Any = None, *, complete: bool | None = None, max_stored: int = 20) -> Judgement:
    """Every applicable checker on ``result.events`` (an upstream run), with ``config``
    (default: the run's scenario config); a run that ended with an error is judged as a
    prefix (``complete`` overrides: the fault sweep also counts a hang as an early end)."""
    from harness.checking.invariants import check_report

    cfg = config if config is not None else result.scenario.config
    complete = result.error is None if complete is None else complete
    rep = check_report(result.events, cfg, complete=complete, max_stored=max_stored)
    every = rep["_violations"]
    # the first ``max_stored`` violations, and the first of each invariant beyond them, so
    # that every broken invariant has a message; each with its slice of the trace
    keep = list(range(min(max_stored, len(every))))
    seen = {every[i].invariant for i in keep}
    for i, v in enumerate(every[max_stored:], start=max_stored):
        if v.invariant not in seen:
            keep.append(i)
            seen.add(v.invariant)
    return Judgement(
        complete=complete,
        checkers=dict(rep["checkers"]),
        violations=[
            {"invariant": every[i].invariant, "message": every[i].message, "slice": _slice(every[i])} for i in keep
        ],
        violations_total=int(rep["violations_total"]),
        shown=list(rep["_violations"]),
    )


def _slice(v: Any) -> str:
    """Where a violation's events lie in the trace: ``events #A..#B, t=X..Y s``."""
    evs = getattr(v, "events", None) or []
    if not evs:
        return ""
    a, b = evs[0], evs[-1]
    return f"events #{a.seq}..#{b.seq}, t={a.t:.3f}..{b.t:.3f} s"


def is_leaf_fake(obj: Any) -> bool:
    """An object of the harness' own making in upstream's place: its class (or, for a class
    or module, itself) is defined in ``harness``, an import fake module, or the
    ``args`` namespace (the runner builds it, ``runner.upstream_args``; upstream's own
    parser never runs, so a flag upstream reads that the runner does not set is missing)."""
    if obj is None:
        return False
    if getattr(obj, "__miles_harness_fake__", False) or isinstance(obj, argparse.Namespace):
        return True
    kind = obj if isinstance(obj, type) else type(obj)
    module = getattr(kind, "__module__", "") or ""
    if isinstance(obj, types.ModuleType):
        module = obj.__name__
    return module == "harness" or module.startswith("harness.")


def _upstream_line(exc: BaseException, tree: Path | None) -> str:
    """The innermost frame of ``exc``'s traceback inside ``tree`` (``file:Lline``, relative)."""
    frames = traceback.extract_tb(exc.__traceback__)
    root = str(tree) if tree is not None else None
    for fr in reversed(frames):
        if root is not None and fr.filename.startswith(root):
            return f"{Path(fr.filename).relative_to(root)}:L{fr.lineno}"
    if frames and root is None:
        return f"{frames[-1].filename}:L{frames[-1].lineno}"
    return "an unknown line"


def leaf_failure(exc: BaseException | None, tree: Path | None = None) -> str | None:
    """The message for an ``AttributeError`` raised on one of the harness' fakes (with
    the upstream line that reached it), else ``None``. Follows ``__cause__`` / ``__context__``,
    since upstream may re-raise it wrapped."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, AttributeError) and getattr(exc, "obj", None) is not None and is_leaf_fake(exc.obj):
            at = _upstream_line(exc, tree)
            if isinstance(exc.obj, argparse.Namespace):
                return (
                    f"harness_error: upstream reads `args.{exc.name}` (at {at}), a flag the harness' args "
                    "namespace (harness.upstream.runner.upstream_args) does not set: the runner does not "
                    f"host this tree's code faithfully. Fix: give `{exc.name}` Miles' default there"
                )
            kind = exc.obj if isinstance(exc.obj, type) else type(exc.obj)
            name = exc.obj.__name__ if isinstance(exc.obj, types.ModuleType) else None
            what = name or f"{kind.__module__}.{kind.__qualname__}"
            return (
                f"harness_error: upstream calls `{exc.name}` on the harness' fake {what}, which lacks it "
                f"(at {at}): the runner does not host this tree's code faithfully. "
                f"Fix: the fake must implement `{exc.name}` (see `miles-harness doctor`)"
            )
        exc = exc.__cause__ or exc.__context__
    return None


class LeafMemberMissing(HarnessError):
    """Upstream called a member a fake of the harness lacks (``leaf_failure``)."""


def check_leaves(result: Any, tree: Path | None = None) -> None:
    """Raise ``LeafMemberMissing`` when ``result`` (an upstream run) ended on, or its
    fully-async worker died of, a member missing from a fake."""
    for exc in (result.error, (getattr(result, "extra", None) or {}).get("worker_error")):
        message = leaf_failure(exc, tree)
        if message is not None:
            raise LeafMemberMissing(message, ["leaf"])


__all__ = ["Judgement", "LeafMemberMissing", "check_leaves", "is_leaf_fake", "judge", "leaf_failure"]
