"""``ServedEngine``: what the HTTP routes drive, with SGLang's semantics, on a ``ServedCore``.

One background thread (``engine_thread.EngineThread``, as ``TorchEngine``'s) owns the
``ServedCore`` and applies commands (add, cancel, pause, load weights, set version,
resume, abort) only between decode steps; the routes run on the web server's event loop
and await those commands. Every engine fact goes into ``self.trace`` (a strict
``TraceRecorder``) *from the engine thread*, in the order the engine did it, so
``check_all`` applies to a served run:

* ``taken`` (a one-sample group: the server does not know the framework's groups) and
  ``submitted`` when a ``/generate`` reaches the engine (after any pause it waited for),
  ``admitted`` / ``retracted`` / ``paused_req`` / ``aborted`` from the core, ``finished``
  when it returns (through ``engine_io.merge_result`` / ``emit_finished``, as every
  harness engine does), with ``tokens_digest`` of its prompt and output ids (a recorded
  Miles sample carries the same digest, so ``harness.record.merge`` joins the two exactly);
* ``engine_pause`` (before the core pauses, so aborted requests finish after it),
  ``engine_resume``, ``engine_version`` when the numeric weight version changes;
* ``/abort_request`` with ``abort_all`` (what Miles posts after every one-step rollout)
  as every harness engine's ``abort_requests`` records it (``engine_thread.abort_all``):
  an ``engine_pause(mode="abort")``, the aborted requests, ``engine_resume`` (none if
  the server was paused: it stays paused), nothing when no request is in flight;
* ``fault`` (``what="abort_request"``) for a request ended by ``/abort_request`` with its
  ``rid`` or by its client going away, ``what="shutdown"`` for those the server's
  shutdown ends.

SGLang semantics kept (``harness/backends/sglang_engine.py`` cites the sglang 0.5.23
source for each):

* a ``/generate`` that arrives while paused (or while a weight load waits for in-flight
  requests) waits at admission until ``/continue_generation``, like the tokenizer
  manager's ``is_pause`` condition;
* ``pause(abort)`` finishes every running and waiting request as ``abort`` with its
  partial output and the pre-update version; ``retract`` frees their KV and re-prefills
  them under the weights current at resume; ``in_place`` keeps the KV, so tokens after an
  update are sampled by the new weights on top of old-weight KV;
* ``flush_cache`` fails (HTTP 400) while a request is running, or waiting when not
  paused (a paused scheduler ignores its waiting queue), so it works after ``retract``
  and fails after ``in_place`` with frozen requests; the engine has no prefix cache, so a
  successful flush changes nothing else (``cached_tokens`` is always 0);
* weight versions are SGLang's strings (initially ``"default"``); ``meta_info
  ["weight_versions"]`` are the per-token spans ``{"version", "start", "end"}`` and
  ``meta_info["weight_version"]`` the last span's (the version now, for a request with
  no token yet).
  Inside the engine and the trace a version is an int: a numeric string is its value,
  anything else the previous int + 1 (``"default"`` at start: ``initial_version``);
* a weight load while *not* paused waits for in-flight requests to finish with new ones
  held at admission (SGLang's model-update lock), then loads; the trace shows it as a
  pause with ``mode="retract"``, ``in_flight=0`` and ``implicit=True``.

Stricter than SGLang, on purpose (a checking server): a second ``pause_generation``
before ``continue_generation``, a ``begin_weight_update`` inside an open one and an
``end_weight_update`` without one are refused with HTTP 400.

``/abort_request`` by ``rid`` (the exact rid; SGLang's scheduler would also end live
requests whose rid merely starts with it) ends a running or waiting request (a request
retracted by a pause waits, so it answers at once, paused or not) with the tokens it
generated so far; a rid that is not live is a no-op. A request still held at admission
by a pause has not reached the engine and is not aborted (as in SGLang, whose tokenizer
holds it). Streaming (``stream``): the route reads ``Progress`` snapshots the engine
thread leaves after every decode step; a newer snapshot replaces an unread one, so
chunks are never more than tokens (SGLang collapses queued chunks the same way).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, Callable

import torch

from miles_async_core import events as ev
from miles_async_core.contracts import check_pause_mode
from miles_async_core.errors import ConfigError, EngineDeadError
from miles_async_core.types import Sample, Status, VersionRuns

from harness.backends.engine_io import check_request, emit_finished, merge_result
from harness.backends.engine_thread import EngineThread, abort_all, set_exception, set_result
from harness.backends.torch_engine import FinishedRequest
from harness.trace import TraceRecorder, tokens_digest

from .responses import IncrementalText, finish_reason, generate_output, output_text, stop_prefix_pending
from .sampling import SamplingOptions
from .pacing import Pacer
from .served_core import ServedCore
from .served_errors import ContextLengthError, ServeError

PAUSE_MODES = ("abort", "retract", "in_place")
WAITING_ABORT = "Abort in waiting queue"  # SGLang's message for a request aborted before it runs


@dataclass(frozen=True, kw_only=True)
class GenerateParams:
    input_ids: list[int]
    options: SamplingOptions
    seed: int
    rid: str
    return_logprob: bool = False
    index: int | None = None  # the output's place in a batch or ``n > 1`` stream (SGLang's ``index``)


@dataclass
class Progress:
    """A streaming request's output so far, left by the engine thread after a step."""

    tokens: list[int]
    log_probs: list[float]
    version: int


