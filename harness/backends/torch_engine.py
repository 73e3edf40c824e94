"""A real rollout engine in torch: continuous batching over a per-request KV cache.

``EngineCore`` is synchronous (no asyncio, no threads) so it runs in any process; one
``step()`` admits waiting requests up to ``max_running`` by prefilling them under the
current weights, then runs one batched decode step in which every running request
samples exactly one token. Requests join and leave between steps.

Requests are checked by ``engine_io.check_request`` (in ``add_request`` and, so a bad
one raises in the caller, in ``TorchEngine.generate``); results reach a ``Sample``
through ``engine_io.merge_result``.

Bookkeeping kept per request: the KV holds ``prompt + output[:-1]`` (the last token is
the next decode input) and ``kv_version``, the weight version of the oldest entry in
that KV. Every sampled token records ``(version, kv_version)`` into ``VersionRuns``.

Log-probs: the engine reports the log-prob of the sampled token under the *sampling*
distribution, ``log_softmax(logits / temperature)``, as SGLang does by default
(its sampler divides by the temperature before the softmax it takes the log of), and
Miles' trainer divides its logits by ``rollout_temperature`` to match. Temperature 0 is
greedy and reports ``log_softmax(logits)``. ``TorchTrainer`` uses the same rule.

Pause modes (``contracts.py``, SGLang's pause semantics; checked by ``contracts.check_pause_mode``):
``abort`` finishes every running and waiting request now as ABORTED with its partial output; ``retract`` frees the KV of running
requests and puts them at the front of the waiting queue, so they are re-prefilled
under the weights current at re-admission; ``in_place`` keeps their KV, so after an
update they decode with the new weights on top of the old KV. While paused ``step()``
does nothing; ``update_weights`` is legal only while paused.

Sampling draws one uniform per token from the request's own seeded ``torch.Generator``
(on the CPU, so the stream is the same on any device) and inverts the CDF, so a
request's tokens do not depend on what else is in the batch.

``TorchEngine`` adapts a core to the asyncio ``RolloutEngine`` contract: one background
thread (``engine_thread.EngineThread``) owns the core and applies commands (add,
cancel, pause, update, resume, abort) only between steps, so a weight update never
races a decode step. ``abort_requests`` is SGLang's ``/abort_request`` with
``abort_all`` (``engine_thread.abort_all``): an abort pause and resume around the
requests it aborts, nothing when none is in flight.

Its trace events are the engine's own, each stamped where and when it happens, in the
event loop's time base (``loop.time()``, read on whichever thread the event happens):
SUBMITTED in ``generate`` (the caller hands the request over; ``version`` is the
version the caller's side has seen loaded), and on the engine thread ADMITTED,
DECODE_STEP (every batched step, with the samples that got a token and the version
that sampled it), RETRACTED / ABORTED / PAUSED_REQ, ENGINE_PAUSE as the thread applies
the pause (before the core's pause events), ENGINE_RESUME as it applies the resume
(before it can admit anything), and the rollout ``generating`` phase: started by the
first step after an idle or paused spell, ended when the thread finds itself paused or
out of work. Engine-thread events reach the sink through the loop
(``call_soon_threadsafe``) in the order they happened, ahead of the command replies
and results that follow them, so the trace's order is the engine's order.
"""

from __future__ import annotations

import asyncio
import functools
import collections
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from miles_async_core import events as ev
from miles_async_core.contracts import EventSink, NullSink, check_pause_mode
from miles_async_core.errors import ConfigError, EngineDeadError
from miles_async_core.types import Sample, SamplingParams, Status, VersionRuns

from .engine_io import add_request_args, check_request, emit_finished, emit_submitted, merge_result, sample_fields
from .engine_thread import EngineThread, abort_all
from .torch_models import EngineModel


@dataclass(eq=False)
class Request:
    req_id: Any
    prompt_tokens: list[int]
    max_new_tokens: int
    temperature: float
    generator: torch.Generator
    output_tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    token_versions: VersionRuns = field(default_factory=VersionRuns)
    slot: int | None = None
    kv_len: int = 0
    kv_version: int = -1


@dataclass(frozen=True, kw_only=True)
class FinishedRequest:
    req_id: Any
    output_tokens: list[int]
    log_probs: list[float]
    token_versions: VersionRuns
    weight_version: int
    status: Status


