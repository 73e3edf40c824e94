"""Fault schedules for simulated runs, and ``run_with_faults`` that applies one.

A ``FaultSchedule`` is a frozen, seeded description of what goes wrong in a run:

* ``request_failure_rate``: each generate request fails with that probability
  (``SimEngineConfig.request_failure_rate``; the group fails, so one-step drops it and
  the fully-async worker dies with it).
* ``injected_abort_rate``: each request returns ABORTED at completion (as if the server
  aborted it); ``abort_storm_times_s``: at those virtual times every running request is
  aborted at once. Both go through the normal ABORTED paths (one-step keeps the group,
  the fully-async buffer rejects it and calls the unused handler).
* ``trainer_fail_at_step``: the trainer raises at that step (``SimTrainerConfig``).
* ``worker_crash_after_requests``: the engine's ``generate`` raises ``WorkerCrash`` on
  every request after the first N (fully-async only: the one-step loop would resubmit
  forever, as upstream would, without virtual time advancing).
* ``cancel_at_s``: the run's main task is cancelled at that virtual time.
* ``dynamic_filter_reject_rate``: a dynamic sampling filter (fully-async buffer) rejects
  that share of groups with reason ``fault``.

Every injected fault is recorded as a ``fault`` event (with the sample ``index`` when it
concerns one request) before its effect, so the checkers can tell it from a bug.

Contract of ``run_with_faults``: it never raises for a fault; it returns a ``RunOutcome``
whose ``error`` is ``None`` or one of ``EXPECTED_ERRORS``, and whose ``complete`` says
whether the run reached its end (then every checker applies; otherwise only those that
hold on a prefix).
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from miles_async_core import events as ev
from miles_async_core.buffer import DefaultDataBuffer
from miles_async_core.config import AsyncConfig
from miles_async_core.errors import ConfigError, WorkerDiedError
from miles_async_core.types import DataBufferConstructorInput, iter_samples
from harness.sim.scenario import Scenario
from harness.sim.engine import EngineRequestError, SimEngine, _uniform
from harness.sim.trainer import TrainerStepError
from harness.sim.run_scenario import SimResult, simulate
from harness.trace import Event


class WorkerCrash(RuntimeError):
    """An injected crash of the engine worker: every later generate raises."""


EXPECTED_ERRORS = (EngineRequestError, TrainerStepError, WorkerCrash, WorkerDiedError, asyncio.CancelledError)


@dataclass(frozen=True, kw_only=True)
class FaultSchedule:
    request_failure_rate: float = 0.0
    injected_abort_rate: float = 0.0
    abort_storm_times_s: tuple[float, ...] = ()
    trainer_fail_at_step: int | None = None
    worker_crash_after_requests: int | None = None
    cancel_at_s: float | None = None
    dynamic_filter_reject_rate: float = 0.0
    seed: int = 0

    @property
    def may_end_early(self) -> bool:
        return (self.request_failure_rate > 0 or self.trainer_fail_at_step is not None
                or self.worker_crash_after_requests is not None or self.cancel_at_s is not None)

    def check_applies(self, config: AsyncConfig) -> None:
        if self.worker_crash_after_requests is not None and not config.fully_async:
            raise ConfigError(f"faults.worker_crash_after_requests = {self.worker_crash_after_requests}: only with "
                              "fully_async=True (the one-step loop resubmits to a dead engine forever); fix: leave it "
                              "None or use request_failure_rate")
        if self.dynamic_filter_reject_rate and not config.fully_async:
            raise ConfigError(f"faults.dynamic_filter_reject_rate = {self.dynamic_filter_reject_rate}: only with "
                              "fully_async=True (the filter is injected through the data buffer); fix: set it to 0")


NO_FAULTS = FaultSchedule()


@dataclass
class RunOutcome:
    config: AsyncConfig
    events: list[Event]
    history: list[dict]
    error: BaseException | None
    result: SimResult | None = field(default=None, repr=False)

    @property
    def cancelled(self) -> bool:
        return isinstance(self.error, asyncio.CancelledError)

    @property
    def complete(self) -> bool:
        return self.error is None

    @property
    def clean(self) -> bool:
        """Ended normally, or with one of the errors a fault schedule can cause."""
        return self.error is None or isinstance(self.error, EXPECTED_ERRORS)


def fault_engine_class(base: type, faults: FaultSchedule) -> type:
    """A subclass of ``base`` (``SimEngine`` or a variant) that injects ``faults``."""
    if not (faults.injected_abort_rate or faults.abort_storm_times_s or faults.worker_crash_after_requests is not None):
        return base

    class FaultEngine(base):  # type: ignore[misc, valid-type]
        _fault_requests = 0
        _storms_armed = False

        def generate(self, sample, sampling):
            self._fault_requests += 1
            if not self._storms_armed:
                self._storms_armed = True
                loop = asyncio.get_running_loop()
                for t in faults.abort_storm_times_s:
                    loop.call_at(t, self._abort_storm)
            crash = faults.worker_crash_after_requests
            if crash is not None and self._fault_requests > crash:
                if self.sink.enabled:
                    self.sink.emit(ev.FAULT, what="worker_crash", group_index=sample.group_index)
                raise WorkerCrash(f"injected engine worker crash at request {self._fault_requests} "
                                  f"(index={sample.index})")
            return super().generate(sample, sampling)

        def _finish(self, req, *, aborted):
            if not aborted and faults.injected_abort_rate and _uniform(
                    faults.seed + 3, req.sample.index, req.sample.retry_count) < faults.injected_abort_rate:
                if self.sink.enabled:
                    self.sink.emit(ev.FAULT, what="injected_abort", index=req.sample.index)
                aborted = True
            super()._finish(req, aborted=aborted)

        def _abort_storm(self) -> None:
            if self.paused or self._pause is not None or not self.running:
                return
            if self.sink.enabled:
                self.sink.emit(ev.FAULT, what="abort_storm", running=len(self.running))
            for req in list(self.running.values()):
                if self.sink.enabled:
                    self.sink.emit(ev.FAULT, what="abort_storm_request", index=req.sample.index)
                super()._finish(req, aborted=True)
            self._start_segment(self._now())

    return FaultEngine


@dataclass(frozen=True)
class FilterOutput:
    keep: bool
    reason: str | None


class _ArgsWithFilter:
    """The run's config seen by the buffer, plus a seeded ``dynamic_sampling_filter``."""

    def __init__(self, config: AsyncConfig, rate: float, seed: int) -> None:
        self._config, self._rate, self._seed = config, rate, seed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)

    def dynamic_sampling_filter(self, args: Any, group: Any) -> FilterOutput:
        s = next(iter_samples(group))
        reject = _uniform(self._seed + 5, s.group_index, s.retry_count) < self._rate
        return FilterOutput(keep=not reject, reason="fault" if reject else None)


