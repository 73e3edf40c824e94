"""The ``split`` layout's engine: an ``EngineCore`` in its own process.

The child process owns the model and the KV cache and runs the continuous-batching
loop; the parent talks to it over a pipe and implements the ``RolloutEngine`` contract
(``generate`` returns a future resolved by a reader thread). Weights move through one
flat shared-memory tensor: the parent copies the trainer's state dict into it, the
child copies it into its model; both copies are timed and reported.

Trace events are the engine's own, stamped in the child as they happen (ADMITTED,
DECODE_STEP, RETRACTED / ABORTED / PAUSED_REQ, ENGINE_PAUSE and ENGINE_RESUME as the
child applies them, an ``abort_requests`` as ``engine_thread.abort_all`` records it,
its batch going busy or idle as the rollout ``generating`` phase), and sent ahead of
the results and replies that follow them, so the parent records them in the child's
order; SUBMITTED is the parent's, in ``generate``. Request events name engine request
ids in the child; the parent rewrites them to sample indices.

Clock alignment: the child stamps with ``time.monotonic()``. On one machine that is one
system-wide clock (Linux ``CLOCK_MONOTONIC``), which the child's first message checks:
it carries the child's reading ``c``, and the parent, having read its own monotonic
``a`` before starting the child and ``b`` on receipt, needs ``a <= c <= b``; then the
child offset is 0 (exact). Otherwise (clocks not shared) the offset is the midpoint
estimate ``(a + b) / 2 - c``, off by at most ``(b - a) / 2``, and
``clock_shared`` is False. The parent then maps monotonic time to its loop's time base
(``loop.time() - time.monotonic()``, read back to back; 0 for asyncio's default loop),
so a child event at ``c`` is recorded at ``c + child_offset + loop_offset``.

A child that dies fails every waiting future and every later call with
``EngineDiedError`` naming its exit code; nothing hangs.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing as mp
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch

from miles_async_core import events as ev
from miles_async_core.contracts import NullSink, check_pause_mode
from miles_async_core.errors import EngineDeadError
from miles_async_core.types import Sample, SamplingParams, Status

from .engine_io import add_request_args, emit_finished, emit_submitted, merge_result, sample_fields
from .engine_thread import apply_command, pack_finished


class EngineDiedError(EngineDeadError):
    """The engine process exited or crashed."""


@dataclass(frozen=True)
class WeightLayout:
    """Where each parameter lives in the flat shared buffer."""

    entries: tuple[tuple[str, tuple[int, ...], int, int], ...]  # name, shape, offset, numel
    numel: int

    @classmethod
    def of(cls, state_dict: dict[str, torch.Tensor]) -> "WeightLayout":
        entries, off = [], 0
        for name, t in state_dict.items():
            entries.append((name, tuple(t.shape), off, t.numel()))
            off += t.numel()
        return cls(tuple(entries), off)

    def pack(self, state_dict: dict[str, torch.Tensor], flat: torch.Tensor) -> None:
        with torch.no_grad():
            for name, _, off, n in self.entries:
                flat[off : off + n].copy_(state_dict[name].reshape(-1))

    def unpack(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: flat[off : off + n].view(shape) for name, shape, off, n in self.entries}


def _child_main(
    conn: Any,
    build_model: Callable[[], Any],
    flat: torch.Tensor,
    layout: WeightLayout,
    max_running: int,
    eos_token_id: int | None,
    num_threads: int,
    core_cls: type | None = None,
    record_events: bool = True,
) -> None:
    from harness.backends.torch_engine import EngineCore

    conn.send(("hello", time.monotonic()))  # the parent checks the clock is shared (module docstring)
    torch.set_num_threads(num_threads)
    events: list[tuple] = []

    def emit(kind: str, **fields: Any) -> None:
        if record_events:  # off when the parent records nothing (run_mode(measure=False))
            events.append((time.monotonic(), kind, fields))

    core = (core_cls or EngineCore)(
        build_model(), max_running=max_running, eos_token_id=eos_token_id, on_event=emit if record_events else None
    )
    busy = False

    def flush_events() -> None:
        if events:
            conn.send(("events", events[:]))
            events.clear()

    def finish(finished: list) -> None:  # results, after the events that led to them
        flush_events()
        if finished:
            conn.send(("finished", [pack_finished(f) for f in finished]))

    try:
        while True:
            idle = not core.can_step()
            if idle and busy:
                busy = False
                emit(ev.PHASE_END, side="rollout", phase="generating")
                flush_events()
            timeout = None if idle else 0  # block for commands only when there is nothing to run
            while conn.poll(timeout):
                msg = conn.recv()
                if msg[0] == "stop":
                    return
                reply = _apply(core, msg, flat, layout, emit, finish)
                if busy and not core.can_step():  # paused (or emptied) by this command
                    busy = False
                    emit(ev.PHASE_END, side="rollout", phase="generating")
                flush_events()  # engine events of a command arrive before its reply
                if reply is not None:
                    conn.send(reply)
                timeout = 0
            if not core.can_step():
                continue
            if not busy:
                busy = True
                emit(ev.PHASE_START, side="rollout", phase="generating")
            finish(core.step())
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return
    except BaseException:
        try:
            conn.send(("crash", traceback.format_exc()))
        finally:
            raise


def _apply(
    core: Any,
    msg: tuple,
    flat: torch.Tensor,
    layout: WeightLayout,
    emit: Callable[..., None],
    finish: Callable[[list], None],
) -> tuple | None:
    if msg[0] == "update":  # the weights are in the shared buffer; the child copies them in
        t0 = time.perf_counter()
        core.update_weights(msg[2], {k: v.clone() for k, v in layout.unpack(flat).items()})
        return ("reply", msg[1], time.perf_counter() - t0)
    return apply_command(core, msg, emit, finish)


class ProcessEngine:
    """``RolloutEngine`` over an ``EngineCore`` running in a child process."""

    def __init__(
        self,
        build_model: Callable[[], Any],
        initial_weights: dict[str, torch.Tensor],
        *,
        max_running: int = 64,
        eos_token_id: int | None = None,
        seed: int = 0,
        num_threads: int = 1,
        sink: Any = None,
        max_seq_len: int | None = None,
        core_cls: type | None = None,
    ) -> None:
        self.sink = sink or NullSink()
        self.max_seq_len = max_seq_len  # the model's, for checking requests here; None: the child checks it
        self.seed = seed
        self.layout = WeightLayout.of(initial_weights)
        self.flat = torch.zeros(self.layout.numel, dtype=next(iter(initial_weights.values())).dtype).share_memory_()
        self.layout.pack(initial_weights, self.flat)
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(
            target=_child_main,
            name="miles-engine",
            daemon=True,
            args=(
                child_conn,
                build_model,
                self.flat,
                self.layout,
                max_running,
                eos_token_id,
                num_threads,
                core_cls,
                self.sink.enabled,
            ),
        )
        self._started_at = time.monotonic()  # a: the child's first reading must not precede it
        self.child_offset_s = 0.0  # child monotonic -> parent monotonic (module docstring)
        self.clock_shared: bool | None = None  # None until the child's first message
        self._loop_offset_s = 0.0  # parent monotonic -> the loop's time base
        self.process.start()
        child_conn.close()
        self.weight_version = 0
        self.sync_s: list[dict[str, float]] = []  # per update: pack_s (parent copy), load_s (child copy)
        self._futures: dict[int, tuple[asyncio.Future, Sample]] = {}
        self._calls: dict[int, asyncio.Future] = {}
        self._next_id = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: threading.Thread | None = None
        self._dead: BaseException | None = None
        self._send_lock = threading.Lock()
        self._closing = False

    # --- contract --------------------------------------------------------------------------
    def generate(self, sample: Sample, sampling: SamplingParams) -> asyncio.Future:
        # a bad request raises here, in the caller; in the child it would end the process
        args = add_request_args(sample, sampling, seed=self.seed, max_seq_len=self.max_seq_len)
        self._ensure_reader()
        fut = self._bound_loop().create_future()
        if self._dead is not None:
            fut.set_exception(self._dead)
            return fut
        req_id, self._next_id = self._next_id, self._next_id + 1
        self._futures[req_id] = (fut, sample)
        emit_submitted(self.sink, sample, self.weight_version)
        self._send(("add", req_id, *args))
        fut.add_done_callback(functools.partial(self._on_done, req_id=req_id))
        return fut

    async def pause_generation(self, mode: str) -> None:
        check_pause_mode(mode)
        finished = await self._call("pause", mode)  # the child records engine_pause as it applies it
        self._resolve(finished)

    async def update_weights(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        t0 = time.perf_counter()
        self.layout.pack(weights, self.flat)
        pack_s = time.perf_counter() - t0
        load_s = await self._call("update", version)
        self.weight_version = version
        self.sync_s.append({"pack_s": pack_s, "load_s": load_s})

    async def continue_generation(self) -> None:
        await self._call("resume")  # the child records engine_resume as it applies it

    async def abort_requests(self) -> None:
        """SGLang's ``/abort_request`` with ``abort_all`` (upstream's ``abort()`` after every
        one-step rollout): the child applies ``engine_thread.abort_all``; the aborted
        results arrive, and resolve, ahead of the reply."""
        await self._call("abort")

    def close(self) -> None:
        self._closing = True
        if self.process.is_alive():
            try:
                self._send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            self.process.join(timeout=10)
            if self.process.is_alive():
                self.process.kill()
        if self._reader is not None:
            self._reader.join(timeout=5)

    # --- plumbing ----------------------------------------------------------------------------
    def _send(self, msg: tuple) -> None:
        if self._dead is not None:
            raise self._dead
        with self._send_lock:
            self._conn.send(msg)

    async def _call(self, kind: str, *args: Any) -> Any:
        self._ensure_reader()
        if self._dead is not None:
            raise self._dead
        call_id, self._next_id = self._next_id, self._next_id + 1
        fut = self._bound_loop().create_future()
        self._calls[call_id] = fut
        self._send((kind, call_id, *args))
        return await fut

    def _ensure_reader(self) -> None:
        if self._reader is None:
            self._loop = asyncio.get_running_loop()
            self._loop_offset_s = self._loop.time() - time.monotonic()
            self._reader = threading.Thread(target=self._read, name="miles-engine-reader", daemon=True)
            self._reader.start()

    def _read(self) -> None:
        loop = self._bound_loop()
        try:
            while True:
                msg = self._conn.recv()
                if msg[0] == "hello":
                    self._align(msg[1], time.monotonic())
                    continue
                loop.call_soon_threadsafe(self._dispatch, msg)
                if msg[0] == "crash":
                    return
        except (EOFError, OSError):
            if self._closing:
                return
            self.process.join(timeout=5)
            err = EngineDiedError(
                f"the engine process exited (exit code {self.process.exitcode}); results of finished steps are kept"
            )
            loop.call_soon_threadsafe(self._fail_all, err)

    def _align(self, child_t: float, received: float) -> None:
        """The child's first reading ``child_t``, between our start and receipt readings
        if the monotonic clock is shared (module docstring)."""
        a, b = self._started_at, received
        self.clock_shared = a <= child_t <= b
        self.child_offset_s = 0.0 if self.clock_shared else (a + b) / 2 - child_t

    def to_loop_time(self, child_t: float) -> float:
        """A child ``time.monotonic()`` reading in the parent loop's time base."""
        return child_t + self.child_offset_s + self._loop_offset_s

    def _dispatch(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "finished":
            self._resolve(msg[1])
        elif kind == "reply":
            fut = self._calls.pop(msg[1], None)
            if fut is not None and not fut.done():
                fut.set_result(msg[2])
        elif kind == "events":
            if self.sink.enabled:
                for t, k, fields in msg[1]:
                    self._emit_child_event(t, k, fields)
        elif kind == "crash":
            self._fail_all(EngineDiedError(f"the engine process crashed:\n{msg[1]}"))

    def _emit_child_event(self, t: float, kind: str, fields: dict[str, Any]) -> None:
        """Record one child event at its child-side time; request ids become sample
        indices (a request cancelled meanwhile is left out)."""
        if sample_fields(fields, self._futures) is None:
            return
        self.sink.emit(kind, _t=self.to_loop_time(t), **fields)

    def _resolve(self, finished: list[tuple]) -> None:
        for req_id, tokens, log_probs, runs, version, status in finished:
            entry = self._futures.pop(req_id, None)
            if entry is None or entry[0].done():
                continue
            fut, s = entry
            merge_result(
                s, tokens=tokens, log_probs=log_probs, token_runs=runs, weight_version=version, status=Status(status)
            )
            emit_finished(self.sink, s)
            fut.set_result(s)

    def _bound_loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "_ensure_reader binds the loop before the first call"
        return self._loop

    def _on_done(self, fut: asyncio.Future, req_id: int) -> None:
        if fut.cancelled() and self._futures.pop(req_id, None) is not None and self._dead is None:
            try:
                self._send(("cancel", req_id))
            except (BrokenPipeError, OSError, EngineDiedError):
                pass

    def _fail_all(self, err: BaseException) -> None:
        if self._dead is None:
            self._dead = err
        for fut, _ in list(self._futures.values()):
            if not fut.done():
                fut.set_exception(err)
        for fut in list(self._calls.values()):
            if not fut.done():
                fut.set_exception(err)
        self._futures.clear()
        self._calls.clear()
