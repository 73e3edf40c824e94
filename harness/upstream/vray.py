"""A small in-process Ray for the virtual-time host: upstream's Ray orchestration runs as
written, in one process, on the one-thread virtual-time loop (``harness.sim.vtime``).

``modules()`` gives the module objects to install as ``ray`` and the submodules upstream
imports from. The contract, following Ray's documented behaviour, made deterministic:

- ``remote`` wraps a class (an actor class) or a function (a remote function), with or
  without options; option names are checked (``TypeError`` naming an unknown one).
- An actor's constructor runs after ``.remote()`` returns, as in Ray, where it runs in the
  actor's process once that process is up: on a running loop, once nothing else is ready
  at the current virtual instant (a process starts slower than any in-process step, and
  costs no virtual time here); constructors waiting at one instant run one at a time in
  creation order. Calls made before it ran queue behind it, in submission order (Ray runs
  an actor's tasks after its creation task). Outside a running loop it runs at
  ``.remote()``. One that raises leaves a dead handle.
- A call of an ``async def`` method (an async actor's) is an asyncio task on the running
  loop, concurrent with the others, started eagerly: its body runs inside ``.remote()`` up
  to its first suspension (a body that never suspends returns a done ref). Its ref is done
  in the step where the body returns, and an ``await`` of a pending ref waits on a future of
  its own (``ObjectRef.future()``: cancelling it cancels the wait, not the call) whose
  completion wakes the awaiter next, before anything else ready on the loop. So a call and
  its return cost what a direct call costs (the callee runs when called, the caller resumes
  when it returns): between two processes Ray delivers in some order, and this is the one
  the core's direct calls have, so work falling on one virtual instant runs in the same
  order on both. A ref given to ``gather`` or ``wait_for`` is waited on through the same
  kind of future (not a task that awaits it). A ref already done when awaited does not
  suspend; what asyncio's own plumbing around a future costs (``gather``'s callbacks) is
  what it costs.
- Plain calls run one at a time in submission order: at ``.remote()`` when no plain call
  of the actor is running, else queued behind it. So a sync
  actor is sequential, and an async actor's plain method runs at once even while its
  coroutines are suspended (in Ray it runs on, and blocks, the actor's one loop thread).
  Top-level ``ObjectRef`` arguments are resolved, as Ray does.
- ``ray.get`` on a pending ref with no timeout, inside the running loop (a driver's, an
  actor's call or constructor), steps the loop until the ref is done, as Ray's caller
  blocks while the work goes on; work that can never finish, or no loop, is
  ``VRayBlockingGet``. With a timeout, the timeout is what happens (``GetTimeoutError``,
  or the not-ready list), a schedule where the callee is slower than the timeout.
  ``ray.wait`` never blocks. Refs are awaitable; ``await`` is how async code waits.
- Resources: one node (``Cluster``). Placement groups and actors reserve CPUs, GPUs (ids,
  fractions below 1 share a GPU) and custom resources, from the node or from a bundle;
  what does not fit raises ``VRayUnschedulable`` (Ray would leave it pending forever).
- ``kill_actor`` / ``ray.kill``: the actor dies now; queued and in-flight calls fail with
  ``ActorDiedError`` (a ``RayActorError``), its async calls are cancelled, its resources
  and name are freed.

Real time (``reset(real_time=True)``, the served run): the loop is an ordinary asyncio loop
and other threads do real work beside it (servers, Miles' background loop). There a sync
actor (a class with no ``async def`` method: ``SGLangEngine``) runs its calls on a thread
of its own, one at a time in submission order, as a Ray actor process runs them beside the
caller: a blocking HTTP call of one engine does not hold the driver or another engine.
Its ref is resolved on the loop (``call_soon_threadsafe``). A call made from another
thread (an engine's thread, Miles' background loop) is handed to the loop the same way,
and an ``await`` of a ref on another thread's loop is woken on that loop. ``ray.get`` and
``ray.wait`` block their caller for real, up to their ``timeout``: a thread off the loop
waits, the loop's own thread steps the loop meanwhile. Async actors keep running on the
one loop.

Not modelled: processes and their isolation (actors share this interpreter; arguments are
not copied or serialized), the object store and spilling, retries and restarts
(``max_restarts`` and the like are accepted and ignored), ``max_concurrency`` and
concurrency groups (recorded only), ``num_returns`` other than 1, multi-node clusters,
runtime environments, task cancellation by ``ray.cancel``, and tasks an actor spawns
itself (they outlive a kill). A remote error is re-raised as the original exception, not
wrapped in ``RayTaskError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import sys
import threading
import time
import types
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

DEFAULT_NUM_GPUS = 8
DEFAULT_NUM_CPUS = 32
_EPS = 1e-9


class RayError(Exception):
    pass


class RayActorError(RayError):
    """The actor died before or while running the call."""


class ActorDiedError(RayActorError):
    pass


class RayTaskError(RayError):
    """For ``except`` clauses only: vray re-raises a remote call's own exception."""


class TaskCancelledError(RayError):
    pass


class GetTimeoutError(RayError, TimeoutError):
    pass


class VRayError(RuntimeError):
    """A use of Ray that this one-thread host cannot run, or that would hang in Ray."""


class VRayBlockingGet(VRayError):
    pass


class VRayUnschedulable(VRayError):
    pass


class VRayNoLoop(VRayError):
    pass


# Ray's option names, per kind of remote object (Ray rejects any other name).
_COMMON = "num_cpus num_gpus resources accelerator_type memory object_store_memory name scheduling_strategy runtime_env"
_COMMON += " label_selector enable_task_events _metadata placement_group_capture_child_tasks"
_ACTOR_OPTIONS = set(_COMMON.split()) | set(
    "namespace lifetime get_if_exists max_concurrency max_restarts max_task_retries max_pending_calls"
    " concurrency_groups allow_out_of_order_execution _labels".split()
)
_TASK_OPTIONS = set(_COMMON.split()) | {"num_returns", "max_calls", "max_retries", "retry_exceptions"}
_METHOD_OPTIONS = set("num_returns concurrency_group max_task_retries retry_exceptions name enable_task_events".split())


def _check_options(options: dict[str, Any], allowed: set[str], what: str) -> dict[str, Any]:
    for key in options:
        if key not in allowed:
            raise TypeError(f"invalid Ray option {key!r} for {what}; known: {', '.join(sorted(allowed))}")
    if options.get("num_returns") not in (None, 1):
        raise VRayError(f"{what}: num_returns={options['num_returns']!r} is not modelled by vray (only 1)")
    return options