def run_with_faults(scenario: Scenario, faults: FaultSchedule = NO_FAULTS, *, engine_cls: type = SimEngine,
                    buffer_cls: type = DefaultDataBuffer, hooks: Callable | None = None) -> RunOutcome:
    """Run ``scenario`` with ``faults`` injected; ``engine_cls``/``buffer_cls`` let a suite
    run a variant (a seeded bug) under the same faults."""
    cfg = scenario.config
    faults.check_applies(cfg)
    sc = dataclasses.replace(
        scenario,
        engine=dataclasses.replace(scenario.engine, request_failure_rate=faults.request_failure_rate),
        trainer=dataclasses.replace(scenario.trainer, fail_at_step=faults.trainer_fail_at_step))
    holder: dict[str, Any] = {}
    engine = fault_engine_class(engine_cls, faults)

    def buffer_factory(ci: DataBufferConstructorInput) -> Any:
        args = _ArgsWithFilter(cfg, faults.dynamic_filter_reject_rate, faults.seed) \
            if faults.dynamic_filter_reject_rate else ci.args
        return buffer_cls(DataBufferConstructorInput(args, ci.unused_handler_fn), sink=holder["ctx"].sink)

    def hook(ctx: Any) -> None:
        holder["ctx"] = ctx
        if faults.cancel_at_s is not None:
            task = asyncio.current_task()
            loop = asyncio.get_running_loop()

            def cancel() -> None:
                if ctx.sink.enabled:
                    ctx.sink.emit(ev.FAULT, what="cancel")
                task.cancel()

            loop.call_at(faults.cancel_at_s, cancel)
        if hooks is not None:
            hooks(ctx)

    try:
        result = simulate(sc, buffer_factory=buffer_factory, engine_factory=engine, hooks=hook)
    except asyncio.CancelledError as exc:  # simulate() lets BaseException through
        ctx = holder["ctx"]
        return RunOutcome(cfg, list(ctx.sink.events), ctx.history, exc)
    return RunOutcome(cfg, result.events, result.history, result.error, result)
