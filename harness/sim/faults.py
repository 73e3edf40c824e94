"""Run a scenario under a fault schedule (``harness.sim.fault_schedule``).

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
from miles_async_core.errors import WorkerDiedError
from miles_async_core.types import DataBufferConstructorInput, iter_samples
from harness.sim.draws import uniform
from harness.sim.engine import EngineRequestError, SimEngine
from harness.sim.fault_schedule import NO_FAULTS, FaultSchedule, WorkerCrash, fault_engine_class
from harness.sim.run_scenario import SimResult, simulate
from harness.sim.scenario import Scenario
from harness.sim.trainer import TrainerStepError
from harness.trace import Event

__all__ = [
    "EXPECTED_ERRORS",
    "NO_FAULTS",
    "FaultSchedule",
    "RunOutcome",
    "WorkerCrash",
    "fault_engine_class",
    "run_with_faults",
]


EXPECTED_ERRORS = (EngineRequestError, TrainerStepError, WorkerCrash, WorkerDiedError, asyncio.CancelledError)


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
        reject = uniform(self._seed + 5, s.group_index, s.retry_count) < self._rate
        return FilterOutput(keep=not reject, reason="fault" if reject else None)


def run_with_faults(
    scenario: Scenario,
    faults: FaultSchedule = NO_FAULTS,
    *,
    engine_cls: type = SimEngine,
    buffer_cls: type = DefaultDataBuffer,
    hooks: Callable | None = None,
) -> RunOutcome:
    """Run ``scenario`` with ``faults`` injected; ``engine_cls``/``buffer_cls`` let a suite
    run a variant (a seeded bug) under the same faults."""
    cfg = scenario.config
    faults.check_applies(cfg)
    sc = dataclasses.replace(
        scenario,
        engine=dataclasses.replace(scenario.engine, request_failure_rate=faults.request_failure_rate),
        trainer=dataclasses.replace(scenario.trainer, fail_at_step=faults.trainer_fail_at_step),
    )
    holder: dict[str, Any] = {}
    engine = fault_engine_class(engine_cls, faults)

    def buffer_factory(ci: DataBufferConstructorInput) -> Any:
        args = (
            _ArgsWithFilter(cfg, faults.dynamic_filter_reject_rate, faults.seed)
            if faults.dynamic_filter_reject_rate
            else ci.args
        )
        return buffer_cls(DataBufferConstructorInput(args, ci.unused_handler_fn), sink=holder["ctx"].sink)

    def hook(ctx: Any) -> None:
        holder["ctx"] = ctx
        if faults.cancel_at_s is not None:
            task = asyncio.current_task()
            assert task is not None  # the run's main coroutine runs as a task
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
