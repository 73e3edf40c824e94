"""A simulated rollout engine with continuous batching, on (virtual) asyncio time.

Cost model: every engine step decodes one token for each running request and costs
``decode_base_s + decode_per_seq_s * running``; a step that admits requests also runs
one prefill batch before its decode: ``prefill_base_s`` (the batch's fixed cost, as a
real engine's separate prefill forward) plus ``prefill_per_token_s`` per prefilled token
(prompt, plus the tokens already generated for a retracted request). Requests join and leave the batch only between steps.
Response lengths come from a seeded distribution keyed by (seed, index, retry), so the
same sample gets the same length whatever the schedule, and are capped at
``max_new_tokens`` (status TRUNCATED).

The engine is event driven: all running requests advance together, so it keeps one
global step counter and a heap of finish steps, and wakes only at step boundaries
where something changes (a finish, an admission, a pause). Cost is O(log n) per event,
independent of the number of tokens.

Pause modes follow `contracts.py` exactly, and every token records the version that
sampled it and the oldest version in the KV it attended to (``VersionRuns``). Sampled
tokens and log-probs are synthetic: token id = the sampling version, log-prob
``-1 - 0.1 * (version - kv_version)``.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Iterable, Sequence


from miles_async_core import events as ev
from harness.backends.engine_io import emit_finished
from harness.sim.draws import BLOCK_BITS, BLOCK_MASK, MAX_BLOCKS, uniform3, uniform_block
from miles_async_core.contracts import NullSink, check_pause_mode
from miles_async_core.errors import ConfigError
from miles_async_core.types import ABORTED, COMPLETED, TRUNCATED, Sample, SamplingParams

_NORMAL = NormalDist()


class EngineRequestError(RuntimeError):
    """An injected failure of one generate request."""


@dataclass(frozen=True, kw_only=True)
class LengthDist:
    """Response lengths: ``lognormal`` (median, sigma: long tail), ``uniform`` (low, high) or ``fixed`` (median)."""

    kind: str = "lognormal"
    median: float = 64.0
    sigma: float = 0.8
    low: int = 1
    high: int = 128

    def draw(self, u: float) -> int:
        """The length at quantile ``u`` in (0, 1)."""
        return self.draw_all((u,))[0]

    def draw_all(self, us: Sequence[float]) -> list[int]:
        """``[self.draw(u) for u in us]``: the engine draws a block of first attempts at once."""
        if self.kind == "fixed":
            return [max(1, int(self.median))] * len(us)
        if self.kind == "uniform":
            low, span = self.low, self.high - self.low + 1
            return [low + int(u * span) for u in us]
        median, sigma, exp, inv_cdf = self.median, self.sigma, math.exp, _NORMAL.inv_cdf
        return [max(1, int(round(median * exp(sigma * inv_cdf(u))))) for u in us]


@dataclass(frozen=True, kw_only=True)
class SimEngineConfig:
    max_running: int = 1024
    decode_base_s: float = 0.02
    decode_per_seq_s: float = 0.0002
    prefill_per_token_s: float = 0.00002
    prefill_base_s: float = 0.0  # per step that admits requests (one prefill batch)
    prompt_tokens: int = 64
    response_length: LengthDist = field(default_factory=LengthDist)
    request_failure_rate: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.decode_base_s > 0:
            raise ConfigError(
                f"engine.decode_base_s = {self.decode_base_s!r}: must be > 0 (a decode step takes time); "
                "fix: give a positive number of seconds, e.g. 0.02"
            )
        for name in ("decode_per_seq_s", "prefill_per_token_s", "prefill_base_s", "request_failure_rate"):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"engine.{name} = {getattr(self, name)!r}: must be >= 0; fix: use 0 or a positive value"
                )
        if self.max_running < 1:
            raise ConfigError(f"engine.max_running = {self.max_running!r}: must be >= 1; fix: e.g. 1024")
        if self.response_length.kind not in ("lognormal", "uniform", "fixed"):
            raise ConfigError(
                f"engine.response_length.kind = {self.response_length.kind!r}: allowed lognormal, "
                "uniform, fixed; fix: pick one of them"
            )


_WAITING, _RUNNING, _DONE = 0, 1, 2


class _Req:
    """One generate request: the engine's record of it, and ``fut``, the future ``generate``
    returns. ``generate`` sets every field but the three the admission sets (``join_step``,
    ``kv_floor``, ``finish_step``: read only while the request runs).

    The future's first done callback is ``on_fut_done``: when the caller cancels the future,
    it takes the request out of the engine (``SimEngine._on_cancel``) before the caller's
    own callbacks run. The engine removes it before it ends the future itself, so a request
    that completes normally schedules only the caller's callbacks."""

    __slots__ = (
        "sample",
        "target",
        "truncated",
        "base",
        "join_step",
        "kv_floor",
        "finish_step",
        "state",
        "fail",
        "engine",
        "index",
        "prompt_len",
        "fut",
    )

    sample: Sample
    target: int
    truncated: bool
    base: int
    join_step: int
    kv_floor: int
    finish_step: int
    state: int
    fail: bool
    engine: "SimEngine"
    index: int
    prompt_len: int
    fut: "asyncio.Future[Sample]"

    def on_fut_done(self, fut: "asyncio.Future[Sample]") -> None:
        if fut.cancelled():
            self.engine._on_cancel(self)


