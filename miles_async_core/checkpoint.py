"""Checkpoints: what a save writes and what the next life reads (`train.py:L77-L91`,
`train_async.py:L95-L105`, `miles/rollout/data_source.py:L124-L160`).

``CheckpointDir`` is the ``--save`` / ``--load`` folder: the only thing that outlives a
life. A save at rollout N writes the model part (the trainer's state, its optimizer and
learning-rate steps, and the weight version its weights are served as), then the data
source part (``RolloutDataSource.save``), in that order; a life that crashes writes
nothing more, so a crash between the two leaves a half-written checkpoint: a model of N
without a data source of N.

Resume (``resume``), by default as upstream: the latest model checkpoint N decides the
start (``start_rollout_id = N + 1``, ``megatron_utils/actor.py:L212``), the data source
loads its part of N if there is one (else nothing: ``data_source.py:L150`` logs and goes
on from its fresh state), and the weight updater's version counter starts again at 0
(an in-memory counter, ``update_weight_from_tensor.py:L103``), so the first update of the
new life serves version 1. Upstream saves no buffered, in-flight or recycled group: the
data source's state is its cursor alone (``sample_offset``, ``epoch_id``, ... at
``miles/rollout/data_source.py:L124-L137``), saved wherever it stands at the save, which in
``train_async.py`` is after ``generate(N+1)`` has started (``train_async.py:L78-L105``).

Under the harness extension ``exactly_once_resume`` a checkpoint counts only once both
parts are written (``CheckpointDir.complete``), the data source's part also lists every
source group taken and not yet trained (``pending``, re-queued first on load), and the
resumed engines serve the checkpoint's version.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from miles_async_core import events as ev

# The data source state's keys, as ``RolloutDataSource.save`` writes them (data_source.py:L128-L134).
CURSOR_KEYS = ("sample_offset", "epoch_id", "sample_group_index", "sample_index")


@dataclass
class CheckpointDir:
    """The checkpoint folder. ``crashed`` is set when the life writing it dies: later writes
    are the dead process's and never reach the disk."""

    models: dict[int, dict[str, Any]] = field(default_factory=dict)
    data_sources: dict[int, dict[str, Any]] = field(default_factory=dict)
    complete: set[int] = field(default_factory=set)  # both parts written (the extension's commit marker)
    crashed: bool = False

    def latest_model(self) -> int | None:
        """The newest model checkpoint: Megatron's tracker file moves only after a whole save."""
        return max(self.models, default=None)

    def latest_complete(self) -> int | None:
        return max(self.complete, default=None)


def should_save(args: Any, rollout_id: int, sentinel: bool = False) -> bool:
    """``should_run_periodic_action(rollout_id, args.save_interval, None, args.num_rollout)``
    (``miles/utils/misc.py:L130-L151``), or the ``--save-trigger-sentinel`` file exists."""
    if sentinel:
        return True
    interval: int | None = args.save_interval
    if interval is None:
        return False
    last: int = args.num_rollout - 1
    return rollout_id == last or (rollout_id + 1) % interval == 0


def saved_version(weight_version: int, trained_since_update: bool) -> int:
    """The version the saved weights are served as: the last one pushed, plus one if the
    trainer has stepped since that push (the saved weights are then the next push's)."""
    return weight_version + 1 if trained_since_update else weight_version


async def save(
    ckpt: CheckpointDir, rollout_id: int, *, model: dict[str, Any], data_source: Any, sink: Any, exactly_once: bool
) -> None:
    """Write the model part, then the data source part (the order of ``train.py:L86-L91``:
    two calls, ``save_model`` and ``rollout_manager.save``, with a loop step between them);
    each ``checkpoint_saved`` event follows its part's write, so a life that dies after the
    model's event leaves the data source's part unwritten."""
    if ckpt.crashed:
        return
    ckpt.models[rollout_id] = dict(model)
    if sink.enabled:
        sink.emit(
            ev.CHECKPOINT_SAVED,
            rollout_id=rollout_id,
            part="model",
            version=model["version"],
            optimizer_step=model["optimizer_step"],
            lr_step=model["lr_step"],
        )
    await asyncio.sleep(0)  # the rollout manager's save is a separate call
    if ckpt.crashed:  # the process died after the model's save: a half-written checkpoint
        return
    state = data_source.save(rollout_id)
    ckpt.data_sources[rollout_id] = state
    if exactly_once:
        ckpt.complete.add(rollout_id)
    if sink.enabled:
        sink.emit(ev.CHECKPOINT_SAVED, rollout_id=rollout_id, part="data_source", state=state)


@dataclass(frozen=True)
class Loaded:
    """What a life starts from: ``rollout_id`` None means no checkpoint (start at 0)."""

    rollout_id: int | None
    model: dict[str, Any] | None
    data_source: dict[str, Any] | None

    @property
    def start_rollout_id(self) -> int:
        return 0 if self.rollout_id is None else self.rollout_id + 1

    @property
    def version(self) -> int | None:
        return None if self.model is None else int(self.model["version"])


def find(ckpt: CheckpointDir, *, exactly_once: bool) -> Loaded:
    """The checkpoint a new life loads: the latest model (upstream) or the latest complete one."""
    rid = ckpt.latest_complete() if exactly_once else ckpt.latest_model()
    if rid is None:
        return Loaded(None, None, None)
    return Loaded(rid, ckpt.models[rid], ckpt.data_sources.get(rid))


def emit_loaded(loaded: Loaded, sink: Any) -> None:
    if not sink.enabled or loaded.rollout_id is None:
        return
    sink.emit(ev.CHECKPOINT_LOADED, rollout_id=loaded.rollout_id, part="model")
    if loaded.data_source is not None:
        sink.emit(ev.CHECKPOINT_LOADED, rollout_id=loaded.rollout_id, part="data_source", state=loaded.data_source)