@dataclass(eq=False)
class _Pending:
    future: asyncio.Future
    sample: Sample
    params: GenerateParams
    t0: float
    num_retractions: int = 0
    in_core: bool = False
    stream: bool = False
    progress: Progress | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class _LockedSink:
    """The trace, written from the engine thread and the event loop under one lock."""

    enabled = True

    def __init__(self, trace: TraceRecorder) -> None:
        self.trace = trace
        self.lock = threading.Lock()

    def emit(self, kind: str, /, **fields: Any) -> None:
        with self.lock:
            self.trace.emit(kind, **fields)


def _set_all(events: list[asyncio.Event]) -> None:
    for event in events:
        event.set()


def check_context(prompt_tokens: int, max_new_tokens: int, context_length: int) -> None:
    """SGLang's length check (``tokenizer_manager.py`` ``_validate_one_request``): the
    prompt must be shorter than the context, and prompt plus ``max_new_tokens`` too."""
    if prompt_tokens >= context_length:
        raise ContextLengthError(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length ({context_length} tokens)."
        )
    total = prompt_tokens + max_new_tokens
    if total >= context_length:
        raise ContextLengthError(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. You "
            f"requested a total of {total} tokens: {prompt_tokens} tokens from the input messages and "
            f"{max_new_tokens} tokens for the completion. Please reduce the number of tokens in the input messages "
            f"or the completion to fit within the limit (sampling_params.max_new_tokens; the server's "
            f"--context-length)."
        )


def version_int(label: str, previous: int) -> int:
    text = str(label)
    return int(text) if text.isdigit() else previous + 1


@dataclass
class _Serving:
    """What ``ServedEngine.start`` binds to the serving loop."""

    loop: asyncio.AbstractEventLoop
    gate: asyncio.Condition  # admission waits here while paused or a weight load is pending
    idle: asyncio.Event  # set while no request is pending


