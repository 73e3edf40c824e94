"""Prompt data sources (`miles/rollout/data_source.py`).

``RolloutDataSourceWithBuffer.get_samples(m)`` returns ``m`` prompt groups: recycled
groups first (FIFO), then fresh prompts. A fresh prompt becomes ``n`` samples with one
new ``group_index`` and strictly increasing ``index`` values. ``RolloutDataSource`` is
read-only: ``add_samples`` raises, as upstream.

Invariant: every group handed out is recorded through the sink (``taken``, with the
number of the ``get_samples`` call that handed it out), so a trace can account for every
prompt that entered the system and for how many were pulled at once.

Checkpoints (``miles_async_core.checkpoint``): ``save(rollout_id)`` returns the cursor as
upstream saves it (``sample_offset``, ``epoch_id``, ``sample_group_index``,
``sample_index``; the recycle ``buffer`` is not in it, ``data_source.py:L124-L134``) and
``load(state)`` restores it. With ``track_sources`` (a run with lives) each ``taken`` also
names its source group (``source_index``: the prompt's ``sample_offset``; ``epoch``: 0, the
core's prompt stream has no end). With ``exactly_once`` (the harness extension
``exactly_once_resume``) the state also lists ``pending``: every source group taken and not
yet trained (``mark_trained``), in order; ``load`` re-queues them ahead of fresh prompts.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

from miles_async_core import events as ev
from miles_async_core.contracts import NullSink
from miles_async_core.types import PENDING, Sample, VersionRuns

# prompt_fn(k) -> (prompt text, prompt token ids, label) for the k-th fresh prompt.
PromptFn = Callable[[int], tuple[str, list[int], Any]]


class RolloutDataSource:
    def __init__(self, n_samples_per_prompt: int, prompt_fn: PromptFn, *, sink: Any = None) -> None:
        self.n = n_samples_per_prompt
        self.prompt_fn = prompt_fn
        self.sink = sink or NullSink()
        self.sample_offset = 0
        self.sample_group_index = 0
        self.sample_index = 0
        self.calls = 0  # get_samples calls so far; `taken` events carry it (one pull = one call)
        self.epoch_id = 0
        self.track_sources = False  # a run with lives: `taken` names its source group
        self.exactly_once = False  # the exactly_once_resume extension: save what is pending
        self.source_of: dict[int, int] = {}  # group_index -> source index (with track_sources)
        self.outstanding: dict[int, None] = {}  # source indices taken, not yet trained (exactly_once)
        self.requeued: deque[int] = deque()  # pending source indices loaded from a checkpoint

    def _fresh_group(self) -> list[Sample]:
        if self.requeued:
            source = self.requeued.popleft()
        else:
            source = self.sample_offset
            self.sample_offset += 1
        text, tokens, label = self.prompt_fn(source)
        gi = self.sample_group_index
        if self.track_sources or self.exactly_once:
            self.source_of[gi] = source
        if self.exactly_once:
            self.outstanding[source] = None
        self.sample_group_index += 1
        first = self.sample_index
        self.sample_index += self.n
        # The prompt token list is shared by the copies: nothing mutates a prompt. The fields
        # go by position (prompt, prompt_tokens, response_tokens, rollout_log_probs,
        # token_versions, weight_versions, status, index, group_index, label; the rest keep
        # their defaults): Python binds keywords in about twice the time, for every sample.
        return [Sample(text, tokens, [], [], VersionRuns(), [], PENDING, first + i, gi, label) for i in range(self.n)]

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        self.calls += 1
        return self._fresh(num_samples)

    def _fresh(self, num_samples: int) -> list[list[Sample]]:
        groups = [self._fresh_group() for _ in range(num_samples)]
        if self.sink.enabled:
            for g in groups:
                self.sink.emit(
                    ev.TAKEN,
                    group_index=g[0].group_index,
                    indices=[s.index for s in g],
                    recycled=False,
                    call=self.calls,
                    **self._source_fields(g[0].group_index),
                )
        return groups

    def _source_fields(self, group_index: int) -> dict[str, int]:
        """``source_index`` and ``epoch`` of a group, in a run with lives (else nothing)."""
        if not self.track_sources:
            return {}
        return {"source_index": self.source_of[group_index], "epoch": self.epoch_id}

    # --- checkpoints ------------------------------------------------------------------
    def save(self, rollout_id: int) -> dict[str, Any]:
        state: dict[str, Any] = {
            "sample_offset": self.sample_offset,
            "epoch_id": self.epoch_id,
            "sample_group_index": self.sample_group_index,
            "sample_index": self.sample_index,
        }
        if self.exactly_once:
            state["pending"] = self.pending_sources()
        return state

    def pending_sources(self) -> list[int]:
        """Source groups taken and not yet trained, oldest take first, then those loaded
        and not yet handed out again."""
        return list(self.outstanding) + [s for s in self.requeued if s not in self.outstanding]

    def load(self, state: dict[str, Any]) -> None:
        self.sample_offset = int(state.get("sample_offset", 0))
        self.epoch_id = int(state.get("epoch_id", 0))
        self.sample_group_index = int(state.get("sample_group_index", 0))
        self.sample_index = int(state.get("sample_index", 0))
        self.requeued = deque(int(s) for s in state.get("pending", ()))

    def mark_trained(self, group_indices: list[int]) -> None:
        """A training step consumed these groups: they are no longer pending."""
        if self.exactly_once:
            for gi in group_indices:
                self.outstanding.pop(self.source_of.get(gi, -1), None)

    def add_samples(self, groups: list[list[Sample]]) -> None:
        raise RuntimeError("Cannot add samples to RolloutDataSource. This is a read-only data source.")


class RolloutDataSourceWithBuffer(RolloutDataSource):
    def __init__(self, n_samples_per_prompt: int, prompt_fn: PromptFn, *, sink: Any = None) -> None:
        super().__init__(n_samples_per_prompt, prompt_fn, sink=sink)
        self.buffer: deque[list[Sample]] = deque()

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        self.calls += 1
        recycled: list[list[Sample]] = []
        while self.buffer and len(recycled) < num_samples:
            recycled.append(self.buffer.popleft())
        if self.sink.enabled:
            for g in recycled:
                self.sink.emit(
                    ev.TAKEN,
                    group_index=g[0].group_index,
                    indices=[s.index for s in g],
                    recycled=True,
                    call=self.calls,
                    **self._source_fields(g[0].group_index),
                )
        return recycled + self._fresh(num_samples - len(recycled))

    def add_samples(self, groups: list[list[Sample]]) -> None:
        for group in groups:
            assert len(group) == self.n, f"recycled group has {len(group)} samples, expected {self.n}"
            self.buffer.append(group)
