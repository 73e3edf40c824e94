"""The fully-async data buffer: Miles' ``DataBuffer`` contract and ``DefaultDataBuffer``.

Mirrors `miles/rollout/fully_async_data_buffer.py` (radixark/miles at ``rules.PINNED_MILES_COMMIT``).

Guarantees of ``DefaultDataBuffer``:

* ``len(buffer) <= capacity = int(factor * B)`` at all times; ``put`` of an accepted
  group blocks exactly while the buffer is full.
* A group with any ABORTED sample is never stored; the unused handler gets its
  ``prompt_group`` exactly once. A dynamic-filter reject is never stored and never
  handed to the handler.
* ``get`` returns groups in put order, skipping groups whose staleness (against the
  ``current_version`` argument, oldest numeric version of the group) exceeds
  ``max_weight_staleness``; each such group goes to the handler exactly once.
* ``get_metrics`` reports the window since the previous call, then resets it.

Decisions where upstream leaves a choice open:

* Staleness metrics: ``avg_staleness`` / ``max_staleness`` cover every group *popped* by ``get``,
  including groups then rejected as stale, as upstream code does (its test
  ``test_stale_group_recycled`` pins this), not only the groups training consumed.
* Retry cap and persistence: a retry cap (``async_max_retries``) is enforced by the unused handler of the
  rollout function, not here; the buffer is not persisted across checkpoints (upstream
  loses buffered and in-flight prompts on resume; this in-memory core does too).
"""

from __future__ import annotations

import abc
import asyncio
import logging
from typing import Any, Callable

from miles_async_core import events as ev
from miles_async_core.contracts import NullSink
from miles_async_core.staleness import group_staleness
from miles_async_core.types import ABORTED, DataBufferConstructorInput, DataBufferInput, samples_of

logger = logging.getLogger(__name__)

METRIC_PREFIX = "rollout/fully_async/"


class DataBuffer(abc.ABC):
    """What a custom buffer (``--custom-async-data-buffer-path``) must provide."""

    @abc.abstractmethod
    async def put(self, input: DataBufferInput) -> None: ...

    @abc.abstractmethod
    async def get(self, current_version: int | None = None, **context: Any) -> DataBufferInput: ...

    @abc.abstractmethod
    def get_metrics(self) -> dict[str, float]: ...


def call_dynamic_filter(fn: Callable[..., Any] | None, args: Any, group: Any) -> tuple[bool, str | None]:
    """No filter (``fn is None``) keeps. Any other return than a ``DynamicFilterOutput``
    (anything with ``keep``) is wrapped as ``keep=output`` and read by truth value
    (`filter_hub/base_types.py:L11-L21`), so a filter that returns ``None`` drops the
    group, with no reason and so no drop metric; a bare bool keeps or drops."""
    if fn is None:
        return True, None
    out = fn(args, group)
    if not hasattr(out, "keep"):
        return bool(out), None
    return bool(out.keep), getattr(out, "reason", None)


class DefaultDataBuffer(DataBuffer):
    def __init__(self, constructor_input: DataBufferConstructorInput, *, sink: Any = None) -> None:
        args = constructor_input.args
        factor = args.async_data_buffer_capacity_factor
        assert factor > 0, "async_data_buffer_capacity_factor must be > 0 (validated in config)"
        self.capacity = int(factor * args.rollout_batch_size)
        assert self.capacity >= 1, "buffer capacity must be >= 1 (validated in config)"
        self.args = args
        self.max_weight_staleness = args.max_weight_staleness
        self.dynamic_filter = getattr(args, "dynamic_sampling_filter", None)
        self.unused_handler_fn = constructor_input.unused_handler_fn
        self.sink = sink or NullSink()
        self._buffer: list[DataBufferInput] = []
        self._cond = asyncio.Condition()
        self._current_version: int | None = None
        self._aborted = 0
        self._stale = 0
        self._filter_drops: dict[str, int] = {}
        self._consumed_staleness: list[int] = []

    def __len__(self) -> int:
        return len(self._buffer)

    async def put(self, input: DataBufferInput) -> None:
        gi = input.prompt_group[0].group_index if input.prompt_group else -1
        if ABORTED in [s.status for s in samples_of(input.group)]:
            self._aborted += 1
            if self.sink.enabled:
                self.sink.emit(ev.PUT_REJECTED, group_index=gi, reason="aborted")
            self.unused_handler_fn(input.prompt_group, cause="aborted")
            return
        keep, reason = call_dynamic_filter(self.dynamic_filter, self.args, input.group)
        if not keep:
            if reason:
                self._filter_drops[reason] = self._filter_drops.get(reason, 0) + 1
            if self.sink.enabled:
                self.sink.emit(ev.PUT_REJECTED, group_index=gi, reason=f"dynamic_filter:{reason}")
            return
        async with self._cond:
            if len(self._buffer) >= self.capacity and self.sink.enabled:
                self.sink.emit(ev.PUT_BLOCKED, group_index=gi, queue_size=len(self._buffer))
            while len(self._buffer) >= self.capacity:
                await self._cond.wait()
            self._buffer.append(input)
            if self.sink.enabled:
                self.sink.emit(ev.PUT_ACCEPTED, group_index=gi, queue_size=len(self._buffer))
            self._cond.notify_all()

    async def get(self, current_version: int | None = None, **context: Any) -> DataBufferInput:
        if current_version is not None:
            self._current_version = current_version
        async with self._cond:
            while True:
                while not self._buffer:
                    await self._cond.wait()
                entry = self._buffer.pop(0)
                self._cond.notify_all()
                s = group_staleness(entry.group, current_version)
                gi = entry.prompt_group[0].group_index if entry.prompt_group else -1
                if s is not None:
                    self._consumed_staleness.append(s)
                if s is None or self.max_weight_staleness is None or s <= self.max_weight_staleness:
                    if self.sink.enabled:
                        self.sink.emit(
                            ev.GOT,
                            group_index=gi,
                            staleness=s,
                            current_version=current_version,
                            queue_size=len(self._buffer),
                        )
                    return entry
                logger.debug("Filtered stale group (staleness=%s > max=%s)", s, self.max_weight_staleness)
                self._stale += 1
                if self.sink.enabled:
                    self.sink.emit(ev.STALE_REJECTED, group_index=gi, staleness=s, current_version=current_version)
                self.unused_handler_fn(entry.prompt_group, cause="stale")

    def get_metrics(self) -> dict[str, float]:
        p = METRIC_PREFIX
        m: dict[str, float] = {
            p + "queue_size": float(len(self._buffer)),
            p + "aborted_groups_filtered": float(self._aborted),
            p + "stale_groups_filtered": float(self._stale),
        }
        for reason, count in self._filter_drops.items():
            m[f"rollout/dynamic_filter/drop_{reason}"] = float(count)
        if self._consumed_staleness:
            m[p + "avg_staleness"] = sum(self._consumed_staleness) / len(self._consumed_staleness)
            m[p + "max_staleness"] = float(max(self._consumed_staleness))
        in_buffer = [s for e in self._buffer if (s := group_staleness(e.group, self._current_version)) is not None]
        if in_buffer:
            m[p + "buffer_avg_staleness"] = sum(in_buffer) / len(in_buffer)
            m[p + "buffer_max_staleness"] = float(max(in_buffer))
        self._aborted = 0
        self._stale = 0
        self._filter_drops = {}
        self._consumed_staleness = []
        return m
