"""A progress watchdog for virtual-time runs: a run that stops making progress ends in
seconds with a report, instead of spinning until an outer timeout kills it.

On virtual time a hang is not a quiet process: a loop that waits with a timeout and
retries (upstream's fully-async drain waits 30 s at a time for a group, warning each
time, ``miles/rollout/fully_async_rollout.py:L140-L159``) jumps the clock from timer to
timer at full CPU speed, forever. The watchdog, checked by the loop
(``harness.sim.vtime.VirtualTimeLoop``) every ``WATCHDOG_STRIDE`` iterations, stops the run and raises
``WatchdogTripped`` when

* ``hang``: virtual time went on for ``hang_after_s`` with no progress (no trace event;
  a run without a trace counts engine requests and decode steps), or the loop ran
  ``MAX_QUIET_ITERATIONS`` iterations at one virtual instant with no progress;
* ``runaway``: the trace passed ``max_events`` events, or ``max_events_per_step`` events
  with no training step (a retry loop that never feeds the trainer), the process's resident memory
  grew by more than ``max_rss_growth_mb`` since the run started, or more than
  ``max_tasks`` asyncio tasks were alive at once (an endless retry loop).

The limits come from the scenario (its ``[watchdog]`` table, ``WatchdogLimits``); a
limit left unset is derived from the scenario's own scale (``resolve``): the bound on
quiet virtual time is 20 times the longest quiet stretch a healthy run can have (a
training step, plus a generation of the longest response with the engine full, plus a
weight sync), at least 300 s; the event budget is 500 events per sample the run
trains (a healthy run records about 15: the differential's matrix at most 15.3), at
least 50,000; between two training steps, 1,000 events per sample of a batch (the
matrix's healthy runs at most 33.8), at least 10,000.

``WatchdogTripped.report`` is readable text: why it tripped, the last events of the
trace, and the stack of every pending task.
"""

from __future__ import annotations

import asyncio
import io
import json
import linecache
import os
import resource
from dataclasses import dataclass
from typing import Any, Callable

MAX_QUIET_ITERATIONS = 2_000_000  # loop iterations at one virtual instant with no progress
WATCHDOG_STRIDE = 64  # the loop calls check() every this many iterations
CHECK_EVERY = 4096  # iterations between checks of the budgets (events, memory, tasks)
LAST_EVENTS = 20
STACK_FRAMES = 12