@dataclass
class Cluster:
    """The one node: its resources (``resources`` are custom ones) and identity."""

    num_gpus: int = DEFAULT_NUM_GPUS
    num_cpus: float = DEFAULT_NUM_CPUS
    resources: dict[str, float] = field(default_factory=dict)
    node_ip: str = "127.0.0.1"
    node_id: str = "vray-node-0"

    def totals(self) -> dict[str, float]:
        return {"CPU": float(self.num_cpus), "GPU": float(self.num_gpus), **self.resources}


@dataclass
class _Pool:
    """Resources left in the node or in one bundle: GPUs by id (fraction left of each)."""

    label: str
    free: dict[str, float]
    gpus: dict[int, float]

    def describe(self) -> dict[str, float]:
        return {**self.free, "GPU": round(sum(self.gpus.values()), 4)}


@dataclass
class _Grant:
    pool: _Pool
    amounts: dict[str, float]
    gpus: dict[int, float]


def _take(pool: _Pool, ask: dict[str, float]) -> _Grant | None:
    """Reserve ``ask`` from ``pool``, or None (and nothing taken) if it does not fit. As in
    Ray, a GPU fraction below 1 takes part of one GPU; 1 or more takes whole GPUs."""
    if any(k != "GPU" and pool.free.get(k, 0.0) + _EPS < v for k, v in ask.items()):
        return None
    want = ask.get("GPU", 0.0)
    picked: dict[int, float] = {}
    if 0 < want < 1:
        gid = next((i for i, left in pool.gpus.items() if left + _EPS >= want), None)
        if gid is None:
            return None
        picked = {gid: want}
    elif want >= 1:
        whole = [i for i, left in pool.gpus.items() if left + _EPS >= 1.0][: int(want)]
        if len(whole) < want:
            return None
        picked = dict.fromkeys(whole, 1.0)
    amounts = {k: v for k, v in ask.items() if k != "GPU"}
    for k, v in amounts.items():
        pool.free[k] = round(pool.free.get(k, 0.0) - v, 4)
    for i, f in picked.items():
        pool.gpus[i] = round(pool.gpus[i] - f, 4)
    return _Grant(pool, amounts, picked)


def _give_back(grant: _Grant) -> None:
    for k, v in grant.amounts.items():
        grant.pool.free[k] = round(grant.pool.free[k] + v, 4)
    for i, f in grant.gpus.items():
        grant.pool.gpus[i] = round(grant.pool.gpus[i] + f, 4)


def _ask(options: dict[str, Any], what: str) -> dict[str, float]:
    gpus = float(options.get("num_gpus") or 0)
    if gpus > 1 and gpus != int(gpus):
        raise ValueError(f"{what}: num_gpus={gpus}: Ray accepts a fraction of one GPU or whole GPUs")
    # Ray: an actor needs 0 CPUs to run unless num_cpus says otherwise.
    ask = {"CPU": float(options.get("num_cpus") or 0), "GPU": gpus, **(options.get("resources") or {})}
    return {k: float(v) for k, v in ask.items() if v}


class _State:
    def __init__(self, cluster: Cluster, real_time: bool = False) -> None:
        self.cluster = cluster
        self.real_time = real_time
        self.home: asyncio.AbstractEventLoop | None = None  # real time: the loop actors run on
        self.home_thread: int | None = None
        self.pool = _Pool(
            f"node {cluster.node_id}",
            {"CPU": float(cluster.num_cpus), **cluster.resources},
            {i: 1.0 for i in range(cluster.num_gpus)},
        )
        self.actors: list[_Actor] = []
        self.named: dict[tuple[str, str], ActorHandle] = {}
        self.pgs: list[PlacementGroup] = []
        self.initialized = False
        self.namespace = ""
        self.next_id = 0
        self.births: _Births | None = None

    def births_on(self, loop: asyncio.AbstractEventLoop) -> _Births:
        if self.births is None or self.births.loop is not loop:
            self.births = _Births(loop)
        return self.births

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id


_state = _State(Cluster())
_current: contextvars.ContextVar[_Actor | None] = contextvars.ContextVar("vray_current_actor", default=None)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    if _state.real_time and _state.home is None:
        _state.home, _state.home_thread = loop, threading.get_ident()
    return loop


def _foreign_thread() -> bool:
    """Real time: the caller is a thread other than the one running the home loop."""
    return _state.real_time and _state.home is not None and threading.get_ident() != _state.home_thread


def _caller() -> str:
    """The first frame outside this module: the code that called into Ray."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class _FrontHandle(asyncio.Handle):
    """A handle vray put at the front of the loop's ready queue (``_call_soon_front``)."""


def _call_soon_front(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., Any], *args: Any, context: Any = None
) -> asyncio.Handle:
    """``loop.call_soon`` while a return is delivered (``_front``): the handle runs next,
    after the ones already put first and before everything else ready."""
    loop._check_closed()  # type: ignore[attr-defined]
    handle = _FrontHandle(callback, args, loop, context)
    ready = loop._ready  # type: ignore[attr-defined]
    i = 0
    while i < len(ready) and type(ready[i]) is _FrontHandle:
        i += 1
    ready.insert(i, handle)
    return handle


@contextlib.contextmanager
def _call_soon_as(loop: asyncio.AbstractEventLoop, call_soon: Callable[..., Any]) -> Iterator[None]:
    """``loop.call_soon`` is ``call_soon`` in the block: an instance attribute, which shadows
    the loop's method for asyncio's futures and tasks (they look it up on their loop)."""
    before = loop.__dict__.get("call_soon")
    loop.__dict__["call_soon"] = call_soon
    try:
        yield
    finally:
        if before is None:
            loop.__dict__.pop("call_soon", None)
        else:
            loop.__dict__["call_soon"] = before


def _front(loop: asyncio.AbstractEventLoop) -> contextlib.AbstractContextManager[None]:
    """What ``loop.call_soon`` schedules in the block runs next (``_call_soon_front``)."""
    return _call_soon_as(loop, functools.partial(_call_soon_front, loop))


class _Awaiting(asyncio.Future):
    """What one await of a ref waits on (Ray's ``ObjectRef.as_future()``: a future per
    awaiter, so cancelling it cancels the wait, not the call). Its completion wakes the
    awaiter next, before anything else ready on the loop (``_front``), as a direct call's
    caller resumes the moment the callee returns. A ref already done when it is awaited has
    no return left to deliver: what asyncio's plumbing costs then (``gather``'s callbacks)
    is what it costs."""

    def set_name(self, name: object) -> None:
        """``loop.create_task`` names what a task factory returns (Python 3.13); a wait has
        no name to keep."""

    def _deliver(self, value: Any, error: BaseException | None) -> None:
        loop = self.get_loop()
        if _state.real_time and _running_loop() is not loop:  # an awaiter on another thread's loop
            loop.call_soon_threadsafe(self._deliver, value, error)
            return
        if self.done():  # its awaiter was cancelled
            return
        with _front(loop):
            if error is not None:
                self.set_exception(error)
            else:
                self.set_result(value)


