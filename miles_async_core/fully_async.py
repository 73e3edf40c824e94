"""``--fully-async`` rollout: a persistent worker and per-step drains
(`miles/rollout/fully_async_rollout.py`).

The worker starts on the first train call and never restarts. It keeps at most G
groups (group granularity) or G·n samples (sample granularity) in flight, always
pulls one prompt group at a time (``--over-sampling-batch-size`` has no effect), and
awaits ``buffer.put`` for each finished group. Any exception from a group kills it; its
sibling group tasks run on, as upstream (the extension ``cancel_orphaned_tasks`` cancels them).

A drain collects B groups with ``buffer.get(current_version=weight_version)``, the
version read once when the drain starts, checks the worker first (a dead worker fails
every later drain, even with groups buffered), sorts by first sample index, and ends
with exactly one ``buffer.get_metrics()``. With a ``generate_function`` that returns several
samples per call a group is n trajectories (``generate.py``), checked at the top level (L171).

The unused-samples handler: ``drop`` forgets the group, ``retry`` resets every sample
(``reset_for_retry``) and re-adds the flat prompt group to the data source, unless the
harness' retry cap (``async_max_retries``) is reached, in which case it is dropped.
Every call is counted and reported in the drain metrics and through the sink.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from miles_async_core import events as ev
from miles_async_core.buffer import DefaultDataBuffer
from miles_async_core.contracts import NullSink, RolloutEngine
from miles_async_core.generate import GenerateFunction
from miles_async_core.rollout import RewardFn, discard_tasks, prompt_group_of, retrieve_outcome, submit_group
from miles_async_core.scheduler import Progress, make_submission_scheduler
from miles_async_core.types import DataBufferConstructorInput, DataBufferInput, SamplingParams, first_sample

logger = logging.getLogger(__name__)

NO_PROGRESS_WARN_SECS = 30.0
HANDLER_PREFIX = "rollout/fully_async/handler_"


class _NoProgressWarning:
    """A drain's warning after each ``NO_PROGRESS_WARN_SECS`` without a group. Upstream waits
    for each group with a timeout, warns when it times out and waits again
    (fully_async_rollout.py:L144-L155): a warning every ``NO_PROGRESS_WARN_SECS`` since the
    last group arrived or the drain started. One timer per drain warns at those same times:
    set for a due time, it warns if no group came since, else it moves to the new due time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.last = loop.time()  # when the drain started or its last group arrived
        self._arm(self.last + NO_PROGRESS_WARN_SECS)

    def _arm(self, due: float) -> None:
        self.timer = self.loop.call_at(due, self._fire, due)

    def _fire(self, due: float) -> None:
        if self.last + NO_PROGRESS_WARN_SECS == due:  # no group since this timer was set
            logger.warning("No completed rollout groups for %.1fs", NO_PROGRESS_WARN_SECS)
            self.last = due
        self._arm(self.last + NO_PROGRESS_WARN_SECS)

    def progress(self) -> None:
        self.last = self.loop.time()

    def cancel(self) -> None:
        self.timer.cancel()


