"""``EngineHost``: what the HTTP routes drive, with SGLang's semantics, on an ``EngineCore``.

One background thread (``engine_thread.EngineThread``, as ``TorchEngine``'s) owns the
``EngineCore`` and applies commands (add, cancel, pause, load weights, set version,
resume, abort) only between decode steps; the routes run on the web server's event loop
and await those commands. Every engine fact goes into ``self.trace`` (a strict
``TraceRecorder``) *from the engine thread*, in the order the engine did it, so
``check_all`` applies to a served run:

* ``taken`` (a one-sample group: the server does not know the framework's groups) and
  ``submitted`` when a ``/generate`` reaches the engine (after any pause it waited for),
  ``admitted`` / ``retracted`` / ``paused_req`` / ``aborted`` from the core, ``finished``
  when it returns (through ``engine_io.merge_result`` / ``emit_finished``, as every
  harness engine does);
* ``engine_pause`` (before the core pauses, so aborted requests finish after it),
  ``engine_resume``, ``engine_version`` when the numeric weight version changes;
* ``/abort_request`` with ``abort_all`` (what Miles posts after every one-step rollout)
  as every harness engine's ``abort_requests`` records it (``engine_thread.abort_all``):
  an ``engine_pause(mode="abort")``, the aborted requests, ``engine_resume`` (none if
  the server was paused: it stays paused), nothing when no request is in flight;
* ``fault`` (``what="abort_request"``) for a request ended by ``/abort_request`` with its
  ``rid``, ``what="shutdown"`` for those the server's shutdown ends.

SGLang semantics kept (spec §5.2; ``harness/backends/sglang_engine.py`` cites the
sglang 0.5.23 source):

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
  ["weight_version"]`` is the version when the output is emitted and
  ``meta_info["weight_versions"]`` the per-token spans ``{"version", "start", "end"}``.
  Inside the engine and the trace a version is an int: a numeric string is its value,
  anything else the previous int + 1 (``"default"`` at start: ``initial_version``);
* a weight load while *not* paused waits for in-flight requests to finish with new ones
  held at admission (SGLang's model-update lock), then loads; the trace shows it as a
  pause with ``mode="retract"``, ``in_flight=0`` and ``implicit=True``.

Stricter than SGLang, on purpose (a checking server): a second ``pause_generation``
before ``continue_generation``, a ``begin_weight_update`` inside an open one and an
``end_weight_update`` without one are refused with HTTP 400.

Known gap: ``/abort_request`` with one ``rid`` removes that request but cannot return its
partial output (``EngineCore`` has no per-request abort that reports one), so it
returns ``finish_reason`` abort with no tokens; ``abort_all`` (what Miles posts) returns
every partial output.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from miles_async_core import events as ev
from miles_async_core.contracts import check_pause_mode
from miles_async_core.errors import ConfigError, EngineDeadError
from miles_async_core.types import Sample, Status

from harness.backends.engine_io import check_request, emit_finished, merge_result
from harness.backends.engine_thread import EngineThread, abort_all, set_exception, set_result
from harness.backends.torch_engine import EngineCore, FinishedRequest
from harness.trace import TraceRecorder

PAUSE_MODES = ("abort", "retract", "in_place")
_FINISH_TYPE = {Status.COMPLETED: "stop", Status.TRUNCATED: "length", Status.ABORTED: "abort"}


class ServeError(Exception):
    """A request the server refuses; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True, kw_only=True)
class GenerateParams:
    input_ids: list[int]
    max_new_tokens: int
    temperature: float
    seed: int
    rid: str
    return_logprob: bool = False


@dataclass(eq=False)
class _Pending:
    future: asyncio.Future
    sample: Sample
    params: GenerateParams
    t0: float
    num_retractions: int = 0
    in_core: bool = False


class _LockedSink:
    """The trace, written from the engine thread and the event loop under one lock."""

    enabled = True

    def __init__(self, trace: TraceRecorder) -> None:
        self.trace = trace
        self.lock = threading.Lock()

    def emit(self, kind: str, /, **fields: Any) -> None:
        with self.lock:
            self.trace.emit(kind, **fields)


def version_int(label: str, previous: int) -> int:
    text = str(label)
    return int(text) if text.isdigit() else previous + 1


