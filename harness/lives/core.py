"""The core's host: each life runs the core's drivers on the simulated engine and trainer
in virtual time (as ``harness.sim.run_scenario.simulate`` wires them).

All lives of a run share one checkpoint folder (``miles_async_core.checkpoint.CheckpointDir``,
Miles' ``--save``/``--load``) and one trace recorder, whose clock runs on from one life to
the next. A life starts as Miles starts after a failure (``start_life``: the trainer's
state and steps, ``start_rollout_id`` and the data source's state from the checkpoint, the
engines serving the checkpoint's weights). A crash follows ``harness.lives.stops.Crash``:
at the loop's next step the sink records ``life_end``, marks the folder ``crashed`` (the
dead process's later writes never reach it) and stops the loop. ``mid_data_save`` dies
where ``between_saves`` does, inside the data source's write, which it leaves torn
(``TornState``): the next life's load of it raises, as upstream's ``torch.load`` does on a
half-written state file. A planned stop saves at
its rollout (``--save-trigger-sentinel``) and exits after it
(``--debug-exit-after-rollout``). Every life runs under the scenario's watchdog.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from harness.lives.run import LifeEnd
from harness.lives.stops import Crash, Stop, StopPoint
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
from miles_async_core.data_source import RolloutDataSourceWithBuffer
from miles_async_core.drivers import make_context, run
from miles_async_core.drivers.common import RunContext, start_life
from miles_async_core.types import SamplingParams


class DataSourceFactory(Protocol):
    """Makes a life's data source, as ``RolloutDataSourceWithBuffer(n, prompt_fn, sink=sink)``."""

    def __call__(self, n_samples_per_prompt: int, prompt_fn: Callable[[int], Any], /, *, sink: Any) -> Any: ...


class TornCheckpoint(RuntimeError):
    """A resumed life read a checkpoint part whose write a crash cut short."""


class TornState(dict):
    """The data source's part of rollout ``rollout_id``'s checkpoint, its write cut short by a
    crash (``mid_data_save``): reading it raises ``TornCheckpoint``, as upstream's
    ``torch.load`` raises on a half-written ``global_dataset_state_dict_<N>.pt``
    (``data_source.py:L150``). The checkpoint is not complete, so the exactly-once
    extension never loads it."""

    def __init__(self, rollout_id: int) -> None:
        super().__init__()
        self.rollout_id = rollout_id

    def get(self, key: str, default: Any = None) -> Any:
        raise TornCheckpoint(
            f"the data source's state of rollout {self.rollout_id} is half-written (a crash cut its write short) "
            "and does not load"
        )

    __getitem__ = get


class LifeSink:
    """One life's sink: stamps ``life`` on every event into the shared recorder and follows
    the crash rule; once the life is dead it records nothing more."""

    enabled = True

    def __init__(self, recorder: TraceRecorder, life: int, stop: StopPoint | None, config: Any, ckpt: CheckpointDir):
        self.recorder = recorder
        self.events = recorder.events  # the watchdog reads the trace so far
        self.life = life
        self.stop = stop
        self.ckpt = ckpt
        # inside the data source's write: where the first part's save ends (the core saves the model first)
        torn = stop is not None and stop.at is Stop.MID_DATA_SAVE
        self.crash = Crash(
            StopPoint(Stop.BETWEEN_SAVES, stop.rollout_id) if torn and stop else stop, config, self._crash
        )
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def dead(self) -> bool:
        return self.crash.dead

    def emit(self, kind: str, /, **fields: Any) -> None:
        if self.crash.dead:
            return
        self.recorder.emit(kind, **{"life": self.life, **fields})
        self.crash.see(kind, fields)

    def _crash(self) -> None:
        assert self.stop is not None and self.loop is not None
        self.recorder.emit(ev.LIFE_END, life=self.life, how="crash", at=self.stop.at.value)
        if self.stop.at is Stop.MID_DATA_SAVE:
            self.ckpt.data_sources[self.stop.rollout_id] = TornState(self.stop.rollout_id)
        self.ckpt.crashed = True  # the dying process's later work is neither recorded nor written
        self.loop.stop()


