"""The resume sweep: every setting stopped at every save boundary and at seeded points
between them, resumed, and judged across lives (``harness.checking.invariants.resume``).

A *host* runs one case: ``host(case) -> LivesResult`` (the case's scenario as lives, one
per stop, the last run to ``--num-rollout``; the trace follows ``miles_async_core.events``
with lives). ``core_host`` runs the core's drivers in virtual time (``run_lives``); another
host (upstream Miles' own drivers) only has to return the same kind of result.

``settings(exactly_once)`` lists the settings: each driver (``train.py``, one-step and
fully-async ``train_async.py``), each pause mode (async), each unused-samples handler
(fully async, with a staleness bound so the handler is called), with and without
over-sampling and ``--partial-rollout`` (sync and one-step), and with
``--update-weights-interval 2`` (async). ``stop_points(config)`` lists
the stops of a setting: a crash right after each save that is not the last, and the seeded
points between saves (``harness.sim.lives.STOP_LABELS``). ``sweep`` runs them; every
run is bounded by the scenario's watchdog. ``FAST`` is the subset the fast tier runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from harness.checking.invariants import check_all
from harness.checking.invariants.resume import resume_report
from harness.sim.engine import LengthDist, SimEngineConfig
from harness.sim.lives import LivesResult, StopPoint, run_lives
from harness.sim.scenario import Scenario
from harness.sim.trainer import SimTrainerConfig
from miles_async_core.config import AsyncConfig

NUM_ROLLOUT = 8
SAVE_INTERVAL = 2
RESUME_CHECKS = ("resume_exactly_once", "resume_rollout_once", "resume_versions")


@dataclass(frozen=True)
class ResumeCase:
    setting: str
    scenario: Scenario
    stops: tuple[StopPoint, ...]

    @property
    def name(self) -> str:
        return f"{self.setting} / {'+'.join(s.label for s in self.stops)}"


Host = Callable[[ResumeCase], LivesResult]


def core_host(case: ResumeCase) -> LivesResult:
    """The core's drivers on the simulated engine and trainer, in virtual time."""
    return run_lives(case.scenario, case.stops)


def _scenario(name: str, **config: Any) -> Scenario:
    base: dict[str, Any] = {
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 2,
        "num_rollout": NUM_ROLLOUT,
        "save_interval": SAVE_INTERVAL,
    }
    # long responses vary (a heavy tail), so what is in flight at a stop is the long part
    engine = SimEngineConfig(response_length=LengthDist(kind="lognormal", median=40.0, sigma=0.8))
    return Scenario(
        name=name,
        config=AsyncConfig(**{**base, **config}),
        engine=engine,
        trainer=SimTrainerConfig(step_base_s=3.0),
        max_new_tokens=128,
    )


def settings(exactly_once: bool = False) -> list[tuple[str, Scenario]]:
    """(name, scenario) of every setting the sweep stops and resumes."""
    ext = {"exactly_once_resume": True} if exactly_once else {}
    out: list[tuple[str, Scenario]] = []
    for over in (False, True):
        for partial in (False, True):
            tag = ("+os" if over else "") + ("+partial" if partial else "")
            extra = {"over_sampling_batch_size": 8} if over else {}
            out.append((f"sync{tag}", _scenario(f"sync{tag}", driver="train", partial_rollout=partial, **extra, **ext)))
            for mode in ("retract", "abort", "in_place"):
                name = f"one-step/{mode}{tag}"
                out.append((name, _scenario(name, pause_generation_mode=mode, partial_rollout=partial, **extra, **ext)))
    for mode in ("retract", "abort", "in_place"):
        for handler in ("drop", "retry"):
            name = f"fully-async/{mode}/{handler}"
            out.append(
                (
                    name,
                    _scenario(
                        name,
                        fully_async=True,
                        pause_generation_mode=mode,
                        max_weight_staleness=1,
                        async_unused_samples_handler=handler,
                        **ext,
                    ),
                )
            )
    # --update-weights-interval 2: the look-ahead generate is awaited only every other step
    out.append(("one-step/retract+k2", _scenario("one-step/retract+k2", update_weights_interval=2, **ext)))
    out.append(
        (
            "fully-async/retract/retry+k2",
            _scenario(
                "fully-async/retract/retry+k2",
                fully_async=True,
                max_weight_staleness=2,
                update_weights_interval=2,
                async_unused_samples_handler="retry",
                **ext,
            ),
        )
    )
    return out


