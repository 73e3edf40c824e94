"""A run as a sequence of lives, on any host: ``run_lives(scenario, stops, host)``.

A *host* runs one life of a scenario at a time on a checkpoint folder that outlives it
(``LifeHost``): the core's drivers in virtual time (``harness.lives.core.CoreHost``) or
upstream Miles' own drivers with upstream's own start-up, save and load
(``harness.upstream.lives.UpstreamHost``). ``run_lives`` is the one loop: life ``i`` ends
at ``stops[i]`` (the crash rule of ``harness.lives.stops``), the next starts as Miles
starts after a failure (``--load``, ``start_rollout_id`` from the trainer's checkpoint, the
data source's ``load``), and the last runs to ``--num-rollout``. A life that ends any
other way ends the run: one that raised (the result's ``error``: a watchdog trip, a
resume that fails) or one that ran to ``--num-rollout`` before its stop fired (that stop
is not ``reached``).

The joined trace follows the lives schema of ``miles_async_core/events.py``: every event
carries ``life``, times run on from one life to the next, each life opens with
``life_start`` and ends with ``life_end``. Same scenario, stops and host: the same trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness.lives.stops import StopPoint
from harness.sim.scenario import Scenario
from harness.trace import Event
from miles_async_core.errors import ConfigError

LIFE_ENDS = ("crash", "planned", "completed", "error")


@dataclass(frozen=True)
class LifeEnd:
    """How one life ended (``how``: one of ``LIFE_ENDS``), with what it raised and what the
    host keeps of it (``run``: e.g. upstream's ``UpstreamRunResult``)."""

    how: str
    error: BaseException | None = None
    run: Any = None


class Lives(Protocol):
    """One run's lives on a host: the checkpoint folder and the joined trace they share."""

    @property
    def events(self) -> list[Event]: ...

    def life(self, number: int, stop: StopPoint | None) -> LifeEnd: ...


class LifeHost(Protocol):
    """Runs lives. ``name`` heads the sweep's rows; ``refuses(scenario, stops)`` says why the
    host does not run a case (a setting upstream refuses at start-up, a stop the host cannot
    make), else ``None``; ``lives(scenario)`` opens one run's checkpoint folder and trace."""

    name: str

    def refuses(self, scenario: Scenario, stops: Sequence[StopPoint]) -> str | None: ...

    def lives(self, scenario: Scenario) -> AbstractContextManager[Lives]: ...


@dataclass
class LivesResult:
    scenario: Scenario
    stops: tuple[StopPoint, ...]
    events: list[Event]
    ended: list[str]  # per life run: "crash:<at>", "planned", "completed" or "error:<what>"
    error: BaseException | None = None  # anything but the stops themselves: a watchdog trip, a failed resume
    runs: list[Any] = field(default_factory=list)  # per life: what the host keeps of it (LifeEnd.run)

    @property
    def reached(self) -> list[bool]:
        """Per stop: whether its life stopped there (else that life ran to its end, or raised)."""
        return [
            i < len(self.ended) and self.ended[i].split(":")[0] in ("crash", "planned") for i in range(len(self.stops))
        ]


def run_lives(scenario: Scenario, stops: Sequence[StopPoint], host: LifeHost) -> LivesResult:
    """Run ``scenario`` as ``len(stops) + 1`` lives on ``host``."""
    stops = tuple(stops)
    if scenario.config.save_interval is None and not any(s.how == "planned" for s in stops):
        raise ConfigError(
            "run_lives: config.save_interval is None, so no life ever saves and every resume starts "
            "over. Fix: set save_interval (--save-interval) to 1 or more"
        )
    ended: list[str] = []
    runs: list[Any] = []
    error: BaseException | None = None
    with host.lives(scenario) as lives:
        for number, stop in enumerate([*stops, None]):
            end = lives.life(number, stop)
            runs.append(end.run)
            if end.how == "error":
                error = end.error
                ended.append(f"error:{type(error).__name__}: {error}")
                break
            ended.append(f"crash:{stop.label}" if end.how == "crash" and stop is not None else end.how)
            if end.how == "completed":
                break
        events = lives.events
    return LivesResult(scenario, stops, events, ended, error, runs)
