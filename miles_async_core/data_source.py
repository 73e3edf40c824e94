"""Prompt data sources (`miles/rollout/data_source.py`).

``RolloutDataSourceWithBuffer.get_samples(m)`` returns ``m`` prompt groups: recycled
groups first (FIFO), then fresh prompts. A fresh prompt becomes ``n`` samples with one
new ``group_index`` and strictly increasing ``index`` values. ``RolloutDataSource`` is
read-only: ``add_samples`` raises, as upstream.

Invariant: every group handed out is recorded through the sink (``taken``, with the
number of the ``get_samples`` call that handed it out), so a trace can account for every
prompt that entered the system and for how many were pulled at once.
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

    def _fresh_group(self) -> list[Sample]:
        text, tokens, label = self.prompt_fn(self.sample_offset)
        self.sample_offset += 1
        gi = self.sample_group_index
        self.sample_group_index += 1
        first = self.sample_index
        self.sample_index += self.n
        # The prompt token list is shared by the copies: nothing mutates a prompt. The fields
        # go by position (prompt, prompt_tokens, response_tokens, rollout_log_probs,
        # token_versions, weight_versions, status, index, group_index, label; the rest keep
        # their defaults): Python binds keywords in about twice the time, for every sample.
        return [Sample(text, tokens, [], [], VersionRuns(), [], PENDING, first + i, gi, label)
                for i in range(self.n)]

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        self.calls += 1
        return self._fresh(num_samples)

    def _fresh(self, num_samples: int) -> list[list[Sample]]:
        groups = [self._fresh_group() for _ in range(num_samples)]
        if self.sink.enabled:
            for g in groups:
                self.sink.emit(ev.TAKEN, group_index=g[0].group_index, indices=[s.index for s in g], recycled=False,
                               call=self.calls)
        return groups

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
                self.sink.emit(ev.TAKEN, group_index=g[0].group_index, indices=[s.index for s in g], recycled=True,
                               call=self.calls)
        return recycled + self._fresh(num_samples - len(recycled))

    def add_samples(self, groups: list[list[Sample]]) -> None:
        for group in groups:
            assert len(group) == self.n, f"recycled group has {len(group)} samples, expected {self.n}"
            self.buffer.append(group)
