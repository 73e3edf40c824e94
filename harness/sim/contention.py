"""Contention: the engines and the trainer slowing each other on shared hardware.

On the calibrated CPU layout the engine (its own process) and the trainer (with the
driver, in the main process) share two cores, memory bandwidth and caches, so each side
runs slower while the other one works (the main job's loss table shows it as "rollout
slower" and "train slower"). The model has two numbers (``CostModel.contention_engine``
and ``contention_trainer``, fitted by ``harness.advise.costs.fit_contention``):

* while the trainer is training, every engine step (admission included) costs
  ``1 + engine`` times its cost (``SimEngine.set_slowdown``; a step in progress keeps
  what it has done and runs the rest at the new rate);
* while any engine is decoding, a training step progresses at ``1 / (1 + trainer)`` of
  its rate: a step of cost ``w`` that overlaps decoding for ``o`` seconds takes
  ``w + o * trainer / (1 + trainer)``.

* engines sharing one host (``CostModel.engine_slots``, fitted by
  ``harness.advise.costs.fit_engine_sharing``): with ``slots`` > 0, while ``k`` > 1
  engines decode at once every engine step costs ``max(1, k / slots)`` times as much
  (processor sharing: the engines together decode as fast as ``slots`` engines alone;
  on a cluster every engine has its own GPUs and ``slots`` is 0, off);
* the main process's demand on that host (``host_growth``; ``engine_cores``,
  ``main_cores``, ``host_cores``, fitted by ``harness.advise.host_share``): the slots are
  fitted on the sync mode, where the main process (driver and trainer) is idle while the
  engines decode; in an overlapped mode it wants ``main_cores`` of the host's
  ``host_cores`` all along, so ``k`` engines share more than in sync. With the host shared
  in proportion to demand (each engine wants ``engine_cores``), a state's slow-down is
  ``max(1, demand / host_cores)``, and ``k`` engines in the mode are slowed by
  ``host_growth(k)`` = (their slow-down over one engine's in the mode) / (the same in sync)
  on top of the sync sharing (one engine's slow-down in the mode is already in
  ``engine``). 0 (any of the three): off, the growth is 1.

Weight sync and waiting are not slowed (the model has them idle on one side).

Invariant: a ``Contention`` is attached only when a factor is above 0
(``harness.advise.predict.simulate_layout``); without one the engine's factor stays 1
and the trainer sleeps its cost as before, so a simulation without contention is the
same run, event for event (the golden traces do not change).
"""

from __future__ import annotations

import asyncio
from typing import Any

from miles_async_core.errors import ConfigError

_TIMER, _CHANGE = "timer", "change"


def host_growth(k: int, *, engine_cores: float, main_cores: float, host_cores: float) -> float:
    """How much more ``k`` engines slow each other with the main process wanting
    ``main_cores`` than without it: (k engines' slow-down / one engine's) with it, over the
    same without it, each slow-down ``max(1, demand / host_cores)`` (the host shared in
    proportion to demand). 1 when any figure is 0 (not measured) or ``k`` <= 1."""
    if k <= 1 or not (engine_cores > 0 and main_cores > 0 and host_cores > 0):
        return 1.0

    def slow(n: int, main: float) -> float:
        return max(1.0, (n * engine_cores + main) / host_cores)

    return (slow(k, main_cores) / slow(1, main_cores)) / (slow(k, 0.0) / slow(1, 0.0))


def _set(fut: asyncio.Future, value: str) -> None:
    if not fut.done():
        fut.set_result(value)


class Contention:
    """The coupling: engines report how many of them decode (``engine_busy``), the trainer
    runs its steps through ``train``; each side's rate follows the other's state."""

    def __init__(
        self,
        *,
        engine: float,
        trainer: float,
        engine_slots: float = 0.0,
        engine_cores: float = 0.0,
        main_cores: float = 0.0,
        host_cores: float = 0.0,
    ) -> None:
        for name, value in (
            ("contention_engine", engine),
            ("contention_trainer", trainer),
            ("engine_slots", engine_slots),
            ("engine_cores", engine_cores),
            ("main_cores", main_cores),
            ("host_cores", host_cores),
        ):
            if not value >= 0:
                source = (
                    "harness.advise.host_share"
                    if name.endswith("_cores")
                    else "harness.advise.costs.fit_contention / fit_engine_sharing"
                )
                raise ConfigError(
                    f"{name} = {value!r}: must be >= 0 (0: no slow-down); fix: use 0 or a positive value from {source}"
                )
        self.engine, self.trainer, self.slots = float(engine), float(trainer), float(engine_slots)
        self.cores = {
            "engine_cores": float(engine_cores),
            "main_cores": float(main_cores),
            "host_cores": float(host_cores),
        }
        self.engines: list[Any] = []  # objects with set_slowdown(factor)
        self.busy = 0  # engines decoding now
        self.training = False
        self._wake: asyncio.Future | None = None

    def attach(self, engine: Any) -> None:
        self.engines.append(engine)
        factor = self.engine_factor()
        if factor != 1.0:
            engine.set_slowdown(factor)

    def engine_factor(self) -> float:
        """What an engine step costs now, relative to the calibrated engine alone."""
        factor = 1.0 + self.engine if self.training else 1.0
        if self.slots and self.busy > 1:
            share = (self.busy / self.slots if self.busy > self.slots else 1.0) * host_growth(self.busy, **self.cores)
            if share > 1.0:
                factor *= share
        return factor

    def _apply(self) -> None:
        factor = self.engine_factor()
        for e in self.engines:
            e.set_slowdown(factor)

    def engine_busy(self, count: int) -> None:
        """``count`` engines decode from now on; a training step in progress re-plans,
        and with shared slots every engine's rate follows the count."""
        was = self.busy > 0
        self.busy = count
        if self.slots:
            self._apply()
        if (count > 0) != was and self._wake is not None:
            _set(self._wake, _CHANGE)

    def _set_training(self, training: bool) -> None:
        self.training = training
        if self.engine:
            self._apply()

    async def train(self, work_s: float) -> None:
        """Sleep one training step of ``work_s`` seconds of work alone, at ``1 / (1 +
        trainer)`` of the rate while an engine decodes."""
        loop = asyncio.get_running_loop()
        self._set_training(True)
        try:
            left = work_s
            if not self.trainer:  # only the engines slow down: the step takes its cost
                await asyncio.sleep(left)
                left = 0.0
            while left > 0:
                slow = 1.0 + self.trainer if self.busy else 1.0
                t0 = loop.time()
                self._wake = wake = loop.create_future()
                handle = loop.call_at(t0 + left * slow, _set, wake, _TIMER)
                try:
                    why = await wake
                finally:
                    handle.cancel()
                    self._wake = None
                # the timer ends the step exactly (no rounding remainder to sleep off)
                left = 0.0 if why == _TIMER else left - (loop.time() - t0) / slow
        finally:
            self._set_training(False)
