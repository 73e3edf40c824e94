"""The ``split`` layout's engine: an ``EngineCore`` in its own process.

The child process owns the model and the KV cache and runs the continuous-batching
loop; the parent talks to it over a pipe and implements the ``RolloutEngine`` contract
(``generate`` returns a future resolved by a reader thread). Weights move through one
flat shared-memory tensor: the parent copies the trainer's state dict into it, the
child copies it into its model; both copies are timed and reported.

The child reports when its batch goes busy or idle with ``time.monotonic()`` stamps
(the same clock the parent's asyncio loop uses on Linux), so overlap is measured from
what each process really did. A child that dies fails every waiting future and every
later call with ``EngineDiedError`` naming its exit code; nothing hangs.
"""

from __future__ import annotations

import asyncio
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

from .engine_io import check_request, emit_finished, merge_result, request_for


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
                flat[off:off + n].copy_(state_dict[name].reshape(-1))

    def unpack(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: flat[off:off + n].view(shape) for name, shape, off, n in self.entries}


def _child_main(conn: Any, build_model: Callable[[], Any], flat: torch.Tensor, layout: WeightLayout,
                max_running: int, eos_token_id: int | None, num_threads: int) -> None:
    from harness.backends.torch_engine import EngineCore

    torch.set_num_threads(num_threads)
    events: list[tuple] = []
    core = EngineCore(build_model(), max_running=max_running, eos_token_id=eos_token_id,
                      on_event=lambda kind, **f: events.append((time.monotonic(), kind, f)))
    busy = False

    def flush_events() -> None:
        if events:
            conn.send(("events", events[:]))
            events.clear()

    try:
        while True:
            idle = core.paused or not core.has_work()
            if idle and busy:
                busy = False
                conn.send(("phase", time.monotonic(), False))
            timeout = None if idle else 0  # block for commands only when there is nothing to run
            while conn.poll(timeout):
                msg = conn.recv()
                if msg[0] == "stop":
                    return
                reply = _apply(core, msg, flat, layout)
                flush_events()  # engine events of a command arrive before its reply
                if reply is not None:
                    conn.send(reply)
                timeout = 0
            if core.paused or not core.has_work():
                continue
            if not busy:
                busy = True
                conn.send(("phase", time.monotonic(), True))
            finished = core.step()
            flush_events()
            if finished:
                conn.send(("finished", [_pack_finished(f) for f in finished]))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return
    except BaseException:
        try:
            conn.send(("crash", traceback.format_exc()))
        finally:
            raise


def _pack_finished(f: Any) -> tuple:
    return (f.req_id, f.output_tokens, f.log_probs, f.token_versions.to_json(), f.weight_version, f.status.value)


def _apply(core: Any, msg: tuple, flat: torch.Tensor, layout: WeightLayout) -> tuple | None:
    kind = msg[0]
    if kind == "add":
        _, req_id, prefix, budget, temperature, seed = msg
        core.add_request(req_id, prefix, budget, temperature, seed)
        return None
    if kind == "cancel":
        core.cancel(msg[1])
        return None
    call_id = msg[1]
    if kind == "pause":
        finished = core.pause(msg[2])
        return ("reply", call_id, [_pack_finished(f) for f in finished])
    if kind == "update":
        t0 = time.perf_counter()
        core.update_weights(msg[2], {k: v.clone() for k, v in layout.unpack(flat).items()})
        return ("reply", call_id, time.perf_counter() - t0)
    if kind == "resume":
        core.resume()
        return ("reply", call_id, None)
    raise ValueError(f"unknown engine command {kind!r}")