def stop_points(config: AsyncConfig) -> list[StopPoint]:
    """A crash right after each save but the last, and the seeded points between the saves
    of rollouts 3 and 5 (with ``SAVE_INTERVAL`` 2): rollout 4's training step, the pause and
    the weight load after it, rollout 5's generation (its drain, fully async) while rollout 4
    trains, the gap between rollout 5's model and data source saves, and a planned exit
    after a sentinel save at rollout 4."""
    saves = [r for r in range(config.num_rollout) if (r + 1) % SAVE_INTERVAL == 0][:-1]
    out = [StopPoint("save_boundary", r) for r in saves]
    out += [StopPoint(at, 4) for at in ("mid_train", "during_pause", "mid_update")]
    out.append(StopPoint("mid_generation", 5))
    if config.fully_async:
        out.append(StopPoint("mid_drain", 5))
    out += [StopPoint("between_model_and_data_source", 5), StopPoint("planned_exit", 4, "planned")]
    return out


def cases(exactly_once: bool = False, *, only: Iterable[str] | None = None) -> list[ResumeCase]:
    wanted = set(only) if only is not None else None
    out = []
    for name, scenario in settings(exactly_once):
        if wanted is not None and name not in wanted:
            continue
        out += [ResumeCase(name, scenario, (stop,)) for stop in stop_points(scenario.config)]
    return out


# one of each driver, with the stops where upstream's semantics lose or duplicate
FAST = ("sync", "one-step/retract", "fully-async/retract/retry")


@dataclass
class SweepRow:
    case: ResumeCase
    reached: bool
    error: str | None
    lost: int = 0
    duplicated: int = 0
    mechanisms: dict[str, int] = field(default_factory=dict)
    lost_length: float | None = None
    trained_length: float | None = None
    failed_checks: list[str] = field(default_factory=list)  # every checker with a violation

    def to_dict(self) -> dict[str, Any]:
        return {
            "setting": self.case.setting,
            "stops": [s.label for s in self.case.stops],
            "reached": self.reached,
            "error": self.error,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "mechanisms": self.mechanisms,
            "lost_length_mean": self.lost_length,
            "trained_length_mean": self.trained_length,
            "failed_checks": self.failed_checks,
        }


def run_case(case: ResumeCase, host: Host = core_host) -> SweepRow:
    result = host(case)
    row = SweepRow(case, reached=all(result.reached), error=repr(result.error) if result.error else None)
    report = resume_report(result.events, case.scenario.config)
    if report is not None:
        row.lost, row.duplicated, row.mechanisms = len(report.lost), len(report.duplicated), report.mechanisms()
        row.lost_length, row.trained_length = report.lost_length_mean, report.trained_length_mean
    row.failed_checks = sorted(
        {v.invariant for v in check_all(result.events, case.scenario.config, complete=result.error is None)}
    )
    return row


def sweep(all_cases: Iterable[ResumeCase], host: Host = core_host) -> list[SweepRow]:
    return [run_case(c, host) for c in all_cases]


