"""Runs that stop and resume, in virtual time: a run is a sequence of lives.

``run_lives(scenario, stops)`` runs the core's drivers on the simulated engine and trainer
(as ``harness.sim.run_scenario.simulate`` wires them), one life per stop and a last life
that runs to ``--num-rollout``. All lives share one checkpoint folder
(``miles_async_core.checkpoint.CheckpointDir``) and one trace: every event carries its
``life``, and time runs on from one life to the next.

A stop (``StopPoint``) ends a life:

* ``how="crash"``: the life dies right after the event that ``StopWatcher`` matches
  (``at`` names which: ``STOP_LABELS``). Every in-memory object is gone: nothing the dying
  process does later is recorded or written (``CheckpointDir.crashed``), so a crash at a
  model's ``checkpoint_saved`` leaves a half-written checkpoint.
* ``how="planned"``: the life saves at ``rollout_id`` (``--save-trigger-sentinel``) and exits
  after it (``--debug-exit-after-rollout``), as a planned restart does.

Each next life starts as Miles starts after a failure: ``--load`` from the checkpoint
folder, ``start_rollout_id`` from the checkpoint, the data source's ``load()``, the
engines serving the checkpoint's weights (``miles_async_core.drivers.common.start_life``).
Every life runs under the scenario's watchdog. Same scenario and stops -> the same trace.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from harness.measure.ages import AgeRecorder
from harness.sim.engine import SimEngine
from harness.sim.run_scenario import emit_run_end, sim_reward
from harness.sim.scenario import Scenario
from harness.sim.trainer import SimTrainer
from harness.sim.vtime import run_virtual
from harness.sim.watchdog import WatchdogTripped, for_scenario, install
from harness.trace import Event, TraceRecorder
from miles_async_core import events as ev
from miles_async_core.checkpoint import CheckpointDir
from miles_async_core.config import AsyncConfig
from miles_async_core.data_source import RolloutDataSourceWithBuffer
from miles_async_core.drivers import make_context, run
from miles_async_core.drivers.common import RunContext, start_life
from miles_async_core.errors import ConfigError
from miles_async_core.types import SamplingParams

# Where a crash can happen, relative to rollout ``rollout_id`` (StopWatcher says which event).
STOP_LABELS = (
    "save_boundary",
    "between_model_and_data_source",
    "mid_generation",
    "mid_drain",
    "during_pause",
    "mid_update",
    "mid_train",
    "planned_exit",
)


@dataclass(frozen=True)
class StopPoint:
    at: str  # one of STOP_LABELS
    rollout_id: int
    how: str = "crash"  # crash | planned (planned_exit)

    def __post_init__(self) -> None:
        if self.at not in STOP_LABELS:
            raise ConfigError(
                f"stop point at={self.at!r} is not one of {', '.join(STOP_LABELS)}. Fix: pass one of them"
            )
        if (self.how == "planned") != (self.at == "planned_exit") or self.how not in ("crash", "planned"):
            raise ConfigError(
                f"stop point how={self.how!r} at={self.at!r}: a planned stop is at planned_exit, "
                "every other stop is a crash. Fix: pass how='planned' with at='planned_exit', else crash"
            )

    @property
    def label(self) -> str:
        return f"{self.at}@{self.rollout_id}"


class StopWatcher:
    """Matches the event a crash ``StopPoint`` stops right after, reading a trace as it is
    recorded (any host whose trace follows ``miles_async_core.events`` can use it):

    * ``save_boundary`` / ``between_model_and_data_source``: the data source's / the
      model's ``checkpoint_saved`` of ``rollout_id``;
    * ``mid_generation``: the ``max(1, B*n // 2)``-th ``finished`` after the rollout's
      ``generate_start`` (or, fully async, its ``drain_start``);
    * ``mid_drain``: the first ``got`` of the rollout's drain (fully async);
    * ``mid_train``: the rollout's ``trained`` (its step has begun);
    * ``during_pause`` / ``mid_update``: the first ``engine_pause`` / ``engine_version``
      after the rollout's ``trained``.
    """

    def __init__(self, stop: StopPoint, config: AsyncConfig) -> None:
        self.stop = stop
        self.half = max(1, config.rollout_batch_size * config.n_samples_per_prompt // 2)
        self.anchored = False
        self.count = 0

    def see(self, kind: str, fields: dict[str, Any]) -> bool:
        at, rid = self.stop.at, self.stop.rollout_id
        if at in ("save_boundary", "between_model_and_data_source"):
            part = "data_source" if at == "save_boundary" else "model"
            return kind == ev.CHECKPOINT_SAVED and fields.get("rollout_id") == rid and fields.get("part") == part
        if at == "mid_train":
            return kind == ev.TRAINED and fields.get("rollout_id") == rid
        anchor = {"mid_generation": (ev.GENERATE_START, ev.DRAIN_START), "mid_drain": (ev.DRAIN_START,)}.get(
            at, (ev.TRAINED,)
        )
        if not self.anchored:
            self.anchored = kind in anchor and fields.get("rollout_id") == rid
            return False
        target = {
            "mid_generation": ev.FINISHED,
            "mid_drain": ev.GOT,
            "during_pause": ev.ENGINE_PAUSE,
            "mid_update": ev.ENGINE_VERSION,
        }.get(at)
        if kind == target:
            self.count += 1
            return at != "mid_generation" or self.count >= self.half
        return False


class LifeSink:
    """One life's sink: stamps ``life`` on every event into the shared recorder and, once
    the stop event is recorded, ends the life at the next loop step (what the current step
    does synchronously still happens, as a process dies between instructions, not inside
    an engine's pause): records ``life_end``, marks the checkpoint folder crashed, stops the
    loop, and records nothing more."""

    enabled = True

    def __init__(
        self,
        recorder: TraceRecorder,
        life: int,
        watcher: StopWatcher | None,
        ckpt: CheckpointDir,
    ) -> None:
        self.recorder = recorder
        self.events = recorder.events  # the watchdog reads the trace so far
        self.life = life
        self.watcher = watcher
        self.ckpt = ckpt
        self.dead = False
        self.dying = False
        self.loop: asyncio.AbstractEventLoop | None = None

    def emit(self, kind: str, /, **fields: Any) -> None:
        if self.dead:
            return
        self.recorder.emit(kind, **{"life": self.life, **fields})
        if not self.dying and self.watcher is not None and self.watcher.see(kind, fields):
            self.dying = True
            assert self.loop is not None, "LifeSink.loop is set when the life's loop starts"
            self.loop.call_soon(self._crash)

    def _crash(self) -> None:
        assert self.watcher is not None
        self.recorder.emit(ev.LIFE_END, life=self.life, how="crash", at=self.watcher.stop.at)
        # the dying process's later work is neither recorded nor written
        self.dead = self.ckpt.crashed = True
        assert self.loop is not None
        self.loop.stop()


@dataclass
class LivesResult:
    scenario: Scenario
    stops: tuple[StopPoint, ...]
    events: list[Event]
    reached: list[bool]  # per stop: whether its life stopped there (else that life ran to its end)
    error: BaseException | None = None  # anything but the stops themselves: a watchdog trip, a failure


class DataSourceFactory(Protocol):
    """Makes a life's data source, as ``RolloutDataSourceWithBuffer(n, prompt_fn, sink=sink)``."""

    def __call__(self, n_samples_per_prompt: int, prompt_fn: Callable[[int], Any], /, *, sink: Any) -> Any: ...


def run_lives(
    scenario: Scenario,
    stops: Sequence[StopPoint],
    *,
    data_source_factory: DataSourceFactory | None = None,
    hooks: Callable[[RunContext], None] | None = None,
) -> LivesResult:
    """Run ``scenario`` as ``len(stops) + 1`` lives; see the module docstring.
    ``data_source_factory(n, prompt_fn, sink)`` and ``hooks(ctx)`` let suites swap in variants."""
    cfg = scenario.config
    if cfg.save_interval is None and not any(s.how == "planned" for s in stops):
        raise ConfigError(
            "run_lives: config.save_interval is None, so no life ever saves and every resume starts "
            "over. Fix: set save_interval (--save-interval) to 1 or more"
        )
    ckpt, clock = CheckpointDir(), {"offset": 0.0, "loop": None}
    recorder = TraceRecorder(lambda: clock["offset"] + clock["loop"].time())  # type: ignore[union-attr]
    reached: list[bool] = []
    for life, stop in enumerate([*stops, None]):
        ckpt.crashed = False
        sink, error = _life(scenario, life, stop, ckpt, recorder, clock, data_source_factory, hooks)
        if stop is not None:
            reached.append(sink.dead or stop.how == "planned" and _exited(recorder.events, life))
        if error is not None:
            return LivesResult(scenario, tuple(stops), recorder.events, reached, error)
        clock["offset"] = recorder.events[-1].t if recorder.events else clock["offset"]
    return LivesResult(scenario, tuple(stops), recorder.events, reached)


def _exited(events: list[Event], life: int) -> bool:
    return any(e.kind == ev.LIFE_END and e["life"] == life and e["how"] == "planned" for e in events)


def _life(
    scenario: Scenario,
    life: int,
    stop: StopPoint | None,
    ckpt: CheckpointDir,
    recorder: TraceRecorder,
    clock: dict[str, Any],
    data_source_factory: DataSourceFactory | None,
    hooks: Callable[[RunContext], None] | None,
) -> tuple[LifeSink, BaseException | None]:
    cfg = scenario.config
    crash = stop is not None and stop.how == "crash"
    sink = LifeSink(recorder, life, StopWatcher(stop, cfg) if crash and stop is not None else None, ckpt)
    prompt = [0] * scenario.engine.prompt_tokens
    # holds the context past the loop's end, so the loop cancels a fully-async worker still
    # running instead of the collector destroying it pending (as ``simulate`` holds it)
    holder: dict[str, RunContext] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        clock["loop"], sink.loop = loop, loop
        engine = SimEngine(scenario.engine, sink=sink)
        install(for_scenario(scenario, sink=sink, engine=engine))

        def prompt_fn(k: int) -> tuple[str, Any, int]:
            return (f"prompt-{k}", prompt, k)

        source = (data_source_factory or RolloutDataSourceWithBuffer)(cfg.n_samples_per_prompt, prompt_fn, sink=sink)
        source.track_sources, source.exactly_once = True, cfg.exactly_once_resume
        ctx = make_context(
            cfg,
            engine,
            SimTrainer(scenario.trainer),
            prompt_fn,
            sampling=SamplingParams(max_new_tokens=scenario.max_new_tokens),
            reward_fn=sim_reward(cfg.seed),
            sink=sink,
            observer=AgeRecorder(),
            data_source=source,
        )
        ctx.checkpoint = ckpt
        holder["ctx"] = ctx
        if hooks is not None:
            hooks(ctx)
        start_life(ctx, life)
        if stop is not None and stop.how == "planned":
            ctx.save_sentinel = lambda rid: rid == stop.rollout_id
            ctx.args = dataclasses.replace(
                ctx.args, debug_exit_after_rollout=stop.rollout_id - ctx.args.start_rollout_id + 1
            )
        await run(ctx)
        emit_run_end(ctx)
        planned = stop is not None and stop.how == "planned"
        sink.emit(
            ev.LIFE_END,
            life=life,
            how="planned" if planned else "completed",
            at=stop.at if planned and stop is not None else "num_rollout",
        )

    try:
        run_virtual(main())
    except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - a crash stops the loop; anything else is the result's error
        if not sink.dead or isinstance(exc, WatchdogTripped):
            return sink, exc
    return sink, None
