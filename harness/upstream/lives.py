"""Lives on upstream Miles' own drivers, in virtual time: a run that stops and resumes
from its last checkpoint, as a Miles job does after a failure or a planned restart.

A run is a sequence of lives, each one ``harness.upstream.runner`` run of the same
scenario on fresh objects (a new data source, rollout function, buffer, engine,
trainer, event loop): nothing in memory survives a stop, only the checkpoint folder.
What each life does with that folder is upstream's own code (its orchestration over the
leaves, ``harness.upstream.orchestration``), followed at the leaves by this module's hooks
(``UpstreamRunner.hooks``):

* ``RolloutManager.save/load`` call upstream's ``data_source.save(N)`` / ``load(N)``
  (``miles/ray/rollout/rollout_manager.py:L275-L281``: save only with
  ``--rollout-global-dataset``), which write and read
  ``<--save>/rollout/global_dataset_state_dict_<N>.pt`` (``miles/rollout/data_source.py:L124-L160``);
  the hooks follow them on the data source (``follow_data_source``);
* the train actor leaf's save writes its step count, learning-rate step and weight
  version, then the tracker ``latest_checkpointed_iteration.txt`` = N, last, as Megatron
  writes it (``harness.upstream.leaves.write_checkpoint``);
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

A life ends at its ``harness.lives.stops.StopPoint`` by the one crash rule
(``harness.lives.stops.Crash``: the life's main task is cancelled at the loop step after
the stop's event and nothing it would record or write afterwards is kept;
``mid_data_save`` cuts the data source's file in half inside the save and dies there), or
at a planned stop (``--save-trigger-sentinel``: the sentinel file is created while rollout
N trains, so upstream's loop saves at N and removes it; ``--debug-exit-after-rollout``
ends the loop after N). ``UpstreamHost`` is the ``harness.lives.run.LifeHost`` that runs
these lives for ``harness.lives.run.run_lives`` and the resume sweep
(``harness.lives.sweep``).

The joined trace: each event carries ``life``, times run on across lives, each life opens
with ``life_start`` and ends with ``life_end`` (the last one with upstream's ``run_end``),
and the checkpoint calls are recorded as ``checkpoint_saved`` / ``checkpoint_loaded``.
``taken`` carries the group's ``source_index`` (its line in the prompt file) and
``epoch`` (upstream's ``epoch_id`` when the line was read). At every data-source save the
groups taken and not yet trained are listed with where upstream holds them (``held``), a
second observation of what names the mechanism of a loss.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.lives.run import LifeEnd
from harness.lives.stops import Crash, Stop, StopPoint
from harness.sim.scenario import Scenario
from harness.trace import Event
from harness.upstream.runner import UpstreamRunner
from miles_async_core import events as ev
from miles_async_core.drivers.common import RunContext

TRACKER = "latest_checkpointed_iteration.txt"  # Megatron's tracker file
LIFE_START, LIFE_END = ev.LIFE_START, ev.LIFE_END
CHECKPOINT_SAVED, CHECKPOINT_LOADED = ev.CHECKPOINT_SAVED, ev.CHECKPOINT_LOADED


class _ResumedContext(RunContext):
    """The runner's context with the trainer's step count continued from the checkpoint
    (a trainer resumed by Megatron keeps its iteration; ``RunContext.trainer_steps``
    counts only this life's steps)."""

    steps_base: int = 0

    @property
    def trainer_steps(self) -> int:
        return self.steps_base + len(self.history)


class _Life:
    """The hooks of one life: what follows upstream's save and load, the stop, the recorded extras."""

    def __init__(self, number: int, ckpt: Path, stop: StopPoint | None, save_interval: int | None) -> None:
        self.number, self.ckpt, self.stop, self.save_interval = number, ckpt, stop, save_interval
        self.runner: UpstreamRunner | None = None
        self.main: asyncio.Task | None = None
        self.loaded_version: int | None = None
        self.crash: Crash | None = None  # the one crash rule (harness.lives.stops), set with the runner
        self.open: set[int] = set()
        self.drained: set[int] = set()
        self.last_trained: int | None = None  # the rollout a save after training is for

    @property
    def dead(self) -> bool:
        return self.crash is not None and self.crash.dead

    def _tears(self, rollout_id: int) -> bool:
        """Whether this life's stop is inside the data source's save of ``rollout_id``."""
        stop = self.stop
        return stop is not None and stop.at is Stop.MID_DATA_SAVE and stop.rollout_id == rollout_id

    # --- the hook the runner calls inside its run, before upstream's train(args) ---------
    def __call__(self, runner: UpstreamRunner) -> None:
        self.runner, self.main = runner, asyncio.current_task()
        args = runner.args
        args.save, args.load = str(self.ckpt), str(self.ckpt)
        args.save_interval, args.start_rollout_id = self.save_interval, None
        stop = self.stop
        if stop is not None and stop.how == "planned":
            args.save_trigger_sentinel = str(self.ckpt / f"save-now-life{self.number}")
        self._observe(runner)
        # upstream's own save and load run; the life follows them at the leaves
        runner.on_trainer_loaded = self.trainer_loaded
        runner.on_trainer_saved = self.trainer_saved
        runner.on_data_source = self.follow_data_source

    def _emit(self, kind: str, **fields: Any) -> None:
        assert self.runner is not None
        self.runner.sink.emit(kind, **fields)

    def _observe(self, runner: UpstreamRunner) -> None:
        self.crash = Crash(self.stop, runner.scenario.config, self._die)
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
            assert self.crash is not None
            if self.crash.see(kind, fields):
                return
            if kind == ev.TRAINED:
                self._on_trained(fields["rollout_id"])

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
        if stop is not None and stop.how == "planned" and rollout_id == stop.rollout_id:
            runner = self.runner
            assert runner is not None
            Path(runner.args.save_trigger_sentinel).write_text("save")  # upstream removes it after saving
            runner.args.debug_exit_after_rollout = rollout_id - runner.args.start_rollout_id + 1

    def _tear(self, path: Path) -> None:
        """``mid_data_save``: the data source's file half-written, and the process dies in the
        write (the one stop inside a step: ``harness.lives.stops``)."""
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])  # the write the crash cut short
        assert self.crash is not None and self.stop is not None
        self.crash.now()
        self._die()
        raise asyncio.CancelledError(self.stop.label)

    def _die(self) -> None:
        if self.main is not None and not self.main.done():
            self.main.cancel()

    # --- upstream's save and load, followed at the leaves ------------------------------
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
            # a stop is at the save of the rollout just trained, whatever rollout id upstream
            # passes down (a save under the wrong name is what a resume then shows)
            saving = life.last_trained if life.last_trained is not None else rollout_id
            if life._tears(saving):
                runner = life.runner
                assert runner is not None
                life._tear(Path(runner.args.save) / f"rollout/global_dataset_state_dict_{rollout_id}.pt")
            named = {} if saving == rollout_id else {"saved_as": rollout_id}  # the name upstream wrote it under
            life._emit(CHECKPOINT_SAVED, rollout_id=saving, part="data_source", state=_cursor(ds), held=held, **named)

        def loaded(rollout_id: int | None = None) -> None:
            runner = life.runner
            assert runner is not None
            path = Path(runner.args.load or "") / f"rollout/global_dataset_state_dict_{rollout_id}.pt"
            found = runner.args.load is not None and path.exists()
            load(rollout_id)
            if found:  # a missing state is logged by upstream and loads nothing (data_source.py:L146-L149)
                life._emit(CHECKPOINT_LOADED, rollout_id=rollout_id, part="data_source", state=_cursor(ds))

        ds.save, ds.load = saved, loaded

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


