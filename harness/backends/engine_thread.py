"""What every driver of an ``EngineCore`` does between steps, defined once.

``EngineThread`` is the engine thread of the in-process drivers (``TorchEngine``, the
served ``EngineHost``): one background thread that owns the core and runs its
continuous-batching loop for an asyncio caller. Contract: commands posted from any
thread (``post``; ``call`` awaits one's result on the caller's loop) run on the engine
thread in the order posted and only between steps, so a pause or a weight load never
races a decode step. While no command waits and the owner's ``can_step()`` is False the
thread sleeps on its condition variable, calling ``on_idle()`` first; otherwise it runs
the owner's ``step()``, one iteration of the batch. An exception on the engine thread
ends it: it is kept in ``error`` and handed to ``on_error`` (the owners fail every waiter
with it), never swallowed.

``abort_all`` is SGLang's ``/abort_request`` with ``abort_all`` (what upstream's
``abort()`` posts after every one-step rollout, ``inference_rollout_train.py:L24-L33``),
applied to a core between steps by every driver (this thread, ``ProcessEngine``'s child,
the Ray actor's engine thread, the served host), so all of them record it alike.

``apply_command`` applies one command message of the out-of-process drivers
(``ProcessEngine``'s child, the Ray actor) to their core: ``("add", req_id, *args)``,
``("cancel", req_id)``, and ``(kind, call_id, ...)`` for ``pause`` / ``resume`` /
``abort``, which return ``("reply", call_id, result)``; the weight load, which moves the
weights differently in each, stays theirs. Results travel as ``pack_finished`` tuples.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any, Callable

from miles_async_core import events as ev


class EngineThread:
    """One engine thread: ``post`` / ``call`` commands, ``start`` / ``stop`` the thread."""

    def __init__(
        self,
        name: str,
        *,
        can_step: Callable[[], bool],
        step: Callable[[], None],
        on_error: Callable[[BaseException], None],
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self._can_step, self._step, self._on_error, self._on_idle = can_step, step, on_error, on_idle
        self._cond = threading.Condition()
        self._commands: collections.deque[Callable[[], Any]] = collections.deque()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    def start(self) -> None:
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread after the command or step it is in; commands still queued are not run."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def post(self, fn: Callable[[], Any]) -> None:
        with self._cond:
            self._commands.append(fn)
            self._cond.notify_all()

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine thread between steps; its result, or its exception
        raised here."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def command() -> None:
            try:
                result = fn()
            except BaseException as exc:  # re-raised in the awaiting caller
                loop.call_soon_threadsafe(set_exception, done, exc)
            else:
                loop.call_soon_threadsafe(set_result, done, result)

        self.post(command)
        return await done

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stop and not self._commands and not self._can_step():
                        if self._on_idle is not None:
                            self._on_idle()
                        self._cond.wait()
                    if self._stop:
                        return
                    commands = list(self._commands)
                    self._commands.clear()
                for command in commands:
                    command()
                if self._can_step():
                    self._step()
        except BaseException as exc:  # surfaced to every waiter, never swallowed
            self.error = exc
            self._on_error(exc)


def abort_all(core: Any, emit: Callable[..., None], finish: Callable[[list], None]) -> int:
    """SGLang's ``abort_request(abort_all=True)`` on ``core``, between steps; returns how
    many requests it ended.

    Every running and waiting request finishes now as ABORTED with its partial output
    (``core.pause("abort")``, SGLang keeps the output too), recorded as an abort pause:
    ``engine_pause(mode="abort")``, the core's ``aborted`` events, the results (``finish``
    hands them out, so they are seen inside the pause, as ``pause_generation("abort")``
    returns them), then ``engine_resume``, unless the engine was paused already: it stays
    paused, as SGLang's does. Nothing at all, not one event, when nothing is in flight.
    ``emit(kind, **fields)`` records an engine event."""
    if not core.has_work():
        return 0
    was_paused = core.paused
    emit(ev.ENGINE_PAUSE, mode="abort", in_flight=core.num_running() + core.num_waiting())
    aborted = core.pause("abort")
    finish(aborted)
    if not was_paused:
        core.resume()
        emit(ev.ENGINE_RESUME)
    return len(aborted)


def pack_finished(f: Any) -> tuple:
    """A ``FinishedRequest`` as a plain tuple, to cross a pipe or Ray."""
    return (f.req_id, f.output_tokens, f.log_probs, f.token_versions.to_json(), f.weight_version, f.status.value)


def apply_command(core: Any, msg: tuple, emit: Callable[..., None], finish: Callable[[list], None]) -> tuple | None:
    """Apply one command message to ``core`` between steps (module docstring); the reply
    to send, or ``None``. ``emit`` records an engine event, ``finish`` hands out results."""
    kind = msg[0]
    if kind == "add":
        core.add_request(*msg[1:])
        return None
    if kind == "cancel":
        core.cancel(msg[1])
        return None
    call_id = msg[1]
    if kind == "pause":
        emit(ev.ENGINE_PAUSE, mode=msg[2], in_flight=core.num_running() + core.num_waiting())
        return ("reply", call_id, [pack_finished(f) for f in core.pause(msg[2])])
    if kind == "resume":
        core.resume()
        emit(ev.ENGINE_RESUME)
        return ("reply", call_id, None)
    if kind == "abort":
        return ("reply", call_id, abort_all(core, emit, finish))
    raise ValueError(f"unknown engine command {kind!r}")


def set_result(fut: asyncio.Future, value: Any) -> None:
    """``fut.set_result(value)`` unless it is done already (cancelled by its waiter)."""
    if not fut.done():
        fut.set_result(value)


def set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    """``fut.set_exception(exc)`` unless it is done already."""
    if not fut.done():
        fut.set_exception(exc)