class ProcessEngine:
    """``RolloutEngine`` over an ``EngineCore`` running in a child process."""

    def __init__(self, build_model: Callable[[], Any], initial_weights: dict[str, torch.Tensor], *,
                 max_running: int = 64, eos_token_id: int | None = None, seed: int = 0, num_threads: int = 1,
                 sink: Any = None, max_seq_len: int | None = None) -> None:
        self.sink = sink or NullSink()
        self.max_seq_len = max_seq_len  # the model's, for checking requests here; None: the child checks it
        self.seed = seed
        self.layout = WeightLayout.of(initial_weights)
        self.flat = torch.zeros(self.layout.numel, dtype=next(iter(initial_weights.values())).dtype).share_memory_()
        self.layout.pack(initial_weights, self.flat)
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=_child_main, name="miles-engine", daemon=True,
                                   args=(child_conn, build_model, self.flat, self.layout, max_running, eos_token_id,
                                         num_threads))
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
        from harness.backends.torch_engine import request_seed

        prefix, budget = request_for(sample, sampling)
        # a bad request raises here, in the caller; in the child it would end the process
        check_request(prefix, budget, sampling.temperature, max_seq_len=self.max_seq_len,
                      generated=len(sample.response_tokens))
        self._ensure_reader()
        fut = self._loop.create_future()
        if self._dead is not None:
            fut.set_exception(self._dead)
            return fut
        req_id, self._next_id = self._next_id, self._next_id + 1
        self._futures[req_id] = (fut, sample)
        if self.sink.enabled:
            self.sink.emit(ev.SUBMITTED, index=sample.index, group_index=sample.group_index,
                           version=self.weight_version)
        self._send(("add", req_id, prefix, budget, sampling.temperature, request_seed(self.seed, sample)))
        fut.add_done_callback(lambda f, rid=req_id: self._on_done(f, rid))
        return fut

    async def pause_generation(self, mode: str) -> None:
        check_pause_mode(mode)
        in_flight = len(self._futures)
        finished = await self._call("pause", mode)
        self._resolve(finished)
        if self.sink.enabled:
            self.sink.emit(ev.ENGINE_PAUSE, mode=mode, in_flight=in_flight)

    async def update_weights(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        t0 = time.perf_counter()
        self.layout.pack(weights, self.flat)
        pack_s = time.perf_counter() - t0
        load_s = await self._call("update", version)
        self.weight_version = version
        self.sync_s.append({"pack_s": pack_s, "load_s": load_s})

    async def continue_generation(self) -> None:
        await self._call("resume")
        if self.sink.enabled:
            self.sink.emit(ev.ENGINE_RESUME)

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
        fut = self._loop.create_future()
        self._calls[call_id] = fut
        self._send((kind, call_id, *args))
        return await fut

    def _ensure_reader(self) -> None:
        if self._reader is None:
            self._loop = asyncio.get_running_loop()
            self._reader = threading.Thread(target=self._read, name="miles-engine-reader", daemon=True)
            self._reader.start()

    def _read(self) -> None:
        loop = self._loop
        try:
            while True:
                msg = self._conn.recv()
                loop.call_soon_threadsafe(self._dispatch, msg)
                if msg[0] == "crash":
                    return
        except (EOFError, OSError):
            if self._closing:
                return
            self.process.join(timeout=5)
            err = EngineDiedError(f"the engine process exited (exit code {self.process.exitcode}); "
                                  "results of finished steps are kept")
            loop.call_soon_threadsafe(self._fail_all, err)

    def _dispatch(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "finished":
            self._resolve(msg[1])
        elif kind == "reply":
            fut = self._calls.pop(msg[1], None)
            if fut is not None and not fut.done():
                fut.set_result(msg[2])
        elif kind == "phase":
            if self.sink.enabled:
                self.sink.emit(ev.PHASE_START if msg[2] else ev.PHASE_END, side="rollout", phase="generating",
                               _t=msg[1])
        elif kind == "events":
            if self.sink.enabled:
                for _, k, fields in msg[1]:
                    self.sink.emit(k, **fields)
        elif kind == "crash":
            self._fail_all(EngineDiedError(f"the engine process crashed:\n{msg[1]}"))

    def _resolve(self, finished: list[tuple]) -> None:
        for req_id, tokens, log_probs, runs, version, status in finished:
            entry = self._futures.pop(req_id, None)
            if entry is None or entry[0].done():
                continue
            fut, s = entry
            merge_result(s, tokens=tokens, log_probs=log_probs, token_runs=runs, weight_version=version,
                         status=Status(status))
            emit_finished(self.sink, s)
            fut.set_result(s)

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