class CoreHost:
    """``LifeHost`` for the core. ``data_source_factory(n, prompt_fn, sink=...)`` and
    ``hooks(ctx)`` let suites swap in variants (the seeded resume bugs)."""

    name = "core"

    def __init__(
        self,
        *,
        data_source_factory: DataSourceFactory | None = None,
        hooks: Callable[[RunContext], None] | None = None,
    ) -> None:
        self.data_source_factory = data_source_factory
        self.hooks = hooks

    def refuses(self, scenario: Scenario, stops: Sequence[StopPoint]) -> str | None:
        return None  # the core runs every setting and makes every stop

    @contextmanager
    def lives(self, scenario: Scenario) -> Iterator[_CoreLives]:
        yield _CoreLives(self, scenario)


class _CoreLives:
    def __init__(self, host: CoreHost, scenario: Scenario) -> None:
        self.host, self.scenario = host, scenario
        self.ckpt = CheckpointDir()
        self.offset = 0.0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.recorder = TraceRecorder(self._now)

    @property
    def events(self) -> list[Event]:
        return self.recorder.events

    def _now(self) -> float:
        assert self.loop is not None, "the trace is recorded while a life's loop runs"
        return self.offset + self.loop.time()

    def life(self, number: int, stop: StopPoint | None) -> LifeEnd:
        self.ckpt.crashed = False
        sink, error = self._run(number, stop)
        self.offset = self.events[-1].t if self.events else self.offset
        if error is not None:
            return LifeEnd("error", error)
        if sink.dead:
            return LifeEnd("crash")
        planned = any(e.kind == ev.LIFE_END and e["life"] == number and e["how"] == "planned" for e in self.events)
        return LifeEnd("planned" if planned else "completed")

    def _run(self, life: int, stop: StopPoint | None) -> tuple[LifeSink, BaseException | None]:
        scenario, cfg, host = self.scenario, self.scenario.config, self.host
        sink = LifeSink(self.recorder, life, stop, cfg, self.ckpt)
        planned = stop is not None and stop.how == "planned"
        prompt = [0] * scenario.engine.prompt_tokens
        # holds the context past the loop's end, so the loop cancels a fully-async worker still
        # running instead of the collector destroying it pending (as ``simulate`` holds it)
        holder: dict[str, RunContext] = {}

        async def main() -> None:
            loop = asyncio.get_running_loop()
            self.loop, sink.loop = loop, loop
            engine = SimEngine(scenario.engine, sink=sink)
            install(for_scenario(scenario, sink=sink, engine=engine))

            def prompt_fn(k: int) -> tuple[str, Any, int]:
                return (f"prompt-{k}", prompt, k)

            make_source = host.data_source_factory or RolloutDataSourceWithBuffer
            source = make_source(cfg.n_samples_per_prompt, prompt_fn, sink=sink)
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
            ctx.checkpoint = self.ckpt
            holder["ctx"] = ctx
            if host.hooks is not None:
                host.hooks(ctx)
            start_life(ctx, life)
            if planned and stop is not None:
                ctx.save_sentinel = lambda rid: rid == stop.rollout_id
                ctx.args = dataclasses.replace(
                    ctx.args, debug_exit_after_rollout=stop.rollout_id - ctx.args.start_rollout_id + 1
                )
            await run(ctx)
            emit_run_end(ctx)
            sink.emit(
                ev.LIFE_END,
                life=life,
                how="planned" if planned else "completed",
                at=stop.at.value if planned and stop is not None else "num_rollout",
            )

        try:
            run_virtual(main())
        except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - a crash stops the loop; anything else is the life's error
            if not sink.dead or isinstance(exc, WatchdogTripped):
                return sink, exc
        return sink, None
