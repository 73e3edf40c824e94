"""Kernel vs staleness decomposition of the trainer-engine gap on real samples.

Contract. For every response token of every sample, three log-probs of the same token
are lined up: the engine's (``sample.rollout_log_probs``, taken at sampling time), the
trainer's full-forward recomputation under the *exact weights that sampled that token*
(its engine weight version, read from ``sample.token_versions``), and the trainer's
recomputation under its *current* weights. ``harness.measure.logprob_metrics.decompose_gap`` turns them
into ``kernel = engine - generating``, ``staleness = generating - current`` and
``total = engine - current``; ``kernel + staleness == total`` holds per token up to
float rounding (exactly, for float32 inputs differenced in float64).

A sample may span versions (``retract`` re-prefills under new weights; ``in_place``
keeps decoding on old KV): tokens are grouped by version and each distinct version
costs one full forward of the whole sequence (batched over the samples that need it),
so a token sampled by version ``v`` is scored by weights ``v`` over the same prefix.

Token categories (current version ``c``, token version ``v``, KV version ``kv``):

* ``fresh``: ``v == c`` and ``kv == v``;
* ``stale``: ``v < c`` and ``kv == v``;
* ``in_place_old_kv``: ``kv < v``. The engine attended to K/V computed by older
  weights, which no single-weights forward reproduces, so the "kernel" part of these
  tokens is not float noise: it also holds the mixture of two policies inside one
  forward. They are reported on their own so they never pollute the numerics figure.

Sample age is ``current version - oldest token version``; each decomposition carries
``meta`` = ``{step, age, index, versions}`` for ``harness.measure.logprob_metrics.aggregate_by``.

``VersionStore`` keeps CPU copies of the last ``capacity`` weight versions; asking for
an evicted version raises ``ConfigError`` naming the capacity and the fix.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from harness.measure.logprob_metrics import GapDecomposition, aggregate_by, decompose_gap
from harness.backends.torch_models import EngineModel
from harness.backends.torch_trainer import response_log_probs
from miles_async_core.errors import ConfigError
from miles_async_core.types import Sample, VersionRuns

CATEGORIES = ("fresh", "stale", "in_place_old_kv")
StateDict = dict[str, torch.Tensor]


class VersionStore:
    """CPU copies of the weights of the last ``capacity`` engine weight versions."""

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ConfigError(
                f"VersionStore capacity={capacity!r}: must be an integer >= 1 (the number of weight versions "
                "kept). Fix: pass max_weight_staleness + 2 (every version a sample can still carry, plus the current)."
            )
        self.capacity = capacity
        self._weights: collections.OrderedDict[int, StateDict] = collections.OrderedDict()
        self._evicted: set[int] = set()

    def put(self, version: int, state_dict: StateDict, *, copy: bool = True) -> None:
        """Store a detached CPU copy of ``state_dict`` under ``version``; evict the oldest.
        ``copy=False`` takes the tensors as they are (CPU tensors nobody writes to later,
        e.g. a fresh ``get_weights()`` result): no second copy inside a timed run."""
        self._weights[int(version)] = {k: v.detach().to("cpu", copy=copy) for k, v in state_dict.items()}
        self._weights.move_to_end(int(version))
        self._evicted.discard(int(version))
        while len(self._weights) > self.capacity:
            old, _ = self._weights.popitem(last=False)
            self._evicted.add(old)

    def get(self, version: int) -> StateDict:
        version = int(version)
        if version in self._weights:
            return self._weights[version]
        held = list(self._weights)
        why = "was evicted" if version in self._evicted else "was never stored"
        raise ConfigError(
            f"weights of version {version} {why}: the VersionStore keeps the last capacity={self.capacity} "
            f"versions (holding {held}). Fix: construct VersionStore(capacity=K) with K >= the oldest sample "
            f"age + 1 (e.g. max_weight_staleness + 2), and put() every version the engine loads."
        )

    def __contains__(self, version: object) -> bool:
        return version in self._weights

    def versions(self) -> list[int]:
        return list(self._weights)


def token_categories(sample: Sample, current_version: int) -> list[str]:
    """One category per response token (see the module docstring)."""
    out = []
    for version, kv_version, count in sample.token_versions.runs:
        if kv_version < version:
            cat = "in_place_old_kv"
        elif version == current_version:
            cat = "fresh"
        else:
            cat = "stale"
        out.extend([cat] * count)
    return out


def _check_sample(sample: Sample, current_version: int) -> None:
    n = len(sample.response_tokens)
    if not n == len(sample.rollout_log_probs) == len(sample.token_versions):
        raise ConfigError(
            f"sample {sample.index}: {n} response tokens, {len(sample.rollout_log_probs)} rollout_log_probs and "
            f"{len(sample.token_versions)} token_versions; they must align token for token (types.py invariant)."
        )
    newest = sample.token_versions.newest
    if newest is not None and newest > current_version:
        raise ConfigError(
            f"sample {sample.index} has a token of version {newest}, newer than current_version={current_version}. "
            "Fix: pass current_version in the numbering the store uses (GapTracker: the trainer's optimizer_steps)."
        )


def _log_probs_under(
    model: EngineModel,
    weights: StateDict,
    samples: list[Sample],
    temperature: float,
) -> list[torch.Tensor]:
    model.load_weights(weights)
    model.module.eval()
    with torch.no_grad():
        return [lp.detach().double().cpu() for lp in response_log_probs(model, samples, temperature)]


def decompose_samples(
    samples: Sequence[Sample],
    store: VersionStore,
    current_weights: StateDict,
    model_builder: Callable[[], EngineModel],
    temperature: float,
    *,
    current_version: int,
    step: int | None = None,
) -> list[GapDecomposition]:
    """One ``GapDecomposition`` per sample with a response (see the module docstring).

    ``model_builder()`` makes the trainer-side model once (its weights are replaced by
    each version's); ``store`` must hold every token version the samples carry."""
    todo = [s for s in samples if s.response_tokens]
    for s in todo:
        _check_sample(s, current_version)
    if not todo:
        return []
    model = model_builder()
    current = _log_probs_under(model, current_weights, todo, temperature)
    token_versions = [torch.tensor(s.token_versions.versions()) for s in todo]
    generating = [torch.full_like(c, float("nan")) for c in current]
    for version in sorted({v for s in todo for v in s.token_versions.versions()}):
        rows = [i for i, tv in enumerate(token_versions) if bool((tv == version).any())]
        lps = _log_probs_under(model, store.get(version), [todo[i] for i in rows], temperature)
        for i, lp in zip(rows, lps):
            sel = token_versions[i] == version
            generating[i][sel] = lp[sel]
    out = []
    for s, gen, cur in zip(todo, generating, current):
        assert not torch.isnan(gen).any(), "every token was scored by its generating version"
        oldest = s.token_versions.oldest
        assert oldest is not None, "a sample with response tokens has their versions (_check_sample)"
        meta = {
            "step": step,
            "age": current_version - oldest,
            "index": s.index,
            "versions": sorted({r[0] for r in s.token_versions.runs}),
        }
        out.append(decompose_gap(s.rollout_log_probs, gen, cur, token_categories(s, current_version), meta=meta))
    return out


def summarize(decompositions: Sequence[GapDecomposition]) -> dict[str, Any]:
    """Pooled aggregates overall, per step, per sample age and per token category."""
    pooled = GapDecomposition.concat(list(decompositions))
    return {
        "overall": pooled.aggregates(),
        "by_category": pooled.aggregates_by_category(),
        "by_step": aggregate_by(decompositions, lambda d: d.meta.get("step")),
        "by_age": dict(sorted(aggregate_by(decompositions, lambda d: d.meta["age"]).items())),
    }


class GapTracker:
    """The decomposition wired to a training loop, measuring age in optimizer steps.

    A weight version counts weight updates (``RunContext.weight_version``, the engine's
    ``weight_version``, every ``token_versions`` entry); the trainer counts optimizer
    steps (``TorchTrainer.optimizer_steps``). With ``--update-weights-interval`` k > 1
    the two differ, and the weights being trained are no engine version at all, so the
    store is keyed by optimizer steps. ``on_engine_update(engine_version,
    optimizer_steps, weights)`` is called where the driver loads weights into the
    engine: the weights go into the store under the trainer's step count then.
    ``observe(step, samples, ..., optimizer_steps=...)`` is called just before the
    optimizer step on ``samples``: token versions are translated to the step count
    their weights were taken at, so sample age is the policy lag in optimizer steps,
    and a token is ``fresh`` only when it was sampled with exactly the weights being
    trained."""

    def __init__(self, *, capacity: int, model_builder: Callable[[], EngineModel], temperature: float) -> None:
        self.store = VersionStore(capacity)
        self.model_builder, self.temperature = model_builder, temperature
        self.decompositions: list[GapDecomposition] = []
        self._to_steps: dict[int, int] = {}  # engine weight version -> optimizer steps of its weights
        self._model: EngineModel | None = None  # built once: a real model costs seconds to build

    def on_engine_update(
        self, engine_version: int, optimizer_steps: int, weights: StateDict, *, copy: bool = True
    ) -> None:
        self.store.put(optimizer_steps, weights, copy=copy)
        self._to_steps[int(engine_version)] = int(optimizer_steps)

    def _translated(self, sample: Sample) -> Sample:
        runs = VersionRuns()
        for version, kv_version, count in sample.token_versions.runs:
            missing = [v for v in (version, kv_version) if v not in self._to_steps]
            if missing:
                raise ConfigError(
                    f"sample {sample.index} has tokens of engine version {missing[0]}, which was never reported "
                    f"(known: {sorted(self._to_steps)}). Fix: call on_engine_update at every engine weight load, "
                    "including the initial one."
                )
            runs.append(self._to_steps[version], self._to_steps[kv_version], count)
        return dataclasses.replace(sample, token_versions=runs)

    def observe(
        self, step: int, samples: Sequence[Sample], *, current_weights: StateDict, optimizer_steps: int
    ) -> dict[str, float]:
        """Decompose ``samples`` against the weights about to be trained (taken after
        ``optimizer_steps`` steps); returns this step's pooled aggregates under ``gap/``
        keys (kept in ``decompositions`` too)."""
        translated = [self._translated(s) for s in samples]
        if self._model is None:
            self._model = self.model_builder()
        model = self._model
        decomps = decompose_samples(
            translated,
            self.store,
            current_weights,
            lambda: model,
            self.temperature,
            current_version=optimizer_steps,
            step=step,
        )
        self.decompositions += decomps
        return {f"gap/{k}": v for k, v in GapDecomposition.concat(decomps).aggregates().items()}

    def summary(self) -> dict[str, Any]:
        return summarize(self.decompositions)
