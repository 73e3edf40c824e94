"""Group generation and the one-step-ahead rollout (`inference_rollout_train.py`).

``generate_and_rm_group`` submits every sample of a group, fires the scheduler's
sample callback exactly once per sample (success, error or cancellation), and returns
or raises only after every sample is done; on a failure it cancels the siblings.

``OneStepRollout`` is one ``generate`` call of the default (non fully-async) path:
pull ``over_sampling_batch_size`` groups per submission while the scheduler has
capacity, keep the first B groups the dynamic filter accepts, abort what is still in
flight at the end (``abort_request abort_all``: the engine's ``abort_requests`` after every
rollout, as upstream), await the pending groups in completion order (the first that raises
fails the rollout, as upstream), return the B groups sorted by index. With
``--partial-rollout`` the pending groups go back to the data source as they are, to be
resumed by a later rollout (``OneStepRollout._resume_later``).
Its metrics are upstream's, ``rollout/dynamic_filter/drop_<reason>`` per filter drop with a
truthy reason, plus the core's own ``rollout/dropped_groups/*`` counts. Every group it does not return is accounted for through the sink (``dropped`` with a
reason): nothing is lost silently.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Iterator

from miles_async_core import events as ev
from miles_async_core.buffer import call_dynamic_filter
from miles_async_core.collect import collect
from miles_async_core.contracts import NullSink, RolloutEngine
from miles_async_core.errors import EngineDeadError
from miles_async_core.generate import GenerateFunction, generate_and_rm
from miles_async_core.scheduler import Progress, make_submission_scheduler
from miles_async_core.types import ABORTED, PENDING, Sample, SamplingParams, Status, first_sample

logger = logging.getLogger(__name__)

RewardFn = Callable[[Sample], float]


async def generate_and_rm_group(
    engine: RolloutEngine,
    group: list[Sample],
    sampling: SamplingParams,
    *,
    reward_fn: RewardFn | None = None,
    sample_done_callback: Callable[..., Any] | None = None,
    sink: Any = None,
    generate_function: GenerateFunction | None = None,
) -> list[Any]:
    if generate_function is None:
        futs = []
        for s in group:
            if s.status is PENDING:  # a fresh sample is a plain request (_generate, without its checks)
                f = engine.generate(s, sampling)
                futs.append(f if isinstance(f, asyncio.Future) else asyncio.ensure_future(f))
            else:
                futs.append(_generate(engine, s, sampling))
        return await await_group(futs, group, reward_fn=reward_fn, sample_done_callback=sample_done_callback, sink=sink)
    # the group is what the calls returned, in order (inference_rollout_common.py:L161-L168)
    futs = [
        asyncio.ensure_future(generate_and_rm(generate_function, engine, s, sampling, reward_fn=reward_fn, sink=sink))
        for s in group
    ]
    await await_group(futs, group, sample_done_callback=sample_done_callback, sink=sink)
    return [f.result() for f in futs]


def _generate(engine: RolloutEngine, sample: Sample, sampling: SamplingParams) -> asyncio.Future[Any]:
    """One sample's generate call. A sample of a resumed ``--partial-rollout`` group that is
    already finished is kept as it is, and one with no token budget left is truncated
    without a request, as upstream's ``generate_and_rm`` and single-turn ``generate``
    (``inference_rollout_common.py:L70-L75``, ``single_turn.py:L26-L33``)."""
    if sample.status is Status.ABORTED and sample.response_tokens and sample.response_length >= sampling.max_new_tokens:
        sample.status = Status.TRUNCATED
    if sample.status is Status.COMPLETED or sample.status is Status.TRUNCATED:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(sample)
        return fut
    f = engine.generate(sample, sampling)
    return f if isinstance(f, asyncio.Future) else asyncio.ensure_future(f)


async def await_group(
    futs: list[asyncio.Future[Any]],
    group: list[Sample],
    *,
    reward_fn: RewardFn | None = None,
    sample_done_callback: Callable[..., Any] | None = None,
    sink: Any = None,
) -> list[Sample]:
    """The group's requests are submitted: wait for all of them or the first failure (then
    cancel and collect the rest), reward the samples, record ``group_done``."""
    first_failure_or_all = asyncio.get_running_loop().create_future()
    remaining = len(futs)

    def on_sample_done(f: asyncio.Future[Any]) -> None:
        # One callback per sample does both jobs (the scheduler's credit and the group's
        # countdown): long simulations create hundreds of thousands of samples.
        nonlocal remaining
        remaining -= 1
        if sample_done_callback is not None:
            sample_done_callback(f)
        if (remaining == 0 or f.cancelled() or f.exception() is not None) and not first_failure_or_all.done():
            first_failure_or_all.set_result(None)

    for f in futs:
        f.add_done_callback(on_sample_done)
    try:
        await first_failure_or_all
        for f in futs:
            if f.cancelled():
                raise asyncio.CancelledError(f"a sample of group {group[0].group_index} was cancelled")
            if f.done() and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]  # not None, checked above
    except BaseException:
        for f in futs:
            f.cancel()
        await collect(futs)
        if sink is not None and sink.enabled:
            sink.emit(ev.GROUP_DONE, group_index=group[0].group_index, ok=False)
        raise
    if reward_fn is not None:
        for s in group:
            # a sample kept from a resumed partial group keeps its reward (upstream rewards
            # only `sample.reward is None`, inference_rollout_common.py:L130)
            if s.status != ABORTED and s.reward is None:
                s.reward = reward_fn(s)
    if sink is not None and sink.enabled:
        sink.emit(ev.GROUP_DONE, group_index=group[0].group_index, ok=True)
    return group


async def discard_tasks(tasks: Any) -> None:
    """Cancel the unfinished tasks and retrieve every outcome. A failed task whose
    exception nobody retrieved is logged from its finalizer at an arbitrary later point
    ("Task exception was never retrieved"); on CPython 3.11 that traceback formatting,
    run from a GC pass inside another ``ast.parse``, corrupts the AST constructor's
    recursion bookkeeping and fails an unrelated parse with ``SystemError``."""
    # Cancel in submission order: set order follows memory addresses, and the order of
    # cancel() calls is the order the tasks run their cleanup (and emit trace events).
    tasks = sorted(tasks, key=lambda t: first_sample(prompt_group_of(t)).index if hasattr(t, "prompt_group") else -1)
    for task in tasks:
        if not task.done():
            task.cancel()
    if tasks:
        await collect(tasks)


def prompt_group_of(task: asyncio.Future[Any]) -> list[Sample]:
    """The prompt group a task of ``submit_group`` generates."""
    group: list[Sample] = task.prompt_group  # type: ignore[attr-defined]
    return group


def retrieve_outcome(task: asyncio.Future[Any]) -> None:
    """A done-callback for a task left running: reads its outcome, so a failure is never
    logged from the task's finalizer (see ``discard_tasks``)."""
    if not task.cancelled():
        task.exception()


