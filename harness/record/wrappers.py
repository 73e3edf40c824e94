"""The recording wrappers, one per Miles extension point. Each records what passes
through it and then calls the user's original (``harness.record.chain``) or upstream's
default. Where upstream loads and calls each (pinned tree):

* ``generate``: ``--custom-generate-function-path``, loaded by ``load_generate_function``
  (``inference_rollout_common.py:L50``), awaited once per sample by ``generate_and_rm``.
* ``RecordingDataBuffer``: ``--custom-async-data-buffer-path``, built with
  ``DataBufferConstructorInput`` by ``FullyAsyncRolloutFn`` (``fully_async_rollout.py:L82``).
* ``RecordingDataSource``: ``--data-source-path``, built with ``args`` by the rollout
  manager (``ray/rollout/rollout_manager.py:L69``).
* ``RecordingRolloutFn``: ``--rollout-function-path``, built by ``load_rollout_function``
  (``rollout_manager.py:L79``); upstream refuses the flag with ``--fully-async``
  (``arguments.py:L57``), where the buffer's ``get`` marks the drains instead.
* ``dynamic_filter``: ``--dynamic-sampling-filter-path``, called per finished group by
  the one-step rollout (``inference_rollout_train.py:L95``, ``L140``) and by the default
  buffer's ``put`` (``fully_async_data_buffer.py:L116``).
* ``convert_samples_to_train_data``: ``--custom-convert-samples-to-train-data-path``
  (``rollout_manager.py:L93``), called after the log function with ``(args, samples)``.
* ``log_rollout_data``: ``--custom-rollout-log-function-path`` (``ray/rollout/metrics.py:L73``),
  ``(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> skip default``.
* ``post_write``: ``--custom-update-weight-post-write-path`` (``update_weight_from_distributed/
  delta.py:L69``), ``(args, version_dir, rollout_engines)`` after a disk-delta write.

Event kinds are the harness's trace kinds (``miles_async_core.events``) in Miles' own
sample and group indices, plus ``generate_begin`` / ``generate_call`` (the start and end
of one ``/generate`` round of a sample, as the generate function saw it), which the merge
turns into trace events (``harness.record.merge``), and ``train_data`` /
``weights_written``, which it keeps out of the trace.
"""

from __future__ import annotations

import argparse
import inspect
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from miles_async_core import events as ev

from harness.trace import tokens_digest

from .chain import EXTENSION_POINTS, inner_path, load_inner
from .miles_shapes import DataBufferConstructorInput, DataBufferInput, GenerateFnInput, GenerateFnOutput, Group
from .miles_shapes import RolloutFnInput, RolloutFnOutput, Sample
from .writer import emit

GENERATE_BEGIN = "generate_begin"
GENERATE_CALL = "generate_call"
WEIGHTS_WRITTEN = "weights_written"