class ObjectRef:
    """The result of a remote call: done at once (a call that ran to its end at ``.remote()``,
    ``put``) or in the step where its task ends."""

    def __init__(self, label: str) -> None:
        self._id, self._label = _state.new_id(), label
        self._caller: _Actor | None = _current.get()  # whose process made the call (None: the driver's)
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._waiters: list[_Awaiting] = []
        self._events: list[threading.Event] = []  # real time: threads blocked in ray.get / ray.wait

    def hex(self) -> str:
        return f"{self._id:056x}"

    def __repr__(self) -> str:
        return f"ObjectRef({self._label}, {'done' if self._done else 'pending'})"

    def __copy__(self) -> ObjectRef:
        return self

    def __deepcopy__(self, memo: Any) -> ObjectRef:
        return self

    def _resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        if self._done:
            return
        self._done, self._value, self._error = True, value, error
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            fut._deliver(value, error)
        for event in list(self._events):
            event.set()

    def _wake(self, event: threading.Event) -> None:
        """Real time: ``event`` is set when the ref is done (at once if it is)."""
        self._events.append(event)
        if self._done:  # _resolve sets _done before it reads _events
            event.set()

    def _result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def future(self) -> asyncio.Future[Any]:
        """An asyncio future of the running loop that completes with this ref (``_Awaiting``)."""
        loop = _running_loop()
        if loop is None:
            raise VRayNoLoop(f"{self!r}.future() at {_caller()} needs a running loop")
        fut = _Awaiting(loop=loop)
        if not self._done:
            self._waiters.append(fut)
            if self._done and fut in self._waiters:  # resolved on the home thread meanwhile (real time)
                self._waiters.remove(fut)
                fut._deliver(self._value, self._error)
        elif self._error is not None:
            fut.set_exception(self._error)
        else:
            fut.set_result(self._value)
        return fut

    def __await__(self) -> Any:
        return self.future().__await__()


def _done_ref(label: str, value: Any = None, error: BaseException | None = None) -> ObjectRef:
    ref = ObjectRef(label)
    ref._resolve(value, error)
    return ref


def _pending_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[ObjectRef]:
    return [a for a in (*args, *kwargs.values()) if isinstance(a, ObjectRef) and not a._done]


def _resolved(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Ray passes a top-level ``ObjectRef`` argument as its value (its error fails the call)."""
    value = lambda a: a._result() if isinstance(a, ObjectRef) else a  # noqa: E731
    return tuple(value(a) for a in args), {k: value(v) for k, v in kwargs.items()}


def _check_args_done(label: str, args: tuple, kwargs: dict) -> None:
    if pending := _pending_args(args, kwargs):
        raise VRayError(
            f"{label} at {_caller()}: argument {pending[0]!r} is not done; Ray would wait for it, "
            "a call that runs at .remote() cannot: await the ref first"
        )


def _call_as(actor: _Actor | None, fn: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[Any, Exception | None]:
    """``fn`` called with its ref arguments resolved, ``actor`` current: (value, error)."""
    token = _current.set(actor)
    try:
        a, k = _resolved(args, kwargs)
        return fn(*a, **k), None
    except Exception as e:
        return None, e
    finally:
        _current.reset(token)


def _run_now(actor: _Actor | None, ref: ObjectRef, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    value, error = _call_as(actor, fn, args, kwargs)
    if actor is not None and actor.dead is not None:  # it died while running the call
        value, error = None, actor.died_error(ref._label)
    ref._resolve(value, error)


def _awaited_ref(coro: Any) -> ObjectRef | None:
    """The ref that ``asyncio.ensure_future(ref)`` wraps in a coroutine of its own
    (``_wrap_awaitable`` in ``asyncio/tasks.py``, what ``gather``, ``wait_for`` and ``shield``
    make of an awaitable that is not a future), else None."""
    code = getattr(coro, "gi_code", None) or getattr(coro, "cr_code", None)
    if code is None or code.co_name != "_wrap_awaitable" or code.co_filename != asyncio.tasks.__file__:
        return None
    frame = getattr(coro, "gi_frame", None) or getattr(coro, "cr_frame", None)
    ref = frame.f_locals.get("awaitable") if frame is not None else None
    return ref if isinstance(ref, ObjectRef) else None


def _own_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """A task factory on ``loop``, wrapping the one it had, installed once. It records each
    task started while an actor is current as that actor's (``_Actor.started``), so that its
    death ends them, as a dead actor's process takes its tasks with it. And a ref given to
    ``asyncio.ensure_future`` (by ``gather``, ``wait_for``) is its own per-await future
    (``ObjectRef.future()``), not a task that awaits it: an awaiter woken first
    (``_Awaiting``) and no task step between the return and ``gather``'s callback, as for a
    coroutine's direct ``await``; cancelling it cancels the wait, not the call."""
    previous = loop.get_task_factory()
    if getattr(previous, "__vray__", False):
        return

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        if (ref := _awaited_ref(coro)) is not None:
            coro.close()
            return ref.future()
        task: Any = asyncio.Task(coro, loop=loop, **kwargs) if previous is None else previous(loop, coro, **kwargs)
        context = kwargs.get("context")
        owner = context.get(_current) if context is not None else _current.get()
        if owner is not None:
            owner.started[task] = None
            task.add_done_callback(lambda t: owner.started.pop(t, None))
        return task

    factory.__vray__ = True  # type: ignore[attr-defined]
    loop.set_task_factory(factory)


def _eager_task(loop: asyncio.AbstractEventLoop, coro: Any, context: contextvars.Context, name: str) -> Any:
    """A task of ``coro`` whose first step runs now, up to its first suspension, before the
    caller goes on (asyncio's eager task start, ``eager_start=True`` from Python 3.12; on
    3.11 the pure-Python task with its first step run here)."""
    if sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=loop, context=context, name=name, eager_start=True)  # type: ignore[call-arg]
    steps: list[Callable[[], None]] = []
    with _call_soon_as(loop, lambda callback, *a, context=None: steps.append(callback)):
        task = asyncio.tasks._PyTask(coro, loop=loop, name=name, context=context)  # type: ignore[attr-defined]
    caller = asyncio.current_task(loop)
    if caller is not None:
        asyncio.tasks._leave_task(loop, caller)
    try:
        context.run(steps[0])
    finally:
        if caller is not None:
            asyncio.tasks._enter_task(loop, caller)
    return task