async def _group_task(
    engine: RolloutEngine,
    group: list[Sample],
    sampling: SamplingParams,
    *,
    progress: Progress,
    reward_fn: RewardFn | None,
    sample_done_callback: Callable[..., Any] | None,
    sink: Any,
    generate_function: GenerateFunction | None,
    loop: asyncio.AbstractEventLoop,
) -> list[Any]:
    """A submitted group's body: reports its end to ``progress`` from its last loop step,
    so a waiter resuming later in that step counts it done, as ``asyncio.wait`` does.
    ``loop`` is the loop it runs on (``current_task(loop)`` does not look it up again)."""
    try:
        return await generate_and_rm_group(
            engine,
            group,
            sampling,
            reward_fn=reward_fn,
            sink=sink,
            sample_done_callback=sample_done_callback,
            generate_function=generate_function,
        )
    finally:
        task = asyncio.current_task(loop)
        assert task is not None  # this coroutine runs as a task (submit_group)
        progress.ended(task)


def as_completed_in_order(tasks: Any, *, key: Callable[..., Any]) -> Iterator[Awaitable[Any]]:
    """``asyncio.as_completed(tasks)`` (CPython 3.11: the same queue, callbacks and loop
    steps), each awaitable returning the finished task itself. The tasks already done when
    it starts come out by ``key``: asyncio registers their callbacks in set order, which
    follows memory addresses, so the upstream runner and the core pin it; the rest come out as they finish."""
    todo = set(tasks)
    done: asyncio.Queue[Any] = asyncio.Queue()

    def on_completion(task: asyncio.Future[Any]) -> None:
        todo.discard(task)
        done.put_nowait(task)

    for task in sorted(todo, key=key):
        task.add_done_callback(on_completion)
    for _ in range(len(todo)):
        yield done.get()