class FullyAsyncRolloutFn:
    def __init__(
        self,
        args: Any,
        engine: RolloutEngine,
        data_source: Any,
        *,
        sampling: SamplingParams,
        reward_fn: RewardFn | None = None,
        buffer_factory: Callable[..., Any] | None = None,
        sink: Any = None,
        generate_function: GenerateFunction | None = None,
    ) -> None:
        assert args.async_unused_samples_handler in ("retry", "drop")
        self.args = args
        self.engine = engine
        self.data_source = data_source
        self.sampling = sampling
        self.reward_fn = reward_fn
        self.generate_function = generate_function  # --custom-generate-function-path; None: single-turn
        self.buffer_factory = buffer_factory or (lambda ci: DefaultDataBuffer(ci, sink=sink))
        self.sink = sink or NullSink()
        self.scheduler = make_submission_scheduler(
            args.rollout_submission_granularity, args.n_samples_per_prompt, default="sample"
        )
        self.group_budget = args.group_budget
        self.buffer: Any = None
        self._worker: asyncio.Task[Any] | None = None
        self._worker_error_raised = False  # a drain has raised the dead worker's exception
        self._producer_resumed = asyncio.Event()
        self._producer_resumed.set()
        self._handler_counts = {"dropped": 0, "retried": 0, "retry_cap": 0}
        self.in_flight_groups: dict[int, list[Any]] = {}  # submitted, not yet through put (for accounting)

    # --- unused-samples handler -----------------------------------------------------
    def unused_handler_fn(self, prompt_group: list[Any], cause: str = "unknown") -> None:
        gi = prompt_group[0].group_index
        handler = self.args.async_unused_samples_handler
        if self.sink.enabled:
            self.sink.emit(ev.HANDLER, group_index=gi, handler=handler, cause=cause)
        if handler == "drop":
            self._handler_counts["dropped"] += 1
            if self.sink.enabled:
                self.sink.emit(ev.DROPPED, group_index=gi, reason=f"handler_drop:{cause}")
            return
        cap = self.args.async_max_retries
        if cap is not None and prompt_group[0].retry_count >= cap:
            self._handler_counts["retry_cap"] += 1
            if self.sink.enabled:
                self.sink.emit(ev.DROPPED, group_index=gi, reason=f"retry_cap:{cause}")
            return
        self._recycle(prompt_group)

    def _recycle(self, prompt_group: list[Any]) -> None:
        for s in prompt_group:
            s.reset_for_retry()
        self.data_source.add_samples([prompt_group])
        self._handler_counts["retried"] += 1
        if self.sink.enabled:
            self.sink.emit(ev.RECYCLED, group_index=prompt_group[0].group_index)

    # --- entry point ------------------------------------------------------------------
    async def __call__(self, rollout_id: int, weight_version: int | None) -> tuple[list[Any], dict[str, Any]]:
        if self._worker is None:
            self.buffer = self.buffer_factory(DataBufferConstructorInput(self.args, self.unused_handler_fn))
            self._worker = asyncio.ensure_future(self._worker_loop())
            logger.info("Started fully-async rollout worker")
        return await self._drain(rollout_id, weight_version)

    @property
    def worker(self) -> asyncio.Task[Any] | None:
        return self._worker

    def unreported_worker_error(self) -> BaseException | None:
        """The worker's exception if it died and no drain has raised it (it died after
        the last drain of the run); the driver logs it and keeps it on the context."""
        worker = self._worker
        if worker is None or not worker.done() or worker.cancelled() or self._worker_error_raised:
            return None
        return worker.exception()

    async def _worker_loop(self) -> None:
        scheduler, progress = self.scheduler, Progress(self.scheduler)
        active: set[asyncio.Task[Any]] = set()
        done: set[asyncio.Task[Any]] = set()
        try:
            while True:
                await self._producer_resumed.wait()
                while scheduler.has_capacity(pending_groups=len(active), group_budget=self.group_budget):
                    # exactly one group per pull, as upstream's `[prompt_group] = samples`
                    # (fully_async_rollout.py:L115): over-sampling has no effect, and a data
                    # source that returns more or fewer kills the worker (ValueError)
                    [prompt_group] = self.data_source.get_samples(1)
                    self.in_flight_groups[prompt_group[0].group_index] = prompt_group
                    submit_group(
                        self.engine,
                        prompt_group,
                        self.sampling,
                        scheduler=scheduler,
                        progress=progress,
                        active=active,
                        reward_fn=self.reward_fn,
                        sink=self.sink,
                        generate_function=self.generate_function,
                    )
                done, active = await progress.wait_for_progress(active)
                # Upstream puts in set-iteration order (unspecified); sorting keeps runs reproducible.
                for task in sorted(done, key=lambda t: prompt_group_of(t)[0].index):
                    await self.buffer.put(DataBufferInput(prompt_group_of(task), task.result()))
                    del self.in_flight_groups[prompt_group_of(task)[0].group_index]
        except BaseException:
            # The first failure kills the worker (as upstream). Upstream leaves the sibling
            # group tasks running (fully_async_rollout.py:L128-L136) and so does the core,
            # reading each outcome when it ends, so no failure is logged from a finalizer
            # (the CPython 3.11 problem, rollout.discard_tasks). The harness extension
            # cancel_orphaned_tasks cancels and collects them instead.
            if getattr(self.args, "cancel_orphaned_tasks", False):
                await discard_tasks(active | done)
            else:
                for task in sorted(active | done, key=lambda t: prompt_group_of(t)[0].index):
                    if task.done():
                        retrieve_outcome(task)
                    else:
                        task.add_done_callback(retrieve_outcome)
            raise

    async def _next_group(self, weight_version: int | None) -> DataBufferInput:
        worker = self._worker
        assert worker is not None, "_next_group runs only after the worker started (__call__)"
        # asyncio.ensure_future(coroutine): the worker's (running) loop's create_task
        get_task: asyncio.Task[DataBufferInput] = worker.get_loop().create_task(
            self.buffer.get(current_version=weight_version)
        )
        try:
            while True:
                if worker.done():
                    # upstream's self._worker.result() (fully_async_rollout.py:L152): the
                    # worker's exception, or CancelledError for a cancelled worker
                    if not worker.cancelled() and worker.exception() is not None:
                        self._worker_error_raised = True
                    worker.result()
                    raise RuntimeError("fully-async rollout worker exited without an exception")
                if get_task.done():
                    return get_task.result()
                # the no-progress warning is the drain's one timer (_NoProgressWarning)
                await asyncio.wait([get_task, worker], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not get_task.done():
                get_task.cancel()

    async def _drain(self, rollout_id: int, weight_version: int | None) -> tuple[list[Any], dict[str, Any]]:
        args = self.args
        if self.sink.enabled:
            self.sink.emit(ev.DRAIN_START, rollout_id=rollout_id, current_version=weight_version)
        data: list[Any] = []
        warning = _NoProgressWarning(asyncio.get_running_loop())
        try:
            while len(data) < args.rollout_batch_size:
                entry = await self._next_group(weight_version)
                warning.progress()
                # top level, as upstream (fully_async_rollout.py:L171): a nested group has n
                # trajectories of any number of turns each
                assert len(entry.group) == args.n_samples_per_prompt, (
                    f"group has {len(entry.group)} trajectories, expected {args.n_samples_per_prompt}"
                )
                data.append(entry.group)
        finally:
            warning.cancel()
        data.sort(key=lambda g: first_sample(g).index)
        return data, self._finish_drain(rollout_id)

    def _finish_drain(self, rollout_id: int) -> dict[str, float]:
        """The drain's one ``get_metrics()`` call, plus the handler's window counters."""
        metrics: dict[str, float] = self.buffer.get_metrics()
        for key, count in self._handler_counts.items():
            metrics[HANDLER_PREFIX + key] = float(count)
            self._handler_counts[key] = 0
        if self.sink.enabled:
            self.sink.emit(ev.DRAIN_END, rollout_id=rollout_id)
        return metrics