def _spawn(
    actor: _Actor | None, fn: Callable[..., Any], args: tuple, kwargs: dict, label: str, ref: ObjectRef | None = None
) -> ObjectRef:
    loop = _running_loop()
    if loop is None:
        raise VRayNoLoop(
            f"{label}.remote() at {_caller()}: a coroutine call runs as a task of the running "
            "virtual-time loop, and none is running: make the call inside run_virtual"
        )
    ref = ObjectRef(label) if ref is None else ref

    async def body() -> None:
        _current.set(actor)  # the task's own context: the actor is current in the call
        try:
            for dep in _pending_args(args, kwargs):
                await dep
            a, k = _resolved(args, kwargs)
            value = await fn(*a, **k)
        except Exception as e:
            ref._resolve(error=e)
        else:  # the return reaches the caller in this step, as a direct call's does
            ref._resolve(value)

    body.__qualname__ = label  # the task is named by the call it runs (e.g. RolloutManager.generate)
    _own_tasks(loop)
    context = contextvars.copy_context()
    context.run(_current.set, actor)  # the call runs in the actor: what it starts is the actor's

    def finished(t: asyncio.Task[Any]) -> None:
        if actor is not None:
            actor.inflight.pop(ref, None)
        if t.cancelled():
            ref._resolve(error=TaskCancelledError(f"{label} was cancelled"))

    task = _eager_task(loop, body(), context, f"{label}#{ref._id:08d}")
    if task.done():  # it ran to its end inside .remote()
        finished(task)
        return ref
    if actor is not None:
        actor.inflight[ref] = task
    task.add_done_callback(finished)
    return ref


class _Actor:
    def __init__(self, cls: type, options: dict[str, Any], grant: _Grant) -> None:
        self.cls, self.options, self.grant = cls, options, grant
        self.id = f"{_state.new_id():032x}"
        self.instance: Any = None
        self.born = False  # its constructor has run
        self.unborn_calls: list[tuple[ObjectRef, str, tuple, dict]] = []  # made before it ran
        self.dead: str | None = None
        self.dead_from: BaseException | None = None
        self.busy = False
        self.queue: deque[tuple[ObjectRef, Callable[[], None]]] = deque()
        self.inflight: dict[ObjectRef, asyncio.Task[Any]] = {}
        # tasks it started itself and not yet done, in the order it started them
        self.started: dict[Any, None] = {}
        self.handle = ActorHandle(self)
        # real time: a sync actor's own thread (its process' one executing thread in Ray)
        self.thread: ThreadPoolExecutor | None = None
        self.on_thread: dict[ObjectRef, None] = {}  # its calls submitted there and not yet returned
        if _state.real_time and not any(inspect.iscoroutinefunction(f) for _, f in inspect.getmembers(cls)):
            self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"vray-{cls.__name__}")

    def died_error(self, label: str) -> ActorDiedError:
        err = ActorDiedError(f"the actor {self.cls.__name__} ({self.id}) is dead: {self.dead}; {label} did not run")
        err.__cause__ = self.dead_from
        return err

    def construct(self, args: tuple, kwargs: dict) -> None:
        """The creation task: the constructor, then the calls that queued behind it."""
        if self.dead is not None:  # killed before its process was up
            return
        token = _current.set(self)
        try:
            a, k = _resolved(args, kwargs)
            self.instance = self.cls(*a, **k)
        except Exception as e:  # Ray: the creation task failed, the actor is dead
            _die(self, f"its constructor raised {type(e).__name__}: {e}", e)
            return
        finally:
            _current.reset(token)
        self.born = True
        waiting, self.unborn_calls = self.unborn_calls, []
        for ref, name, args_, kwargs_ in waiting:
            self._dispatch(name, args_, kwargs_, ref)

    def call(self, name: str, args: tuple, kwargs: dict) -> ObjectRef:
        label = f"{self.cls.__name__}.{name}"
        if self.dead is not None:
            return _done_ref(label, error=self.died_error(label))
        if not self.born:
            if name != "__ray_ready__" and not inspect.iscoroutinefunction(getattr(self.cls, name)):
                _check_args_done(label, args, kwargs)  # refused where it is made, as for a born actor
            ref = ObjectRef(label)
            self.unborn_calls.append((ref, name, args, kwargs))
            return ref
        return self._dispatch(name, args, kwargs, None)

    def call_into(self, name: str, args: tuple, kwargs: dict, ref: ObjectRef) -> None:
        """``call`` with the ref made by a caller on another thread (real time)."""
        if self.dead is not None or self.born:
            self._dispatch(name, args, kwargs, ref)
        else:
            self.unborn_calls.append((ref, name, args, kwargs))

    def _dispatch(self, name: str, args: tuple, kwargs: dict, ref: ObjectRef | None) -> ObjectRef:
        label = f"{self.cls.__name__}.{name}"
        if self.dead is not None:
            error = self.died_error(label)
            if ref is None:
                return _done_ref(label, error=error)
            ref._resolve(error=error)
            return ref
        if name == "__ray_ready__":
            if ref is None:
                return _done_ref(label, True)
            ref._resolve(True)
            return ref
        fn = getattr(self.instance, name)
        if inspect.iscoroutinefunction(fn):
            return _spawn(self, fn, args, kwargs, label, ref)
        _check_args_done(label, args, kwargs)
        ref = ObjectRef(label) if ref is None else ref
        if self.thread is not None:
            return self._on_thread(ref, fn, args, kwargs)
        # Plain calls run one at a time (an async actor's too: Ray runs them on its loop's one thread).
        self.queue.append((ref, functools.partial(_run_now, self, ref, fn, args, kwargs)))
        if not self.busy:
            self.busy = True
            try:
                while self.queue:
                    self.queue.popleft()[1]()
            finally:
                self.busy = False
        return ref

    def _on_thread(self, ref: ObjectRef, fn: Callable[..., Any], args: tuple, kwargs: dict) -> ObjectRef:
        """Real time: the call runs on the actor's thread, after the ones submitted before
        it; its ref is resolved on the home loop."""
        home = _state.home
        assert home is not None and self.thread is not None

        def finish(value: Any, error: BaseException | None) -> None:
            self.on_thread.pop(ref, None)
            if self.dead is not None:
                ref._resolve(error=self.died_error(ref._label))
            else:
                ref._resolve(value, error)

        def work() -> None:
            if self.dead is not None:
                home.call_soon_threadsafe(finish, None, None)
                return
            home.call_soon_threadsafe(finish, *_call_as(self, fn, args, kwargs))

        self.on_thread[ref] = None
        self.thread.submit(work)
        return ref