class ServedEngine:
    def __init__(
        self,
        core: ServedCore,
        *,
        tokenizer: Any = None,
        model_path: str = "tiny",
        weight_version: str = "default",
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        pacer: Pacer | None = None,
    ) -> None:
        self.core = core
        self.pacer = pacer if pacer is not None and pacer.pacing.enabled else None
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.seed = seed
        self.trace = TraceRecorder(clock, strict=True)
        self.sink = _LockedSink(self.trace)
        self.request_log: list[dict[str, Any]] = []
        self.weight_version = str(weight_version)  # SGLang's label, read on the loop
        self._labels: dict[int, str] = {core.version: self.weight_version}
        self.pause_mode: str | None = None
        self.update_session_open = False
        self._clock = clock
        self._ids = itertools.count()
        self._seed_counter = itertools.count()
        self._pending: dict[int, _Pending] = {}
        self._rids: dict[str, int] = {}
        self._held = 0  # requests waiting at admission (paused, or a weight load pending)
        self._writers = 0
        self._serving: _Serving | None = None  # set by start()
        self._budget: int | None = None  # None: run freely; n: at most n more steps (test hook)
        self._budget_waiters: list[asyncio.Future] = []
        self._thread = EngineThread(
            "serve-engine",
            can_step=self._can_step,
            step=self._step,
            on_error=self._on_thread_error,
            on_idle=self._check_budget,
        )
        core.set_event_hook(self._on_core_event)

    # --- life cycle (call start() inside the serving loop) ----------------------------------
    def start(self) -> None:
        self._serving = _Serving(asyncio.get_running_loop(), asyncio.Condition(), asyncio.Event())
        self._serving.idle.set()
        self._thread.start()

    def _on_loop(self) -> _Serving:
        assert self._serving is not None, "start() inside the serving loop first"
        return self._serving

    def close(self) -> None:
        self._thread.stop()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The serving event loop (``None`` before ``start``)."""
        return None if self._serving is None else self._serving.loop

    @property
    def alive(self) -> bool:
        return self._thread.alive

    @property
    def version(self) -> int:
        return self.core.version

    @property
    def max_seq_len(self) -> int:
        """The context length (SGLang's ``--context-length``): prompt and output together."""
        return self.core.model.max_seq_len

    context_length = max_seq_len

    @property
    def vocab_size(self) -> int:
        return self.core.model.vocab_size

    def next_seed(self) -> int:
        """The sampling seed of a request that names none: stable for a given arrival order."""
        return (self.seed * 1_000_003 + next(self._seed_counter) * 7_919) % (2**63)

    def decode(self, tokens: list[int], *, skip_special_tokens: bool = True) -> str:
        if self.tokenizer is None:
            return ""
        try:
            return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)
        except TypeError:  # a tokenizer whose decode takes no such option
            return self.tokenizer.decode(tokens)

    def check_rid(self, rid: str) -> None:
        if rid in self._rids:
            raise ServeError(
                f"Duplicate request ID: rid={rid!r} is still running. Fix: give each live request its own rid."
            )

    # --- generate ---------------------------------------------------------------------------
    async def generate(self, params: GenerateParams) -> dict[str, Any]:
        """One request to the end; its ``/generate`` output."""
        if params.options.max_new_tokens == 0:
            return self._empty_output(params)
        pending = await self._submit(params, stream=False)
        try:
            return await asyncio.shield(pending.future)
        except asyncio.CancelledError:  # the client went away: SGLang aborts the request
            self._thread.post(lambda: self._abort_index(pending.sample.index, reason="client disconnected"))
            raise

    async def stream(self, params: GenerateParams) -> AsyncGenerator[dict[str, Any], None]:
        """One request's outputs as it runs: cumulative (text and ids so far), each with
        ``finish_reason`` null, then the final output."""
        if params.options.max_new_tokens == 0:
            yield self._empty_output(params)
            return
        pending = await self._submit(params, stream=True)
        sent, interval, stops = 0, params.options.stream_interval, params.options.stop
        skip = params.options.skip_special_tokens
        detok = IncrementalText(lambda ids: self.decode(ids, skip_special_tokens=skip))
        try:
            while not pending.future.done():
                await pending.wake.wait()  # set by each step's progress and by the end (a done callback)
                pending.wake.clear()
                progress = pending.progress
                if pending.future.done() or progress is None or len(progress.tokens) - sent < interval:
                    continue
                text = detok.update(progress.tokens)  # an incomplete UTF-8 character waits for its next bytes
                if stops and stop_prefix_pending(text, stops):
                    continue
                sent = len(progress.tokens)
                yield generate_output(
                    rid=params.rid,
                    prompt_tokens=len(params.input_ids),
                    tokens=progress.tokens,
                    log_probs=progress.log_probs,
                    runs=None,
                    finish=None,
                    weight_version=self._label(progress.version),
                    num_retractions=pending.num_retractions,
                    text=text,
                    return_logprob=params.return_logprob,
                    label=self._label,
                    index=params.index,
                )
            yield pending.future.result()
        except (asyncio.CancelledError, GeneratorExit):
            if not pending.future.done():  # the client went away mid-stream
                self._thread.post(lambda: self._abort_index(pending.sample.index, reason="client disconnected"))
            raise

    def _empty_output(self, params: GenerateParams) -> dict[str, Any]:
        """``max_new_tokens=0`` (SGLang's warm-up request): nothing to generate."""
        return generate_output(
            rid=params.rid,
            prompt_tokens=len(params.input_ids),
            tokens=[],
            log_probs=[],
            runs=[],
            finish=finish_reason(Status.TRUNCATED, length=0),
            weight_version=self.weight_version,
            num_retractions=0,
            text="",
            return_logprob=params.return_logprob,
            label=self._label,
            e2e_latency=0.0,
            index=params.index,
        )

    def validate(self, params: GenerateParams) -> None:
        """Refuse (``ServeError``) a request that cannot run: a prompt that leaves no room
        for ``max_new_tokens`` in the context, a temperature below 0, a live rid."""
        check_context(len(params.input_ids), params.options.max_new_tokens, self.context_length)
        if params.options.max_new_tokens > 0:
            try:
                check_request(
                    params.input_ids,
                    params.options.max_new_tokens,
                    params.options.temperature,
                    max_seq_len=self.max_seq_len,
                )
            except ConfigError as exc:
                raise ServeError(str(exc)) from None
        self.check_rid(params.rid)

    async def _submit(self, params: GenerateParams, *, stream: bool) -> _Pending:
        self.validate(params)
        await self._wait_admission()
        self._raise_if_dead()
        self.check_rid(params.rid)
        index = next(self._ids)
        sample = Sample(prompt_tokens=list(params.input_ids), index=index, group_index=index)
        pending = _Pending(self._on_loop().loop.create_future(), sample, params, self._clock(), stream=stream)
        pending.future.add_done_callback(lambda _: pending.wake.set())  # a stream wakes for its end too
        self._pending[index] = pending
        self._rids[params.rid] = index
        self._on_loop().idle.clear()

        def add() -> None:
            if self._pending.get(index) is not pending:  # aborted before it reached the engine
                return
            # the server does not know the framework's groups: each request is a one-sample group
            self.sink.emit(ev.TAKEN, group_index=index, indices=[index], recycled=False)
            self.sink.emit(ev.SUBMITTED, index=index, group_index=index, version=self.core.version, rid=params.rid)
            opts = params.options
            try:
                self.core.add_request(
                    index, params.input_ids, opts.max_new_tokens, opts.temperature, params.seed, options=opts
                )
            except Exception as exc:  # checked above; never let a request kill the engine thread
                self._drop(index)
                self._on_loop().loop.call_soon_threadsafe(set_exception, pending.future, ServeError(str(exc)))
                return
            pending.in_core = True

        self._thread.post(add)
        return pending

    async def _wait_admission(self) -> None:
        self._held += 1
        try:
            async with self._on_loop().gate:
                await self._on_loop().gate.wait_for(lambda: self.pause_mode is None and self._writers == 0)
        finally:
            self._held -= 1

    async def _notify_gate(self) -> None:
        async with self._on_loop().gate:
            self._on_loop().gate.notify_all()

    def find_rid(self, rid: str) -> int | None:
        return self._rids.get(rid)

    # --- control ------------------------------------------------------------------------------
    async def pause(self, mode: str) -> None:
        try:
            check_pause_mode(mode)
        except ConfigError as exc:
            raise ServeError(str(exc)) from None
        if self.pause_mode is not None:
            raise ServeError(
                f"pause_generation(mode={mode!r}) while generation is already paused "
                f"(mode={self.pause_mode!r}); allowed: one pause, then /continue_generation. "
                "Fix: call /continue_generation before pausing again."
            )
        self.pause_mode = mode  # new requests wait from now on

        def cmd() -> None:
            core = self.core
            self.sink.emit(ev.ENGINE_PAUSE, mode=mode, in_flight=core.num_running() + core.num_waiting())
            self._finish(core.pause(mode))

        await self.call(cmd)

    async def resume(self) -> bool:
        """``/continue_generation``; returns whether the engine was paused."""
        if self.pause_mode is None:
            return False

        def cmd() -> None:
            self.core.resume()
            self.sink.emit(ev.ENGINE_RESUME)

        await self.call(cmd)
        self.pause_mode = None
        await self._notify_gate()
        return True

    async def flush_cache(self) -> bool:
        core = self.core
        return await self.call(lambda: core.num_running() == 0 and (core.paused or core.num_waiting() == 0))

    async def set_weight_version(self, label: str, *, abort_all: bool = False) -> None:
        if abort_all:
            await self.abort(abort_all=True)
        await self.call(lambda: self._set_version(str(label)))
        self.weight_version = str(label)

    async def load_weights(self, named: dict[str, torch.Tensor], label: str | None) -> None:
        """Load a (possibly partial: one bucket) set of named tensors, then set ``label``."""
        self.check_named_tensors(named)
        if self.pause_mode is not None:
            await self.call(lambda: self._load(named, label, implicit=False))
        else:
            self._writers += 1
            try:
                await self._on_loop().idle.wait()
                while self._pending:  # a request added between the wake-up and now
                    self._on_loop().idle.clear()
                    await self._on_loop().idle.wait()
                await self.call(lambda: self._load(named, label, implicit=True))
            finally:
                self._writers -= 1
                await self._notify_gate()
        if label is not None:
            self.weight_version = str(label)

    def check_named_tensors(self, named: dict[str, torch.Tensor]) -> None:
        expected = {k: v for k, v in self.core.model.module.state_dict().items()}
        if not named:
            raise ServeError("the update carries no tensors. Fix: send at least one (name, tensor) pair.")
        unknown = sorted(k for k in named if k not in expected)
        if unknown:
            raise ServeError(
                f"unknown parameter names {unknown[:5]}; allowed: the model's own names, e.g. "
                f"{sorted(expected)[:3]} (GET /model_info lists them). Fix: rename or drop them."
            )
        wrong = [
            f"{k}: got {tuple(v.shape)}, model has {tuple(expected[k].shape)}"
            for k, v in named.items()
            if tuple(v.shape) != tuple(expected[k].shape)
        ]
        if wrong:
            raise ServeError(
                f"tensor shapes do not match the model ({'; '.join(wrong[:5])}); nothing was loaded. "
                "Fix: send tensors of the model's shapes."
            )
        not_float = [k for k, v in named.items() if not torch.is_floating_point(v)]
        if not_float:
            raise ServeError(f"tensors {not_float[:5]} are not floating point; nothing was loaded.")

    async def abort(self, *, rid: str | None = None, abort_all: bool = False) -> int:
        """``/abort_request``: returns how many requests it ended. ``abort_all`` is
        ``engine_thread.abort_all``, as every harness engine's ``abort_requests``; a
        ``rid`` must match a live request exactly, else nothing happens."""
        if abort_all:
            return await self.call(self._abort_all)
        index = self._rids.get(rid) if rid else None
        if index is None:
            return 0
        return await self.call(lambda: self._abort_index(index, reason="abort_request(rid)"))

    async def scheduler_state(self) -> dict[str, Any]:
        """What the engine holds now (read between steps): running and waiting rids, the
        retracted ones among the waiting, KV tokens used and total, whether paused."""

        def read() -> dict[str, Any]:
            running: list[str] = []
            waiting: list[str] = []
            retracted = 0
            for req, where in self.core.live():
                pending = self._pending.get(req.req_id)
                rid = pending.params.rid if pending is not None else str(req.req_id)
                (running if where == "running" else waiting).append(rid)
                retracted += where == "waiting" and bool(req.output_tokens)
            used, total = self.core.kv_tokens()
            counters = self.core.counters
            return {
                "running_rids": running,
                "waiting_rids": waiting,
                "retracted": retracted,
                "kv_used": used,
                "kv_total": total,
                "paused": self.core.paused,
                "gen_throughput": counters.tokens_generated / counters.busy_s if counters.busy_s else 0.0,
            }

        state = await self.call(read)
        state.update(
            pause_mode=self.pause_mode, held_at_admission=self._held, max_running_requests=self.core.max_running
        )
        return state

    async def step(self, n: int | None) -> None:
        """Test hook: ``n`` = run at most n more decode steps and return when they ran (or
        nothing can run), then hold; ``None`` = run freely again; 0 = hold now."""
        fut = self._on_loop().loop.create_future()

        def cmd() -> None:
            self._budget = n
            if n:
                self._budget_waiters.append(fut)
            else:
                set_result(fut, None)
            self._check_budget()

        self._thread.post(cmd)
        await fut

    async def health_generate(self) -> bool:
        self._raise_if_dead()
        if self.pause_mode is not None or self._pending or self._writers:
            return True  # busy or paused: SGLang answers from its last receive time
        opts = SamplingOptions(max_new_tokens=1, temperature=0.0)
        out = await self.generate(
            GenerateParams(input_ids=[0], options=opts, seed=0, rid=f"HEALTH_CHECK_{next(self._ids)}")
        )
        return out["meta_info"]["finish_reason"]["type"] in ("length", "stop")

    async def abort_everything(self) -> None:
        """Shutdown: end every request (so no HTTP call hangs) and release held steps."""
        await self.call(self._abort_at_shutdown)
        await self.step(None)

    # --- command plumbing ------------------------------------------------------------------------
    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine thread between steps and return its result; what it
        raises comes back as a ``ServeError`` (a refused load, e.g. by ``load_state_dict``,
        must not kill the engine)."""
        self._raise_if_dead()
        try:
            return await self._thread.call(fn)
        except ServeError:
            raise
        except Exception as exc:
            raise ServeError(f"{type(exc).__name__}: {exc}", 400) from None

    def _raise_if_dead(self) -> None:
        if self._thread.error is not None:
            raise ServeError(f"the engine thread died: {self._thread.error!r}", 503)
        if not self._thread.started:
            raise ServeError("the engine is not running (start() was not called or close() was)", 503)

    # --- engine-thread side ---------------------------------------------------------------------
    def _on_core_event(self, kind: str, **fields: Any) -> None:
        if kind == ev.RETRACTED and fields["index"] in self._pending:
            self._pending[fields["index"]].num_retractions += 1
        self.sink.emit(kind, **fields)

    def _set_version(self, label: str) -> None:
        new = version_int(label, self.core.version)
        self._labels[new] = label
        if new != self.core.version:
            self.core.version = new  # EngineCore's public version; tokens sampled from now on carry it
            self.sink.emit(ev.ENGINE_VERSION, version=new, label=label)

    def _load(self, named: dict[str, torch.Tensor], label: str | None, *, implicit: bool) -> None:
        core = self.core
        if implicit:
            self.sink.emit(ev.ENGINE_PAUSE, mode="retract", in_flight=0, implicit=True)
            core.pause("retract")
        try:
            merged = dict(core.model.module.state_dict())
            merged.update(named)
            core.update_weights(core.version, merged)
            if label is not None:
                self._set_version(str(label))
        finally:
            if implicit:
                core.resume()
                self.sink.emit(ev.ENGINE_RESUME)

    def _abort_all(self) -> int:
        return abort_all(self.core, self.sink.emit, lambda aborted: self._finish(aborted))

    def _abort_at_shutdown(self) -> int:
        """Every request ends now, as ABORTED with its partial output; the trace names them
        in ``fault(what="shutdown")`` events (a shutdown is no abort pause of the run)."""
        core = self.core
        was_paused = core.paused
        aborted = core.pause("abort")
        if not was_paused:
            core.resume()
        for done in aborted:
            self.sink.emit(ev.FAULT, what="shutdown", index=done.req_id)
        self._finish(aborted, message="Aborted: the server is shutting down")
        return len(aborted)

    def _abort_index(self, index: int, *, reason: str) -> int:
        """End one request with what it generated so far (SGLang's abort by rid)."""
        pending = self._pending.get(index)
        if pending is None:
            return 0
        found = self.core.abort_one(index)
        if found is None:
            if pending.in_core:  # it finished in the step that just ran: its answer is on its way
                return 0
            done, where = (
                FinishedRequest(
                    req_id=index,
                    output_tokens=[],
                    log_probs=[],
                    token_versions=VersionRuns(),
                    weight_version=self.core.version,
                    status=Status.ABORTED,
                ),
                "waiting",
            )
        else:
            done, where = found
            self.sink.emit(ev.FAULT, what="abort_request", index=index, reason=reason)
        self._finish([done], message=WAITING_ABORT if where == "waiting" else "Aborted")
        return 1

    def _drop(self, index: int) -> _Pending | None:
        pending = self._pending.pop(index, None)
        if pending is not None and self._rids.get(pending.params.rid) == index:
            del self._rids[pending.params.rid]
        if not self._pending:
            self._on_loop().loop.call_soon_threadsafe(self._on_loop().idle.set)
        return pending

    def _finish(self, finished: list[FinishedRequest], *, message: str = "Aborted") -> None:
        for done in finished:
            pending = self._drop(done.req_id)
            if pending is None:
                continue
            if pending.in_core:
                merge_result(
                    pending.sample,
                    tokens=done.output_tokens,
                    log_probs=done.log_probs,
                    token_runs=done.token_versions.runs,
                    weight_version=done.weight_version,
                    status=done.status,
                )
                tokens = pending.sample.prompt_tokens + pending.sample.response_tokens
                emit_finished(self.sink, pending.sample, tokens_digest=tokens_digest(tokens))
            out = self._response(pending, done, message)
            self._on_loop().loop.call_soon_threadsafe(set_result, pending.future, out)

    def _label(self, version: int) -> str:
        return self._labels.get(version, str(version))

    def _response(self, pending: _Pending, done: FinishedRequest, message: str) -> dict[str, Any]:
        params, tokens = pending.params, list(done.output_tokens)
        matched = self.core.matched.pop(done.req_id, None)
        finish = finish_reason(done.status, matched=matched, length=params.options.max_new_tokens, message=message)
        return generate_output(
            rid=params.rid,
            prompt_tokens=len(params.input_ids),
            tokens=tokens,
            log_probs=list(done.log_probs),
            runs=[list(r) for r in done.token_versions.runs],
            finish=finish,
            weight_version=self._label(done.weight_version),
            num_retractions=pending.num_retractions,
            text=output_text(self.decode, tokens, params.options, matched),
            return_logprob=params.return_logprob,
            label=self._label,
            e2e_latency=self._clock() - pending.t0,
            index=params.index,
            top_logprobs=self.core.top_logprobs.pop(done.req_id, None),
        )

    def _can_step(self) -> bool:
        core = self.core
        return not core.paused and core.has_work() and (self._budget is None or self._budget > 0)

    def _check_budget(self) -> None:
        if self._budget_waiters and (self._budget == 0 or not self._can_step()):
            for fut in self._budget_waiters:
                self._on_loop().loop.call_soon_threadsafe(set_result, fut, None)
            self._budget_waiters.clear()

    def _step(self) -> None:  # one decode step (EngineThread runs it between commands)
        pacer, counters = self.pacer, self.core.counters
        if pacer is None:
            finished = self.core.step()
        else:  # the step's tokens are handed out once it has lasted its paced budget
            started, steps, prefilled = pacer.now(), counters.decode_steps, counters.prefill_tokens
            finished = self.core.step()
            counters.busy_s += pacer.hold(
                started, decoded=counters.decode_steps > steps, prefill_tokens=counters.prefill_tokens - prefilled
            )
        if self._budget is not None:
            self._budget -= 1
        self._report_progress()
        self._finish(finished)
        self._check_budget()

    def _report_progress(self) -> None:
        """Leave each streaming request's output so far for its route to read."""
        woken = []
        for req, where in self.core.live():
            pending = self._pending.get(req.req_id)
            if pending is None or not pending.stream or where != "running":
                continue
            pending.progress = Progress(list(req.output_tokens), list(req.log_probs), self.core.version)
            woken.append(pending.wake)
        if woken:  # one wake-up of the loop per step, however many streams
            self._on_loop().loop.call_soon_threadsafe(_set_all, woken)

    def _on_thread_error(self, exc: BaseException) -> None:  # surfaced to every waiter and every later call
        self._on_loop().loop.call_soon_threadsafe(self._fail_all, exc)

    def _fail_all(self, exc: BaseException) -> None:
        for p in self._pending.values():
            set_exception(p.future, EngineDeadError(f"the engine thread died: {exc!r}"))
        self._pending.clear()
        self._rids.clear()