def summarize(rows: list[SweepRow]) -> list[dict[str, Any]]:
    """One line per setting: resumes, groups lost and duplicated (total and per resume),
    mechanisms, the length bias (mean response length of lost over trained groups), the
    resume checkers that failed, and stops never reached or runs that errored."""
    by: dict[str, list[SweepRow]] = {}
    for r in rows:
        by.setdefault(r.case.setting, []).append(r)
    out = []
    for setting, rs in by.items():
        mech: dict[str, int] = {}
        for r in rs:
            for k, v in r.mechanisms.items():
                mech[k] = mech.get(k, 0) + v
        lost = sum(r.lost for r in rs)
        lost_len = sum((r.lost_length or 0.0) * r.lost for r in rs) / lost if lost else None
        trained = [r.trained_length for r in rs if r.trained_length is not None]
        trained_len = sum(trained) / len(trained) if trained else None
        out.append(
            {
                "setting": setting,
                "resumes": len(rs),
                "lost": lost,
                "duplicated": sum(r.duplicated for r in rs),
                "lost_per_resume": lost / len(rs),
                "dup_per_resume": sum(r.duplicated for r in rs) / len(rs),
                "mechanisms": dict(sorted(mech.items())),
                "lost_length_mean": lost_len,
                "trained_length_mean": trained_len,
                "length_bias": (lost_len / trained_len) if lost_len is not None and trained_len else None,
                "resume_checks_failed": sorted({c for r in rs for c in r.failed_checks if c in RESUME_CHECKS}),
                "other_checks_failed": sorted({c for r in rs for c in r.failed_checks if c not in RESUME_CHECKS}),
                "not_reached": [r.case.name for r in rs if not r.reached],
                "errors": [r.case.name for r in rs if r.error],
            }
        )
    return out


def driver_of(setting: str) -> str:
    """``sync``, ``one-step`` or ``fully-async``: a setting's name up to its first ``/`` or ``+``."""
    return setting.split("/")[0].split("+")[0]


def summarize_by_stop(rows: list[SweepRow]) -> list[dict[str, Any]]:
    """One line per driver and stop point, over that driver's settings: what each kind of stop costs."""
    by: dict[tuple[str, str], list[SweepRow]] = {}
    for r in rows:
        by.setdefault((driver_of(r.case.setting), r.case.stops[0].at), []).append(r)
    out = []
    for (driver, at), rs in by.items():
        mech: dict[str, int] = {}
        for r in rs:
            for k, v in r.mechanisms.items():
                mech[k] = mech.get(k, 0) + v
        out.append(
            {
                "driver": driver,
                "stop": at,
                "resumes": len(rs),
                "lost": sum(r.lost for r in rs),
                "duplicated": sum(r.duplicated for r in rs),
                "lost_per_resume": sum(r.lost for r in rs) / len(rs),
                "dup_per_resume": sum(r.duplicated for r in rs) / len(rs),
                "mechanisms": dict(sorted(mech.items())),
            }
        )
    return out


def format_by_stop(summary: list[dict[str, Any]]) -> str:
    header = ("driver", "stop", "resumes", "lost/resume", "dup/resume", "mechanisms")
    lines = [
        (
            s["driver"],
            s["stop"],
            str(s["resumes"]),
            f"{s['lost_per_resume']:.2f}",
            f"{s['dup_per_resume']:.2f}",
            " ".join(f"{k}:{v}" for k, v in s["mechanisms"].items()) or "-",
        )
        for s in summary
    ]
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *lines])


def format_table(summary: list[dict[str, Any]]) -> str:
    header = ("setting", "resumes", "lost", "dup", "lost/resume", "mechanisms", "len lost/trained", "failed checks")
    lines = []
    for s in summary:
        bias = (
            "-"
            if s["length_bias"] is None
            else (f"{s['lost_length_mean']:.1f}/{s['trained_length_mean']:.1f} = x{s['length_bias']:.2f}")
        )
        mech = " ".join(f"{k}:{v}" for k, v in s["mechanisms"].items()) or "-"
        failed = ", ".join(s["resume_checks_failed"] + s["other_checks_failed"]) or "none"
        if s["errors"] or s["not_reached"]:
            failed += f" [{len(s['errors'])} errors, {len(s['not_reached'])} stops not reached]"
        lines.append(
            (
                s["setting"],
                str(s["resumes"]),
                str(s["lost"]),
                str(s["duplicated"]),
                f"{s['lost_per_resume']:.2f}",
                mech,
                bias,
                failed,
            )
        )
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *lines])


def with_config(case: ResumeCase, **changes: Any) -> ResumeCase:
    """The same case with config fields changed (e.g. the exactly-once extension on)."""
    scenario = dataclasses.replace(case.scenario, config=dataclasses.replace(case.scenario.config, **changes))
    return dataclasses.replace(case, scenario=scenario)
