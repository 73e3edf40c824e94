"""The narrow interfaces the core drives: engine, trainer and event sink.

Backends (simulated in ``harness/sim/``, real in ``harness/backends/``) implement
these; the drivers never look behind them. Time is whatever the running asyncio loop
says: the harness substitutes a virtual-time loop (``harness.sim.vtime``), so the core
needs no clock of its own.

Engine contract (the semantics every backend must honour):

* ``generate(sample, sampling)`` returns an awaitable that resolves to the same
  ``Sample`` with ``response_tokens``, ``rollout_log_probs`` and ``token_versions``
  filled (one entry per token) and exactly one entry appended to ``weight_versions``:
  the engine version when the output is emitted (SGLang's ``meta_info``). Status is
  ``COMPLETED``, ``TRUNCATED`` (hit ``max_new_tokens``) or ``ABORTED``. Cancelling
  the awaitable removes the request from the engine.
* ``pause_generation(mode)`` (``mode`` checked by ``check_pause_mode``: one of
  ``config.PAUSE_GENERATION_MODES``) stops every decode step before it returns:
  ``abort`` finishes all in-flight requests now as ``ABORTED`` with their partial
  output and the pre-update version; ``retract`` frees their KV and puts them back
  in the waiting queue, so on resume the prompt and the tokens so far are prefilled
  again under the new weights; ``in_place`` freezes them with their KV, and after the
  update decoding continues with the new weights on top of the old KV.
  New requests wait for admission while paused.
* ``update_weights(version, weights)`` loads weights and sets the engine version;
  only legal while paused.
* ``continue_generation()`` resumes.
* optional ``abort_requests()``: SGLang's ``/abort_request`` with ``abort_all``: aborts
  whatever is in flight (as ``pause_generation("abort")`` + ``continue_generation()``)
  and does nothing on an idle engine. One-step rollouts call it after every rollout, as
  upstream's ``abort()``; without it they pause and resume, and only when groups are
  still pending.
"""

from __future__ import annotations

from typing import Any, Awaitable, Protocol, runtime_checkable

from miles_async_core.config import PAUSE_GENERATION_MODES
from miles_async_core.errors import ConfigError
from miles_async_core.types import Sample, SamplingParams


def check_pause_mode(mode: str) -> None:
    """Raise ``ConfigError`` unless ``mode`` is one of ``PAUSE_GENERATION_MODES``; every
    engine calls this, so a bad mode reads the same whichever backend runs."""
    if mode not in PAUSE_GENERATION_MODES:
        raise ConfigError(
            f"--pause-generation-mode {mode!r} is not one of {list(PAUSE_GENERATION_MODES)}. "
            f"Fix: pass --pause-generation-mode with one of those values (retract is the default)."
        )


@runtime_checkable
class RolloutEngine(Protocol):
    weight_version: int

    def generate(self, sample: Sample, sampling: SamplingParams) -> Awaitable[Sample]: ...

    async def pause_generation(self, mode: str) -> None: ...

    async def update_weights(self, version: int, weights: Any) -> None: ...

    async def continue_generation(self) -> None: ...


@runtime_checkable
class Trainer(Protocol):
    """Consumes one batch of B groups per rollout id and hands out its weights."""

    async def train(self, rollout_id: int, groups: list[Any]) -> dict[str, float]: ...

    def get_weights(self) -> Any: ...


class EventSink(Protocol):
    enabled: bool  # False: emit() records nothing, and callers may skip building its payload

    def emit(self, kind: str, /, **fields: Any) -> None: ...


class NullSink:
    """Records nothing; the drivers check ``sink.enabled`` before building payloads."""

    def __init__(self) -> None:
        self.enabled = False  # not a class attribute: CPython 3.11 specialises reading this one

    def emit(self, kind: str, /, **fields: Any) -> None:  # pragma: no cover - trivial
        return None