@dataclass
class EngineCounters:
    tokens_generated: int = 0
    decode_steps: int = 0
    prefill_tokens: int = 0
    busy_s: float = 0.0


class EngineCore:
    def __init__(
        self,
        model: EngineModel,
        *,
        max_running: int = 16,
        eos_token_id: int | None = None,
        version: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        on_event: Callable[..., None] | None = None,
        kv_seq_len: int | None = None,
    ) -> None:
        """``kv_seq_len``: positions per slot the KV pool starts with (default the model's
        ``max_seq_len``); an owner that starts it narrower widens it (``model.grow_cache``)
        before a step needs more."""
        if max_running < 1:
            raise ConfigError(f"max_running={max_running} must be >= 1. Fix: pass a positive batch size.")
        self.model = model
        self.max_running = max_running
        self.eos_token_id = eos_token_id
        self.version = version
        self.paused = False
        self.counters = EngineCounters()
        self._clock = clock
        self._on_event = on_event
        self._step_t0 = 0.0
        self._waiting: collections.deque[Request] = collections.deque()
        self._running: list[Request] = []  # invariant: self._running[i].slot == i
        model.alloc_cache(max_running, kv_seq_len)

    # --- queue management ------------------------------------------------------------
    def add_request(
        self, req_id: Any, prompt_tokens: list[int], max_new_tokens: int, temperature: float = 1.0, seed: int = 0
    ) -> None:
        check_request(prompt_tokens, max_new_tokens, temperature, max_seq_len=self.model.max_seq_len)
        gen = torch.Generator().manual_seed(int(seed) % (2**63))
        self._waiting.append(self._new_request(req_id, list(prompt_tokens), max_new_tokens, float(temperature), gen))

    def _new_request(
        self, req_id: Any, prompt_tokens: list[int], max_new_tokens: int, temperature: float, gen: torch.Generator
    ) -> Request:
        """The queue entry of one request (a subclass's core keeps more per request)."""
        return Request(req_id, prompt_tokens, max_new_tokens, temperature, gen)

    def cancel(self, req_id: Any) -> bool:
        for req in self._waiting:
            if req.req_id == req_id:
                self._waiting.remove(req)
                return True
        for i, req in enumerate(self._running):
            if req.req_id == req_id:
                self._remove_running([i])
                self._release(req)
                return True
        return False

    def set_event_hook(self, on_event: Callable[..., None] | None) -> None:
        """``on_event(kind, **fields)`` for ADMITTED / RETRACTED / ABORTED / PAUSED_REQ
        (``index`` is the req_id) and DECODE_STEP (``indices``: the req_ids that got a
        token, ``version``, ``dur_s``: the step's seconds, admission included), called
        synchronously inside ``step`` / ``pause`` at the moment it happens, so the hook
        can stamp the time."""
        self._on_event = on_event

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def can_step(self) -> bool:
        """Whether ``step()`` would do anything: not paused, and something to run. The
        drivers of a core (``TorchEngine``'s thread, ``ProcessEngine``'s child) wait
        for a command while it is False."""
        return not self.paused and self.has_work()

    def num_running(self) -> int:
        return len(self._running)

    def num_waiting(self) -> int:
        return len(self._waiting)

    # --- one iteration -------------------------------------------------------------------
    def step(self) -> list[FinishedRequest]:
        if not self.can_step():
            return []
        t0 = self._step_t0 = self._clock()
        self._admit()
        finished = self._decode() if self._running else []
        self.counters.busy_s += self._clock() - t0
        return finished

    def _admit(self) -> None:
        admitted, slots = [], []
        while self._waiting and len(self._running) < self.max_running:
            req = self._waiting.popleft()
            req.slot = len(self._running)
            self._running.append(req)
            admitted.append(req)
            slots.append(req.slot)
        if not admitted:
            return
        prefixes = [req.prompt_tokens + req.output_tokens for req in admitted]
        self.model.prefill(slots, [p[:-1] for p in prefixes])  # one batch
        for req, prefix in zip(admitted, prefixes):
            req.kv_len = len(prefix) - 1
            req.kv_version = self.version
            self.counters.prefill_tokens += req.kv_len
            self._emit(ev.ADMITTED, index=req.req_id, version=self.version, prefix_tokens=len(prefix))

    def _decode(self) -> list[FinishedRequest]:
        reqs = self._running
        device = self.model.device
        positions = torch.tensor([r.kv_len for r in reqs], dtype=torch.long, device=device)
        last = [(r.output_tokens or r.prompt_tokens)[-1] for r in reqs]
        logits = self.model.decode(positions, torch.tensor(last, dtype=torch.long, device=device))
        tokens, logps = self._choose(logits, reqs)
        self.counters.decode_steps += 1
        self.counters.tokens_generated += len(reqs)
        if self._on_event is not None:  # the tokens exist now: one event per step, stamped by the hook
            self._on_event(
                ev.DECODE_STEP,
                indices=[r.req_id for r in reqs],
                version=self.version,
                dur_s=self._clock() - self._step_t0,
            )
        done: list[tuple[int, Status]] = []
        for i, (req, tok, lp) in enumerate(zip(reqs, tokens, logps)):
            req.output_tokens.append(tok)
            req.log_probs.append(lp)
            req.token_versions.append(self.version, req.kv_version)
            req.kv_len += 1
            status = self._stop_status(req, tok)
            if status is not None:
                done.append((i, status))
        finished = [self._finish(reqs[i], status) for i, status in done]
        self._remove_running([i for i, _ in done])
        return finished

    def _choose(self, logits: torch.Tensor, reqs: list[Request]) -> tuple[list[int], list[float]]:
        """Each running request's next token and its log-prob (a server adds its sampling fields)."""
        return sample_tokens(logits, [r.temperature for r in reqs], [r.generator for r in reqs])

    def _stop_status(self, req: Request, tok: int) -> Status | None:
        """How ``req`` ends after ``tok``, or ``None`` while it goes on: EOS, then the length cap."""
        if self.eos_token_id is not None and tok == self.eos_token_id:
            return Status.COMPLETED
        if len(req.output_tokens) >= req.max_new_tokens:
            return Status.TRUNCATED
        return None

    def _remove_running(self, indices: list[int]) -> None:
        """Drop running entries, moving the last slot into each hole (keeps slots 0..B-1)."""
        for i in sorted(indices, reverse=True):
            last = self._running.pop()
            if i < len(self._running):
                assert last.slot is not None, "a request that stays running holds a slot"
                self.model.move_slot(last.slot, i)
                last.slot = i
                self._running[i] = last

    # --- pause / update / resume -----------------------------------------------------------
    def pause(self, mode: str) -> list[FinishedRequest]:
        """Stop decoding; returns the requests ``abort`` finished (empty otherwise)."""
        check_pause_mode(mode)
        self.paused = True
        aborted: list[FinishedRequest] = []
        if mode == "abort":
            for req in list(self._running) + list(self._waiting):
                self._emit(ev.ABORTED, index=req.req_id, version=self.version, generated_tokens=len(req.output_tokens))
                aborted.append(self._finish(req, Status.ABORTED))
            self._running, self._waiting = [], collections.deque()
        elif mode == "retract":
            for req in reversed(self._running):
                self._emit(
                    ev.RETRACTED, index=req.req_id, version=self.version, generated_tokens=len(req.output_tokens)
                )
                self._release(req)
                self._waiting.appendleft(req)
            self._running = []
        else:
            for req in self._running:
                self._emit(ev.PAUSED_REQ, index=req.req_id, version=self.version, mode=mode)
        return aborted

    def update_weights(self, version: int, state_dict: dict[str, torch.Tensor]) -> None:
        if not self.paused:
            raise RuntimeError(
                f"update_weights(version={version}) called while the engine is running "
                f"(state=running, {len(self._running)} running); call pause(mode) first."
            )
        self.model.load_weights(state_dict)
        self.version = version

    def resume(self) -> None:
        self.paused = False

    # --- helpers -------------------------------------------------------------------------
    def _release(self, req: Request) -> None:
        """Forget the request's KV; its slot is reused by whoever takes that index."""
        req.slot, req.kv_len, req.kv_version = None, 0, -1

    def _finish(self, req: Request, status: Status) -> FinishedRequest:
        self._release(req)
        return FinishedRequest(
            req_id=req.req_id,
            output_tokens=req.output_tokens,
            log_probs=req.log_probs,
            token_versions=req.token_versions,
            weight_version=self.version,
            status=status,
        )

    def _emit(self, kind: str, **fields: Any) -> None:
        if self._on_event is not None:
            self._on_event(kind, **fields)