class _Births:
    """The constructors waiting for their processes on one loop, in creation order. One
    probe on the loop runs the first once nothing else is ready at the current instant: it
    steps to the back of the ready queue while anything is ahead of it (so it never holds
    the virtual clock back, and never reorders what it waits behind), then runs one
    constructor and, if more wait, waits again."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: deque[tuple[_Actor, tuple, dict]] = deque()
        self.probing = False

    def add(self, actor: _Actor, args: tuple, kwargs: dict) -> None:
        self.waiting.append((actor, args, kwargs))
        if not self.probing:
            self.probing = True
            self.loop.call_soon(self.probe)

    def probe(self) -> None:
        if self.loop._ready:  # type: ignore[attr-defined]
            self.loop.call_soon(self.probe)
            return
        actor, args, kwargs = self.waiting.popleft()
        if self.waiting:
            self.loop.call_soon(self.probe)
        else:
            self.probing = False
        actor.construct(args, kwargs)


def _die(actor: _Actor, cause: str, error: BaseException | None = None) -> None:
    if actor.dead is not None:
        return
    actor.dead, actor.dead_from, actor.instance = cause, error, None
    _give_back(actor.grant)
    if actor in _state.actors:  # not an actor of a state that reset() has since replaced
        _state.actors.remove(actor)
    for key in [k for k, h in _state.named.items() if h is actor.handle]:
        del _state.named[key]
    while actor.queue:
        ref = actor.queue.popleft()[0]
        ref._resolve(error=actor.died_error(ref._label))
    unborn, actor.unborn_calls = actor.unborn_calls, []
    for ref, *_ in unborn:
        ref._resolve(error=actor.died_error(ref._label))
    for ref, task in list(actor.inflight.items()):
        ref._resolve(error=actor.died_error(ref._label))
        task.cancel()
    actor.inflight.clear()
    for task in list(actor.started):  # its process is gone, and its own tasks with it
        task.cancel()
    if actor.thread is not None:  # the call running there finishes unheard; the rest never run
        actor.thread.shutdown(wait=False, cancel_futures=True)
    for ref in list(actor.on_thread):
        ref._resolve(error=actor.died_error(ref._label))
    actor.on_thread.clear()


class ActorHandle:
    """A handle of one actor; ``handle.method.remote(...)`` calls it."""

    __slots__ = ("_vray_actor",)

    def __init__(self, actor: _Actor) -> None:
        self._vray_actor = actor

    def __getattr__(self, name: str) -> ActorMethod:
        if name == "_vray_actor":
            raise AttributeError(name)
        actor = self._vray_actor
        if name == "__ray_ready__" or (not name.startswith("__") and callable(getattr(actor.cls, name, None))):
            return ActorMethod(actor, name, {})
        # a class that fakes one of upstream's actors names what it lacks in its own terms (leaves._Leaf)
        missing = getattr(actor.cls, "vray_missing_method", None)
        if missing is not None and not name.startswith("__"):
            raise missing(name, sys._getframe(1))
        raise AttributeError(f"actor class {actor.cls.__name__!r} has no method {name!r}")

    def __repr__(self) -> str:
        return f"ActorHandle({self._vray_actor.cls.__name__}, {self._vray_actor.id})"

    def __copy__(self) -> ActorHandle:
        return self

    def __deepcopy__(self, memo: Any) -> ActorHandle:
        return self


class ActorMethod:
    def __init__(self, actor: _Actor, name: str, options: dict[str, Any]) -> None:
        self._actor, self._name, self._options = actor, name, options

    def remote(self, *args: Any, **kwargs: Any) -> ObjectRef:
        if _foreign_thread():  # real time: the call is handed to the home loop, as to Ray's transport
            assert _state.home is not None
            ref = ObjectRef(f"{self._actor.cls.__name__}.{self._name}")
            _state.home.call_soon_threadsafe(self._actor.call_into, self._name, args, kwargs, ref)
            return ref
        return self._actor.call(self._name, args, kwargs)

    def options(self, **options: Any) -> ActorMethod:
        _check_options(options, _METHOD_OPTIONS, f"actor method {self._name}")
        return ActorMethod(self._actor, self._name, {**self._options, **options})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"Actor methods cannot be called directly: use {self._name}.remote()")


class ActorClass:
    def __init__(self, cls: type, options: dict[str, Any]) -> None:
        self._cls, self._options = cls, _check_options(options, _ACTOR_OPTIONS, f"actor class {cls.__name__}")

    def options(self, **options: Any) -> ActorClass:
        return ActorClass(self._cls, {**self._options, **options})

    def remote(self, *args: Any, **kwargs: Any) -> ActorHandle:
        return _create_actor(self._cls, self._options, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"Actors cannot be instantiated directly: use {self._cls.__name__}.remote()")


class RemoteFunction:
    def __init__(self, fn: Callable[..., Any], options: dict[str, Any]) -> None:
        self._fn, self._options = fn, _check_options(options, _TASK_OPTIONS, f"remote function {fn.__qualname__}")

    def options(self, **options: Any) -> RemoteFunction:
        return RemoteFunction(self._fn, {**self._options, **options})

    def remote(self, *args: Any, **kwargs: Any) -> ObjectRef:
        _refuse_foreign(f"{self._fn.__qualname__}.remote()")
        _state.initialized = True
        if inspect.iscoroutinefunction(self._fn):
            return _spawn(None, self._fn, args, kwargs, self._fn.__qualname__)
        _check_args_done(self._fn.__qualname__, args, kwargs)
        ref = ObjectRef(self._fn.__qualname__)
        _run_now(None, ref, self._fn, args, kwargs)
        return ref

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"Remote functions cannot be called directly: use {self._fn.__qualname__}.remote()")


def remote(*args: Any, **options: Any) -> Any:
    """``@remote``, ``@remote(**options)`` or ``remote(**options)(target)``."""
    if len(args) == 1 and not options and callable(args[0]):
        return _make_remote(args[0], {})
    if args:
        raise TypeError("@ray.remote takes either no arguments (no parentheses) or keyword options only")
    _check_options(options, _ACTOR_OPTIONS | _TASK_OPTIONS, "ray.remote")
    return lambda target: _make_remote(target, options)


def _make_remote(target: Any, options: dict[str, Any]) -> ActorClass | RemoteFunction:
    return ActorClass(target, options) if inspect.isclass(target) else RemoteFunction(target, options)


def method(*args: Any, **options: Any) -> Any:
    """``@ray.method(...)``: options are checked and recorded on the function, nothing else."""
    _check_options(options, _METHOD_OPTIONS, "ray.method")

    def record(fn: Any) -> Any:
        fn.__ray_method_options__ = options
        return fn

    return record(args[0]) if len(args) == 1 and callable(args[0]) else record


@dataclass
class PlacementGroupSchedulingStrategy:
    placement_group: PlacementGroup
    placement_group_bundle_index: int = -1
    placement_group_capture_child_tasks: bool | None = None


@dataclass
class NodeAffinitySchedulingStrategy:
    node_id: str
    soft: bool
    _spill_on_unavailable: bool = False
    _fail_on_unavailable: bool = False


class PlacementGroup:
    def __init__(self, bundles: list[dict[str, float]], strategy: str, name: str, grants: list[_Grant]) -> None:
        self.id = f"{_state.new_id():036x}"
        self.bundle_specs = [dict(b) for b in bundles]
        self.bundle_count, self.strategy, self.name = len(bundles), strategy, name
        self._grants = grants
        self._pools = [
            _Pool(f"bundle {i} of placement group {self.id}", dict(g.amounts), dict(g.gpus))
            for i, g in enumerate(grants)
        ]
        self._removed = False

    def ready(self) -> ObjectRef:
        return _done_ref(f"placement group {self.id} ready", self)

    def wait(self, timeout_seconds: float = 30) -> bool:
        return not self._removed

    def __repr__(self) -> str:
        return f"PlacementGroup({self.id}, {self.bundle_specs})"


_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def placement_group(
    bundles: list[dict[str, float]], strategy: str = "PACK", name: str = "", lifetime: str | None = None
) -> PlacementGroup:
    """Reserve the bundles now, all or none; if they do not fit, raise ``VRayUnschedulable``."""
    _state.initialized = True
    if not isinstance(bundles, list) or not bundles or not all(isinstance(b, dict) and b for b in bundles):
        raise ValueError(f"placement_group: bundles must be a non-empty list of non-empty dicts, got {bundles!r}")
    if any(v < 0 for b in bundles for v in b.values()) or any(not any(b.values()) for b in bundles):
        raise ValueError(f"placement_group: a bundle has only zero or negative resources: {bundles!r}")
    if strategy not in _STRATEGIES:
        raise ValueError(f"placement_group: strategy {strategy!r}; Ray's are {', '.join(_STRATEGIES)}")
    asked = {k: round(sum(b.get(k, 0) for b in bundles), 4) for b in bundles for k in b}
    free = _state.pool.describe()
    what = f"placement_group({bundles}, strategy={strategy!r}) at {_caller()} asks {asked}"
    if strategy == "STRICT_SPREAD" and len(bundles) > 1:
        raise VRayUnschedulable(
            f"{what} on one node per bundle, and the cluster has one node: Ray would leave it "
            "pending forever (pg.ready() never resolves)"
        )
    grants: list[_Grant] = []
    for i, bundle in enumerate(bundles):
        custom = {k: v for k, v in bundle.items() if k not in ("GPU", "CPU")}
        ask = _ask({"num_gpus": bundle.get("GPU"), "num_cpus": bundle.get("CPU"), "resources": custom}, f"bundle {i}")
        grant = _take(_state.pool, ask)
        if grant is None:
            for g in grants:
                _give_back(g)
            raise VRayUnschedulable(
                f"{what} (bundle {i} does not fit), the node has {free} free: Ray would leave "
                "it pending forever (pg.ready() never resolves)"
            )
        grants.append(grant)
    pg = PlacementGroup(bundles, strategy, name, grants)
    _state.pgs.append(pg)
    return pg


def remove_placement_group(pg: PlacementGroup) -> None:
    """Free its bundles; as in Ray, the actors placed in it are killed."""
    if pg._removed:
        return
    for actor in [a for a in _state.actors if a.grant.pool in pg._pools]:
        _die(actor, f"its placement group {pg.id} was removed")
    for grant in pg._grants:
        _give_back(grant)
    pg._removed = True
    _state.pgs.remove(pg)


def _refuse_foreign(what: str) -> None:
    if _foreign_thread():
        raise VRayError(
            f"{what} at {_caller()} from a thread other than the loop's: vray's real-time host hands "
            "actor method calls across threads, not actor creation or remote functions"
        )


def _create_actor(cls: type, options: dict[str, Any], args: tuple, kwargs: dict) -> ActorHandle:
    _refuse_foreign(f"{cls.__name__}.remote()")
    _state.initialized = True
    name, namespace = options.get("name"), options.get("namespace") or _state.namespace
    if name and (existing := _state.named.get((namespace, name))) is not None:
        if options.get("get_if_exists"):
            return existing
        raise ValueError(f"The name {name} (namespace={namespace!r}) is already taken by {existing!r}")
    ask = _ask(options, f"{cls.__name__}.remote()")
    pools, where = [_state.pool], "the node"
    strategy = options.get("scheduling_strategy")
    if isinstance(strategy, PlacementGroupSchedulingStrategy):
        pg, index = strategy.placement_group, strategy.placement_group_bundle_index
        if pg._removed:
            raise VRayUnschedulable(f"{cls.__name__}.remote(): placement group {pg.id} was removed")
        if not -1 <= index < pg.bundle_count:
            raise ValueError(f"placement_group_bundle_index {index} is out of range: the group has {pg.bundle_count}")
        pools = pg._pools if index == -1 else [pg._pools[index]]  # -1: any bundle (Ray)
        where = f"placement group {pg.id}" if index == -1 else pools[0].label
    elif isinstance(strategy, NodeAffinitySchedulingStrategy):
        if strategy.node_id != _state.cluster.node_id and not strategy.soft:
            raise VRayUnschedulable(f"{cls.__name__}.remote(): no node {strategy.node_id!r} (hard node affinity)")
    elif strategy not in (None, "DEFAULT", "SPREAD"):
        raise ValueError(f"{cls.__name__}.remote(): unknown scheduling_strategy {strategy!r}")
    grant = next((g for p in pools if (g := _take(p, ask)) is not None), None)
    if grant is None:
        left = pools[0].describe() if len(pools) == 1 else [p.describe() for p in pools]
        raise VRayUnschedulable(
            f"{cls.__name__}.remote() at {_caller()} asks {ask} of {where}, which has {left} "
            "left: Ray would leave the actor pending forever"
        )
    actor = _Actor(cls, options, grant)
    _state.actors.append(actor)
    if name:
        _state.named[(namespace, name)] = actor.handle
    loop = _running_loop()
    if loop is None:
        actor.construct(args, kwargs)
    else:
        _state.births_on(loop).add(actor, args, kwargs)
    return actor.handle


def kill_actor(handle: ActorHandle, cause: str = "killed by the harness") -> None:
    """Fault injection: the actor dies now (see the module docstring)."""
    if not isinstance(handle, ActorHandle):
        raise TypeError(f"kill_actor takes an ActorHandle, got {handle!r}")
    _die(handle._vray_actor, cause)


def kill(actor: ActorHandle, *, no_restart: bool = True) -> None:
    kill_actor(actor, "killed by ray.kill")


def get_actor(name: str, namespace: str | None = None) -> ActorHandle:
    handle = _state.named.get((namespace or _state.namespace, name))
    if handle is None:
        raise ValueError(f"Failed to look up actor with name {name!r} (namespace={namespace!r}): none is alive")
    return handle


def _blocked(what: str, refs: list[ObjectRef]) -> VRayBlockingGet:
    where = "inside the running loop" if _running_loop() else "with no loop that could finish it"
    return VRayBlockingGet(
        f"{what} at {_caller()} waits for {refs[0]!r}, not done, {where}: blocking on one thread "
        "would deadlock this host; await the ref instead"
    )


def _noop() -> None:
    return None


def _block_until_done(what: str, refs: list[ObjectRef], count: int | None = None, timeout: float | None = None) -> None:
    """A blocking ``ray.get`` from code running in a task of the loop (a driver's or an
    actor's synchronous call): as Ray's caller thread blocks while the work goes on
    elsewhere, the loop is stepped here, the calling task set aside, until ``count`` of the
    refs (default: every one) are done, or, in real time, ``timeout`` seconds have passed.
    Nothing can step the calling task meanwhile (it is running, not awaiting). A ref that
    cannot finish (it waits on the caller, or on nothing) is ``VRayBlockingGet``."""
    loop = _running_loop()
    if loop is None:
        raise _blocked(what, refs)
    want = len(refs) if count is None else count
    me = asyncio.current_task(loop)
    ready = loop._ready  # type: ignore[attr-defined]
    # the iteration that runs this call pops a count of handles fixed when it began: what the
    # nested steps run of them is made up with no-ops, so it never pops an empty queue
    expected = len(ready)
    deadline = None if timeout is None else loop.time() + timeout
    wake = None if deadline is None else loop.call_at(deadline, _noop)  # so the step's select returns by then
    if me is not None:
        asyncio.tasks._leave_task(loop, me)
    try:
        while sum(r._done for r in refs) < want and (deadline is None or loop.time() < deadline):
            try:
                loop._run_once()  # type: ignore[attr-defined]
            except RuntimeError as exc:  # the virtual clock found nothing left to run
                raise _blocked(what, [r for r in refs if not r._done]) from exc
    finally:
        if wake is not None:
            wake.cancel()
        if me is not None:
            asyncio.tasks._enter_task(loop, me)
        for _ in range(expected - len(ready)):
            loop.call_soon(_noop)


def _wait_real_time(what: str, refs: list[ObjectRef], count: int, timeout: float | None) -> None:
    """Real time: block the caller until ``count`` of ``refs`` are done or ``timeout``
    seconds have passed: a thread off the home loop waits (its calls are the loop's to
    run), the home loop's own thread steps the loop (``_block_until_done``)."""
    if not _foreign_thread():
        _block_until_done(what, refs, count, timeout)
        return
    event = threading.Event()
    for r in refs:
        r._wake(event)
    deadline = None if timeout is None else time.monotonic() + timeout
    while sum(r._done for r in refs) < count:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return
        event.wait(left)
        event.clear()


def get(object_refs: ObjectRef | list[ObjectRef], *, timeout: float | None = None) -> Any:
    refs = [object_refs] if isinstance(object_refs, ObjectRef) else object_refs
    if not isinstance(refs, list) or not all(isinstance(r, ObjectRef) for r in refs):
        raise ValueError(f"ray.get takes an ObjectRef or a list of ObjectRefs, got {object_refs!r}")
    if (pending := [r for r in refs if not r._done]) and _state.real_time:
        _wait_real_time("ray.get", pending, len(pending), timeout)  # the caller blocks, as Ray's does
        if pending := [r for r in pending if not r._done]:
            raise GetTimeoutError(f"ray.get timed out after {timeout} s waiting for {pending[0]!r}")
    if pending:
        if timeout is not None:
            raise GetTimeoutError(f"ray.get timed out after {timeout} s waiting for {pending[0]!r}")
        _block_until_done("ray.get", pending)
    values = [r._result() for r in refs]
    return values[0] if isinstance(object_refs, ObjectRef) else values


def wait(
    object_refs: list[ObjectRef], *, num_returns: int = 1, timeout: float | None = None, fetch_local: bool = True
) -> tuple[list[ObjectRef], list[ObjectRef]]:
    if not isinstance(object_refs, list):
        raise TypeError(f"ray.wait takes a list of ObjectRefs, got {object_refs!r}")
    if not 0 < num_returns <= len(object_refs):
        raise ValueError(f"ray.wait: num_returns={num_returns} for {len(object_refs)} refs")
    if _state.real_time and sum(r._done for r in object_refs) < num_returns:
        _wait_real_time("ray.wait", object_refs, num_returns, timeout)
    ready = [r for r in object_refs if r._done][:num_returns]
    if len(ready) < num_returns and timeout is None:
        raise _blocked("ray.wait", [r for r in object_refs if not r._done])
    return ready, [r for r in object_refs if all(r is not x for x in ready)]


def put(value: Any) -> ObjectRef:
    return _done_ref("put", value)


def get_gpu_ids() -> list[int]:
    """The GPU ids the current actor was granted; [] outside an actor, as in Ray's driver."""
    actor = _current.get()
    return sorted(actor.grant.gpus) if actor is not None else []


def get_node_ip_address() -> str:
    return _state.cluster.node_ip


class RuntimeContext:
    def get_node_id(self) -> str:
        return _state.cluster.node_id

    def get_actor_id(self) -> str | None:
        actor = _current.get()
        return actor.id if actor is not None else None

    @property
    def current_actor(self) -> ActorHandle:
        actor = _current.get()
        if actor is None:
            raise RuntimeError("current_actor is only available in an actor")
        return actor.handle


def get_runtime_context() -> RuntimeContext:
    return RuntimeContext()


def nodes() -> list[dict[str, Any]]:
    c = _state.cluster
    names = {"NodeManagerAddress": c.node_ip, "NodeManagerHostname": c.node_ip, "NodeName": c.node_ip}
    return [{"NodeID": c.node_id, "Alive": True, "alive": True, **names, "Resources": c.totals()}]


@dataclass(frozen=True)
class NodeState:
    node_id: str
    node_ip: str
    is_head_node: bool
    state: str
    node_name: str
    resources_total: dict[str, float]


def list_nodes(*, filters: list[tuple[str, str, Any]] | None = None, **_: Any) -> list[NodeState]:
    c = _state.cluster
    found = [NodeState(c.node_id, c.node_ip, True, "ALIVE", c.node_ip, c.totals())]
    return [n for n in found if all((getattr(n, k) == v) == (op == "=") for k, op, v in filters or [])]


def is_initialized() -> bool:
    return _state.initialized


def init(
    address: str | None = None, *, namespace: str | None = None, ignore_reinit_error: bool = False, **kw: Any
) -> None:
    """Ray's ``init``; ``num_gpus``, ``num_cpus``, ``resources`` reshape the node (only while
    nothing is placed); Ray's other arguments are ignored."""
    if _state.initialized and not ignore_reinit_error:
        raise RuntimeError("Maybe you called ray.init twice by accident? (ignore_reinit_error=True allows it)")
    shape = {k: kw[k] for k in ("num_gpus", "num_cpus", "resources") if kw.get(k) is not None}
    if shape:
        if _state.actors or _state.pgs:
            raise VRayError("vray.init: the node cannot be reshaped while actors or placement groups exist")
        c = _state.cluster
        reset(
            real_time=_state.real_time,
            **{"num_gpus": c.num_gpus, "num_cpus": c.num_cpus, "resources": c.resources, "node_ip": c.node_ip, **shape},
        )
    _state.initialized = True
    _state.namespace = namespace or _state.namespace


def shutdown() -> None:
    """Ray's ``shutdown``: every actor dies, every placement group is removed."""
    for actor in list(_state.actors):
        _die(actor, "ray.shutdown")
    for pg in list(_state.pgs):
        remove_placement_group(pg)
    _state.initialized, _state.namespace = False, ""


def reset(
    num_gpus: int = DEFAULT_NUM_GPUS, num_cpus: float = DEFAULT_NUM_CPUS, *, real_time: bool = False, **cluster: Any
) -> Cluster:
    """Forget every actor, name and placement group, and start a fresh node (``Cluster``'s
    fields); ``real_time``: the host of the module docstring's real-time mode. Tasks of a
    finished run belong to its loop: nothing is cancelled here; a sync actor's thread of
    the forgotten state ends once its queued calls have run."""
    global _state
    for actor in _state.actors:
        if actor.thread is not None:
            actor.thread.shutdown(wait=False)
    _state = _State(Cluster(num_gpus, num_cpus, **cluster), real_time=real_time)
    return _state.cluster


def cluster() -> Cluster:
    return _state.cluster


@dataclass(frozen=True)
class ActorInfo:
    handle: ActorHandle
    class_name: str
    name: str | None
    options: dict[str, Any]
    placement: str
    gpu_ids: list[int]


def actors() -> list[ActorInfo]:
    """The live actors, in creation order."""
    return [
        ActorInfo(
            a.handle, a.cls.__name__, a.options.get("name"), dict(a.options), a.grant.pool.label, sorted(a.grant.gpus)
        )
        for a in _state.actors
    ]


def task_owner(task: Any) -> str | None:
    """The class of the live actor whose process ``task`` is the work of, or ``None``: the
    driver's own. A call in flight is its caller's (a call the driver made and has not
    awaited is the driver's loose end, whichever actor runs it); a task an actor started
    itself (``_own_tasks``) is that actor's."""
    for a in _state.actors:
        for ref, t in a.inflight.items():
            if t is task:
                return None if ref._caller is None else ref._caller.cls.__name__
    return next((a.cls.__name__ for a in _state.actors if task in a.started), None)


def free(object_refs: list[ObjectRef], local_only: bool = False) -> None:
    """Nothing to free: vray has no object store."""


# What each module installed under Ray's names exports (names of this module's objects).
_EXPORTS = {
    "ray": "remote method get wait put kill get_actor get_gpu_ids get_runtime_context nodes init shutdown "
    "is_initialized ObjectRef",
    "ray.actor": "ActorHandle ActorClass ActorMethod",
    "ray.exceptions": "RayError RayActorError ActorDiedError RayTaskError TaskCancelledError GetTimeoutError",
    "ray.util": "placement_group remove_placement_group get_node_ip_address",
    "ray.util.placement_group": "PlacementGroup placement_group remove_placement_group",
    "ray.util.scheduling_strategies": "PlacementGroupSchedulingStrategy NodeAffinitySchedulingStrategy",
    "ray.util.state": "list_nodes",
    "ray._private": "",
    "ray._private.services": "get_node_ip_address",
    "ray._private.internal_api": "free",
}


def modules() -> dict[str, types.ModuleType]:
    """The module objects to install in ``sys.modules`` under Ray's names, fresh each call."""
    mods = {name: types.ModuleType(name, f"vray's {name} (harness.upstream.vray)") for name in _EXPORTS}
    for name, m in mods.items():
        m.__dict__.update({n: globals()[n] for n in _EXPORTS[name].split()})
        if any(other.startswith(name + ".") for other in mods):
            m.__path__ = []  # a package: a submodule vray lacks fails to import as "No module named ..."
        parent, _, child = name.rpartition(".")
        # As in Ray, ``ray.util.placement_group`` stays the function (the module is in sys.modules only).
        if parent and not hasattr(mods[parent], child):
            setattr(mods[parent], child, m)
    mods["ray"].__dict__["__version__"] = "2.40.0"  # the floor pyproject.toml names, for code that checks the version
    return mods


@contextlib.contextmanager
def installed(extra: dict[str, types.ModuleType] | None = None) -> Iterator[None]:
    """vray's modules (``modules()``) and ``extra`` in ``sys.modules`` for the block; what
    was there before is put back after (the real ``ray``, or nothing)."""
    mods = {**modules(), **(extra or {})}
    before = {name: sys.modules.get(name) for name in mods}
    sys.modules.update(mods)
    try:
        yield
    finally:
        for name, mod in before.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
