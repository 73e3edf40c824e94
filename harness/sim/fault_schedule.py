"""Fault schedules for simulated runs, and the engine subclass that injects one
(``harness.sim.faults.run_with_faults`` runs a scenario under a schedule; a scenario file's
``[faults]`` table is read into a ``FaultSchedule`` here, without the runner).

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
* ``engine_stall_after_requests``: the engine accepts every request after the first N
  and never answers it (a wedged server): nothing fails, the run waits forever, which
  the watchdog (``harness.sim.watchdog``) reports as a hang. Not drawn by the property
  suites; a scenario file states it (its ``[faults]`` table) to seed a hang.
* ``dynamic_filter_reject_rate``: a dynamic sampling filter (fully-async buffer) rejects
  that share of groups with reason ``fault``.

Every injected fault is recorded as a ``fault`` event (with the sample ``index`` when it
concerns one request) before its effect, so the checkers can tell it from a bug.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig
from miles_async_core.errors import ConfigError
from harness.sim.draws import uniform


class WorkerCrash(RuntimeError):
    """An injected crash of the engine worker: every later generate raises."""


@dataclass(frozen=True, kw_only=True)
class FaultSchedule:
    request_failure_rate: float = 0.0
    injected_abort_rate: float = 0.0
    abort_storm_times_s: tuple[float, ...] = ()
    trainer_fail_at_step: int | None = None
    worker_crash_after_requests: int | None = None
    cancel_at_s: float | None = None
    dynamic_filter_reject_rate: float = 0.0
    # not in the repr: a drawn case's description (its digest, kept in the fault findings
    # file) is the same as before the field existed; the property suites never draw it
    engine_stall_after_requests: int | None = field(default=None, repr=False)
    seed: int = 0

    @property
    def may_end_early(self) -> bool:
        return (
            self.request_failure_rate > 0
            or self.trainer_fail_at_step is not None
            or self.worker_crash_after_requests is not None
            or self.cancel_at_s is not None
        )

    def check_applies(self, config: AsyncConfig) -> None:
        if self.worker_crash_after_requests is not None and not config.fully_async:
            raise ConfigError(
                f"faults.worker_crash_after_requests = {self.worker_crash_after_requests}: only with "
                "fully_async=True (the one-step loop resubmits to a dead engine forever); fix: leave it "
                "None or use request_failure_rate"
            )
        if self.dynamic_filter_reject_rate and not config.fully_async:
            raise ConfigError(
                f"faults.dynamic_filter_reject_rate = {self.dynamic_filter_reject_rate}: only with "
                "fully_async=True (the filter is injected through the data buffer); fix: set it to 0"
            )


NO_FAULTS = FaultSchedule()


def fault_engine_class(base: type, faults: FaultSchedule) -> type:
    """A subclass of ``base`` (``SimEngine`` or a variant) that injects ``faults``."""
    if not (
        faults.injected_abort_rate
        or faults.abort_storm_times_s
        or faults.worker_crash_after_requests is not None
        or faults.engine_stall_after_requests is not None
    ):
        return base

    class FaultEngine(base):
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
                raise WorkerCrash(
                    f"injected engine worker crash at request {self._fault_requests} (index={sample.index})"
                )
            stall = faults.engine_stall_after_requests
            if stall is not None and self._fault_requests > stall:
                if self.sink.enabled:
                    self.sink.emit(ev.FAULT, what="engine_stall", index=sample.index)
                return asyncio.get_running_loop().create_future()  # never answered
            return super().generate(sample, sampling)

        def _finish(self, req, *, aborted):
            if (
                not aborted
                and faults.injected_abort_rate
                and uniform(faults.seed + 3, req.sample.index, req.sample.retry_count) < faults.injected_abort_rate
            ):
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