class _ProcessState:
    """What one process's wrappers share: the rollout manager's version as last seen,
    the groups taken during the current one-step rollout, the open drain, the dynamic
    filter's verdicts not yet read by the buffer, and (read by a run that waits on the
    buffer's state, ``harness.record.mutant_runs``) the buffer and the drains closed so far."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version: int | None = None
        self.taken: list[int | None] | None = None  # Sample.group_index is int | None upstream
        self.drain_open = False
        self.rollout_id: int | None = None
        self.verdicts: dict[int | None, str | None] = {}
        self.filtered: set[int | None] = set()  # one-step groups the filter dropped during this rollout
        self.buffer: _BufferImpl | None = None  # the process's recording buffer (fully async)
        self.drains_closed = 0

    def learn_version(self, version: int | None) -> None:
        if version is not None and version != self.version:
            self.version = version
            emit(ev.SET_WEIGHT_VERSION, version=version)


STATE = _ProcessState()


def reset_state() -> None:
    """Forget what earlier runs of this process left (several recorded runs in one
    process, as the harness's own tests make; a Miles process makes one run)."""
    global STATE, _GENERATE
    STATE = _ProcessState()
    _GENERATE = None


def _status(sample: Sample) -> str:
    status = getattr(sample, "status", None)
    return str(getattr(status, "value", status)).lower()


def _flat(group: Iterable[Sample | list[Sample]]) -> list[Sample]:
    return [y for x in group for y in (x if isinstance(x, list) else [x])]


# --------------------------------------------------------------------------- generate

_GENERATE: Callable[[GenerateFnInput], Awaitable[GenerateFnOutput]] | None = None


def _inner_generate() -> Callable[[GenerateFnInput], Awaitable[GenerateFnOutput]]:
    global _GENERATE
    if _GENERATE is None:
        from miles.rollout.inference_rollout.compatibility import load_generate_function

        path = inner_path("generate") or EXTENSION_POINTS["generate"][1]
        _GENERATE = load_generate_function(path)
    return _GENERATE


async def generate(input: GenerateFnInput) -> GenerateFnOutput:
    """``--custom-generate-function-path harness.record.generate``: one ``generate_call``
    event per sample the inner generate function returns (its index and group, what the
    round added: tokens, status, the ``weight_version`` entries the engine reported) and
    ``tokens_digest`` of the sample's ``tokens`` after it: upstream's single-turn generate
    leaves there the ``input_ids`` it sent then the output ids it got
    (``generate_endpoint_utils.py:L83-L94``), which a server that records its trace
    digests the same way."""
    sample = input.sample
    before = {id(sample): (int(sample.response_length or 0), len(sample.weight_versions or []))}
    at = (time.monotonic(), time.time())
    if not input.evaluation:
        emit(GENERATE_BEGIN, index=sample.index, group_index=sample.group_index, _at=at)
    output = await _inner_generate()(input)
    samples = output.samples if isinstance(output.samples, list) else [output.samples]
    for s in samples:
        length0, versions0 = before.get(id(s), (0, 0))
        if s is not sample:
            emit(ev.TRAJECTORY_SAMPLE, index=s.index, group_index=s.group_index, trajectory=sample.index)
        emit(
            GENERATE_CALL,
            index=s.index,
            group_index=s.group_index,
            start_mono=at[0],
            start_wall=at[1],
            added_tokens=int(s.response_length or 0) - length0,
            response_length=int(s.response_length or 0),
            status=_status(s),
            weight_versions=[str(v) for v in (s.weight_versions or [])],
            added_versions=[str(v) for v in (s.weight_versions or [])[versions0:]],
            evaluation=bool(input.evaluation),
            tokens_digest=tokens_digest(s.tokens) if s.tokens else None,
        )
    return output


# --------------------------------------------------------------------------- data source


class RecordingDataSource:
    """``--data-source-path harness.record.RecordingDataSource``: ``taken`` for every group
    ``get_samples`` hands out, ``recycled`` for every group ``add_samples`` takes back;
    everything else (``save``, ``load``, ``buffer``, ...) is the inner data source's."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._inner = load_inner("data_source")(args)
        self._args = args
        self._calls = 0
        self._sources: dict[int, tuple[int, int]] = {}  # group_index -> (source_index, epoch)

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("_inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        queued = {id(g) for g in getattr(self._inner, "buffer", ())}
        cursor = (getattr(self._inner, "sample_offset", None), getattr(self._inner, "epoch_id", None))
        groups = self._inner.get_samples(num_samples)
        self._calls += 1
        fresh = 0
        for g in groups:
            gi = g[0].group_index
            source = {}
            if id(g) not in queued:
                source = self._source(gi, cursor, fresh)
                fresh += 1
            elif gi in self._sources:
                source = dict(zip(("source_index", "epoch"), self._sources[gi]))
            emit(
                ev.TAKEN,
                group_index=gi,
                indices=[s.index for s in g],
                recycled=id(g) in queued,
                call=self._calls,
                **source,
            )
            with STATE.lock:
                if STATE.taken is not None:
                    STATE.taken.append(gi)
        return groups

    def add_samples(self, samples: list[list[Sample]]) -> object:
        out = self._inner.add_samples(samples)
        for g in samples or []:
            emit(ev.RECYCLED, group_index=g[0].group_index)
        return out

    def _source(self, gi: int, cursor: tuple[int | None, int | None], k: int) -> dict[str, int]:
        """The ``k``-th group this call read from the dataset: its position in the epoch's
        order and the epoch (``RolloutDataSource.get_samples`` reads on from ``sample_offset``
        and wraps into the next epoch, ``data_source.py:L85-L97``); a source group keeps
        this identity across a resume, its ``group_index`` does not."""
        offset, epoch = cursor
        dataset = getattr(self._inner, "dataset", None)
        if offset is None or epoch is None or dataset is None:
            return {}
        n = len(dataset)
        pos = offset + k
        self._sources[gi] = (pos % n, epoch + pos // n)
        return {"source_index": pos % n, "epoch": epoch + pos // n}

    def _state(self) -> dict[str, object]:
        inner = self._inner
        return {k: getattr(inner, k, None) for k in ("sample_offset", "epoch_id", "sample_group_index", "sample_index")}

    def save(self, rollout_id: int) -> object:
        """``RolloutManager.save`` calls it (``rollout_manager.py:L275-L277``): recorded as the
        data source's part of checkpoint ``rollout_id``, with the cursor it wrote."""
        out = self._inner.save(rollout_id)
        emit(ev.CHECKPOINT_SAVED, rollout_id=rollout_id, part="data_source", state=self._state())
        return out

    def load(self, rollout_id: int | None = None) -> object:
        """``RolloutManager.load`` (``rollout_manager.py:L280-L281``), called once at start-up
        with ``start_rollout_id - 1`` (``placement_group.py:L182``): that rollout is the
        model checkpoint the trainer loaded (Megatron: ``start_rollout_id = loaded + 1``,
        ``actor.py:L212``), recorded as the model part (``inferred``: the trainer's own
        load is in another process); the data source's part only when its state file
        exists (upstream logs a missing one and loads nothing, ``data_source.py:L146-L149``)."""
        args = self._args
        load_dir = getattr(args, "load", None)
        found = (
            bool(load_dir)
            and rollout_id is not None
            and os.path.exists(os.path.join(str(load_dir), f"rollout/global_dataset_state_dict_{rollout_id}.pt"))
        )
        out = self._inner.load(rollout_id)
        if rollout_id is not None and rollout_id >= 0:
            emit(ev.CHECKPOINT_LOADED, rollout_id=rollout_id, part="model", inferred=True)
        if found:
            emit(ev.CHECKPOINT_LOADED, rollout_id=rollout_id, part="data_source", state=self._state())
        return out


# --------------------------------------------------------------------------- filter


def dynamic_filter(args: argparse.Namespace, samples: Group, **kwargs: object) -> object:
    """``--dynamic-sampling-filter-path harness.record.dynamic_filter``: the inner filter's
    verdict (keep when there is none). One-step: a finished group (``group_done``), and a
    reject is the group's drop. Fully async: the buffer's ``put`` records the reject."""
    from miles.rollout.filter_hub.base_types import DynamicFilterOutput, call_dynamic_filter

    out = call_dynamic_filter(load_inner("filter"), args, samples, **kwargs)
    out = out if isinstance(out, DynamicFilterOutput) else DynamicFilterOutput(keep=bool(out))
    gi = _flat(samples)[0].group_index
    if not getattr(args, "fully_async", False):
        emit(ev.GROUP_DONE, group_index=gi, ok=True)
        if not out.keep:
            with STATE.lock:
                STATE.filtered.add(gi)
            emit(ev.DROPPED, group_index=gi, reason=f"dynamic_filter:{out.reason}")
    elif not out.keep:
        with STATE.lock:
            STATE.verdicts[gi] = out.reason
    return out


# --------------------------------------------------------------------------- rollout function


class RecordingRolloutFn:
    """``--rollout-function-path harness.record.RecordingRolloutFn`` (one-step and sync
    modes): ``generate_start`` / ``generate_end`` around each training rollout, the
    version the manager passes (``set_weight_version`` when it changes), and each group
    taken during the rollout and not returned: ``dropped`` (``not_returned``)."""

    def __init__(self, input: object) -> None:
        from miles.rollout.inference_rollout.compatibility import load_rollout_function

        path = inner_path("rollout") or EXTENSION_POINTS["rollout"][1]
        self.inner = load_rollout_function(input, path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __call__(self, input: RolloutFnInput) -> object:
        if getattr(input, "evaluation", False):
            return self.inner(input)
        STATE.learn_version(input.weight_version)
        emit(ev.GENERATE_START, rollout_id=input.rollout_id, version=input.weight_version)
        with STATE.lock:
            STATE.taken = []
        out = self.inner(input)
        if inspect.iscoroutine(out):
            return self._finish_async(input, out)
        self._finish(input, out)
        return out

    async def _finish_async(self, input: RolloutFnInput, coro: Awaitable[RolloutFnOutput]) -> RolloutFnOutput:
        out = await coro
        self._finish(input, out)
        return out

    def _finish(self, input: RolloutFnInput, out: RolloutFnOutput) -> None:
        returned = {_flat(g)[0].group_index for g in out.samples}
        with STATE.lock:
            taken, STATE.taken = STATE.taken or [], None
            filtered, STATE.filtered = STATE.filtered, set()
        for gi in taken:
            if gi not in returned and gi not in filtered:
                emit(ev.DROPPED, group_index=gi, reason="not_returned")
        emit(ev.GENERATE_END, rollout_id=input.rollout_id)


# --------------------------------------------------------------------------- fully-async buffer


def _recording_buffer_base() -> type:
    from miles.rollout.fully_async_data_buffer import DataBuffer

    return DataBuffer


class RecordingDataBuffer:
    """``--custom-async-data-buffer-path harness.record.RecordingDataBuffer``: a
    ``DataBuffer`` around the inner one (upstream's ``DefaultDataBuffer`` unless the user
    named theirs). ``put``: ``group_done``, then ``put_rejected`` (aborted, or the dynamic
    filter's reason), or ``put_blocked`` (it waited at capacity) and ``put_accepted``;
    ``get``: ``drain_start`` at a drain's first get, ``got`` with the group's staleness.
    The unused-samples handler the rollout function passes is wrapped: ``stale_rejected``
    when the inner buffer calls it from ``get``, ``handler``, and ``dropped`` under
    ``--async-unused-samples-handler drop`` (``retry`` re-adds through the data source,
    recorded there); ``get_metrics``: ``drain_end`` and the drain's ``metrics``. Queue sizes are read from the inner buffer's ``_buffer`` list when it
    has one (upstream's default does); a buffer without one records ``queue_size: null``."""

    _impl: type | None = None

    # the instance is of the class made below (_BufferImpl and Miles' DataBuffer), not of this one
    def __new__(cls, input: DataBufferConstructorInput) -> _BufferImpl:  # type: ignore[misc]
        # the DataBuffer subclass is made on first use, so importing harness.record does not import Miles
        if RecordingDataBuffer._impl is None:
            RecordingDataBuffer._impl = type("RecordingDataBuffer", (_BufferImpl, _recording_buffer_base()), {})
        return RecordingDataBuffer._impl(input)


class _BufferImpl:
    def __init__(self, input: DataBufferConstructorInput) -> None:
        from miles.rollout.fully_async_data_buffer import DataBufferConstructorInput

        self._args = input.args
        self._handle = input.unused_handler_fn
        self._aborting = False
        self._get_version: int | None = None
        inner_cls = load_inner("buffer")
        self._inner = inner_cls(DataBufferConstructorInput(args=input.args, unused_handler_fn=self._handler))
        STATE.buffer = self

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("_inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def queued(self) -> int | None:
        """Groups in the buffer now (None: the inner buffer has no ``_buffer`` list)."""
        return self._queue()

    def _queue(self) -> int | None:
        buf = getattr(self._inner, "_buffer", None)
        return len(buf) if isinstance(buf, list) else None

    def _staleness(self, group: Group, version: int | None) -> int | None:
        from miles.rollout.fully_async_data_buffer import group_oldest_weight_version

        oldest = group_oldest_weight_version(group)
        return None if version is None or oldest is None else int(version) - int(oldest)

    def _handler(self, prompt_group: list[Sample]) -> None:
        gi = prompt_group[0].group_index
        handler = getattr(self._args, "async_unused_samples_handler", "drop")
        cause = "aborted" if self._aborting else "stale"
        if cause == "stale":
            emit(
                ev.STALE_REJECTED,
                group_index=gi,
                staleness=self._staleness(prompt_group, self._get_version),
                current_version=self._get_version,
            )
        emit(ev.HANDLER, group_index=gi, handler=handler, cause=cause)
        self._handle(prompt_group)
        if handler == "drop":
            emit(ev.DROPPED, group_index=gi, reason=f"handler_drop:{cause}")

    async def put(self, input: DataBufferInput) -> None:
        gi = input.prompt_group[0].group_index
        emit(ev.GROUP_DONE, group_index=gi, ok=True)
        if any(_status(s) == "aborted" for s in _flat(input.group)):
            emit(ev.PUT_REJECTED, group_index=gi, reason="aborted")
            self._aborting = True  # the inner put calls the handler before its first await
            try:
                await self._inner.put(input)
            finally:
                self._aborting = False
            return
        buf = getattr(self._inner, "_buffer", None)
        capacity = getattr(self._inner, "_capacity", None)
        full = isinstance(buf, list) and capacity is not None and len(buf) >= capacity
        at = (time.monotonic(), time.time())
        await self._inner.put(input)
        with STATE.lock:
            rejected = gi in STATE.verdicts
            reason = STATE.verdicts.pop(gi, None)
        if rejected:
            emit(ev.PUT_REJECTED, group_index=gi, reason=f"dynamic_filter:{reason}")
            return
        if full:
            emit(ev.PUT_BLOCKED, group_index=gi, queue_size=capacity, _at=at)
        emit(ev.PUT_ACCEPTED, group_index=gi, queue_size=self._queue())

    async def get(self, current_version: int | None = None, **context: object) -> DataBufferInput:
        version = current_version
        with STATE.lock:
            opening, STATE.drain_open = not STATE.drain_open, True
        if opening:
            STATE.learn_version(version)
            emit(ev.DRAIN_START, rollout_id=None, current_version=version)
        self._get_version = version
        entry = await self._inner.get(current_version=current_version, **context)
        emit(
            ev.GOT,
            group_index=entry.prompt_group[0].group_index,
            staleness=self._staleness(entry.group, version),
            current_version=version,
            queue_size=self._queue(),
        )
        return entry

    def get_metrics(self) -> dict[str, float]:
        """The drain's end: the rollout function reads the metrics once, after its last get
        (``fully_async_rollout.py``, ``_drain``); recorded here, not at the log call, so that
        groups put meanwhile fall in the next drain's window."""
        metrics = self._inner.get_metrics()
        with STATE.lock:
            closing, STATE.drain_open = STATE.drain_open, False
            STATE.drains_closed += closing
        if closing:
            emit(ev.DRAIN_END, rollout_id=None)
            emit(ev.METRICS, rollout_id=None, metrics=dict(metrics))
        return metrics


# --------------------------------------------------------------------------- after the rollout


def log_rollout_data(
    rollout_id: int,
    args: argparse.Namespace,
    samples: Group,
    rollout_extra_metrics: dict[str, object] | None,
    rollout_time: float,
) -> bool:
    """``--custom-rollout-log-function-path harness.record.log_rollout_data``: the batch
    the rollout returned for training (``trained``: its groups, with the version the
    rollout ran under) and, one-step, the rollout's metrics. Returns
    the inner log function's answer (False without one: upstream's logging runs)."""
    groups: list[int | None] = []
    for s in _flat(samples):
        if s.group_index not in groups:
            groups.append(s.group_index)
    with STATE.lock:
        STATE.rollout_id = rollout_id
        version = STATE.version
    if not getattr(args, "fully_async", False):  # fully async: the buffer's get_metrics recorded them
        emit(ev.METRICS, rollout_id=rollout_id, metrics=dict(rollout_extra_metrics or {}))
    emit(ev.TRAINED, rollout_id=rollout_id, group_indices=groups, trainer_version=version, samples=len(_flat(samples)))
    inner = load_inner("log")
    return bool(inner(rollout_id, args, samples, rollout_extra_metrics, rollout_time)) if inner else False


def convert_samples_to_train_data(args: argparse.Namespace, samples: list[Sample]) -> object:
    """``--custom-convert-samples-to-train-data-path harness.record.convert_samples_to_train_data``:
    the inner converter, or upstream's conversion (``train_data_conversion.py:L50``, its
    default branch; without the rollout's metadata, which upstream does not pass to a
    custom converter); records ``train_data`` (samples and tokens handed to training)."""
    inner = load_inner("convert")
    if inner is not None:
        data = inner(args, samples)
    else:
        from miles.ray.rollout.train_data_conversion import convert_samples_to_train_data as upstream
        from miles.utils.misc import load_function

        data = upstream(
            args,
            samples,
            metadata={},
            custom_convert_samples_to_train_data_func=None,
            custom_reward_post_process_func=load_function(getattr(args, "custom_reward_post_process_path", None)),
        )
    with STATE.lock:
        rollout_id = STATE.rollout_id
    emit(
        "train_data",
        rollout_id=rollout_id,
        samples=len(samples),
        tokens=sum(len(t) for t in data.get("tokens", [])) if isinstance(data, dict) else None,
    )
    return data


def post_write(args: argparse.Namespace, version_dir: str, rollout_engines: list[object] | None) -> None:
    """``--custom-update-weight-post-write-path harness.record.post_write``: the trainer
    rank wrote a disk-delta version (``weights_written``), then the inner hook publishes it."""
    emit(WEIGHTS_WRITTEN, version_dir=str(version_dir), engines=len(rollout_engines or []))
    inner = load_inner("post_write")
    if inner is not None:
        inner(args, version_dir, rollout_engines)