def _cursor(ds: Any) -> dict[str, int]:
    return {
        "sample_offset": ds.sample_offset,
        "epoch_id": ds.epoch_id,
        "sample_group_index": ds.sample_group_index,
        "sample_index": ds.sample_index,
        "recycle_buffer": len(getattr(ds, "buffer", ())),
    }


class UpstreamHost:
    """``harness.lives.run.LifeHost`` on upstream's code (the tree must be activated:
    ``upstream_host``). Each life is one ``UpstreamRunner`` run with this module's hooks, on
    a checkpoint folder the run's lives share (a fresh temporary one unless ``ckpt_dir``);
    ``--save-interval`` is the scenario's."""

    name = "upstream"

    def __init__(self, *, ckpt_dir: str | Path | None = None, **runner_kwargs: Any):
        self.ckpt_dir, self.runner_kwargs = ckpt_dir, runner_kwargs
        self.miles_tree: str | None = None

    def refuses(self, scenario: Scenario, stops: Sequence[StopPoint]) -> str | None:
        """Why upstream does not run this case: a setting it refuses at start-up (the project's
        rule messages first, as they carry the fix, then Miles' own argument checks in this
        tree), or a driver the tree lacks a seam for."""
        from harness.upstream import source
        from harness.upstream.runner import upstream_refusal
        from miles_async_core import rules

        cfg = scenario.config
        checks = (rules.miles_fully_async_no_abort, rules.miles_colocate_not_async, rules.miles_fully_async_no_colocate)
        return (
            source.refused_reason(cfg)
            or next((msg for r in checks if (msg := r.check(cfg))), None)
            or upstream_refusal(scenario)
        )

    @contextmanager
    def lives(self, scenario: Scenario) -> Iterator[_UpstreamLives]:
        own = self.ckpt_dir is None
        ckpt = Path(tempfile.mkdtemp(prefix="miles-harness-lives-")) if own else Path(self.ckpt_dir)  # type: ignore[arg-type]
        ckpt.mkdir(parents=True, exist_ok=True)
        try:
            yield _UpstreamLives(self, scenario, ckpt)
        finally:
            if own:
                shutil.rmtree(ckpt, ignore_errors=True)


