"""The ``ray`` layout's engine: N rollout engines as Ray actors behind one ``RolloutEngine``.

``RayEngineGroup`` is ONE engine to the core's drivers (``generate`` / ``pause_generation``
/ ``update_weights`` / ``continue_generation`` / ``weight_version``), so the drivers are
unchanged; behind it:

* **Engines.** Each engine is an ``EngineActor`` (a threaded Ray actor) that owns an
  ``EngineCore`` driven by one engine thread, exactly as ``ProcessEngine``'s child drives
  it: commands are applied between steps, every batched step is one ``core.step()``.
* **Router.** ``harness.backends.router``: least outstanding requests, as Miles' own router picks a worker
  (``miles/router/router.py:L215-L229``, ``_use_url``: ``min`` over the live workers'
  request counts, ties to the first registered; dead workers skipped): a request goes to
  the live engine with the fewest requests submitted and not yet returned, ties to the
  lowest engine index. (SGLang's Rust router defaults to ``cache_aware``; Miles' rollout
  path with ``--use-miles-router`` uses this one; with a prefix-free tiny workload the
  cache-aware policy degenerates to load balancing anyway.)
* **Weights.** ``update_weights`` broadcasts through Ray: ``broadcast="put_once"`` (the
  default) puts the state dict into the object store once (``ray.put``) and hands every
  engine the same object ref; ``"per_engine"`` passes the dict as an argument of each
  engine's call (Ray serializes it once per engine). ``suites/bench/test_ray_layout.py``
  measures both. Each update's timings are in ``sync_s``.
* **Pause / update / resume** go to every engine with the same mode, in Miles' order
  (``update_weight_from_distributed/mixin.py:L309-L331``: ``ray.get`` of
  ``pause_generation(mode)`` on every engine, then the load on every engine, then
  ``update_weight_version`` and ``continue_generation`` on every engine): each phase
  waits for all engines before the next starts, so an update is loaded by every engine
  before any engine resumes. ``abort_requests`` (SGLang's ``/abort_request`` with
  ``abort_all``, which upstream posts to every worker after each one-step rollout) goes
  to every live engine likewise.

The trainer stays in the driver process, not in an actor: the core's drivers call
``trainer.train`` / ``get_weights`` in process, ``TorchTrainer`` already trains on a worker
thread (torch releases the GIL, so the driver's loop keeps routing and recording), and the
main job's gap replay and checks read the trainer's state after the run. A trainer actor
would add one more process to the same two cores and one more copy of the weights
(actor -> object store) per update, and gain nothing on one machine; Miles needs actors
for its trainer because a Megatron/FSDP trainer spans several GPUs and nodes.

Ordering. Every actor has one ordered outbox: its engine thread appends events (stamped
as they happen), finished results and command replies in the order they happen, and the
driver drains it with ``poll`` (one long-poll task per engine). Commands carry a
per-engine sequence number and the actor applies them in that order, whatever order Ray
runs the calls of a threaded actor in. So each engine's events reach the trace in that
engine's order and ahead of the results and replies that follow them, and a command's
reply is seen after every event it caused (the checkers rely on both).

Trace. Every engine event carries ``engine`` (the engine index); SUBMITTED is the
group's, with the engine the router chose. Each engine records ``engine_loaded`` as it
applies an update. ``engine_version`` stays the driver's one event per update.

Clock alignment. An actor stamps its events with its ``time.monotonic()``. At start the
group reads its own monotonic ``a``, calls ``hello`` (the actor's reading ``c``) and reads
``b`` on the reply. On one machine the clock is one system-wide ``CLOCK_MONOTONIC`` and
``a <= c <= b`` holds: the offset is 0 (exact). Otherwise (an actor on another node of a
``--ray-address`` cluster) the offset is the midpoint estimate ``(a + b) / 2 - c``, off by
at most ``(b - a) / 2`` (kept per engine in ``clock``). Driver monotonic time then maps to
the loop's time base (``loop.time() - time.monotonic()``, read back to back), as
``ProcessEngine`` does.

A dead engine (``ray.kill``, a crash: its poll raises ``RayActorError``): the group records
``fault(what="engine_died", engine=i, lost=[sample indices], lost_groups=[...])``, stops
routing to it (Miles' router marks a worker dead and skips it, ``router.py:L87-L113``,
``L223-L225``), and fails the requests that were on it with ``EngineLostError`` -- a
failed generate call, which the one-step rollout logs and skips, dropping the group (the
trace's ``dropped(reason=generate_error)`` says where the prompt went), and which kills
the fully-async worker (any exception from a group task's ``result()`` does). With ``on_engine_death="fail"`` (the default, Miles
without ``--use-fault-tolerance``) the next pause raises ``EngineDeadError`` naming the
engine: Miles' updater ``ray.get``s ``pause_generation`` on every engine
(``mixin.py:L313-L314``) and a dead actor raises there, so the run ends at its next weight
update with every finished step kept. ``"continue"`` goes on with the live engines (what
``--use-fault-tolerance`` does between a death and the restart at the next update,
``actor_group.py:L124-L125``; this harness does not restart engines).

Cluster. ``ensure_ray(address)`` joins ``--ray-address`` or starts a local cluster sized to
the machine (``num_cpus = os.cpu_count()``) once per process and records how long that
took; ``shutdown_ray()`` stops a cluster this process started. Actors are pooled per
process (``engine_pool()``): a group resets its actors' cores (a fresh model from the
same builder) instead of starting new processes, so the modes of one run share actor
start-up, which is measured (``startup``) and happens before the timed window.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import os
import threading
import time
from typing import Any, Callable

from miles_async_core import events as ev
from miles_async_core.contracts import NullSink, check_pause_mode
from miles_async_core.errors import ConfigError, EngineDeadError
from miles_async_core.types import Sample, SamplingParams, Status

from .engine_io import add_request_args, emit_finished, emit_submitted, merge_result, sample_fields
from .engine_thread import apply_command, pack_finished
from .router import LeastOutstandingRouter

BROADCASTS = ("put_once", "per_engine")
ON_ENGINE_DEATH = ("fail", "continue")
POLL_TIMEOUT_S = 0.5


class EngineLostError(RuntimeError):
    """A request was on an engine that died; its partial output is gone with the engine."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:  # pragma: no cover - depends on the install
        raise ConfigError("--layout ray needs Ray: pip install -e '.[ray]' (or `make` installs it)") from None
    return ray