def sample_tokens(
    logits: torch.Tensor, temperatures: list[float], generators: list[torch.Generator]
) -> tuple[list[int], list[float]]:
    """Sample one token per row; returns (tokens, log-probs under the sampling distribution)."""
    temps = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=torch.float32)
    logp = torch.log_softmax(logits.float() / temps.to(logits.device).view(-1, 1), dim=-1)
    u = torch.cat([torch.rand(1, generator=g) for g in generators]).to(logits.device)
    cdf = logp.exp().cumsum(dim=-1)
    drawn = torch.searchsorted(cdf, (u * cdf[:, -1]).view(-1, 1)).clamp_(max=logits.shape[-1] - 1)
    greedy = torch.tensor([t <= 0 for t in temperatures], device=logits.device).view(-1, 1)
    chosen = torch.where(greedy, logp.argmax(dim=-1, keepdim=True), drawn)
    return chosen.view(-1).tolist(), logp.gather(1, chosen).view(-1).tolist()


def fill_sample(sample: Sample, done: FinishedRequest) -> Sample:
    """Write an engine result into ``sample`` (appending to any partial response)."""
    return merge_result(
        sample,
        tokens=done.output_tokens,
        log_probs=done.log_probs,
        token_runs=done.token_versions.runs,
        weight_version=done.weight_version,
        status=done.status,
    )