class WatchdogTripped(Exception):
    """A virtual-time run stopped making progress (``kind`` ``hang``) or outgrew its budget
    (``runaway``); ``report`` holds the last events and every pending task's stack."""

    def __init__(self, kind: str, reason: str, report: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason
        self.report = report


@dataclass(frozen=True, kw_only=True)
class WatchdogLimits:
    """A scenario's ``[watchdog]`` table; ``None`` = derived from the scenario (``resolve``)."""

    hang_after_s: float | None = None
    max_events: int | None = None
    max_events_per_step: int | None = None
    max_rss_growth_mb: float = 2048.0
    max_tasks: int | None = None

    def __post_init__(self) -> None:
        for name in ("hang_after_s", "max_events", "max_events_per_step", "max_rss_growth_mb", "max_tasks"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(
                    f"watchdog.{name} = {value!r}: must be > 0; fix: give a positive number, or leave "
                    "it out to derive it from the scenario"
                )


def quiet_stretch_s(scenario: Any) -> float:
    """The longest a healthy run of ``scenario`` goes without a trace event, about: one
    training step on a full batch, one generation of the longest response with the
    engine full, and a weight sync (on the simulated backends, part of the step)."""
    cfg, eng, tr = scenario.config, scenario.engine, scenario.trainer
    samples = cfg.rollout_batch_size * cfg.n_samples_per_prompt
    tokens = samples * (eng.prompt_tokens + scenario.max_new_tokens)
    train = tr.step_base_s + tr.per_token_s * tokens
    batch = min(eng.max_running, samples * 2)
    generate = (
        eng.prefill_base_s
        + eng.prefill_per_token_s * eng.prompt_tokens * batch
        + (eng.decode_base_s + eng.decode_per_seq_s * batch) * scenario.max_new_tokens
    )
    return train + generate


def resolve(limits: WatchdogLimits, scenario: Any) -> WatchdogLimits:
    """``limits`` with every unset bound derived from ``scenario``."""
    cfg = scenario.config
    samples = (cfg.num_rollout + 1) * cfg.rollout_batch_size * cfg.n_samples_per_prompt
    return WatchdogLimits(
        hang_after_s=limits.hang_after_s or max(300.0, 20.0 * quiet_stretch_s(scenario)),
        max_events=limits.max_events or max(50_000, 500 * samples),
        max_events_per_step=limits.max_events_per_step
        or max(10_000, 1_000 * cfg.rollout_batch_size * cfg.n_samples_per_prompt),
        max_rss_growth_mb=limits.max_rss_growth_mb,
        max_tasks=limits.max_tasks or max(10_000, 50 * cfg.rollout_batch_size * cfg.n_samples_per_prompt),
    )


def rss_mb() -> float:
    """Resident memory of this process now (``/proc/self/statm``), or its peak where there
    is no ``/proc`` (``getrusage``)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Watchdog:
    """Installed on a ``VirtualTimeLoop`` (``install``, from inside the run), which calls
    ``check(now)`` every ``WATCHDOG_STRIDE`` iterations. ``progress()`` counts what the run has done (trace
    events); ``events()`` returns the trace so far, for the budget and the report."""

    def __init__(
        self, limits: WatchdogLimits, *, progress: Callable[[], int], events: Callable[[], list] | None = None
    ) -> None:
        hang, max_events, per_step, max_tasks = (
            limits.hang_after_s,
            limits.max_events,
            limits.max_events_per_step,
            limits.max_tasks,
        )
        if hang is None or max_events is None or per_step is None or max_tasks is None:
            raise ValueError("Watchdog needs resolved limits: pass resolve(limits, scenario)")
        self._hang_after_s, self._max_events, self._max_events_per_step, self._max_tasks = (
            hang,
            max_events,
            per_step,
            max_tasks,
        )
        self.limits = limits
        self.progress = progress
        self.events = events
        self.loop: asyncio.AbstractEventLoop | None = None
        self._now = 0.0
        self._iterations = 0
        self._next_check = CHECK_EVERY
        self._last_progress = -1
        self._last_progress_t = 0.0
        self._last_progress_iteration = 0
        self._rss_start = rss_mb()
        self._scanned = 0  # trace events looked at for a training step
        self._last_trained = 0  # the trace's length at the last training step

    def check(self, now: float) -> None:
        self._iterations += WATCHDOG_STRIDE
        if now != self._now:
            self._now = now
            p = self.progress()
            if p != self._last_progress:
                self._last_progress, self._last_progress_t = p, now
                self._last_progress_iteration = self._iterations
            elif now - self._last_progress_t > self._hang_after_s:
                events = self.events() if self.events is not None else []
                since = f"the last trace event (t={events[-1].t:.3f}s)" if events else "the last progress"
                self._trip(
                    "hang",
                    f"virtual time is t={now:.3f}s, more than watchdog.hang_after_s = "
                    f"{self.limits.hang_after_s:g} s after {since}, and nothing happened since",
                )
        if self._iterations >= self._next_check:
            self._next_check = self._iterations + CHECK_EVERY
            self._check_budgets(now)

    def _check_budgets(self, now: float) -> None:
        p = self.progress()
        if p != self._last_progress:
            self._last_progress, self._last_progress_t = p, now
            self._last_progress_iteration = self._iterations
        elif self._iterations - self._last_progress_iteration > MAX_QUIET_ITERATIONS:
            self._trip(
                "hang",
                f"the loop ran {self._iterations - self._last_progress_iteration} iterations at "
                f"t={now:.3f}s with no trace event and no clock movement",
            )
        if self.events is not None:
            self._check_event_budgets(now, self.events())
        grown = rss_mb() - self._rss_start
        if grown > self.limits.max_rss_growth_mb:
            self._trip(
                "runaway",
                f"resident memory grew by {grown:.0f} MB by t={now:.3f}s (over "
                f"watchdog.max_rss_growth_mb = {self.limits.max_rss_growth_mb:g})",
            )
        if self.loop is not None:
            tasks = len(asyncio.all_tasks(self.loop))
            if tasks > self._max_tasks:
                self._trip(
                    "runaway",
                    f"{tasks} tasks alive at t={now:.3f}s (over watchdog.max_tasks = {self.limits.max_tasks})",
                )

    def _check_event_budgets(self, now: float, events: list[Any]) -> None:
        for i in range(self._scanned, len(events)):
            if events[i].kind == "trained":
                self._last_trained = i + 1
        self._scanned = len(events)
        if len(events) > self._max_events:
            self._trip(
                "runaway",
                f"{len(events)} trace events by t={now:.3f}s (over watchdog.max_events = {self.limits.max_events})",
            )
        if len(events) - self._last_trained > self._max_events_per_step:
            self._trip(
                "runaway",
                f"{len(events) - self._last_trained} trace events by t={now:.3f}s since the last "
                f"training step (over watchdog.max_events_per_step = "
                f"{self.limits.max_events_per_step}): work that never reaches the trainer",
            )

    def _trip(self, kind: str, reason: str) -> None:
        report = self.report(kind, reason)
        # re-armed from here: the cancellation that follows gets the same bounds
        self._last_progress_t, self._last_progress_iteration = self._now, self._iterations
        self.limits = WatchdogLimits(
            hang_after_s=self.limits.hang_after_s,
            max_events=1 << 62,
            max_events_per_step=1 << 62,
            max_rss_growth_mb=float("inf"),
            max_tasks=1 << 62,
        )
        raise WatchdogTripped(kind, reason, report)

    def report(self, kind: str, reason: str) -> str:
        out = io.StringIO()
        out.write(f"watchdog: {kind}: {reason}\n")
        events = self.events() if self.events is not None else []
        out.write(f"\nlast {min(LAST_EVENTS, len(events))} of {len(events)} trace events:\n")
        for e in events[-LAST_EVENTS:]:
            out.write(f"  {json.dumps(e.to_json(), sort_keys=True, default=str)}\n")
        tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()] if self.loop is not None else []
        out.write(f"\n{len(tasks)} pending tasks:\n")
        for t in sorted(tasks, key=_creation_order):
            out.write(format_task(t))
        return out.getvalue()


def format_task(task: asyncio.Task) -> str:
    """The task's name, then its await chain, outermost first: each coroutine's file, line,
    function and source line, down to the future it waits on."""
    text = repr(task)  # asyncio's repr names the future the task waits on
    waits = text[text.index(" wait_for=") + 10 :].rstrip(">") if " wait_for=" in text else "nothing (ready to run)"
    lines = [f"  {task.get_name()} ({_qualname(task.get_coro())}), waiting on {_short(waits)}:"]
    coro: Any = task.get_coro()
    for _ in range(STACK_FRAMES):
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        code = frame.f_code
        lines.append(f'    File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
        source = linecache.getline(code.co_filename, frame.f_lineno).strip()
        if source:
            lines.append(f"      {source}")
        nxt = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        if nxt is None or not (hasattr(nxt, "cr_frame") or hasattr(nxt, "gi_frame")):
            break
        coro = nxt
    return "\n".join(lines) + "\n"


def _qualname(coro: Any) -> str:
    return getattr(coro, "__qualname__", type(coro).__name__)


def _short(obj: Any) -> str:
    text = obj if isinstance(obj, str) else repr(obj)
    return text if len(text) <= 160 else text[:157] + "..."


def _creation_order(task: asyncio.Task) -> tuple[int, str]:
    name = task.get_name()
    suffix = name.rpartition("-")[2]
    return (int(suffix), name) if suffix.isdigit() else (-1, name)


def for_scenario(scenario: Any, *, sink: Any = None, engine: Any = None) -> Watchdog:
    """The watchdog of a run of ``scenario``: progress is the trace's length when ``sink``
    records one, else ``engine``'s request and decode-step counts."""
    limits = resolve(getattr(scenario, "watchdog", None) or WatchdogLimits(), scenario)
    if sink is not None and isinstance(getattr(sink, "events", None), list):
        return Watchdog(limits, progress=lambda: len(sink.events), events=lambda: sink.events)
    if engine is not None and hasattr(engine, "stats"):
        return Watchdog(limits, progress=lambda: engine.stats["requests"] + engine.stats["steps"])
    raise ValueError("a watchdog needs a progress count: a sink with a trace or an engine with stats")


def install(watchdog: Watchdog) -> Watchdog:
    """Put ``watchdog`` on the running ``VirtualTimeLoop``, from inside the run."""
    loop = asyncio.get_running_loop()
    watchdog.loop = loop
    loop.watchdog = watchdog  # type: ignore[attr-defined]
    return watchdog