class EngineHost:
    def __init__(self, core: EngineCore, *, tokenizer: Any = None, model_path: str = "tiny",
                 weight_version: str = "default", seed: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.core = core
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
        self._writers = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gate: asyncio.Condition | None = None
        self._idle: asyncio.Event | None = None
        self._budget: int | None = None  # None: run freely; n: at most n more steps (test hook)
        self._budget_waiters: list[asyncio.Future] = []
        self._thread = EngineThread("serve-engine", can_step=self._can_step, step=self._step,
                                    on_error=self._on_thread_error, on_idle=self._check_budget)
        core.set_event_hook(self._on_core_event)

    # --- life cycle (call start() inside the serving loop) ----------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._gate = asyncio.Condition()
        self._idle = asyncio.Event()
        self._idle.set()
        self._thread.start()

    def close(self) -> None:
        self._thread.stop()

    @property
    def alive(self) -> bool:
        return self._thread.alive

    @property
    def version(self) -> int:
        return self.core.version

    @property
    def max_seq_len(self) -> int:
        return self.core.model.max_seq_len

    @property
    def vocab_size(self) -> int:
        return self.core.model.vocab_size

    def next_seed(self) -> int:
        """The sampling seed of a request that names none: stable for a given arrival order."""
        return (self.seed * 1_000_003 + next(self._seed_counter) * 7_919) % (2**63)

    # --- generate ---------------------------------------------------------------------------
    async def generate(self, params: GenerateParams) -> dict[str, Any]:
        try:
            check_request(params.input_ids, params.max_new_tokens, params.temperature, max_seq_len=self.max_seq_len)
        except ConfigError as exc:
            raise ServeError(str(exc)) from None
        await self._wait_admission()
        self._raise_if_dead()
        index = next(self._ids)
        sample = Sample(prompt_tokens=list(params.input_ids), index=index, group_index=index)
        pending = _Pending(self._loop.create_future(), sample, params, self._clock())
        self._pending[index] = pending
        self._idle.clear()

        def add() -> None:
            if self._pending.get(index) is not pending:  # aborted before it reached the engine
                return
            # the server does not know the framework's groups: each request is a one-sample group
            self.sink.emit(ev.TAKEN, group_index=index, indices=[index], recycled=False)
            self.sink.emit(ev.SUBMITTED, index=index, group_index=index, version=self.core.version, rid=params.rid)
            try:
                self.core.add_request(index, params.input_ids, params.max_new_tokens, params.temperature,
                                      params.seed)
            except Exception as exc:  # checked above; never let a request kill the engine thread
                self._pending.pop(index, None)
                self._loop.call_soon_threadsafe(set_exception, pending.future, ServeError(str(exc)))
                self._finish([])
                return
            pending.in_core = True

        self._thread.post(add)
        try:
            return await asyncio.shield(pending.future)
        except asyncio.CancelledError:  # the client went away: SGLang aborts the request
            self._thread.post(lambda: self._cancel(index, reason="client disconnected"))
            raise

    async def _wait_admission(self) -> None:
        async with self._gate:
            await self._gate.wait_for(lambda: self.pause_mode is None and self._writers == 0)

    async def _notify_gate(self) -> None:
        async with self._gate:
            self._gate.notify_all()

    def find_rid(self, rid: str) -> int | None:
        return next((i for i, p in list(self._pending.items()) if p.params.rid == rid), None)

    # --- control ------------------------------------------------------------------------------
    async def pause(self, mode: str) -> None:
        try:
            check_pause_mode(mode)
        except ConfigError as exc:
            raise ServeError(str(exc)) from None
        if self.pause_mode is not None:
            raise ServeError(f"pause_generation(mode={mode!r}) while generation is already paused "
                             f"(mode={self.pause_mode!r}); allowed: one pause, then /continue_generation. "
                             "Fix: call /continue_generation before pausing again.")
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
                await self._idle.wait()
                while self._pending:  # a request added between the wake-up and now
                    self._idle.clear()
                    await self._idle.wait()
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
            raise ServeError(f"unknown parameter names {unknown[:5]}; allowed: the model's own names, e.g. "
                             f"{sorted(expected)[:3]} (GET /model_info lists them). Fix: rename or drop them.")
        wrong = [f"{k}: got {tuple(v.shape)}, model has {tuple(expected[k].shape)}"
                 for k, v in named.items() if tuple(v.shape) != tuple(expected[k].shape)]
        if wrong:
            raise ServeError(f"tensor shapes do not match the model ({'; '.join(wrong[:5])}); nothing was loaded. "
                             "Fix: send tensors of the model's shapes.")
        not_float = [k for k, v in named.items() if not torch.is_floating_point(v)]
        if not_float:
            raise ServeError(f"tensors {not_float[:5]} are not floating point; nothing was loaded.")

    async def abort(self, *, rid: str | None = None, abort_all: bool = False) -> int:
        """``/abort_request``: returns how many requests it ended. ``abort_all`` is
        ``engine_thread.abort_all``, as every harness engine's ``abort_requests``."""
        if abort_all:
            return await self.call(self._abort_all)
        if rid is None:
            return 0
        index = self.find_rid(rid)
        if index is None:
            return 0
        return await self.call(lambda: self._cancel(index, reason="abort_request(rid)"))

    async def step(self, n: int | None) -> None:
        """Test hook: ``n`` = run at most n more decode steps and return when they ran (or
        nothing can run), then hold; ``None`` = run freely again; 0 = hold now."""
        fut = self._loop.create_future()

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
        out = await self.generate(GenerateParams(input_ids=[0], max_new_tokens=1, temperature=0.0, seed=0,
                                                 rid=f"HEALTH_CHECK_{next(self._ids)}"))
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
        return abort_all(self.core, self.sink.emit,
                         lambda aborted: self._finish(aborted, message="Aborted by abort_request(abort_all=True)"))

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

    def _cancel(self, index: int, *, reason: str) -> int:
        pending = self._pending.get(index)
        if pending is None or not self.core.cancel(index):
            return 0
        self.sink.emit(ev.FAULT, what="abort_request", index=index, reason=reason)
        empty = FinishedRequest(req_id=index, output_tokens=[], log_probs=[],
                                token_versions=type(pending.sample.token_versions)(),
                                weight_version=self.core.version, status=Status.ABORTED)
        self._finish([empty], message=f"Aborted ({reason}); the partial output is not returned by this server")
        return 1

    def _finish(self, finished: list[FinishedRequest], *, message: str = "Aborted") -> None:
        for done in finished:
            pending = self._pending.pop(done.req_id, None)
            if pending is None:
                continue
            sample = merge_result(pending.sample, tokens=done.output_tokens, log_probs=done.log_probs,
                                  token_runs=done.token_versions.runs, weight_version=done.weight_version,
                                  status=done.status)
            emit_finished(self.sink, sample)
            out = self._response(pending, done, message)
            self._loop.call_soon_threadsafe(set_result, pending.future, out)
        if not self._pending:
            self._loop.call_soon_threadsafe(self._idle.set)

    def _label(self, version: int) -> str:
        return self._labels.get(version, str(version))

    def _response(self, pending: _Pending, done: FinishedRequest, message: str) -> dict[str, Any]:
        tokens = list(done.output_tokens)
        runs = [list(r) for r in done.token_versions.runs]
        spans, start = [], 0
        for version, _kv, count in runs:
            label = self._label(version)
            if spans and spans[-1]["version"] == label:
                spans[-1]["end"] += count
            else:
                spans.append({"version": label, "start": start, "end": start + count})
            start += count
        if done.status is Status.COMPLETED:
            finish = {"type": "stop", "matched": tokens[-1] if tokens else None}
        elif done.status is Status.TRUNCATED:
            finish = {"type": "length", "length": len(tokens)}
        else:
            finish = {"type": "abort", "message": message, "status_code": None, "err_type": None}
        meta: dict[str, Any] = {
            "id": pending.params.rid,
            "finish_reason": finish,
            "prompt_tokens": len(pending.params.input_ids),
            "completion_tokens": len(tokens),
            "cached_tokens": 0,
            "weight_version": self._label(done.weight_version),
            "weight_versions": spans,
            "num_retractions": pending.num_retractions,
            "e2e_latency": self._clock() - pending.t0,
            # harness extension (SGLang has no field for it): [version, kv_version, count] runs
            "token_versions": runs,
        }
        if pending.params.return_logprob:
            meta["output_token_logprobs"] = [[float(lp), int(t), None] for lp, t in zip(done.log_probs, tokens)]
        text = self.tokenizer.decode(tokens) if self.tokenizer is not None else ""
        return {"text": text, "output_ids": tokens, "meta_info": meta}

    def _can_step(self) -> bool:
        core = self.core
        return not core.paused and core.has_work() and (self._budget is None or self._budget > 0)

    def _check_budget(self) -> None:
        if self._budget_waiters and (self._budget == 0 or not self._can_step()):
            for fut in self._budget_waiters:
                self._loop.call_soon_threadsafe(set_result, fut, None)
            self._budget_waiters.clear()

    def _step(self) -> None:  # one decode step (EngineThread runs it between commands)
        finished = self.core.step()
        if self._budget is not None:
            self._budget -= 1
        self._finish(finished)
        self._check_budget()

    def _on_thread_error(self, exc: BaseException) -> None:  # surfaced to every waiter and every later call
        self._loop.call_soon_threadsafe(self._fail_all, exc)

    def _fail_all(self, exc: BaseException) -> None:
        for p in self._pending.values():
            set_exception(p.future, EngineDeadError(f"the engine thread died: {exc!r}"))
        self._pending.clear()