class TorchEngine:
    """asyncio adapter over an ``EngineCore`` driven by one background thread."""

    def __init__(self, core: EngineCore, *, seed: int = 0, sink: EventSink | None = None) -> None:
        self.core = core
        self.seed = seed
        self.sink = sink or NullSink()
        self._thread = EngineThread(
            "torch-engine",
            can_step=core.can_step,
            step=self._step,
            on_error=self._on_thread_error,
            on_idle=lambda: self._set_busy(False),
        )
        self._futures: dict[int, tuple[asyncio.Future, Sample]] = {}
        self._next_id = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._submit_version = core.version  # the version the loop side has seen loaded (SUBMITTED carries it)
        self._busy = False  # engine thread: the rollout generating phase is open
        if self.sink.enabled:
            core.set_event_hook(self._forward_event)

    @property
    def weight_version(self) -> int:
        return self.core.version

    # --- the RolloutEngine contract ------------------------------------------------------
    def generate(self, sample: Sample, sampling: SamplingParams) -> asyncio.Future:
        # the checks add_request makes, here so a bad request raises in the caller
        args = add_request_args(sample, sampling, seed=self.seed, max_seq_len=self.core.model.max_seq_len)
        self._ensure_started()
        fut = self._bound_loop().create_future()
        req_id, self._next_id = self._next_id, self._next_id + 1
        self._futures[req_id] = (fut, sample)
        emit_submitted(self.sink, sample, self._submit_version)
        self._thread.post(lambda: self.core.add_request(req_id, *args))
        fut.add_done_callback(functools.partial(self._on_done, req_id=req_id))
        return fut

    async def pause_generation(self, mode: str) -> None:
        check_pause_mode(mode)

        def pause() -> None:  # engine thread, between steps
            core = self.core
            if self.sink.enabled:
                self._emit_engine(ev.ENGINE_PAUSE, mode=mode, in_flight=core.num_running() + core.num_waiting())
            self._resolve_all(core.pause(mode))
            self._set_busy(False)

        await self._call(pause)

    async def update_weights(self, version: int, weights: Any) -> None:
        await self._call(lambda: self.core.update_weights(version, weights))  # the driver records engine_version
        self._submit_version = version

    async def continue_generation(self) -> None:
        def resume() -> None:  # engine thread: nothing is admitted before this event
            self.core.resume()
            if self.sink.enabled:
                self._emit_engine(ev.ENGINE_RESUME)

        await self._call(resume)

    async def abort_requests(self) -> None:
        """SGLang's ``/abort_request`` with ``abort_all``, which upstream's ``abort()``
        posts after every one-step rollout: ``engine_thread.abort_all`` on the engine
        thread (every request in flight resolves as ABORTED with its partial output
        before this returns; nothing happens when none is in flight)."""
        emit = self._emit_engine if self.sink.enabled else _ignore
        await self._call(lambda: abort_all(self.core, emit, self._resolve_all))

    def close(self) -> None:
        """Stop the engine thread (requests still in flight stay unresolved)."""
        self._thread.stop()

    # --- loop-thread side ---------------------------------------------------------------------
    def _ensure_started(self) -> None:
        """Start the engine thread, bound to the running loop, on first use; raise if it died."""
        loop = asyncio.get_running_loop()
        if not self._thread.started:
            self._loop = loop
            self._thread.start()
        elif loop is not self._loop:
            raise RuntimeError("TorchEngine is bound to another event loop; create one engine per loop.")
        if self._thread.error is not None:
            raise EngineDeadError("the torch engine thread died") from self._thread.error

    async def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine thread between steps and wait for it."""
        self._ensure_started()
        return await self._thread.call(fn)

    def _bound_loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "_ensure_started binds the loop before the first request"
        return self._loop

    def _on_done(self, fut: asyncio.Future, req_id: int) -> None:
        if fut.cancelled():
            self._futures.pop(req_id, None)
            self._thread.post(lambda: self.core.cancel(req_id))

    def _resolve(self, finished: list[FinishedRequest]) -> None:
        for done in finished:
            entry = self._futures.pop(done.req_id, None)
            if entry is None or entry[0].done():
                continue
            fut, sample = entry
            fut.set_result(fill_sample(sample, done))
            emit_finished(self.sink, sample)

    def _fail_all(self, exc: BaseException) -> None:
        for fut, _ in self._futures.values():
            if not fut.done():
                fut.set_exception(EngineDeadError(f"the torch engine thread died: {exc!r}"))
        self._futures.clear()

    def _emit_stamped(self, kind: str, fields: dict[str, Any], t: float) -> None:
        """Loop side: record an engine-thread event under the time it happened. The sink
        sees sample indices, not engine request ids; a request cancelled meanwhile is
        left out (an event about it alone is dropped)."""
        if sample_fields(fields, self._futures) is None:
            return
        self.sink.emit(kind, _t=t, **fields)

    # --- engine-thread side -------------------------------------------------------------------
    def _forward_event(self, kind: str, **fields: Any) -> None:
        self._emit_engine(kind, **fields)

    def _emit_engine(self, kind: str, **fields: Any) -> None:
        """Stamp an event now, on the engine thread, in the loop's time base
        (``loop.time()`` only reads the loop's monotonic clock), and hand it to the loop."""
        loop = self._bound_loop()
        loop.call_soon_threadsafe(self._emit_stamped, kind, fields, loop.time())

    def _set_busy(self, busy: bool) -> None:
        if busy != self._busy:
            self._busy = busy
            if self.sink.enabled:
                self._emit_engine(ev.PHASE_START if busy else ev.PHASE_END, side="rollout", phase="generating")

    def _resolve_all(self, finished: list[FinishedRequest]) -> None:
        if finished:
            self._bound_loop().call_soon_threadsafe(self._resolve, finished)

    def _step(self) -> None:  # one iteration of the batch (EngineThread runs it between commands)
        self._set_busy(True)
        self._resolve_all(self.core.step())

    def _on_thread_error(self, exc: BaseException) -> None:
        self._bound_loop().call_soon_threadsafe(self._fail_all, exc)


def _ignore(*args: Any, **kwargs: Any) -> None:
    return None


def run_groups(core: EngineCore, groups: list[list[Sample]], sampling: SamplingParams, *, seed: int = 0) -> None:
    """Synchronous generate for every sample of ``groups`` (filled in place), for the
    one-process sync loop and tests. The engine must not be paused."""
    if core.paused:
        raise RuntimeError("run_groups on a paused engine would never finish; call resume() first.")
    by_id: dict[tuple[str, int], Sample] = {}
    for group in groups:
        for sample in group:
            req_id = ("run_groups", len(by_id))
            core.add_request(req_id, *add_request_args(sample, sampling, seed=seed, max_seq_len=core.model.max_seq_len))
            by_id[req_id] = sample
    while core.has_work():
        for done in core.step():
            fill_sample(by_id.pop(done.req_id), done)