class SimEngine:
    def __init__(self, config: SimEngineConfig | None = None, *, sink: Any = None) -> None:
        self.cfg = config or SimEngineConfig()
        self.sink = sink or NullSink()
        self.weight_version = 0
        self.paused = False
        self.running: dict[int, _Req] = {}
        self.waiting: deque[_Req] = deque()
        # The running requests by finish step, each step's in admission order, and a heap of
        # those steps: requests finish in (finish step, admission) order. Entries of requests
        # that left the batch early (retracted, aborted, cancelled) are skipped when reached.
        self._finishing: dict[int, list[_Req]] = {}
        self._heap: list[int] = []
        self._step = 0  # global count of completed engine steps
        self._seg = (0.0, 0.0, 1.0, 0)  # (t0, extra prefill seconds, seconds per step, step at t0)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_step = -1
        self._kick_scheduled = False
        self._pause: tuple[str, asyncio.Future] | None = None
        self._busy = False
        # steps run, tokens decoded, prompt tokens prefilled, requests served, steps that admitted
        # requests (each ran a prefill batch before its decode)
        self.stats = {"tokens": 0, "steps": 0, "prefill_tokens": 0, "requests": 0, "admitting_steps": 0}
        # Speed tricks, these caches, _loop and _finish_all: 1.204x samples per CPU-s (results/bench/sim_tricks_ab.json)
        self._wake_key: tuple | None = None  # (now, segment) of the last boundary computed by generate
        # _account's token and log-prob runs of the current version, by (kv_version, count):
        # extending from a kept list spares allocating (and freeing) a temporary one per call
        self._fills: dict[tuple[int, int], tuple[list[int], list[float]]] = {}
        self._fills_version: int | None = None
        self._wake_next = 0
        self._slow = 1.0  # contention (set_slowdown): every step's cost times this
        # Response lengths of first attempts (retry 0), drawn a block of consecutive
        # indices at a time (``_length_block``): by block number, the most recent kept.
        self._lengths: dict[int, list[int]] = {}
        self._running_loop: asyncio.AbstractEventLoop | None = None  # see _loop
        self._version_str = (0, "0")  # weight_version and str(weight_version), for _finish
        # The running batch was retracted: while the engine is paused, ``running`` (in batch
        # order, without the requests cancelled since) is the head of the waiting queue,
        # though its requests stay in it and in the finish heap (``_apply_pause``)
        self._retracted = False
        self._retract_step = 0  # the engine step it was retracted at (the resume is checked against it)

    # --- contract -----------------------------------------------------------------------
    def generate(self, sample: Sample, sampling: SamplingParams) -> "asyncio.Future[Sample]":
        """Queue a request for ``sample`` and wake the engine; returns the request's future."""
        loop = self._running_loop
        if loop is None or not loop.is_running():  # _loop(), inlined
            loop = self._loop()
        cfg = self.cfg
        max_new = sampling.max_new_tokens
        req = _Req()
        fut = req.fut = loop.create_future()
        fut.add_done_callback(req.on_fut_done)
        index, retry = sample.index, sample.retry_count
        if retry == 0 and type(index) is int and type(retry) is int and 0 <= index < 1 << 62:
            b = index >> BLOCK_BITS
            drawn = (self._lengths.get(b) or self._length_block(b))[index & BLOCK_MASK]
        else:  # a retry: scattered, drawn alone
            drawn = cfg.response_length.draw(uniform3(cfg.seed, index, retry))
        target = drawn if drawn < max_new else max_new
        base = len(sample.response_tokens)  # tokens already generated (non-zero only for resumed samples)
        req.sample = sample
        req.target = base if base > target else target
        req.truncated = drawn >= max_new
        req.fail = cfg.request_failure_rate > 0 and uniform3(cfg.seed + 1, index, retry) < cfg.request_failure_rate
        req.base = base
        req.state = _WAITING  # join_step, kv_floor and finish_step are set when it is admitted
        req.engine = self
        req.index = index
        req.prompt_len = len(sample.prompt_tokens) or cfg.prompt_tokens  # the prompt, as submitted
        if self.sink.enabled:
            self.sink.emit(ev.SUBMITTED, index=index, group_index=sample.group_index, version=self.weight_version)
        self.waiting.append(req)
        self.stats["requests"] += 1
        if not self.paused:
            if self.running:
                # _wake_at_next_boundary(), computed once per instant and segment: the
                # samples of a group arrive together
                key = (loop.time(), self._seg)
                if key != self._wake_key:
                    t0, extra, c, s0 = key[1]
                    self._wake_key = key
                    self._wake_next = s0 + max(0, math.floor((key[0] - t0 - extra) / c)) + 1
                nxt = self._wake_next
                if self._timer is None or nxt < self._timer_step:
                    self._set_timer(nxt)
            elif not self._kick_scheduled:
                self._kick_scheduled = True
                loop.call_soon(self._kick)
        return fut

    async def pause_generation(self, mode: str) -> None:
        check_pause_mode(mode)
        if self.running and not self.paused:
            fut = asyncio.get_running_loop().create_future()
            self._pause = (mode, fut)
            self._wake_at_next_boundary()
            await fut
        else:
            self._apply_pause(mode)

    async def abort_requests(self) -> None:
        """SGLang's ``/abort_request`` with ``abort_all``: abort whatever is running or
        waiting (``pause_generation("abort")`` then ``continue_generation``); nothing at
        all when the engine is idle."""
        if self.running or self.waiting:
            await self.pause_generation("abort")
            await self.continue_generation()

    async def update_weights(self, version: int, weights: Any) -> None:
        if not self.paused:
            raise RuntimeError(
                f"update_weights(version={version}) while the engine is generating: call pause_generation(mode) first"
            )
        self.weight_version = version

    async def continue_generation(self) -> None:
        self.paused = False
        if self.sink.enabled:
            self.sink.emit(ev.ENGINE_RESUME)
        if self.running or self.waiting:
            self._start_segment(self._now())

    def set_slowdown(self, factor: float) -> None:
        """Contention (``harness.sim.contention``): from now on every engine step, its
        admission included, costs ``factor`` times its cost. The step in progress keeps
        the part already done and runs the rest at the new rate: every later boundary
        moves to ``now + (old boundary - now) * factor / old factor``."""
        old = self._slow
        if factor == old:
            return
        self._slow = factor
        t0, extra, c, s0 = self._seg
        now, r = self._now(), factor / old
        self._seg = (now, (t0 + extra - now) * r, c * r, s0)
        if self._timer is not None:
            step = self._timer_step
            self._timer.cancel()
            self._timer, self._timer_step = None, -1
            self._set_timer(step)

    # --- internals ----------------------------------------------------------------------
    def _length_block(self, b: int) -> list[int]:
        """``[response_length.draw(uniform(seed, k, 0)) for k in block b]``: the drawn
        length of every first attempt in the block, kept for the requests to come."""
        lengths = self.cfg.response_length.draw_all(uniform_block((self.cfg.seed, b, 0)))
        if len(self._lengths) >= MAX_BLOCKS:
            del self._lengths[next(iter(self._lengths))]  # the oldest block
        self._lengths[b] = lengths
        return lengths

    def _loop(self) -> asyncio.AbstractEventLoop:
        """``asyncio.get_running_loop()``, remembered while that loop runs: on CPython 3.11
        each call of it is a ``getpid`` system call, and the engine asks once per request."""
        loop = self._running_loop
        if loop is None or not loop.is_running():
            loop = self._running_loop = asyncio.get_running_loop()
        return loop

    def _now(self) -> float:
        return self._loop().time()

    def _step_cost(self) -> float:
        return self.cfg.decode_base_s + self.cfg.decode_per_seq_s * len(self.running)

    def _boundary_time(self, step: int) -> float:
        t0, extra, c, s0 = self._seg
        return t0 + extra + (step - s0) * c

    def _set_timer(self, step: int) -> None:
        if self._timer is not None:
            if self._timer_step == step:
                return
            self._timer.cancel()
        self._timer_step = step
        t0, extra, c, s0 = self._seg  # _boundary_time(step)
        self._timer = self._loop().call_at(t0 + extra + (step - s0) * c, self._on_timer, step)

    def _schedule(self) -> None:
        if self.paused or not self.running:
            if self._timer is not None:
                self._timer.cancel()
                self._timer, self._timer_step = None, -1
            return
        heap, finishing = self._heap, self._finishing
        while heap and not self._valid(finishing[heap[0]], heap[0]):
            del finishing[heapq.heappop(heap)]
        self._set_timer(heap[0])

    def _wake_at_next_boundary(self) -> None:
        t0, extra, c, s0 = self._seg
        done = max(0, math.floor((self._now() - t0 - extra) / c))
        nxt = s0 + done + 1
        if self._timer is None or nxt < self._timer_step:
            self._set_timer(nxt)

    @staticmethod
    def _valid(reqs: list[_Req], finish_step: int) -> bool:
        """Some request of ``reqs``, found under ``finish_step``, still runs to finish then."""
        for req in reqs:
            if req.state == _RUNNING and req.finish_step == finish_step:
                return True
        return False

    def _kick(self) -> None:
        self._kick_scheduled = False
        if not self.paused and not self.running and self.waiting:
            self._start_segment(self._now())

    def _on_timer(self, step: int) -> None:
        self._timer, self._timer_step = None, -1
        stats = self.stats
        stats["steps"] += step - self._step
        stats["tokens"] += (step - self._step) * len(self.running)
        self._step = step
        heap = self._heap
        if heap and heap[0] <= step:
            pop, finishing, due = heapq.heappop, self._finishing, []
            while heap and heap[0] <= step:
                finish_step = pop(heap)
                for req in finishing.pop(finish_step):
                    if req.state == _RUNNING and req.finish_step == finish_step:  # still to finish now
                        due.append(req)
            if type(self)._finish is SimEngine._finish:
                self._finish_all(due, False)  # the step's finishes in one call
            else:  # a subclass's _finish, request by request
                for req in due:
                    if req.state == _RUNNING:  # not ended by an earlier one's _finish
                        self._finish(req, aborted=False)
        if self._pause is not None:
            mode, fut = self._pause
            self._pause = None
            self._apply_pause(mode)
            if not fut.done():  # its awaiter may be gone (a run cancelled mid-pause)
                fut.set_result(None)
            return
        self._start_segment(self._now())

    def _start_segment(self, now: float) -> None:
        prefill = 0
        waiting, running, heap, finishing = self.waiting, self.running, self._heap, self._finishing
        before = len(running)
        max_running = self.cfg.max_running
        step, version = self._step, self.weight_version
        sink = self.sink if self.sink.enabled else None
        push = heapq.heappush
        readmitted = 0
        if self._retracted:  # the head of the waiting queue, kept in place by _apply_pause
            self._retracted = False
            # The retract accounted each request's tokens up to the step it left (join_step is
            # that step): at the same step, each joins again where it left and keeps its place
            # in the finish heap; one step later, each would finish a step late
            if step != self._retract_step:
                raise RuntimeError(
                    f"SimEngine: the retracted batch resumes at step {step}, not {self._retract_step}: "
                    "an engine step ran while the engine was paused (a bug of the engine or of a "
                    "subclass); its requests would finish later than their place in the finish heap"
                )
            readmitted = len(running)
            for req in running.values():
                prefix = req.prompt_len + req.base
                prefill += prefix
                req.kv_floor = version
                if sink is not None:
                    sink.emit(ev.ADMITTED, index=req.index, version=version, prefix_tokens=prefix)
        while waiting and len(running) < max_running:
            req = waiting.popleft()
            if req.state != _WAITING:
                continue
            base = req.base
            prefix = req.prompt_len + base
            prefill += prefix
            req.state, req.join_step, req.kv_floor = _RUNNING, step, version
            finish = req.finish_step = step + req.target - base
            same_step = finishing.get(finish)
            if same_step is None:
                finishing[finish] = [req]
                push(heap, finish)
            else:
                same_step.append(req)
            running[req.index] = req
            if sink is not None:
                sink.emit(ev.ADMITTED, index=req.index, version=version, prefix_tokens=prefix)
        self.stats["prefill_tokens"] += prefill
        slow = self._slow
        extra = prefill * self.cfg.prefill_per_token_s
        if readmitted or len(running) > before:  # one prefill batch
            extra += self.cfg.prefill_base_s
            self.stats["admitting_steps"] += 1
        self._seg = (now, extra * slow, self._step_cost() * slow, self._step)
        self._set_busy(bool(self.running) and not self.paused)
        self._schedule()

    def _set_busy(self, busy: bool) -> None:
        if busy != self._busy:
            self._busy = busy
            if self.sink.enabled:
                self.sink.emit(ev.PHASE_START if busy else ev.PHASE_END, side="rollout", phase="generating")

    def _account(self, req: _Req) -> None:
        """Record the tokens made since ``req`` joined the batch, under the current version.
        A request that is not in the batch (waiting, or retracted) made none."""
        self._account_all((req,))

    def _account_all(self, reqs: Iterable[_Req]) -> None:
        """``_account`` of each request of ``reqs`` in turn (a pause accounts the whole batch)."""
        step, v = self._step, self.weight_version
        fills = self._fills
        if self._fills_version != v or len(fills) > 4096:
            fills.clear()
            self._fills_version = v
        for req in reqs:
            n = step - req.join_step if req.state == _RUNNING else 0
            if n > 0:
                kv, s = req.kv_floor, req.sample
                runs = s.token_versions.runs  # VersionRuns.append(v, kv, n), inlined
                if runs and (last := runs[-1])[0] == v and last[1] == kv:
                    last[2] += n
                else:
                    runs.append([v, kv, n])
                fill = fills.get((kv, n))
                if fill is None:  # ([v] * n, [log-prob] * n); extend copies them, nothing else holds them
                    fill = fills[(kv, n)] = ([v] * n, [-1.0 - 0.1 * (v - kv)] * n)
                s.response_tokens.extend(fill[0])
                s.rollout_log_probs.extend(fill[1])
                req.base += n
            req.join_step = step

    def _finish(self, req: _Req, *, aborted: bool) -> None:
        self._finish_all((req,), aborted)

    def _finish_all(self, reqs: Sequence[_Req], aborted: bool) -> None:
        """``_finish`` of each request of ``reqs`` in turn, with what they share read once
        (``_on_timer`` finishes a step's requests in one call)."""
        self._account_all(reqs)  # the tokens each made since it joined the batch
        v = self.weight_version
        version, version_str = self._version_str  # one string per version, shared by its samples
        if version != v or type(version) is not type(v):
            version, version_str = self._version_str = (v, str(v))
        running_pop = self.running.pop
        sink = self.sink if self.sink.enabled else None
        for req in reqs:
            s = req.sample
            req.state = _DONE
            running_pop(req.index, None)
            # record_outcome(s, version_str, status), inlined (version_str is a str: str() of it is itself)
            s.weight_versions.append(version_str)
            s.status = ABORTED if aborted else TRUNCATED if req.truncated else COMPLETED
            if sink is not None:
                if aborted:
                    sink.emit(ev.ABORTED, index=s.index, version=v, generated_tokens=s.response_length)
                emit_finished(sink, s)
            fut = req.fut
            if not fut.done():
                fut.remove_done_callback(req.on_fut_done)
                if req.fail and not aborted:
                    fut.set_exception(EngineRequestError(f"injected failure of request index={s.index}"))
                else:
                    fut.set_result(s)

    def _apply_pause(self, mode: str) -> None:
        self.paused = True
        if self.sink.enabled:
            self.sink.emit(ev.ENGINE_PAUSE, mode=mode, in_flight=len(self.running) + len(self.waiting))
        if mode == "abort":  # a retracted batch (running) is the head of the waiting queue
            for req in list(self.running.values()) + [r for r in self.waiting if r.state == _WAITING]:
                self._finish(req, aborted=True)
            self.waiting.clear()
            self._heap.clear()
            self._finishing.clear()
        elif self._retracted:  # paused again after a retract: the batch is out already
            pass
        elif mode == "retract":
            # The batch leaves with its tokens so far and waits at the head of the queue
            # (``_retracted`` set). Its requests stay in ``running``, in the finish heap and in
            # batch order, as their admission again will put them: no step runs while paused,
            # so each joins again at the step count it left and reaches the same finish step.
            self._account_all(self.running.values())
            self._retract_step = self._step
            sink = self.sink
            if sink.enabled:
                for req in self.running.values():
                    sink.emit(
                        ev.RETRACTED, index=req.sample.index, version=self.weight_version, generated_tokens=req.base
                    )
            self._retracted = True
        else:  # in_place: keep KV and batch; freeze
            self._account_all(self.running.values())
            for req in self.running.values():
                if self.sink.enabled:
                    self.sink.emit(ev.PAUSED_REQ, index=req.sample.index, version=self.weight_version, mode=mode)
        self._set_busy(False)
        self._schedule()

    def _on_cancel(self, req: _Req) -> None:
        if req.state == _DONE:
            return
        was_running = req.state == _RUNNING
        req.state = _DONE
        self.running.pop(req.sample.index, None)
        if was_running and not self.paused:
            self._schedule()
            if not self.running:
                self._set_busy(False)
                if self._pause is not None:  # the pause waited for a boundary no request will reach
                    mode, fut = self._pause
                    self._pause = None
                    self._apply_pause(mode)
                    if not fut.done():
                        fut.set_result(None)
                    return
                if self.waiting and not self._kick_scheduled:  # admit what waited behind it
                    self._kick_scheduled = True
                    asyncio.get_running_loop().call_soon(self._kick)