def submit_group(
    engine: RolloutEngine,
    group: list[Sample],
    sampling: SamplingParams,
    *,
    scheduler: Any,
    progress: Progress,
    active: set[Any],
    reward_fn: RewardFn | None,
    sink: Any,
    generate_function: GenerateFunction | None = None,
) -> asyncio.Task[Any]:
    """Submit one prompt group as a task: counted by the scheduler, tracked by ``progress``,
    added to ``active``; the task carries its ``prompt_group`` for whoever collects it."""
    scheduler.on_submit([group])
    # asyncio.ensure_future(coroutine) is the running loop's create_task, without its checks
    loop = asyncio.get_running_loop()
    task = loop.create_task(
        _group_task(
            engine,
            group,
            sampling,
            progress=progress,
            reward_fn=reward_fn,
            sample_done_callback=scheduler.sample_done_callback,
            sink=sink,
            generate_function=generate_function,
            loop=loop,
        )
    )
    task.prompt_group = group  # type: ignore[attr-defined]  # read back by prompt_group_of
    progress.track(task)
    active.add(task)
    return task


class OneStepRollout:
    """The rollout function of ``train.py`` and one-step ``train_async.py``."""

    def __init__(
        self,
        args: Any,
        engine: RolloutEngine,
        data_source: Any,
        *,
        sampling: SamplingParams,
        reward_fn: RewardFn | None = None,
        sink: Any = None,
        generate_function: GenerateFunction | None = None,
    ) -> None:
        self.args = args
        self.engine = engine
        self.data_source = data_source
        self.sampling = sampling
        self.reward_fn = reward_fn
        self.generate_function = generate_function  # --custom-generate-function-path; None: single-turn
        self.sink = sink or NullSink()
        self.dynamic_filter = getattr(args, "dynamic_sampling_filter", None)

    def _drop(self, group: Any, reason: str) -> None:
        if self.sink.enabled:
            self.sink.emit(ev.DROPPED, group_index=first_sample(group).group_index, reason=reason)

    async def __call__(self, rollout_id: int, weight_version: int | None) -> tuple[list[Any], dict[str, Any]]:
        args = self.args
        B, n = args.rollout_batch_size, args.n_samples_per_prompt
        scheduler = make_submission_scheduler(args.rollout_submission_granularity, n, default="group")
        progress = Progress(scheduler)
        data: list[list[Sample]] = []
        pendings: set[asyncio.Task[Any]] = set()
        dropped = {"generate_error": 0, "dynamic_filter": 0, "kept_beyond_B": 0, "aborted_at_rollout_end": 0}
        filter_drops: dict[str, int] = {}  # MetricGatherer: drops with a truthy reason, by reason
        while len(data) < B:
            while scheduler.has_capacity(pending_groups=len(pendings), group_budget=B - len(data)):
                for group in self.data_source.get_samples(args.resolved_over_sampling_batch_size):
                    submit_group(
                        self.engine,
                        group,
                        self.sampling,
                        scheduler=scheduler,
                        progress=progress,
                        active=pendings,
                        reward_fn=self.reward_fn,
                        sink=self.sink,
                        generate_function=self.generate_function,
                    )
            try:
                done, pendings = await progress.wait_for_progress(pendings)
            except BaseException:
                await discard_tasks(pendings)
                raise
            for task in sorted(done, key=lambda t: prompt_group_of(t)[0].index):
                if task.exception() is not None:
                    if isinstance(task.exception(), EngineDeadError):
                        # The engine is gone: skipping would retry forever. Collect the
                        # sibling groups first so none of their failures goes unretrieved.
                        await discard_tasks(pendings | done)
                        raise task.exception()
                    logger.warning("group generation failed: %r", task.exception())
                    dropped["generate_error"] += 1
                    self._drop(prompt_group_of(task), "generate_error")
                    continue
                group = task.result()
                assert len(group) == n, f"group has {len(group)} samples, expected {n}"
                keep, reason = call_dynamic_filter(self.dynamic_filter, args, group)
                if not keep:
                    dropped["dynamic_filter"] += 1
                    if reason:
                        filter_drops[reason] = filter_drops.get(reason, 0) + 1
                    self._drop(group, f"dynamic_filter:{reason}")
                elif len(data) < B:
                    data.append(group)
                else:
                    dropped["kept_beyond_B"] += 1
                    self._drop(group, "kept_beyond_B")
        partial = getattr(args, "partial_rollout", False)
        aborted: list[list[Sample]] = []
        if pendings or hasattr(self.engine, "abort_requests"):
            # upstream's abort() posts abort_request after every rollout, pending or not
            aborted = await self._abort(pendings, rollout_id)
            if not partial:
                dropped["aborted_at_rollout_end"] += len(aborted)
        assert len(data) == B, f"Got {len(data)} samples, expected {B}"
        data.sort(key=lambda g: first_sample(g).index)
        # upstream's metrics (inference_rollout_train.py:L142,L185), then the core's own accounting
        metrics = {f"rollout/dynamic_filter/drop_{r}": float(c) for r, c in filter_drops.items()}
        metrics.update({f"rollout/dropped_groups/{k}": float(v) for k, v in dropped.items()})
        if partial:
            self._resume_later(aborted)
        return data, metrics

    def _resume_later(self, groups: list[list[Sample]]) -> None:
        """``--partial-rollout``: the groups pending at the end of the rollout go back to the
        data source, in the order they finished aborting, as they are (finished samples with
        their reward, aborted ones with their partial tokens, log-probs and
        ``weight_versions``); the next ``get_samples`` hands them out before fresh prompts
        and their aborted samples resume where they stopped, so they carry several weight
        versions (``InferenceRolloutFn._call_train``, ``inference_rollout_common.py:L225``)."""
        self.data_source.add_samples(groups)
        if self.sink.enabled:
            for group in groups:
                self.sink.emit(ev.RECYCLED, group_index=first_sample(group).group_index)

    async def _abort_requests(self) -> None:
        abort_requests = getattr(self.engine, "abort_requests", None)
        if abort_requests is not None:
            await abort_requests()
        else:
            await self.engine.pause_generation("abort")
            await self.engine.continue_generation()

    async def _abort(self, pendings: set[asyncio.Task[Any]], rollout_id: int) -> list[list[Sample]]:
        """`abort()`: abort every in-flight request and await the pending groups in
        completion order. Without ``--partial-rollout`` each is dropped; with it each is
        returned, its samples that have a response marked with ``start_rollout_id`` (the
        rollout they started in, kept from the first abort), as upstream's ``abort``
        (``inference_rollout_train.py:L38-L53``). A group that raises fails the step with
        its exception, as upstream's ``as_completed_async`` loop (``:L40``): what was
        collected is dropped (upstream never hands it back), and the groups still pending
        are left running, as upstream leaves them, with their outcomes retrieved when they end."""
        # upstream posts abort_request inside asyncio.gather (a task per worker URL)
        await asyncio.gather(self._abort_requests())
        partial = getattr(self.args, "partial_rollout", False)
        waiting = set(pendings)
        collected: list[list[Sample]] = []
        try:
            for next_done in as_completed_in_order(pendings, key=lambda t: first_sample(prompt_group_of(t)).index):
                task = await next_done
                group = task.result()
                waiting.discard(task)
                if partial:
                    for sample in group:
                        if sample.response_tokens and "start_rollout_id" not in sample.metadata:
                            sample.metadata["start_rollout_id"] = rollout_id
                collected.append(group)
                if not partial:
                    self._drop(prompt_group_of(task), "aborted_at_rollout_end")
        except BaseException:
            if partial:
                for group in collected:
                    self._drop(group, "aborted_at_rollout_end")
            for task in sorted(waiting, key=lambda t: first_sample(prompt_group_of(t)).index):  # not set order
                if task.done():
                    if not task.cancelled() and task.exception() is not None:
                        self._drop(prompt_group_of(task), "generate_error")
                else:
                    self._drop(prompt_group_of(task), "aborted_at_rollout_end")
                    task.add_done_callback(retrieve_outcome)
            raise
        return collected
