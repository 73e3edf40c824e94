"""Where a life stops, and the one crash rule every host follows.

``Stop`` is the one vocabulary, named after upstream's save order (``train.py:L77-L91``,
``train_async.py:L95-L105``: the model's save, then ``rollout_manager.save``), each name
one moment on either host, relative to rollout ``rollout_id``:

* ``after_save``: both parts of the rollout's checkpoint written (its second
  ``checkpoint_saved``; the pinned tree's second is the data source's): a save boundary;
* ``between_saves``: the first of the rollout's two saves written (the pinned tree saves
  the model first), the other not: a half-written checkpoint;
* ``mid_data_save``: the data source's state of the rollout half-written (upstream: its
  ``.pt`` file cut in half; the core: a ``TornState`` part), the crash inside that write;
* ``mid_generation``: half the rollout's samples finished (``max(1, B*n // 2)``
  ``finished`` after its ``generate_start``, fully async its ``drain_start``);
* ``mid_drain``: the rollout's drain took its first group (``got``, fully async);
* ``mid_train``: the rollout's ``trained`` (its step has begun);
* ``during_pause`` / ``mid_update``: the first ``engine_pause`` / ``engine_version``
  after the rollout's ``trained``;
* ``planned_exit``: not a crash: a ``--save-trigger-sentinel`` save at the rollout, then
  ``--debug-exit-after-rollout`` ends the life after it.

The crash rule (``Crash``), the same for every host: the life dies at the event loop's
next step after the event ``StopWatcher`` matches. What the current step does
synchronously still happens and is recorded (a process dies between instructions), and
nothing after it: no later event is recorded, no later write reaches the checkpoint
folder. What a crash keeps is what was written by then. (``mid_data_save`` is the one
stop inside a write: the host cuts the file and dies there.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from miles_async_core import events as ev
from miles_async_core.errors import ConfigError


class Stop(StrEnum):
    AFTER_SAVE = "after_save"
    BETWEEN_SAVES = "between_saves"
    MID_DATA_SAVE = "mid_data_save"
    MID_GENERATION = "mid_generation"
    MID_DRAIN = "mid_drain"
    MID_TRAIN = "mid_train"
    DURING_PAUSE = "during_pause"
    MID_UPDATE = "mid_update"
    PLANNED_EXIT = "planned_exit"


# the spellings of the two modules this one replaces (harness.sim.lives, harness.upstream.lives)
RENAMED = {
    "save_boundary": Stop.AFTER_SAVE,
    "save": Stop.AFTER_SAVE,
    "between_model_and_data_source": Stop.BETWEEN_SAVES,
    "after_train": Stop.MID_TRAIN,
    "planned": Stop.PLANNED_EXIT,
}


def stop_named(at: str | Stop) -> Stop:
    """``at`` as a ``Stop``; an old or unknown spelling raises ``ConfigError`` naming the fix."""
    if isinstance(at, Stop):
        return at
    try:
        return Stop(at)
    except ValueError:
        pass
    allowed = ", ".join(s.value for s in Stop)
    if at in RENAMED:
        raise ConfigError(
            f"stop at={at!r} is now {RENAMED[at].value!r} (one stop vocabulary for the core and upstream, "
            f"harness.lives.stops). Fix: pass at={RENAMED[at].value!r}"
        ) from None
    raise ConfigError(f"stop at={at!r} is not one of {allowed}. Fix: pass one of them") from None


@dataclass(frozen=True)
class StopPoint:
    """A life ends at ``at`` of rollout ``rollout_id`` (a crash, or ``planned_exit``)."""

    at: Stop
    rollout_id: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "at", stop_named(self.at))
        if self.rollout_id < 0:
            raise ConfigError(
                f"stop {self.at.value}@{self.rollout_id}: rollout_id must be >= 0. Fix: name the rollout the stop "
                "is relative to"
            )

    @property
    def how(self) -> str:
        """``planned`` for ``planned_exit``, else ``crash`` (``life_end``'s ``how``)."""
        return "planned" if self.at is Stop.PLANNED_EXIT else "crash"

    @property
    def label(self) -> str:
        return f"{self.at.value}@{self.rollout_id}"


class StopWatcher:
    """Matches the event a crash ``StopPoint`` stops right after (the list in the module
    docstring), reading a trace that follows ``miles_async_core.events`` as it is recorded.
    ``mid_data_save`` and ``planned_exit`` match no event (the host makes them)."""

    def __init__(self, stop: StopPoint, config: Any) -> None:
        self.stop = stop
        self.half = max(1, config.rollout_batch_size * config.n_samples_per_prompt // 2)
        self.anchored = False
        self.count = 0

    def see(self, kind: str, fields: dict[str, Any]) -> bool:
        at, rid = self.stop.at, self.stop.rollout_id
        if at in (Stop.MID_DATA_SAVE, Stop.PLANNED_EXIT):
            return False
        if at in (Stop.AFTER_SAVE, Stop.BETWEEN_SAVES):
            if kind != ev.CHECKPOINT_SAVED or fields.get("rollout_id") != rid:
                return False
            # the parts in whatever order the tree saves them: the first written, then both
            self.count += 1
            return self.count == (2 if at is Stop.AFTER_SAVE else 1)
        if at is Stop.MID_TRAIN:
            return kind == ev.TRAINED and fields.get("rollout_id") == rid
        anchor = {
            Stop.MID_GENERATION: (ev.GENERATE_START, ev.DRAIN_START),
            Stop.MID_DRAIN: (ev.DRAIN_START,),
        }.get(at, (ev.TRAINED,))
        if not self.anchored:
            self.anchored = kind in anchor and fields.get("rollout_id") == rid
            return False
        target = {
            Stop.MID_GENERATION: ev.FINISHED,
            Stop.MID_DRAIN: ev.GOT,
            Stop.DURING_PAUSE: ev.ENGINE_PAUSE,
            Stop.MID_UPDATE: ev.ENGINE_VERSION,
        }[at]
        if kind == target:
            self.count += 1
            return at is not Stop.MID_GENERATION or self.count >= self.half
        return False


class Crash:
    """The crash rule for one life (module docstring): ``see`` each event as it is recorded;
    once the watcher matches, ``die`` runs at the loop's next step and ``dead`` is set, after
    which the host records and writes nothing more. ``stop=None`` or a stop that is not an
    event (``planned_exit``, ``mid_data_save``) never fires."""

    def __init__(self, stop: StopPoint | None, config: Any, die: Callable[[], None]) -> None:
        self.watcher = StopWatcher(stop, config) if stop is not None and stop.how == "crash" else None
        self.die = die
        self.dying = False
        self.dead = False

    def see(self, kind: str, fields: dict[str, Any]) -> bool:
        """Whether this event is the stop's (the life then dies at the loop's next step)."""
        if self.dying or self.watcher is None or not self.watcher.see(kind, fields):
            return False
        self.dying = True
        asyncio.get_running_loop().call_soon(self._die)
        return True

    def now(self) -> None:
        """Die inside the current step (a crash in the middle of a write, ``mid_data_save``)."""
        self.dying = self.dead = True

    def _die(self) -> None:
        self.dead = True
        self.die()
