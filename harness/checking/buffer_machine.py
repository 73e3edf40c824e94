"""Buffer conformance: a stateful hypothesis machine that checks ANY ``DataBuffer``.

Contract: ``check_buffer(factory)`` returns ``None`` when the buffer built by
``factory(DataBufferConstructorInput(args, unused_handler_fn)) -> DataBuffer`` (the
signature of Miles' ``--custom-async-data-buffer-path``, so ``DefaultDataBuffer``
itself is a factory) keeps every guarantee of upstream's buffer contract (the invariants
listed below), and otherwise a ``BufferFailure`` naming the broken invariant, with the
shrunk operation sequence and a timeline of the buffer operations of the failing example.

``BufferMachine`` drives the buffer with ``put`` (completed, aborted, dynamic-filter
rejected groups, flat or nested), ``get`` (with ``current_version`` None or a version,
sometimes with unknown context keys), version bumps, ``get_metrics`` and cancellation
of a blocked ``put``/``get``. Every operation is a task on one ``VirtualTimeLoop`` the
machine owns; ``settle`` runs the loop until no callback is ready, so blocked producers
and waiting consumers stay blocked across steps. The machine observes the buffer only
at its boundaries (operation start/return, handler calls, ``get_metrics``, ``len`` if
the buffer has one) and replays each observation against a shadow model, so the
verdict never depends on the implementation's internals. What it assumes: ``put``
returns without awaiting after it stores a group, ``get`` returns without awaiting
after it removes one, and the handler of a stale group runs inside the ``get`` that
removed it (all true of upstream's buffer).

Invariants (names as reported): ``capacity``, ``put_blocks_iff_full``,
``get_blocks_iff_empty``, ``conservation``, ``fifo``, ``staleness_bound``,
``handler_once``, ``filter_not_handled``, ``metrics_window``, ``no_exception``.
``avg_staleness`` / ``max_staleness`` cover every group popped in the window, stale
rejects included, as upstream's code computes them (the decision is recorded in
``miles_async_core/buffer.py``).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import re
import traceback
from dataclasses import dataclass, field
from collections.abc import Sized
from typing import Any, Callable, TypeGuard

import hypothesis.strategies as st
from hypothesis import HealthCheck, Phase
from hypothesis import reproduce_failure as _reproduce_failure
from hypothesis import seed as _seed
from hypothesis import settings as Settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from harness.sim.vtime import VirtualTimeLoop
from miles_async_core.buffer import DataBuffer
from miles_async_core.config import AsyncConfig
from miles_async_core.types import (
    DataBufferConstructorInput,
    DataBufferInput,
    Group,
    Sample,
    Status,
    first_sample,
    iter_samples,
)

P = "rollout/fully_async/"
DROP = "rollout/dynamic_filter/drop_"
FILTER_KEY = "conformance_filter"
MAX_LOOP_ITERATIONS = 10_000
INVARIANTS = (
    "capacity",
    "put_blocks_iff_full",
    "get_blocks_iff_empty",
    "conservation",
    "fifo",
    "staleness_bound",
    "handler_once",
    "filter_not_handled",
    "metrics_window",
    "no_exception",
)

BufferFactory = Callable[[DataBufferConstructorInput], DataBuffer]


# ---- failures ----------------------------------------------------------------------------


class BufferInvariantError(AssertionError):
    """A broken buffer guarantee; ``invariant`` names it, ``detail`` says what happened."""

    invariant = "?"

    def __init__(self, detail: str, timeline: str) -> None:
        self.detail = detail
        self.timeline = timeline
        super().__init__(
            f"invariant {self.invariant!r} violated: {detail}\n\nbuffer timeline of this example:\n{timeline}"
        )


# One class per invariant so hypothesis shrinks towards the same broken invariant
# (it tells failures apart by exception type and line).
VIOLATIONS: dict[str, type[BufferInvariantError]] = {
    name: type(
        "".join(p.title() for p in name.split("_")) + "Violation",
        (BufferInvariantError,),
        {"invariant": name, "__module__": __name__},
    )
    for name in INVARIANTS
}
globals().update({cls.__name__: cls for cls in VIOLATIONS.values()})


@dataclass(frozen=True)
class BufferFailure:
    """What ``check_buffer`` returns for a non-conforming buffer."""

    invariant: str
    message: str
    steps_text: str
    timeline: str = ""
    reproduce_blob: tuple[str, bytes] | None = None

    def __str__(self) -> str:
        return (
            f"invariant {self.invariant!r} violated: {self.message}\n\nshrunk operation sequence:\n"
            f"{self.steps_text}\n\nbuffer timeline:\n{self.timeline}"
        )


# ---- the dynamic filter the machine installs ---------------------------------------------


@dataclass(frozen=True)
class DynamicFilterOutput:
    """`miles/rollout/filter_hub/base_types.py`: ``keep`` and an optional drop ``reason``."""

    keep: bool
    reason: str | None = None


def conformance_filter(args: argparse.Namespace, group: Group) -> bool | DynamicFilterOutput | None:
    """Decides from a mark on the group's first sample, in every form Miles accepts; an
    unmarked group is kept. ``None`` is a reject (``keep=None``, `filter_hub/base_types.py:L17-L19`)."""
    mark = first_sample(group).metadata.get(FILTER_KEY)
    if mark is None:
        return True
    if mark[0] == "keep":
        return True if mark[1] == "bool" else DynamicFilterOutput(keep=True)
    if mark[1] == "none":
        return None
    return False if mark[1] == "bool" else DynamicFilterOutput(keep=False, reason=mark[2])


# ---- strategies ----------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupSpec:
    """The shape of one put, for three trajectories (a group uses the first
    ``n_samples_per_prompt``). Versions are *ages* behind the machine's version at put
    time; ``None`` is SGLang's non-numeric ``"default"``. ``second`` adds a second
    ``weight_versions`` entry (a second generate call) per sample; ``turns`` makes the
    group nested, one extra turn sample per trajectory."""

    kind: str  # "completed" | "aborted" | "filtered"
    ages: tuple[int | None, int | None, int | None]
    second: tuple[int | None, int | None, int | None] | None = None
    turns: tuple[int | None, int | None, int | None] | None = None
    aborted_at: int = 0  # index into the flattened samples (kind == "aborted")
    filter_mark: tuple | None = None


_age = st.one_of(st.integers(0, 5), st.none())
_three = st.tuples(_age, _age, _age)
_reject_marks = st.one_of(
    st.just(("reject", "bool", None)),
    st.just(("reject", "none", None)),
    st.tuples(st.just("reject"), st.just("output"), st.sampled_from([None, "", "zero_std", "too_long"])),
)
_keep_marks = st.one_of(st.none(), st.tuples(st.just("keep"), st.sampled_from(["bool", "output"])))
_MAX_N = 3


def group_specs(kind: str) -> st.SearchStrategy[GroupSpec]:
    """Groups of one kind; an aborted group may carry a filter reject mark (the abort
    check must win), a completed one a keep mark in each form Miles accepts."""
    marks = {"completed": _keep_marks, "aborted": st.one_of(_keep_marks, _reject_marks), "filtered": _reject_marks}[
        kind
    ]
    return st.builds(
        GroupSpec,
        kind=st.just(kind),
        ages=_three,
        second=st.none() | _three,
        turns=st.none() | _three,
        aborted_at=st.integers(0, 7),
        filter_mark=marks,
    )


def samples() -> st.SearchStrategy[Sample]:
    return st.builds(
        Sample,
        index=st.integers(0, 10**6),
        group_index=st.integers(0, 10**6),
        status=st.sampled_from(Status),
        weight_versions=st.lists(st.one_of(st.integers(0, 20).map(str), st.just("default")), max_size=3),
        prompt=st.text(max_size=8),
    )


@st.composite
def buffer_inputs(
    draw: st.DrawFn, n_samples_per_prompt: int | None = None, version: int | None = None
) -> DataBufferInput:
    """A well-formed ``DataBufferInput`` (flat or nested, completed, aborted or marked
    for the conformance filter), unique sample indices, versions at most ``version``."""
    n = n_samples_per_prompt or draw(st.integers(1, _MAX_N))
    version = draw(st.integers(0, 20)) if version is None else version
    spec = draw(st.sampled_from(("completed", "aborted", "filtered")).flatmap(group_specs))
    gid = draw(st.integers(0, 10**5))
    return build_group(spec, gid, version, n).entry


st.register_type_strategy(Sample, samples())
st.register_type_strategy(DataBufferInput, buffer_inputs())


# ---- the shadow model ------------------------------------------------------------------------


@dataclass(eq=False)
class GroupRecord:
    gid: int
    kind: str
    entry: DataBufferInput
    oldest: int | None  # oracle: min numeric version over all samples and turns
    reason: str | None
    desc: str
    state: str = "new"  # new -> putting -> queued -> got | stale ; or rejected | cancelled
    handler_calls: int = 0


def oracle_oldest_version(flat: list[Sample]) -> int | None:
    numeric = [int(v) for s in flat for v in s.weight_versions if str(v).isdigit()]
    return min(numeric) if numeric else None


def build_group(spec: GroupSpec, gid: int, version: int, n: int) -> GroupRecord:
    def ver(age: int | None) -> str:
        return "default" if age is None else str(max(0, version - age))

    prompt = [
        Sample(
            prompt=f"prompt {gid}",
            index=gid * 100 + i,
            group_index=gid,
            weight_versions=[ver(spec.ages[i])] + ([ver(spec.second[i])] if spec.second else []),
            status=Status.TRUNCATED if i == 2 else Status.COMPLETED,
        )
        for i in range(n)
    ]
    group: Group = prompt
    flat = list(prompt)
    if spec.turns is not None:
        turns = [
            Sample(
                prompt=f"prompt {gid}",
                index=gid * 100 + 50 + i,
                group_index=gid,
                weight_versions=[ver(spec.turns[i])],
                status=Status.COMPLETED,
            )
            for i in range(n)
        ]
        group = [[p, t] for p, t in zip(prompt, turns)]
        flat.extend(turns)
    if spec.kind == "aborted":
        flat[spec.aborted_at % len(flat)].status = Status.ABORTED
    if spec.filter_mark is not None:
        prompt[0].metadata[FILTER_KEY] = spec.filter_mark
    mark = spec.filter_mark
    reason = mark[2] if spec.kind == "filtered" and mark is not None and mark[1] == "output" else None
    oldest = oracle_oldest_version(flat)
    shape = "nested" if spec.turns is not None else "flat"
    desc = f"g{gid} ({spec.kind}, {shape}, oldest version {oldest})"
    if spec.kind == "filtered":
        desc = f"g{gid} (filter reject reason={reason!r}, {shape}, oldest version {oldest})"
    return GroupRecord(gid, spec.kind, DataBufferInput(prompt_group=prompt, group=group), oldest, reason, desc)


@dataclass(eq=False)
class Op:
    kind: str  # "put" | "get"
    task: asyncio.Task | None = None
    record: GroupRecord | None = None
    arg: int | None = None
    context: dict = field(default_factory=dict)
    started: bool = False
    finished: bool = False

    @property
    def rec(self) -> GroupRecord:
        assert self.record is not None, "a put carries its group"
        return self.record


@dataclass
class Window:
    aborted: int = 0
    stale: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    popped: list[int] = field(default_factory=list)


def _staleness(rec: GroupRecord, arg: int | None) -> int | None:
    return None if arg is None or rec.oldest is None else arg - rec.oldest


# ---- the machine ------------------------------------------------------------------------------


class BufferMachine(RuleBasedStateMachine):
    """Shadow-model state machine for one buffer implementation (``factory``)."""

    factory: BufferFactory | None = None

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None
        self.violation: tuple[str, str] | None = None
        self.log: list[str] = []
        self.ops: list[Op] = []
        self.groups: dict[int, GroupRecord] = {}
        self.queue: list[GroupRecord] = []
        self.window = Window()
        self.totals = {"tried": 0, "got": 0, "aborted": 0, "filtered": 0, "stale": 0, "cancelled": 0}
        self.quiescent = True
        self.tearing_down = False

    # -- set-up ---------------------------------------------------------------------------------

    @initialize(
        rollout_batch_size=st.integers(1, 3),
        n_samples_per_prompt=st.integers(1, 3),
        async_data_buffer_capacity_factor=st.sampled_from([0.5, 1.0, 1.5, 2.0]),
        max_weight_staleness=st.one_of(st.none(), st.integers(0, 3)),
        with_filter=st.booleans(),
        start_version=st.integers(0, 4),
    )
    def init_buffer(
        self,
        rollout_batch_size: int,
        n_samples_per_prompt: int,
        async_data_buffer_capacity_factor: float,
        max_weight_staleness: int | None,
        with_filter: bool,
        start_version: int,
    ) -> None:
        B, factor = rollout_batch_size, async_data_buffer_capacity_factor
        note = ""
        if int(factor * B) < 1:
            factor, note = 1.0, f" (factor {async_data_buffer_capacity_factor} raised: capacity >= 1 is a config rule)"
        cfg = AsyncConfig(
            rollout_batch_size=B,
            n_samples_per_prompt=n_samples_per_prompt,
            fully_async=True,
            max_weight_staleness=max_weight_staleness,
            async_data_buffer_capacity_factor=factor,
        )
        self.args = argparse.Namespace(
            **cfg.to_dict(), dynamic_sampling_filter=conformance_filter if with_filter else None
        )
        self.n, self.capacity, self.max_staleness = n_samples_per_prompt, cfg.capacity, max_weight_staleness
        self.with_filter, self.version = with_filter, start_version
        self.last_seen_version: int | None = None
        self.get_arg: int | None = None
        self.next_gid = 0
        self.loop = VirtualTimeLoop()
        factory = type(self).factory
        assert factory is not None, "BufferMachine needs a factory: use machine_for(factory)"

        async def construct() -> DataBuffer:
            return factory(DataBufferConstructorInput(self.args, self.unused_handler_fn))

        self.buffer = self.loop.run_until_complete(construct())
        self._log(
            f"buffer built: capacity={self.capacity} = int({factor} x B {B}){note}, n={self.n}, "
            f"max_weight_staleness={max_weight_staleness}, dynamic filter {'on' if with_filter else 'off'}, "
            f"version {self.version}"
        )

    def teardown(self) -> None:
        if self.loop is None:
            return
        self.tearing_down = True
        pending = [op.task for op in self.ops if op.task is not None and not op.task.done()]
        for task in pending:
            task.cancel()
        try:
            self._run_ready()
        finally:
            self.loop.close()

    # -- rules ------------------------------------------------------------------------------------

    @rule(spec=group_specs("completed"), settle=st.booleans())
    def put_completed(self, spec: GroupSpec, settle: bool) -> None:
        self._start_put(spec, settle)

    @rule(spec=group_specs("completed"), settle=st.booleans())
    def put_another_completed(self, spec: GroupSpec, settle: bool) -> None:
        self._start_put(spec, settle)  # a second rule: accepted groups are what fills the buffer

    @rule(spec=group_specs("aborted"), settle=st.booleans())
    def put_aborted(self, spec: GroupSpec, settle: bool) -> None:
        self._start_put(spec, settle)

    @precondition(lambda self: self.with_filter)
    @rule(spec=group_specs("filtered"), settle=st.booleans())
    def put_filter_rejected(self, spec: GroupSpec, settle: bool) -> None:
        self._start_put(spec, settle)

    def _start_put(self, spec: GroupSpec, settle: bool) -> None:
        rec = build_group(spec, self.next_gid, self.version, self.n)
        self.next_gid += 1
        self.groups[rec.gid] = rec
        op = Op("put", record=rec)
        self._log(f"-- put {rec.desc}{'' if settle else ' (scheduled, not yet run)'}")
        op.task = self._running_loop().create_task(self._put_op(op))
        self.ops.append(op)
        self._after_start(settle)

    @rule(without_version=st.booleans(), extra_context=st.booleans(), settle=st.booleans())
    def start_get(self, without_version: bool, extra_context: bool, settle: bool) -> None:
        # Concurrent gets share one current_version, as within one drain of the real
        # driver (one drain reads the version once), so which waiter gets a group never changes a verdict.
        outstanding = [op for op in self.ops if op.kind == "get" and not op.finished]
        arg = self.get_arg if outstanding else (None if without_version else self.version)
        self.get_arg = arg
        op = Op("get", arg=arg, context={"rollout_id": 7, "unknown_key": "ignored"} if extra_context else {})
        self._log(
            f"-- get(current_version={arg}{', rollout_id=7, unknown_key=...' if extra_context else ''})"
            f"{'' if settle else ' (scheduled, not yet run)'}"
        )
        op.task = self._running_loop().create_task(self._get_op(op))
        self.ops.append(op)
        self._after_start(settle)

    @rule()
    def run_until_quiescent(self) -> None:
        self._log("-- run until quiescent")
        self._settle()

    @rule(by=st.integers(1, 2))
    def bump_version(self, by: int) -> None:
        self.version += by
        self._log(f"-- weight version -> {self.version}")

    @precondition(lambda self: self.quiescent and any(op.started and not op.finished for op in self.ops))
    @rule(pick=st.integers(0, 7))
    def cancel_blocked(self, pick: int) -> None:
        blocked = [op for op in self.ops if op.started and not op.finished]
        op = blocked[pick % len(blocked)]
        what = f"put {op.rec.desc}" if op.kind == "put" else f"get(current_version={op.arg})"
        self._log(f"-- cancel blocked {what}")
        assert op.task is not None, "a started op has its task"
        op.task.cancel()
        self._settle()

    @rule(twice=st.booleans())
    def get_metrics(self, twice: bool) -> None:
        for _ in range(2 if twice else 1):
            self._check_metrics()

    # -- invariants ----------------------------------------------------------------------------------
    # One @invariant (so the printed reproduction has one line per step) running the
    # named checks; each violation raises its own class (see VIOLATIONS).

    @invariant()
    def buffer_invariants(self) -> None:
        if self.violation is None and self.quiescent and self.loop is not None:
            self._check_capacity()
            self._check_put_blocks_iff_full()
            self._check_get_blocks_iff_empty()
            self._check_conservation()
        if self.violation is not None:
            name, detail = self.violation
            raise VIOLATIONS[name](detail, self.timeline())

    def _check_capacity(self) -> None:
        n = self._impl_len()
        if n is not None and n > self.capacity:
            self._violate("capacity", f"len(buffer) = {n} > capacity {self.capacity}")

    def _check_put_blocks_iff_full(self) -> None:
        for op in self._blocked("put"):
            rec = op.rec
            if rec.kind != "completed":
                return self._violate(
                    "put_blocks_iff_full", f"put of {rec.desc} is blocked; a rejected group never blocks"
                )
            if len(self.queue) < self.capacity:
                return self._violate(
                    "put_blocks_iff_full",
                    f"put of {rec.desc} is still blocked although the "
                    f"buffer holds {len(self.queue)} of capacity {self.capacity}",
                )

    def _check_get_blocks_iff_empty(self) -> None:
        if self._blocked("get") and self.queue:
            front = self.queue[0]
            s = _staleness(front, self.get_arg)
            n = self._impl_len()
            if self._is_stale(s) and n is not None and n < len(self.queue):
                return self._violate(
                    "handler_once",
                    f"stale {front.desc} left the buffer (len(buffer) = {n}) "
                    "without a call to the unused-samples handler",
                )
            why = (
                "it is stale and should have gone to the unused-samples handler"
                if self._is_stale(s)
                else f"its staleness {s} is within the bound"
            )
            self._violate(
                "get_blocks_iff_empty",
                f"get(current_version={self.get_arg}) is still waiting while "
                f"{len(self.queue)} group(s) are queued; the first is {front.desc} and {why}",
            )

    def _check_conservation(self) -> None:
        t = self.totals
        blocked = len(self._blocked("put"))
        accounted = t["got"] + len(self.queue) + t["aborted"] + t["filtered"] + t["stale"] + blocked + t["cancelled"]
        assert t["tried"] == accounted, f"shadow model bookkeeping: {t}, queue {len(self.queue)}, blocked {blocked}"
        n = self._impl_len()
        if n is not None and n != len(self.queue):
            self._violate(
                "conservation",
                f"len(buffer) = {n} but {len(self.queue)} accepted group(s) are "
                f"neither returned nor rejected: {[r.gid for r in self.queue]}",
            )

    # -- the handler the buffer receives ----------------------------------------------------------

    def unused_handler_fn(self, prompt_group: list[Sample], cause: str | None = None) -> None:
        """Accepts Miles' ``handler(prompt_group)`` and this core's ``cause=`` form."""
        if self.tearing_down:
            return
        try:
            gid = prompt_group[0].group_index
            indices = [s.index for s in prompt_group]
        except (TypeError, AttributeError, IndexError):
            self._violate(
                "handler_once", f"handler received {prompt_group!r}, not a flat list of Samples (the prompt_group)"
            )
            return
        rec = self.groups.get(gid)
        self._log(f"   handler(g{gid}{'' if cause is None else f', cause={cause!r}'})")
        if self.violation:
            return
        if rec is None:
            return self._violate("handler_once", f"handler received an unknown group index {gid}")
        if indices != [s.index for s in rec.entry.prompt_group]:
            return self._violate(
                "handler_once",
                f"handler received samples {indices} for {rec.desc}; expected its "
                f"flat prompt_group {[s.index for s in rec.entry.prompt_group]}",
            )
        if rec.kind == "filtered":
            return self._violate(
                "filter_not_handled",
                f"handler called for {rec.desc}; a dynamic-filter reject must never reach the unused-samples handler",
            )
        rec.handler_calls += 1
        if rec.kind == "aborted":
            self._handled_aborted(rec, cause)
        else:
            self._handled_queued(rec, cause)

    def _handled_aborted(self, rec: GroupRecord, cause: str | None) -> None:
        if rec.state != "putting" or rec.handler_calls > 1:
            return self._violate(
                "handler_once",
                f"handler called again for {rec.desc} (call {rec.handler_calls}, group state {rec.state})",
            )
        if cause not in (None, "aborted"):
            self._violate("handler_once", f"handler for {rec.desc} got cause={cause!r}; expected 'aborted'")

    def _handled_queued(self, rec: GroupRecord, cause: str | None) -> None:
        if rec.state != "queued":
            return self._violate(
                "handler_once",
                f"handler called for {rec.desc}, which is neither aborted nor "
                f"a queued group being discarded as stale (its state: {rec.state})",
            )
        if not any(op.kind == "get" and op.started and not op.finished for op in self.ops):
            return self._violate("handler_once", f"handler called for queued {rec.desc} outside any get")
        if self._check_prefix(rec, "handler(stale)"):
            return
        s = _staleness(rec, self.get_arg)
        if not self._is_stale(s):
            return self._violate(
                "staleness_bound",
                f"{rec.desc} was discarded as stale by "
                f"get(current_version={self.get_arg}) but its staleness is {s} "
                f"(max_weight_staleness={self.max_staleness})",
            )
        if cause not in (None, "stale"):
            return self._violate("handler_once", f"handler for stale {rec.desc} got cause={cause!r}; expected 'stale'")
        self.queue.pop(0)
        rec.state = "stale"
        self.totals["stale"] += 1
        self.window.stale += 1
        self.window.popped.append(s)

    # -- operation wrappers (log every boundary, replay it into the model) ------------------------

    async def _put_op(self, op: Op) -> None:
        rec = op.rec
        op.started, rec.state = True, "putting"
        self.totals["tried"] += 1
        self._log(f"   put {rec.desc} started")
        try:
            await self.buffer.put(rec.entry)
        except asyncio.CancelledError:
            op.finished = True
            if not self.tearing_down:
                rec.state = "cancelled"
                self.totals["cancelled"] += 1
                self._log(f"   put g{rec.gid} cancelled")
            raise
        except Exception as e:  # noqa: BLE001 - the buffer under test must not raise
            op.finished = True
            return self._raised(f"put of {rec.desc}", e)
        op.finished = True
        self._put_returned(rec)

    def _put_returned(self, rec: GroupRecord) -> None:
        if self.violation:
            return
        if rec.kind == "aborted":
            rec.state = "rejected"
            self.totals["aborted"] += 1
            self.window.aborted += 1
            self._log(f"   put g{rec.gid} returned: rejected as aborted")
            if rec.handler_calls != 1:
                self._violate(
                    "handler_once",
                    f"put of aborted {rec.desc} returned after {rec.handler_calls} "
                    "handler call(s); expected exactly 1 with its prompt_group",
                )
            return
        if rec.kind == "filtered":
            rec.state = "rejected"
            self.totals["filtered"] += 1
            if rec.reason:
                self.window.drops[rec.reason] = self.window.drops.get(rec.reason, 0) + 1
            self._log(f"   put g{rec.gid} returned: rejected by the dynamic filter")
            return
        if len(self.queue) >= self.capacity:
            self._log(f"   put g{rec.gid} returned: stored -> {len(self.queue) + 1} > capacity {self.capacity}")
            n = self._impl_len()
            if n is not None and n <= self.capacity:
                return self._silently_removed(len(self.queue) + 1 - n)
            return self._violate(
                "capacity",
                f"put of {rec.desc} returned while the buffer already held "
                f"{len(self.queue)} = capacity group(s) {[r.gid for r in self.queue]}; "
                "it must block until a get frees a slot",
            )
        self.queue.append(rec)
        rec.state = "queued"
        self._log(f"   put g{rec.gid} returned: stored ({len(self.queue)}/{self.capacity})")

    async def _get_op(self, op: Op) -> None:
        op.started = True
        if op.arg is not None:
            self.last_seen_version = op.arg
        self._log(f"   get(current_version={op.arg}) started")
        try:
            out = await self.buffer.get(current_version=op.arg, **op.context)
        except asyncio.CancelledError:
            op.finished = True
            if not self.tearing_down:
                self._log(f"   get(current_version={op.arg}) cancelled")
            raise
        except Exception as e:  # noqa: BLE001 - the buffer under test must not raise
            op.finished = True
            return self._raised(f"get(current_version={op.arg})", e)
        op.finished = True
        self._get_returned(op, out)

    def _get_returned(self, op: Op, out: Any) -> None:
        try:
            gid = out.prompt_group[0].group_index
        except (AttributeError, TypeError, IndexError):
            self._log(f"   get(current_version={op.arg}) returned {out!r}")
            return self._violate("conservation", f"get returned {out!r}, not a DataBufferInput")
        rec = self.groups.get(gid)
        s = None if rec is None else _staleness(rec, op.arg)
        self._log(f"   get(current_version={op.arg}) returned g{gid} (staleness {s})")
        if self.violation:
            return
        if rec is None or out.group is not rec.entry.group and not _same_samples(out.group, rec.entry.group):
            return self._violate("conservation", f"get returned a group (index {gid}) that was never put")
        if rec.state != "queued":
            return self._violate(
                "conservation", f"get returned {rec.desc}, which is not in the buffer: {_STATE_WORDS[rec.state]}"
            )
        if self._check_prefix(rec, f"get(current_version={op.arg})"):
            return
        if self._is_stale(s):
            return self._violate(
                "staleness_bound",
                f"get(current_version={op.arg}) returned {rec.desc} with "
                f"staleness {s} > max_weight_staleness {self.max_staleness}",
            )
        self.queue.pop(0)
        rec.state = "got"
        self.totals["got"] += 1
        if s is not None:
            self.window.popped.append(s)

    def _silently_removed(self, count: int) -> None:
        """``len(buffer)`` says ``count`` queued group(s) left without a return or a handler call."""
        gone = self.queue[:count]
        if all(self._is_stale(_staleness(r, self.get_arg)) for r in gone):
            return self._violate(
                "handler_once",
                f"stale group(s) {[r.desc for r in gone]} left the buffer "
                f"(len(buffer) = {len(self.queue) + 1 - count} after the next put) without a "
                "call to the unused-samples handler",
            )
        self._violate(
            "conservation",
            f"group(s) {[r.desc for r in gone]} left the buffer without being returned "
            "by a get or handed to the handler",
        )

    def _check_prefix(self, rec: GroupRecord, who: str) -> bool:
        """``rec`` is leaving the buffer: every group put before it must have left first."""
        idx = self.queue.index(rec)
        if idx == 0:
            return False
        ahead = self.queue[:idx]
        fresh = [r for r in ahead if not self._is_stale(_staleness(r, self.get_arg))]
        if fresh:
            self._violate(
                "fifo",
                f"{who} took {rec.desc} while {fresh[0].desc}, put before it and not stale, "
                f"is still queued (queue order {[r.gid for r in self.queue]})",
            )
        else:
            self._violate(
                "handler_once",
                f"{who} took {rec.desc} after skipping stale group(s) "
                f"{[r.gid for r in ahead]} without handing them to the unused-samples handler",
            )
        return True

    def _raised(self, what: str, e: BaseException) -> None:
        tb = "".join(traceback.format_exception_only(type(e), e)).strip()
        self._log(f"   {what} raised {tb}")
        self._violate("no_exception", f"{what} raised {tb}\n{''.join(traceback.format_tb(e.__traceback__)[-3:])}")

    # -- metrics -----------------------------------------------------------------------------------

    def _check_metrics(self) -> None:
        try:
            got = self.buffer.get_metrics()
        except Exception as e:  # noqa: BLE001
            return self._raised("get_metrics()", e)
        w = self.window
        expected: dict[str, float] = {
            P + "queue_size": len(self.queue),
            P + "aborted_groups_filtered": w.aborted,
            P + "stale_groups_filtered": w.stale,
        }
        expected.update({DROP + r: c for r, c in w.drops.items()})
        if w.popped:
            expected[P + "avg_staleness"] = sum(w.popped) / len(w.popped)
            expected[P + "max_staleness"] = max(w.popped)
        v = self.last_seen_version
        in_buffer = [v - r.oldest for r in self.queue if v is not None and r.oldest is not None]
        if in_buffer:
            expected[P + "buffer_avg_staleness"] = sum(in_buffer) / len(in_buffer)
            expected[P + "buffer_max_staleness"] = max(in_buffer)
        shown = {k: got[k] for k in sorted(got)} if isinstance(got, dict) else got
        self._log(f"-- get_metrics() -> {shown}")
        self.window = Window()
        if self.violation:
            return
        optional = {P + k for k in ("avg_staleness", "max_staleness", "buffer_avg_staleness", "buffer_max_staleness")}
        problems = [
            f"{k}: expected {e}, got {got.get(k, 'absent')}"
            for k, e in expected.items()
            if k not in got or abs(float(got[k]) - e) > 1e-9
        ]
        problems += [
            f"{k}: expected absent, got {got[k]}"
            for k in got
            if k not in expected and (k in optional or k.startswith(DROP))
        ]
        if problems:
            self._violate(
                "metrics_window",
                "get_metrics() disagrees with the window since the previous call: " + "; ".join(problems),
            )

    # -- helpers -------------------------------------------------------------------------------------

    def _is_stale(self, s: int | None) -> TypeGuard[int]:
        return s is not None and self.max_staleness is not None and s > self.max_staleness

    def _blocked(self, kind: str) -> list[Op]:
        return [op for op in self.ops if op.kind == kind and op.started and not op.finished]

    def _impl_len(self) -> int | None:
        return len(self.buffer) if isinstance(self.buffer, Sized) else None

    def _running_loop(self) -> VirtualTimeLoop:
        assert self.loop is not None, "the machine's loop is made in its initialize rule"
        return self.loop

    def _after_start(self, settle: bool) -> None:
        if settle:
            self._settle()
        else:
            self.quiescent = False

    def _run_ready(self) -> bool:
        """Run the loop until no callback is ready; False if it never got there."""
        loop = self._running_loop()
        for _ in range(MAX_LOOP_ITERATIONS):
            loop.call_soon(loop.stop)
            loop.run_forever()
            if not loop._ready:  # type: ignore[attr-defined]  # noqa: SLF001 - asyncio's ready queue: the one quiescence signal
                return True
        return False

    def _settle(self) -> None:
        if not self._run_ready():
            self._violate(
                "no_exception",
                f"the loop never went quiet after {MAX_LOOP_ITERATIONS} iterations (a busy-waiting put/get?)",
            )
        self.quiescent = True

    def _log(self, line: str) -> None:
        if not self.tearing_down:
            self.log.append(line)

    def _violate(self, name: str, detail: str) -> None:
        if self.violation is None:
            self.violation = (name, detail)
            self._log(f"   !! {name}: {detail.splitlines()[0]}")

    def timeline(self, max_lines: int = 200) -> str:
        lines = self.log[-max_lines:]
        skipped = len(self.log) - len(lines)
        head = [f"   ... {skipped} earlier line(s)"] if skipped else []
        return "\n".join(head + [f"{i + 1 + skipped:4d} {line}" for i, line in enumerate(lines)])


_STATE_WORDS = {
    "new": "its put never ran",
    "putting": "its put has not returned",
    "got": "it was already returned",
    "stale": "it was already discarded as stale",
    "rejected": "its put was rejected",
    "cancelled": "its put was cancelled",
}


def _same_samples(a: Any, b: Any) -> bool:
    try:
        return [s.index for s in iter_samples(a)] == [s.index for s in iter_samples(b)]
    except (TypeError, AttributeError):
        return False


# ---- entry points --------------------------------------------------------------------------------


def machine_for(factory: BufferFactory) -> type[BufferMachine]:
    """A ``BufferMachine`` subclass bound to ``factory`` (named ``BufferMachine`` so the
    printed reproduction reads ``state = BufferMachine()``)."""
    return type("BufferMachine", (BufferMachine,), {"factory": staticmethod(factory), "__module__": __name__})


def default_settings(max_examples: int = 200) -> Settings:
    """Deterministic given a seed; no explain phase (its "lines only failing cases ran"
    note tells nothing here and costs several times the shrink)."""
    return Settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        print_blob=True,
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow],
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    )


_BLOB = re.compile(r"@reproduce_failure\('([^']+)', (b'[^']*'|b\"[^\"]*\")\)")


def check_buffer(
    factory: BufferFactory, *, max_examples: int = 200, seed: int = 0, settings: Settings | None = None
) -> BufferFailure | None:
    """Run the buffer machine against ``factory``; ``None`` if it conforms.

    Deterministic for a given ``seed`` (no example database). ``settings`` replaces the
    defaults (``max_examples`` is then ignored). Errors that are not a broken buffer
    invariant (a bug in the factory's own set-up, say) propagate.
    """
    machine = _seed(seed)(machine_for(factory))
    return _run(machine, settings or default_settings(max_examples))


def replay_buffer_failure(factory: BufferFactory, failure: BufferFailure) -> BufferFailure | None:
    """Re-run exactly the failing example of ``failure`` (its ``print_blob`` blob)."""
    if failure.reproduce_blob is None:
        raise ValueError("this BufferFailure carries no reproduce_failure blob (settings had print_blob=False)")
    machine = _reproduce_failure(*failure.reproduce_blob)(machine_for(factory))
    return _run(machine, default_settings(1))


def _run(machine: type[BufferMachine], settings: Settings) -> BufferFailure | None:
    reported: list[str] = []  # a replay (@reproduce_failure) reports the steps instead of adding notes
    try:
        with with_reporter(lambda text: reported.extend(str(text).splitlines())):
            run_state_machine_as_test(machine, settings=settings)
    except BufferInvariantError as e:
        blob = None
        steps = []
        for note in [*reported, *getattr(e, "__notes__", [])]:
            m = _BLOB.search(note)
            if m:
                blob = (m.group(1), ast.literal_eval(m.group(2)))
            elif note.strip() and note.strip() != "state.buffer_invariants()":
                steps.append(note)
        return BufferFailure(e.invariant, e.detail, "\n".join(steps), e.timeline, blob or _given_blob(machine))
    return None


def _given_blob(machine: type) -> tuple[str, bytes] | None:
    return getattr(machine, "_hypothesis_internal_use_reproduce_failure", None)