class _UpstreamLives:
    def __init__(self, host: UpstreamHost, scenario: Scenario, ckpt: Path) -> None:
        self.host, self.scenario, self.ckpt = host, scenario, ckpt
        self.events: list[Event] = []
        self.offset = 0.0

    def life(self, number: int, stop: StopPoint | None) -> LifeEnd:
        life = _Life(number, self.ckpt, stop, self.scenario.config.save_interval)
        res = UpstreamRunner(self.scenario, hooks=life, **self.host.runner_kwargs).run()
        if isinstance(res.error, asyncio.CancelledError) and life.dead:
            end = LifeEnd("crash", run=res)
        elif res.error is not None:
            end = LifeEnd("error", res.error, res)
        elif stop is not None and stop.how == "planned":
            end = LifeEnd("planned", run=res)
        else:  # the last life, or one that ran to its end before its stop fired
            end = LifeEnd("completed", run=res)
        start = getattr(getattr(life.runner, "args", None), "start_rollout_id", None)
        at = {"crash": stop.at.value if stop else "", "planned": Stop.PLANNED_EXIT.value, "completed": "num_rollout"}
        self.offset = _join(
            self.events,
            res.events,
            number,
            end.how if end.how != "error" else "crash",
            at.get(end.how) or f"error: {type(res.error).__name__}: {res.error}",
            self.offset,
            last=end.how != "crash" and end.how != "planned",
            start={"start_rollout_id": start, "loaded_version": life.loaded_version},
        )
        return end


def _join(
    out: list[Event],
    events: list[Event],
    life: int,
    how: str,
    at: str,
    offset: float,
    *,
    last: bool,
    start: dict[str, Any],
) -> float:
    """Append one life's events with its number, its times moved past the previous life's
    end; a life that does not end the run ends with ``life_end`` instead of ``run_end``
    (``how``: crash, planned or completed, ``at``: the stop; a life that raised is a crash
    ``at`` its error)."""

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
    add(t_end, LIFE_END, {"how": how, "at": at, "pending_groups": pending})
    return t_end


def upstream_host(miles_src: str | None = None) -> UpstreamHost:
    """The host on the Miles tree ``miles_src`` (else ``$MILES_SRC``, else the pinned tree
    beside the repository), activated; ``host.miles_tree`` names the tree.
    ``UpstreamUnavailable`` (the reason) without one."""
    from harness.upstream import source

    path, how = source.find_miles_src(miles_src)
    if path is None:
        raise source.UpstreamUnavailable(how)
    source.activate(path)
    host = UpstreamHost()
    host.miles_tree = path.name
    return host
