"""Lives on upstream Miles' own drivers, in virtual time: a run that stops and resumes
from its last checkpoint, as a Miles job does after a failure or a planned restart.

A run is a sequence of lives, each one ``harness.upstream.runner`` run of the same
scenario on fresh objects (a new data source, rollout function, buffer, engine,
trainer, event loop): nothing in memory survives a stop, only the checkpoint folder.
What each life does with that folder is upstream's own code, reached through the Ray
stand-ins this module puts on the driver module (``UpstreamRunner.hooks``):

* ``rollout_manager.save.remote(N)`` / ``load.remote(N)`` call upstream's
  ``data_source.save(N)`` / ``load(N)`` as ``RolloutManager.save/load`` do
  (``miles/ray/rollout/rollout_manager.py:L275-L281``: save only with
  ``--rollout-global-dataset``), which write and read
  ``<--save>/rollout/global_dataset_state_dict_<N>.pt`` (``miles/rollout/data_source.py:L124-L160``);
* ``actor_model.save_model(N)`` is the trainer stand-in's save: its step count,
  learning-rate step and weight version into ``iter_<N>/trainer.json``, then the
  tracker ``latest_checkpointed_iteration.txt`` = N, last, as Megatron writes it;
* ``create_training_models`` starts a life as Miles does: without a tracker under
  ``--load`` the run starts at 0 and ``--load`` falls back to ``--ref-load`` (unset
  here: ``miles/utils/arguments.py:L3049-L3060``); with one, Megatron's
  ``start_rollout_id = loaded_rollout_id + 1`` (``miles/backends/megatron_utils/actor.py:L212``),
  the trainer's step and learning-rate step restored, ``args.start_rollout_id`` set when
  unset and ``rollout_manager.load.remote(start_rollout_id - 1)`` with
  ``--rollout-global-dataset`` (``miles/ray/placement_group.py:L174-L182``). The driver's
  first ``update_weights`` then pushes the loaded weights to the new engines
  (``train_async.py:L49-L50``, ``train.py:L53-L54``); the updater's version counter
  starts again at 0 in a new process, as upstream's does
  (``update_weight_from_tensor.py:L103``, ``update_weight_from_distributed/broadcast.py:L44``).

A life ends at its ``Stop``: a crash (the life's event loop is cancelled where the stop
fires and nothing it would record afterwards is kept; ``mid_data_save`` leaves the data
source's file half-written first) or a planned stop (``--save-trigger-sentinel``: the
sentinel file is created while rollout N trains, so upstream's loop saves at N and
removes it; ``--debug-exit-after-rollout`` ends the loop after N). The last life runs to
``num_rollout``.

``run_lives(scenario, stops, save_interval=...)`` returns the joined trace: each event
carries ``life``, times run on across lives, each life opens with ``life_start`` and
ends with ``life_end`` (the last one with upstream's ``run_end``), and the checkpoint
calls are recorded as ``checkpoint_saved`` / ``checkpoint_loaded``. ``taken`` carries
the group's ``source_index`` (its line in the prompt file) and ``epoch`` (upstream's
``epoch_id`` when the line was read). At every data-source save the groups taken and
not yet trained are listed with where upstream holds them (``held``), which is what
names the mechanism of a loss (``harness.upstream.resume_sweep``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.sim.scenario import Scenario
from harness.trace import Event
from harness.upstream.runner import UpstreamRunner, UpstreamRunResult
from miles_async_core import events as ev
from miles_async_core.drivers.common import RunContext
from miles_async_core.errors import ConfigError

TRACKER = "latest_checkpointed_iteration.txt"  # Megatron's tracker file
LIFE_START, LIFE_END = ev.LIFE_START, ev.LIFE_END
CHECKPOINT_SAVED, CHECKPOINT_LOADED = ev.CHECKPOINT_SAVED, ev.CHECKPOINT_LOADED
# where a crash can come between two save boundaries: the first ``nth`` event of the kind
# after the checkpoint of rollout ``after`` was saved
BETWEEN = {
    "mid_generation": ev.GROUP_DONE,
    "mid_drain": ev.GOT,
    "during_pause": ev.ENGINE_PAUSE,
    "mid_update": ev.PHASE_START,
    "after_train": ev.TRAINED,
}
AT_SAVE = ("save", "between_saves", "mid_data_save")


@dataclass(frozen=True)
class Stop:
    """Where a life ends. ``after``: the rollout whose checkpoint the next life loads
    (for a planned stop, the rollout after which upstream saves and exits).
    ``at`` (crash only): ``save`` (right after ``rollout_manager.save(after)`` returned:
    a save boundary), ``between_saves`` (the model of ``after`` saved, the data source
    not), ``mid_data_save`` (the data source's file of ``after`` half-written), or one of
    ``BETWEEN`` (the ``nth`` such event after that checkpoint: ``mid_generation`` a
    finished group, ``mid_drain`` a buffer get, ``during_pause`` an engine pause,
    ``mid_update`` a weight sync starting, ``after_train`` a training step recorded)."""

    after: int
    at: str = "save"
    nth: int = 1
    planned: bool = False
    # a stop point of the resume sweep (``harness.sim.lives.StopPoint``, ``at="watched"``):
    # the life ends where that module's ``StopWatcher`` says, on this life's trace
    point: Any = None

    def __post_init__(self) -> None:
        if self.after < 0:
            raise ConfigError(
                f"Stop.after = {self.after}: must be a rollout id >= 0; fix: name the rollout whose "
                "checkpoint the next life loads"
            )
        if not self.planned and self.at not in AT_SAVE and self.at not in BETWEEN and self.point is None:
            raise ConfigError(f"Stop.at = {self.at!r}; allowed: {', '.join((*AT_SAVE, *BETWEEN))}. Fix: use one")
        if self.nth < 1:
            raise ConfigError(f"Stop.nth = {self.nth}: must be >= 1")

    @property
    def label(self) -> str:
        if self.planned:
            return f"planned@{self.after}"
        if self.point is not None:
            return str(self.point.label)
        return f"{self.at}@{self.after}" + (f"#{self.nth}" if self.at in BETWEEN and self.nth != 1 else "")


@dataclass
class LivesResult:
    scenario: Scenario
    stops: list[Stop]
    events: list[Event]
    lives: list[UpstreamRunResult]
    ended: list[str]  # per life: "crash:<where>", "planned", "completed" or "error:<what>"
    save_interval: int | None = None
    error: BaseException | None = None  # a life that raised what no stop explains (e.g. a resume that fails)
    extra: dict[str, Any] = field(default_factory=dict)


class _ResumedContext(RunContext):
    """The runner's context with the trainer's step count continued from the checkpoint
    (a trainer resumed by Megatron keeps its iteration; ``RunContext.trainer_steps``
    counts only this life's steps)."""

    steps_base: int = 0

    @property
    def trainer_steps(self) -> int:
        return self.steps_base + len(self.history)


class _Life:
    """The hooks of one life: checkpointing stand-ins, the stop, the recorded extras."""

    def __init__(self, number: int, ckpt: Path, stop: Stop | None, save_interval: int | None) -> None:
        self.number, self.ckpt, self.stop, self.save_interval = number, ckpt, stop, save_interval
        self.dead = False
        self.ended = "completed"
        self.saved_data: set[int] = set()  # rollouts whose data source this life saved
        self.runner: UpstreamRunner | None = None
        self.main: asyncio.Task | None = None
        self.between_seen = 0
        self.loaded_version: int | None = None
        self.watcher: Any = None
        self.open: set[int] = set()
        self.drained: set[int] = set()
        self.parts: dict[int, set[str]] = {}  # rollout id -> the checkpoint parts saved for it
        self.last_trained: int | None = None  # the rollout a save after training is for

    # --- the hook the runner calls inside its run, before upstream's train(args) ---------
    def __call__(self, runner: UpstreamRunner) -> None:
        self.runner, self.main = runner, asyncio.current_task()
        args = runner.args
        args.save, args.load = str(self.ckpt), str(self.ckpt)
        args.save_interval, args.start_rollout_id = self.save_interval, None
        stop = self.stop
        if stop is not None and stop.planned:
            args.save_trigger_sentinel = str(self.ckpt / f"save-now-life{self.number}")
        self._observe(runner)
        if runner.orchestration == "upstream":
            # upstream's own save and load run; the life follows them at the leaves
            runner.on_trainer_loaded = self.trainer_loaded
            runner.on_trainer_saved = self.trainer_saved
            runner.on_data_source = self.follow_data_source
        else:
            self._rebind(runner)

    def _emit(self, kind: str, **fields: Any) -> None:
        assert self.runner is not None
        self.runner.sink.emit(kind, **fields)

    def _observe(self, runner: UpstreamRunner) -> None:
        stop = self.stop
        if stop is not None and stop.point is not None:
            from harness.sim.lives import StopWatcher

            self.watcher = StopWatcher(stop.point, runner.scenario.config)
        sink = runner.sink
        emit = sink.emit

        def observed(kind: str, /, **fields: Any) -> None:
            if self.dead:  # after a crash nothing of this life is recorded
                return
            if kind == ev.TAKEN:
                fields.update(self._source_of(fields["group_index"]))
            elif kind == ev.TRAINED:  # the trainer's optimizer and learning-rate steps, across lives
                fields.setdefault("optimizer_step", fields["trainer_steps"])
                fields.setdefault("lr_step", fields["trainer_steps"])
            emit(kind, **fields)
            self._follow(kind, fields)
            if self.watcher is not None and self.watcher.see(kind, fields):
                self._crash_at_next_step(self.watcher.stop.at)
                return
            if kind == ev.TRAINED:
                self._on_trained(fields["rollout_id"])
            self._maybe_crash_between(kind, fields)

        sink.emit = observed

    def _follow(self, kind: str, fields: dict[str, Any]) -> None:
        """The groups this life has taken and not yet trained or dropped (``open``), and
        those a drain has got for a rollout not yet trained (``drained``)."""
        if kind == ev.TAKEN:
            self.open.add(fields["group_index"])
        elif kind == ev.GOT:
            self.drained.add(fields["group_index"])
        elif kind == ev.TRAINED:
            self.open -= set(fields["group_indices"])
            self.drained -= set(fields["group_indices"])
        elif kind == ev.DROPPED or (kind == ev.PUT_REJECTED and str(fields["reason"]).startswith("dynamic_filter")):
            self.open.discard(fields["group_index"])
            self.drained.discard(fields["group_index"])

    def _source_of(self, gi: int) -> dict[str, int]:
        """The group's line in the prompt file (its ``label``, ``runner._local_assets``)
        and the data source's epoch when the line was read (``epoch_id`` after the call;
        a line at or past the new ``sample_offset`` was read before the wrap)."""
        runner = self.runner
        assert runner is not None
        ds = runner.data_source
        group = next((g for g in runner._last_taken if g[0].group_index == gi), None)
        if group is None:
            return {}
        index = int(group[0].label)
        epoch = ds.epoch_id if index < ds.sample_offset else ds.epoch_id - 1
        return {"source_index": index, "epoch": max(epoch, 0)}

    def _on_trained(self, rollout_id: int) -> None:
        self.last_trained = rollout_id
        stop = self.stop
        if stop is not None and stop.planned and rollout_id == stop.after:
            runner = self.runner
            assert runner is not None
            Path(runner.args.save_trigger_sentinel).write_text("save")  # upstream removes it after saving
            runner.args.debug_exit_after_rollout = rollout_id - runner.args.start_rollout_id + 1

    def _maybe_crash_between(self, kind: str, fields: dict[str, Any]) -> None:
        stop = self.stop
        if stop is None or stop.planned or stop.at not in BETWEEN or stop.after not in self.saved_data:
            return
        if kind != BETWEEN[stop.at] or (stop.at == "mid_update" and fields.get("phase") != "weight_sync"):
            return
        self.between_seen += 1
        if self.between_seen == stop.nth:
            self._crash_at_next_step(stop.label)

    def _crash(self, where: str) -> None:
        """The process dies here: nothing later is recorded or written."""
        self.ended = f"crash:{where}"
        self._die()

    def _crash_at_next_step(self, where: str) -> None:
        """The process dies at the event loop's next step: what the current step does
        synchronously still happens (and is recorded), nothing after it (the sweep's rule
        for a stop at an event, ``harness.sim.lives``)."""
        self.ended, self.watcher = f"crash:{where}", None
        asyncio.get_running_loop().call_soon(self._die)

    def _die(self) -> None:
        self.dead = True
        if self.main is not None and not self.main.done():
            self.main.cancel()

    # --- orchestration "upstream": upstream's save and load, followed at the leaves -------
    def trainer_loaded(self, loaded: dict | None) -> None:
        """The train actor leaf loaded ``loaded`` from ``--load`` (``None``: Miles'
        validation found no tracker, ``--load`` fell back to ``--ref-load`` and the run
        starts at 0, ``arguments.py:L3045-L3058``)."""
        if loaded is None:
            return
        runner = self.runner
        assert runner is not None
        ctx = runner.ctx
        ctx.__class__ = _ResumedContext
        ctx.steps_base = loaded["optimizer_step"]
        ctx.trainer.steps = loaded["optimizer_step"]  # the weights the first update pushes
        self.loaded_version = loaded["version"]
        self._emit(
            CHECKPOINT_LOADED,
            rollout_id=loaded["rollout_id"],
            part="model",
            optimizer_step=loaded["optimizer_step"],
            lr_step=loaded["lr_step"],
            version=loaded["version"],
        )

    def trainer_saved(self, rollout_id: int, state: dict) -> None:
        """The train actor leaf wrote rollout ``rollout_id``'s model checkpoint."""
        if self.dead:  # a save the driver started after the crash: the process is gone
            raise asyncio.CancelledError("the life crashed")
        self._emit(CHECKPOINT_SAVED, part="model", rollout_id=rollout_id, **state)
        self._part_saved(rollout_id, "model")

    def follow_data_source(self, ds: Any) -> None:
        """Upstream's data source, with its ``save`` and ``load`` followed (as upstream's
        ``RolloutManager.save`` / ``load`` call them)."""
        save, load = ds.save, ds.load
        life = self

        def saved(rollout_id: int) -> None:
            if life.dead:
                raise asyncio.CancelledError("the life crashed")
            held = life._held()
            save(rollout_id)
            stop = life.stop
            # a stop is at the save of the rollout just trained, whatever rollout id upstream
            # passes down (a save under the wrong name is what a resume then shows)
            saving = life.last_trained if life.last_trained is not None else rollout_id
            crash_here = stop is not None and not stop.planned and stop.after == saving
            if crash_here and stop is not None and stop.at == "mid_data_save":
                runner = life.runner
                assert runner is not None
                path = Path(runner.args.save) / f"rollout/global_dataset_state_dict_{rollout_id}.pt"
                data = path.read_bytes()
                path.write_bytes(data[: len(data) // 2])  # the write the crash cut short
                life._crash(stop.label)
                raise asyncio.CancelledError(stop.label)
            life.saved_data.add(saving)
            named = {} if saving == rollout_id else {"saved_as": rollout_id}  # the name upstream wrote it under
            life._emit(CHECKPOINT_SAVED, rollout_id=saving, part="data_source", state=_cursor(ds), held=held, **named)
            life._part_saved(saving, "data_source")
            if crash_here and stop is not None and stop.at == "save":
                life._crash(stop.label)
                raise asyncio.CancelledError(stop.label)

        def loaded(rollout_id: int | None = None) -> None:
            runner = life.runner
            assert runner is not None
            path = Path(runner.args.load or "") / f"rollout/global_dataset_state_dict_{rollout_id}.pt"
            found = runner.args.load is not None and path.exists()
            load(rollout_id)
            if found:  # a missing state is logged by upstream and loads nothing (data_source.py:L146-L149)
                life._emit(CHECKPOINT_LOADED, rollout_id=rollout_id, part="data_source", state=_cursor(ds))

        ds.save, ds.load = saved, loaded

    def _part_saved(self, rollout_id: int, part: str) -> None:
        """A crash ``between_saves`` of rollout N fires after the first of its two saves,
        whichever upstream makes first (the pinned drivers save the model first,
        ``train_async.py:L99-L103``; others the data source)."""
        self.parts.setdefault(rollout_id, set()).add(part)
        stop = self.stop
        if stop is None or stop.planned or stop.after != rollout_id or stop.at != "between_saves":
            return
        if len(self.parts[rollout_id]) == 1:
            self._crash(stop.label)
            raise asyncio.CancelledError(stop.label)

    # --- the Ray stand-ins that reach upstream's checkpoint code --------------------------
    def _rebind(self, runner: UpstreamRunner) -> None:
        g = runner.driver_mod.__dict__
        make_manager, make_models = g["create_rollout_manager"], g["create_training_models"]
        life = self

        def create_rollout_manager(args: Any, pg: Any) -> tuple[Any, Any]:
            manager, per_epoch = make_manager(args, pg)
            manager.save = _Remote(life.save_data_source)
            manager.load = _Remote(life.load_data_source)
            return manager, per_epoch

        async def create_training_models(args: Any, pgs: Any, rollout_manager: Any) -> tuple[Any, Any]:
            actor, critic = await make_models(args, pgs, rollout_manager)
            actor.save_model = life.save_model
            start = life.load_trainer(args)
            if args.start_rollout_id is None:
                args.start_rollout_id = start
            if args.rollout_global_dataset:
                await rollout_manager.load.remote(args.start_rollout_id - 1)
            return actor, critic

        g.update(create_rollout_manager=create_rollout_manager, create_training_models=create_training_models)

    async def save_model(self, rollout_id: int, force_sync: bool = False) -> None:
        if self.dead:  # a save the driver started after the crash: the process is gone
            raise asyncio.CancelledError("the life crashed")
        runner = self.runner
        assert runner is not None
        ctx = runner.ctx
        state = {
            "rollout_id": rollout_id,
            "optimizer_step": ctx.trainer_steps,
            "lr_step": ctx.trainer_steps,
            "version": ctx.weight_version,
        }
        it = self.ckpt / f"iter_{rollout_id:07d}"
        it.mkdir(parents=True, exist_ok=True)
        (it / "trainer.json").write_text(json.dumps(state))
        (self.ckpt / TRACKER).write_text(str(rollout_id))
        self._emit(CHECKPOINT_SAVED, part="model", **state)
        stop = self.stop
        if stop is not None and not stop.planned and stop.after == rollout_id and stop.at == "between_saves":
            self._crash(stop.label)
            raise asyncio.CancelledError(stop.label)

    async def save_data_source(self, rollout_id: int) -> None:
        """``RolloutManager.save`` (``rollout_manager.py:L275-L278``) on upstream's data source."""
        if self.dead:
            raise asyncio.CancelledError("the life crashed")
        runner = self.runner
        assert runner is not None
        args, ds = runner.args, runner.data_source
        stop = self.stop
        crash_here = stop is not None and not stop.planned and stop.after == rollout_id
        held = self._held()
        if args.rollout_global_dataset:
            ds.save(rollout_id)
        if crash_here and stop is not None and stop.at == "mid_data_save":
            path = Path(args.save) / f"rollout/global_dataset_state_dict_{rollout_id}.pt"
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 2])  # the write the crash cut short
            self._crash(stop.label)
            raise asyncio.CancelledError(stop.label)
        self.saved_data.add(rollout_id)
        self._emit(CHECKPOINT_SAVED, rollout_id=rollout_id, part="data_source", state=_cursor(ds), held=held)
        if crash_here and stop is not None and stop.at == "save":
            self._crash(stop.label)
            raise asyncio.CancelledError(stop.label)

    def _held(self) -> dict[str, list[int]]:
        """Where upstream holds each group it has taken and not yet handed to training, at
        a data-source save: in the data source's recycle buffer (``recycled``: a partial
        group put back by an abort or the unused-samples handler; ``leftover``: one put
        back without any response), in the fully-async buffer (``buffered``), or being
        generated or waiting to be put (``in_flight``), or taken for a later rollout than the
        one saved (``look_ahead``: a one-step generate, or a fully-async drain that got it)."""
        runner = self.runner
        assert runner is not None
        out: dict[str, list[int]] = {"recycled": [], "leftover": [], "buffered": [], "in_flight": [], "look_ahead": []}
        for g in getattr(runner.data_source, "buffer", ()):
            partial = any(getattr(s, "response_length", 0) or getattr(s, "response", "") for s in g)
            out["recycled" if partial else "leftover"].append(g[0].group_index)
        if runner.buffer is not None:
            out["buffered"] = [e.prompt_group[0].group_index for e in runner.buffer._buffer]
        queued = set(out["recycled"]) | set(out["leftover"]) | set(out["buffered"])
        fully = runner.scenario.config.fully_async
        for gi in self.open - queued:
            out["look_ahead" if not fully or gi in self.drained else "in_flight"].append(gi)
        return {k: sorted(v) for k, v in out.items()}

    async def load_data_source(self, rollout_id: int | None = None) -> None:
        """``RolloutManager.load`` (``rollout_manager.py:L280-L281``)."""
        runner = self.runner
        assert runner is not None
        path = Path(runner.args.load or "") / f"rollout/global_dataset_state_dict_{rollout_id}.pt"
        found = runner.args.load is not None and path.exists()
        runner.data_source.load(rollout_id)
        if found:  # a missing state is logged by upstream and loads nothing (data_source.py:L146-L149)
            self._emit(CHECKPOINT_LOADED, rollout_id=rollout_id, part="data_source", state=_cursor(runner.data_source))

    def load_trainer(self, args: Any) -> int:
        """Where the life starts, from the trainer's checkpoint (Megatron's rule)."""
        runner = self.runner
        assert runner is not None
        tracker = self.ckpt / TRACKER
        if not tracker.exists():
            args.load = None  # arguments.py:L3049-L3060: --load falls back to --ref-load (unset)
            return 0
        loaded = int(tracker.read_text())
        state = json.loads((self.ckpt / f"iter_{loaded:07d}" / "trainer.json").read_text())
        ctx = runner.ctx
        ctx.__class__ = _ResumedContext
        ctx.steps_base = state["optimizer_step"]
        runner.ctx.trainer.steps = state["optimizer_step"]  # the weights the first update pushes
        self.loaded_version = state["version"]
        self._emit(
            CHECKPOINT_LOADED,
            rollout_id=loaded,
            part="model",
            optimizer_step=state["optimizer_step"],
            lr_step=state["lr_step"],
            version=state["version"],
        )
        return loaded + 1


class _Remote:
    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def remote(self, *a: Any, **k: Any) -> Any:
        return asyncio.ensure_future(self._fn(*a, **k))


def _cursor(ds: Any) -> dict[str, int]:
    return {
        "sample_offset": ds.sample_offset,
        "epoch_id": ds.epoch_id,
        "sample_group_index": ds.sample_group_index,
        "sample_index": ds.sample_index,
        "recycle_buffer": len(getattr(ds, "buffer", ())),
    }


def run_lives(
    scenario: Scenario,
    stops: list[Stop],
    *,
    save_interval: int | None = 1,
    ckpt_dir: str | Path | None = None,
    **runner_kwargs: Any,
) -> LivesResult:
    """Run ``scenario`` on upstream's code (the tree must be activated) as ``len(stops) + 1``
    lives; life ``i`` ends at ``stops[i]``. ``save_interval``: upstream's ``--save-interval``
    in every life. The checkpoint folder is a fresh temporary one unless ``ckpt_dir``."""
    own = ckpt_dir is None
    ckpt = Path(tempfile.mkdtemp(prefix="miles-harness-lives-")) if own else Path(ckpt_dir)  # type: ignore[arg-type]
    ckpt.mkdir(parents=True, exist_ok=True)
    joined: list[Event] = []
    results: list[UpstreamRunResult] = []
    ended: list[str] = []
    error: BaseException | None = None
    offset = 0.0
    try:
        for number in range(len(stops) + 1):
            stop = stops[number] if number < len(stops) else None
            life = _Life(number, ckpt, stop, save_interval)
            res = UpstreamRunner(scenario, hooks=life, **runner_kwargs).run()
            results.append(res)
            if isinstance(res.error, asyncio.CancelledError) and life.dead:
                how = life.ended
            elif res.error is not None:
                how, error = f"error:{type(res.error).__name__}: {res.error}", res.error
            elif stop is not None and stop.planned:
                how = "planned"
            elif stop is not None:  # the run ended before its stop fired
                how = "completed"
            else:
                how = "completed"
            ended.append(how)
            last = stop is None or how.startswith("error") or how == "completed"
            start = getattr(getattr(life.runner, "args", None), "start_rollout_id", None)
            offset = _join(
                joined,
                res.events,
                number,
                how,
                offset,
                last=last,
                start={"start_rollout_id": start, "loaded_version": life.loaded_version},
            )
            if last:
                break
    finally:
        if own:
            shutil.rmtree(ckpt, ignore_errors=True)
    return LivesResult(
        scenario=scenario,
        stops=list(stops),
        events=joined,
        lives=results,
        ended=ended,
        save_interval=save_interval,
        error=error,
    )


def _join(
    out: list[Event], events: list[Event], life: int, how: str, offset: float, *, last: bool, start: dict[str, Any]
) -> float:
    """Append one life's events with its number, its times moved past the previous life's
    end; a life that does not end the run ends with ``life_end`` instead of ``run_end``
    (``how``: crash, planned or completed; a life that raised is a crash ``at`` its error)."""

    def add(t: float, kind: str, fields: dict[str, Any]) -> None:
        out.append(Event(len(out), t, kind, {**fields, "life": life}))

    add(offset, LIFE_START, start)
    t_end = offset
    pending: list[int] = []
    for e in events:
        t_end = offset + e.t
        if e.kind == ev.RUN_END:
            pending = list(e.fields.get("pending_groups", []))
            if not last:
                continue
        add(t_end, e.kind, dict(e.fields))
    kind, _, where = how.partition(":")
    if kind == "error":
        kind, where = "crash", f"error: {where.strip()}"
    add(t_end, LIFE_END, {"how": kind, "at": where, "pending_groups": pending})
    return t_end


def run_points(scenario: Scenario, points: Any, **kwargs: Any) -> Any:
    """The resume sweep's host for upstream (``harness.sim.resume_sweep``): ``scenario`` as
    lives on upstream's drivers, each crash ``StopPoint`` watched on the life's trace by the
    sweep's ``StopWatcher`` (the core host's rule), a planned one as upstream's sentinel
    save and ``--debug-exit-after-rollout``; ``--save-interval`` from the scenario's config.
    Returns the sweep's ``LivesResult``."""
    from harness.sim.lives import LivesResult as SweepResult

    stops = [
        Stop(after=p.rollout_id, planned=True)
        if p.how == "planned"
        else Stop(after=p.rollout_id, at="watched", point=p)
        for p in points
    ]
    res = run_lives(scenario, stops, save_interval=scenario.config.save_interval, **kwargs)
    reached = [
        i < len(res.ended) and (res.ended[i].startswith("crash:") or res.ended[i] == "planned")
        for i in range(len(stops))
    ]
    return SweepResult(scenario=scenario, stops=tuple(points), events=res.events, reached=reached, error=res.error)


def upstream_host(miles_src: str | None = None, *, orchestration: str = "upstream") -> Any:
    """The sweep's host on the Miles tree ``miles_src`` (else ``$MILES_SRC``, else the pinned
    tree beside the repository): activates it and returns ``host(case) -> LivesResult``;
    ``host.miles_tree`` names the tree. ``UpstreamUnavailable`` (the reason) without one."""
    from harness.upstream import source

    path, how = source.find_miles_src(miles_src)
    if path is None:
        raise source.UpstreamUnavailable(how)
    source.activate(path)

    from miles_async_core import rules

    def refuses(case: Any) -> str | None:
        """Why upstream does not run this case: a setting it refuses at start-up (its
        argument checks), or a driver the tree lacks a seam for."""
        cfg = case.scenario.config
        from harness.upstream.runner import upstream_refusal

        # the project's rule messages first (they carry the fix), then whatever else Miles'
        # own argument checks refuse in this tree
        return (
            source.refused_reason(cfg, orchestration)
            or next(
                (
                    msg
                    for r in (
                        rules.miles_fully_async_no_abort,
                        rules.miles_colocate_not_async,
                        rules.miles_fully_async_no_colocate,
                    )
                    if (msg := r.check(cfg))
                ),
                None,
            )
            or upstream_refusal(case.scenario)
        )

    def host(case: Any) -> Any:
        reason = refuses(case)
        if reason:
            from harness.sim.lives import LivesResult as SweepResult

            return SweepResult(
                scenario=case.scenario,
                stops=tuple(case.stops),
                events=[],
                reached=[False] * len(case.stops),
                error=source.UpstreamUnavailable(reason),
            )
        return run_points(case.scenario, case.stops, orchestration=orchestration)

    host.miles_tree = path.name  # type: ignore[attr-defined]
    host.refuses = refuses  # type: ignore[attr-defined]
    return host