# --- the cluster ---------------------------------------------------------------------------------
_CLUSTER: dict[str, Any] = {}


def ensure_ray(address: str | None = None) -> dict[str, Any]:
    """Join ``address`` or start a local cluster (once per process). Returns
    ``{"address", "started_here", "startup_s", "num_cpus"}``; ``startup_s`` is the first
    call's ``ray.init`` time (later calls reuse the cluster)."""
    ray = _ray()
    if ray.is_initialized():
        return dict(_CLUSTER) or {"address": "existing", "started_here": False, "startup_s": 0.0}
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    t0 = time.perf_counter()
    if address:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    _CLUSTER.update(
        address=address or "local",
        started_here=not address,
        startup_s=time.perf_counter() - t0,
        num_cpus=int(ray.cluster_resources().get("CPU", 0)),
    )
    return dict(_CLUSTER)


def shutdown_ray() -> None:
    """Kill the pooled actors and disconnect; a local cluster this process started stops."""
    ray = _ray()
    if _POOL is not None:
        _POOL.clear()
    if ray.is_initialized():
        ray.shutdown()
    _CLUSTER.clear()


# --- the actor ---------------------------------------------------------------------------------
class _EngineActorImpl:
    """An ``EngineCore`` on one engine thread inside a Ray actor (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[int, tuple]] = []
        self._next_seq = 0
        self._outbox: list[tuple] = []
        self._out_cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._error: str | None = None
        self.core: Any = None
        self.epoch = 0  # one per reset: calls of an earlier group are ignored

    def hello(self) -> tuple[float, int]:
        return time.monotonic(), os.getpid()

    def reset(
        self,
        build_model: Callable[[], Any],
        max_running: int,
        eos_token_id: int | None,
        num_threads: int,
        core_cls: type | None = None,
    ) -> tuple[int, float]:
        """A fresh core on a fresh model; returns (the new epoch, the seconds it took)."""
        import torch

        from harness.backends.torch_engine import EngineCore

        t0 = time.perf_counter()
        self.stop()
        torch.set_num_threads(num_threads)
        self.core = (core_cls or EngineCore)(
            build_model(), max_running=max_running, eos_token_id=eos_token_id, on_event=self._emit
        )
        with self._cond:
            self.epoch += 1
            self._heap, self._next_seq, self._stop, self._error = [], 0, False, None
        with self._out_cond:
            self._outbox = []
        self._busy = False
        self._thread = threading.Thread(target=self._run, name="ray-engine", daemon=True)
        self._thread.start()
        return self.epoch, time.perf_counter() - t0

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        with self._out_cond:
            self._out_cond.notify_all()

    def submit(self, epoch: int, seq: int, commands: list[tuple]) -> None:
        with self._cond:
            if epoch != self.epoch:
                return
            heapq.heappush(self._heap, (seq, tuple(commands)))
            self._cond.notify_all()

    def update(self, epoch: int, seq: int, call_id: int, version: int, weights: dict) -> None:
        """``weights``: Ray resolved the object ref (or the per-engine argument) already."""
        self.submit(epoch, seq, [("update", call_id, version, weights)])

    def poll(self, epoch: int, timeout: float) -> list[tuple]:
        with self._out_cond:
            if epoch != self.epoch:
                return []
            if not self._outbox and self._thread is not None:
                self._out_cond.wait(timeout)
            out, self._outbox = self._outbox, []
        return out

    # engine thread ----------------------------------------------------------------------------
    def _emit(self, kind: str, **fields: Any) -> None:
        self._out(("event", time.monotonic(), kind, fields))

    def _out(self, msg: tuple) -> None:
        with self._out_cond:
            self._outbox.append(msg)
            self._out_cond.notify_all()

    def _finish(self, finished: list) -> None:
        if finished:
            self._out(("finished", [pack_finished(f) for f in finished]))

    def _set_busy(self, busy: bool) -> None:
        if busy != self._busy:
            self._busy = busy
            self._emit(ev.PHASE_START if busy else ev.PHASE_END, side="rollout", phase="generating")

    def _ready(self) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        while self._heap and self._heap[0][0] == self._next_seq:
            out.extend(heapq.heappop(self._heap)[1])
            self._next_seq += 1
        return out

    def _run(self) -> None:
        core = self.core
        try:
            while True:
                with self._cond:
                    while True:
                        if self._stop:
                            return
                        commands = self._ready()
                        if commands or core.can_step():
                            break
                        self._set_busy(False)
                        self._cond.wait()
                for cmd in commands:
                    reply = self._apply(cmd)
                    if not core.can_step():
                        self._set_busy(False)
                    if reply is not None:
                        self._out(reply)
                if core.can_step():
                    self._set_busy(True)
                    self._finish(core.step())
        except BaseException:  # surfaced to the driver, which fails every waiter
            import traceback

            self._error = traceback.format_exc()
            self._out(("crash", self._error))

    def _apply(self, cmd: tuple) -> tuple | None:
        core = self.core
        if cmd[0] == "update":  # Ray resolved the weights already (``update``)
            t0 = time.perf_counter()
            core.update_weights(cmd[2], cmd[3])
            self._emit(ev.ENGINE_LOADED, version=core.version)
            return ("reply", cmd[1], time.perf_counter() - t0)
        return apply_command(core, cmd, self._emit, self._finish)


_ACTOR_CLS: Any = None


def engine_actor_cls() -> Any:
    global _ACTOR_CLS
    if _ACTOR_CLS is None:
        # num_cpus=0: the engines share the machine's cores with the driver and each other
        # (threads per engine are set by ``reset``); max_concurrency: poll blocks while
        # submit / update calls arrive.
        _ACTOR_CLS = _ray().remote(num_cpus=0, max_concurrency=8, max_restarts=0)(_EngineActorImpl)
    return _ACTOR_CLS


class EnginePool:
    """Engine actors kept alive between runs of one process (start-up is paid once)."""

    def __init__(self) -> None:
        self.actors: list[Any] = []
        self.started_s: list[float] = []  # per actor: seconds from creation to its first reply

    def acquire(self, n: int) -> tuple[list[Any], float]:
        """``n`` live actors (new ones started as needed) and the seconds spent starting them."""
        ray = _ray()
        alive = []
        for a in self.actors:
            try:
                ray.get(a.hello.remote(), timeout=30)
                alive.append(a)
            except Exception:  # killed by a fault test or crashed: replace it
                pass
        self.actors = alive
        t0 = time.perf_counter()
        fresh = [engine_actor_cls().remote() for _ in range(n - len(self.actors))]
        if fresh:
            ray.get([a.hello.remote() for a in fresh])
            self.started_s += [time.perf_counter() - t0] * len(fresh)
        self.actors += fresh
        return self.actors[:n], time.perf_counter() - t0

    def clear(self) -> None:
        ray = _ray()
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        self.actors = []


_POOL: EnginePool | None = None


def engine_pool() -> EnginePool:
    global _POOL
    if _POOL is None:
        _POOL = EnginePool()
    return _POOL


def align_clock(a: float, c: float, b: float) -> tuple[float, bool]:
    """(offset to add to the remote reading ``c`` to get local monotonic time, whether
    the clock is shared): ``a`` and ``b`` are local readings before the call and on the reply."""
    if a <= c <= b:
        return 0.0, True
    return (a + b) / 2 - c, False


class RayEngineGroup:
    """``RolloutEngine`` over N ``EngineActor``s (module docstring)."""

    def __init__(
        self,
        build_model: Callable[[], Any],
        *,
        num_engines: int = 2,
        max_running: int = 64,
        eos_token_id: int | None = None,
        seed: int = 0,
        num_threads: int = 1,
        sink: Any = None,
        max_seq_len: int | None = None,
        broadcast: str = "put_once",
        on_engine_death: str = "fail",
        address: str | None = None,
        core_cls: type | None = None,
        core_classes: dict[int, type] | None = None,
    ) -> None:
        if num_engines < 1:
            raise ConfigError(f"--num-engines {num_engines}: must be >= 1; fix: e.g. --num-engines 2")
        if broadcast not in BROADCASTS:
            raise ConfigError(f"--broadcast {broadcast!r}: allowed {', '.join(BROADCASTS)}")
        if on_engine_death not in ON_ENGINE_DEATH:
            raise ConfigError(f"--on-engine-death {on_engine_death!r}: allowed {', '.join(ON_ENGINE_DEATH)}")
        ray = _ray()
        self.cluster = ensure_ray(address)
        self.sink = sink or NullSink()
        self.seed, self.max_seq_len, self.broadcast = seed, max_seq_len, broadcast
        self.on_engine_death = on_engine_death
        self.n = num_engines
        self.actors, start_s = engine_pool().acquire(num_engines)
        t0 = time.perf_counter()
        classes = core_classes or {}
        resets = ray.get(
            [
                a.reset.remote(build_model, max_running, eos_token_id, num_threads, classes.get(i, core_cls))
                for i, a in enumerate(self.actors)
            ]
        )
        self._epoch = [e for e, _ in resets]
        reset_s = [s for _, s in resets]
        self.clock: list[dict[str, Any]] = []
        for a in self.actors:
            before = time.monotonic()
            c, pid = ray.get(a.hello.remote())
            offset, shared = align_clock(before, c, time.monotonic())
            self.clock.append({"offset_s": offset, "shared": shared, "pid": pid})
        self.startup = {
            "ray_init_s": self.cluster.get("startup_s", 0.0),
            "actors_start_s": start_s,
            "reset_s": time.perf_counter() - t0,
            "reset_s_per_engine": reset_s,
        }
        self.weight_version = 0
        self.router = LeastOutstandingRouter(num_engines)
        self.dead: dict[int, str] = {}
        self.sync_s: list[dict[str, float]] = []
        self.per_engine = [{"finished": 0, "lost": 0} for _ in range(num_engines)]
        self._seq = [0] * num_engines
        self._pending: list[list[tuple]] = [[] for _ in range(num_engines)]
        self._flush_scheduled = False
        self._futures: dict[int, tuple[asyncio.Future, Sample, int]] = {}
        self._calls: dict[int, tuple[asyncio.Future, int]] = {}
        self._next_id = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_offset_s = 0.0
        self._readers: list[asyncio.Task] = []
        self._closing = False

    # --- contract ----------------------------------------------------------------------------
    def generate(self, sample: Sample, sampling: SamplingParams) -> asyncio.Future:
        args = add_request_args(sample, sampling, seed=self.seed, max_seq_len=self.max_seq_len)
        self._ensure_started()
        i = self.router.pick(self.live())
        fut = self._bound_loop().create_future()
        req_id, self._next_id = self._next_id, self._next_id + 1
        self._futures[req_id] = (fut, sample, i)
        emit_submitted(self.sink, sample, self.weight_version, engine=i)
        self._queue(i, ("add", req_id, *args))
        fut.add_done_callback(functools.partial(self._on_done, req_id=req_id))
        return fut

    async def pause_generation(self, mode: str) -> None:
        check_pause_mode(mode)
        self._check_alive("pause_generation")
        replies = await self._call_all("pause", mode)
        for finished in replies.values():
            self._resolve(finished)

    async def update_weights(self, version: int, weights: Any) -> None:
        self._check_alive("update_weights")
        ray = _ray()
        self._flush()
        live = self.live()
        t0 = time.perf_counter()
        payload = ray.put(weights) if self.broadcast == "put_once" else weights
        put_s = time.perf_counter() - t0
        futs = {}
        for i in live:
            call_id, fut = self._new_call(i)
            self.actors[i].update.remote(self._epoch[i], self._next_seq(i), call_id, version, payload)
            futs[i] = fut
        load = await self._gather(futs)
        self.weight_version = version
        self.sync_s.append(
            {
                "put_s": put_s,
                "total_s": time.perf_counter() - t0,
                "load_s_max": max(load.values(), default=0.0),
                "engines": len(live),
            }
        )

    async def continue_generation(self) -> None:
        self._check_alive("continue_generation")
        await self._call_all("resume")

    async def abort_requests(self) -> None:
        """SGLang's ``/abort_request`` with ``abort_all``, posted by upstream's ``abort()``
        after every one-step rollout to every worker the router lists (``_use_url``'s live
        ones): ``engine_thread.abort_all`` on every live engine, all awaited; the aborted
        results come back ahead of each reply. A dead engine is skipped, not an error
        (its requests already failed; the next pause reports it)."""
        await self._call_all("abort")

    def live(self) -> list[int]:
        return [i for i in range(self.n) if i not in self.dead]

    def stats(self) -> dict[str, Any]:
        """Per-engine counts, start-up and broadcast timings, clock alignment, deaths."""
        return {
            "num_engines": self.n,
            "broadcast": self.broadcast,
            "startup": self.startup,
            "clock": self.clock,
            "routed": list(self.router.routed),
            "per_engine": self.per_engine,
            "dead": dict(self.dead),
            "sync_s": list(self.sync_s),
        }

    def close(self) -> None:
        """Stop the engine threads (the actors go back to the pool); safe from any thread."""
        self._closing = True
        ray = _ray()
        refs = [self.actors[i].stop.remote() for i in self.live()]
        try:
            ray.get(refs, timeout=60)
        except Exception:
            pass

    # --- plumbing ----------------------------------------------------------------------------
    def _check_alive(self, what: str) -> None:
        if self.dead and self.on_engine_death == "fail":
            i, why = next(iter(self.dead.items()))
            # upstream: update_weight_from_distributed/mixin.py:L313-L314
            raise EngineDeadError(
                f"rollout engine {i} of {self.n} died ({why}); {what} cannot reach it. Upstream Miles without "
                "--use-fault-tolerance fails here too: its updater ray.get()s pause_generation on every engine "
                "(update_weight_from_distributed/mixin.py). Finished steps are kept; the requests lost "
                "with the engine are in the trace's fault(what=engine_died) event. Fix: restart the run, or run "
                "with on_engine_death='continue' to go on with the live engines"
            )
        if not self.live():
            raise EngineDeadError(f"every rollout engine has died ({self.dead}); {what} has nothing to reach")

    def _ensure_started(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop_offset_s = self._loop.time() - time.monotonic()
            self._readers = [self._loop.create_task(self._read(i)) for i in range(self.n)]

    def _next_seq(self, i: int) -> int:
        s, self._seq[i] = self._seq[i], self._seq[i] + 1
        return s

    def _queue(self, i: int, cmd: tuple) -> None:
        """Requests are sent in one call per engine per loop iteration."""
        self._pending[i].append(cmd)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._bound_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        for i, cmds in enumerate(self._pending):
            if cmds and i not in self.dead:
                self.actors[i].submit.remote(self._epoch[i], self._next_seq(i), cmds)
            self._pending[i] = []

    def _new_call(self, i: int) -> tuple[int, asyncio.Future]:
        call_id, self._next_id = self._next_id, self._next_id + 1
        fut = self._bound_loop().create_future()
        self._calls[call_id] = (fut, i)
        return call_id, fut

    async def _call_all(self, kind: str, *args: Any) -> dict[int, Any]:
        """Send ``kind`` to every live engine; wait for all replies (Miles' ``ray.get([...])``)."""
        self._ensure_started()
        self._flush()
        futs = {}
        for i in self.live():
            call_id, fut = self._new_call(i)
            self.actors[i].submit.remote(self._epoch[i], self._next_seq(i), [(kind, call_id, *args)])
            futs[i] = fut
        return await self._gather(futs)

    async def _gather(self, futs: dict[int, asyncio.Future]) -> dict[int, Any]:
        results = await asyncio.gather(*futs.values(), return_exceptions=True)
        out: dict[int, Any] = {}
        for (i, _), r in zip(futs.items(), results):
            if isinstance(r, BaseException):
                if isinstance(r, EngineDeadError) and self.on_engine_death == "continue":
                    continue
                raise r
            out[i] = r
        return out

    async def _read(self, i: int) -> None:
        actor = self.actors[i]
        while not self._closing and i not in self.dead:
            try:
                msgs = await actor.poll.remote(self._epoch[i], POLL_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # RayActorError: the actor is gone
                if self._closing:
                    return
                self._engine_died(i, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                return
            for msg in msgs:
                self._dispatch(i, msg)

    def _dispatch(self, i: int, msg: tuple) -> None:
        kind = msg[0]
        if kind == "event":
            if self.sink.enabled:
                self._emit_engine_event(i, msg[1], msg[2], dict(msg[3]))
        elif kind == "finished":
            self._resolve(msg[1])
        elif kind == "reply":
            entry = self._calls.pop(msg[1], None)
            if entry is not None and not entry[0].done():
                entry[0].set_result(msg[2])
        elif kind == "crash":
            self._engine_died(i, f"engine thread crashed:\n{msg[1]}")

    def _emit_engine_event(self, i: int, t: float, kind: str, fields: dict[str, Any]) -> None:
        """Request ids become sample indices (a request cancelled meanwhile is left out)."""
        if sample_fields(fields, self._futures) is None:
            return
        self.sink.emit(kind, _t=t + self.clock[i]["offset_s"] + self._loop_offset_s, engine=i, **fields)

    def _resolve(self, finished: list[tuple]) -> None:
        for req_id, tokens, log_probs, runs, version, status in finished:
            entry = self._futures.pop(req_id, None)
            if entry is None or entry[0].done():
                continue
            fut, s, i = entry
            merge_result(
                s, tokens=tokens, log_probs=log_probs, token_runs=runs, weight_version=version, status=Status(status)
            )
            self.per_engine[i]["finished"] += 1
            self.router.done(i)
            if self.sink.enabled:
                emit_finished(_Tagged(self.sink, i), s)
            fut.set_result(s)

    def _bound_loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "_ensure_started binds the loop before the first call"
        return self._loop

    def _on_done(self, fut: asyncio.Future, req_id: int) -> None:
        if not fut.cancelled():
            return
        entry = self._futures.pop(req_id, None)
        if entry is None:
            return
        i = entry[2]
        self.router.done(i)
        if i not in self.dead:
            self._queue(i, ("cancel", req_id))

    def _engine_died(self, i: int, why: str) -> None:
        if i in self.dead:
            return
        self.dead[i] = why
        lost = [(rid, s) for rid, (f, s, k) in self._futures.items() if k == i and not f.done()]
        self.per_engine[i]["lost"] = len(lost)
        if self.sink.enabled:
            self.sink.emit(
                ev.FAULT,
                what="engine_died",
                engine=i,
                reason=why,
                lost=[s.index for _, s in lost],
                lost_groups=sorted({s.group_index for _, s in lost}),
                live_engines=self.live(),
            )
        err = EngineLostError(f"rollout engine {i} died ({why}); request lost with it")
        for rid, _ in lost:
            fut = self._futures.pop(rid)[0]
            self.router.done(i)
            fut.set_exception(err)
        for call_id, (fut, k) in list(self._calls.items()):
            if k == i:
                del self._calls[call_id]
                if not fut.done():
                    fut.set_exception(EngineDeadError(f"rollout engine {i} died ({why})"))


class _Tagged:
    """A sink view that adds ``engine=i`` to what it records."""

    enabled = True

    def __init__(self, sink: Any, i: int) -> None:
        self.sink, self.i = sink, i

    def emit(self, kind: str, /, **fields: Any) -> None:
        self.sink.emit(kind, engine=self.i, **fields)


__all__ = [
    "BROADCASTS",
    "EngineLostError",
    "EnginePool",
    "LeastOutstandingRouter",
    "ON_ENGINE_DEATH",
    "RayEngineGroup",
    "align_clock",
    "engine_pool",
    "ensure_ray",
    "shutdown_ray",
]
