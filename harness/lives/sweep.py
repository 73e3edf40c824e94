"""The resume sweep: every setting stopped at every save and at seeded points between saves,
resumed, and judged across lives (``harness.checking.invariants.resume``), on any host.

One scenario (``settings``), one list of stops (``stop_points``), one table (``format_table``):
a case runs the same on the core's host and on upstream's (``harness.lives.run.LifeHost``),
so their rows compare cell by cell. ``settings(exactly_once)``: each driver (``train.py``,
one-step and fully-async ``train_async.py``), each pause mode (async), each unused-samples
handler (fully async, with a staleness bound so the handler is called), with and without
over-sampling and ``--partial-rollout`` (sync and one-step), and with
``--update-weights-interval 2`` (async). ``stop_points(config)``: a crash right after each
save that is not the last, the three in one run (a run that resumes three times), and the
seeded points between saves (``harness.lives.stops.Stop``). A case a host refuses (a
setting upstream refuses at start-up, a stop the host cannot make) is listed, not run.
Every run is bounded by the scenario's watchdog. ``FAST`` is the subset the fast tier runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.checking.invariants import check_all
from harness.checking.invariants.resume import resume_report
from harness.lives.core import CoreHost
from harness.lives.run import LifeHost, run_lives
from harness.lives.stops import Stop, StopPoint
from harness.sim.engine import LengthDist, SimEngineConfig
from harness.sim.scenario import Scenario
from harness.sim.trainer import SimTrainerConfig
from miles_async_core.config import AsyncConfig

NUM_ROLLOUT = 8
SAVE_INTERVAL = 2
RESUME_CHECKS = ("resume_exactly_once", "resume_rollout_once", "resume_versions")
# the table's stop columns, in the order a rollout meets them
STOP_COLUMNS = tuple(Stop)


@dataclass(frozen=True)
class ResumeCase:
    setting: str
    scenario: Scenario
    stops: tuple[StopPoint, ...]

    @property
    def label(self) -> str:
        return "+".join(s.label for s in self.stops)

    @property
    def name(self) -> str:
        return f"{self.setting} / {self.label}"


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
            fully = {"fully_async": True, "pause_generation_mode": mode, "max_weight_staleness": 1}
            out.append((name, _scenario(name, **fully, async_unused_samples_handler=handler, **ext)))
    # --update-weights-interval 2: the look-ahead generate is awaited only every other step
    out.append(("one-step/retract+k2", _scenario("one-step/retract+k2", update_weights_interval=2, **ext)))
    k2 = {"fully_async": True, "max_weight_staleness": 2, "update_weights_interval": 2}
    name = "fully-async/retract/retry+k2"
    out.append((name, _scenario(name, **k2, async_unused_samples_handler="retry", **ext)))
    return out


def stop_points(config: AsyncConfig) -> list[tuple[StopPoint, ...]]:
    """The stops of one setting, one run each: a crash right after each save but the last,
    the three in one run, and the seeded points between the saves of rollouts 3 and 5 (with
    ``SAVE_INTERVAL`` 2): rollout 4's training step, the pause and the weight load after
    it, rollout 5's generation (its drain, fully async) while rollout 4 trains, rollout 5's
    half-written checkpoint (between its two saves, and inside the data source's), and a
    planned exit after a sentinel save at rollout 4."""
    saves = [r for r in range(config.num_rollout) if (r + 1) % SAVE_INTERVAL == 0][:-1]
    out: list[tuple[StopPoint, ...]] = [(StopPoint(Stop.AFTER_SAVE, r),) for r in saves]
    out.append(tuple(StopPoint(Stop.AFTER_SAVE, r) for r in saves))
    out += [(StopPoint(at, 4),) for at in (Stop.MID_TRAIN, Stop.DURING_PAUSE, Stop.MID_UPDATE)]
    out.append((StopPoint(Stop.MID_GENERATION, 5),))
    if config.fully_async:
        out.append((StopPoint(Stop.MID_DRAIN, 5),))
    out += [(StopPoint(Stop.BETWEEN_SAVES, 5),), (StopPoint(Stop.MID_DATA_SAVE, 5),)]
    out.append((StopPoint(Stop.PLANNED_EXIT, 4),))
    return out


def cases(exactly_once: bool = False, *, only: Iterable[str] | None = None) -> list[ResumeCase]:
    wanted = set(only) if only is not None else None
    out = []
    for name, scenario in settings(exactly_once):
        if wanted is not None and name not in wanted:
            continue
        out += [ResumeCase(name, scenario, stops) for stops in stop_points(scenario.config)]
    return out


# one of each driver, with the stops where upstream's semantics lose or duplicate
FAST = ("sync", "one-step/retract", "fully-async/retract/retry")


@dataclass
class Resume:
    """One resume of a case: the stop before it, what it lost and trained twice (``None``
    when the resumed life failed to start), and why it failed."""

    at: str
    lost: int | None
    duplicated: int | None
    failed: str | None = None


@dataclass
class SweepRow:
    case: ResumeCase
    host: str
    refused: str | None = None  # why the host did not run the case
    reached: bool = False
    error: str | None = None  # what no stop explains: a watchdog trip, a harness failure
    resume_failed: str | None = None  # a resume that fails on a torn state file (a finding, not an error)
    lost: int = 0
    duplicated: int = 0
    mechanisms: dict[str, int] = field(default_factory=dict)
    lost_length: float | None = None
    trained_length: float | None = None
    failed_checks: list[str] = field(default_factory=list)  # every checker with a violation
    resumes: list[Resume] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "setting": self.case.setting,
            "host": self.host,
            "stops": [s.label for s in self.case.stops],
            "refused": self.refused,
            "reached": self.reached,
            "error": self.error,
            "resume_failed": self.resume_failed,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "mechanisms": self.mechanisms,
            "lost_length_mean": self.lost_length,
            "trained_length_mean": self.trained_length,
            "failed_checks": self.failed_checks,
            "resumes": [dataclasses.asdict(r) for r in self.resumes],
        }


def run_case(case: ResumeCase, host: LifeHost | None = None) -> SweepRow:
    host = host if host is not None else CoreHost()
    row = SweepRow(case, host.name)
    row.refused = host.refuses(case.scenario, case.stops)
    if row.refused:
        return row
    result = run_lives(case.scenario, case.stops, host)
    row.reached = all(result.reached)
    if result.error is not None:
        torn = len(result.ended) >= 2 and case.stops[len(result.ended) - 2].at is Stop.MID_DATA_SAVE
        if torn:  # the resumed life raised loading the state file the crash cut short
            first = str(result.error).split(". ")[0]  # torch's message goes on for lines
            row.resume_failed = f"{type(result.error).__name__}: {first}"
        else:
            row.error = repr(result.error)
    report = resume_report(result.events, case.scenario.config)
    if report is not None and row.resume_failed is None:
        row.lost, row.duplicated, row.mechanisms = len(report.lost), len(report.duplicated), report.mechanisms()
        row.lost_length, row.trained_length = report.lost_length_mean, report.trained_length_mean
        row.resumes = [Resume(case.stops[r.life - 1].at.value, r.lost, r.duplicated) for r in report.resumes]
    elif row.resume_failed is not None:
        row.resumes = [Resume(s.at.value, None, None, row.resume_failed) for s in case.stops]
    row.failed_checks = sorted(
        {v.invariant for v in check_all(result.events, case.scenario.config, complete=result.error is None)}
    )
    if row.resume_failed is not None:
        row.failed_checks = []  # the failed life's trace is a start-up's, not a resume's to judge
    return row


def sweep(all_cases: Iterable[ResumeCase], host: LifeHost | None = None) -> list[SweepRow]:
    host = host if host is not None else CoreHost()
    return [run_case(c, host) for c in all_cases]


def summarize(rows: list[SweepRow]) -> list[dict[str, Any]]:
    """One line per setting and host: resumes, groups lost and duplicated (total and per
    resume), per stop the groups lost and duplicated per resume, the mechanisms, the length
    bias (mean response length of lost over trained groups), the checkers that failed, the
    failed resumes, the cases not run, and stops never reached or runs that errored."""
    by: dict[tuple[str, str], list[SweepRow]] = {}
    for r in rows:
        by.setdefault((r.case.setting, r.host), []).append(r)
    out = []
    for (setting, host), rs in by.items():
        ran = [r for r in rs if r.refused is None]
        counted = [r for r in ran if r.resume_failed is None]
        resumes = sum(len(r.case.stops) for r in counted)
        mech: dict[str, int] = {}
        for r in counted:
            for k, v in r.mechanisms.items():
                mech[k] = mech.get(k, 0) + v
        lost, dup = sum(r.lost for r in counted), sum(r.duplicated for r in counted)
        lost_len = sum((r.lost_length or 0.0) * r.lost for r in counted) / lost if lost else None
        trained = [r.trained_length for r in counted if r.trained_length is not None]
        trained_len = sum(trained) / len(trained) if trained else None
        out.append(
            {
                "setting": setting,
                "host": host,
                "resumes": resumes,
                "lost": lost,
                "duplicated": dup,
                "lost_per_resume": lost / resumes if resumes else None,
                "dup_per_resume": dup / resumes if resumes else None,
                "by_stop": _by_stop(rs),
                "mechanisms": dict(sorted(mech.items())),
                "lost_length_mean": lost_len,
                "trained_length_mean": trained_len,
                "length_bias": (lost_len / trained_len) if lost_len is not None and trained_len else None,
                "resume_checks_failed": sorted({c for r in ran for c in r.failed_checks if c in RESUME_CHECKS}),
                "other_checks_failed": sorted({c for r in ran for c in r.failed_checks if c not in RESUME_CHECKS}),
                "resumes_failed": {r.case.label: r.resume_failed for r in ran if r.resume_failed},
                "not_run": {r.case.label: r.refused for r in rs if r.refused},
                "not_reached": [r.case.name for r in ran if not r.reached],
                "errors": [r.case.name for r in ran if r.error],
            }
        )
    return out


def _by_stop(rows: Sequence[SweepRow]) -> dict[str, dict[str, Any]]:
    """Per stop: resumes, groups lost and duplicated per resume (over the resumes that
    started), resumes that failed, whether the host refused it."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        for i, stop in enumerate(r.case.stops):
            cell = out.setdefault(stop.at.value, {"resumes": 0, "lost": 0, "duplicated": 0, "failed": 0, "refused": 0})
            if r.refused:
                cell["refused"] += 1
                continue
            res = r.resumes[i] if i < len(r.resumes) else None
            if res is None or res.lost is None:
                cell["failed"] += 1
                continue
            cell["resumes"] += 1
            cell["lost"] += res.lost
            cell["duplicated"] += res.duplicated or 0
    return {at: out[at] for at in (s.value for s in STOP_COLUMNS) if at in out}


def _cell(c: dict[str, Any] | None) -> str:
    if c is None:
        return ""
    if c["resumes"]:
        return f"{c['lost'] / c['resumes']:.3g}/{c['duplicated'] / c['resumes']:.3g}"
    if c["failed"]:
        return "failed"
    return "not run"


def format_table(summary: list[dict[str, Any]]) -> str:
    """One line per setting and host; the stop columns read ``lost/duplicated`` per resume
    at that stop (``failed``: the resume raised; ``not run``: the host refused the stop)."""
    stops = [s.value for s in STOP_COLUMNS if any(s.value in x["by_stop"] for x in summary)]
    header = ("setting", "host", "resumes", "lost", "dup", "lost/resume", *stops, "mechanisms", "len lost/trained")
    header += ("failed checks",)
    lines = []
    for s in summary:
        if not s["resumes"] and not s["resumes_failed"]:
            continue  # every case refused: listed below the table
        bias = (
            "-"
            if s["length_bias"] is None
            else (f"{s['lost_length_mean']:.1f}/{s['trained_length_mean']:.1f} = x{s['length_bias']:.2f}")
        )
        mech = " ".join(f"{k}:{v}" for k, v in s["mechanisms"].items()) or "-"
        failed = ", ".join(s["resume_checks_failed"] + s["other_checks_failed"]) or "none"
        if s["errors"] or s["not_reached"]:
            failed += f" [{len(s['errors'])} errors, {len(s['not_reached'])} stops not reached]"
        per = "-" if s["lost_per_resume"] is None else f"{s['lost_per_resume']:.2f}"
        cells = [_cell(s["by_stop"].get(at)) for at in stops]
        lines.append(
            (s["setting"], s["host"], str(s["resumes"]), str(s["lost"]), str(s["duplicated"]), per, *cells, mech, bias)
            + (failed,)
        )
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *lines])


def format_notes(summary: list[dict[str, Any]]) -> str:
    """What the table leaves out, one line per host and reason: the settings or stops a host
    did not run (and why), the resumes that failed."""
    every = {x["setting"] for x in summary}
    ran = {(x["host"], x["setting"]) for x in summary if x["resumes"] or x["resumes_failed"]}
    groups: dict[tuple[str, str, str], list[str]] = {}
    for s in summary:
        whole = not s["resumes"] and not s["resumes_failed"] and s["not_run"]
        if whole:
            groups.setdefault((s["host"], "not run", next(iter(s["not_run"].values()))), []).append(s["setting"])
            continue
        for label, why in s["not_run"].items():
            groups.setdefault((s["host"], f"{label} not run", why), []).append(s["setting"])
        for label, why in s["resumes_failed"].items():
            groups.setdefault((s["host"], f"{label}: resume failed", why), []).append(s["setting"])
    out = []
    for (host, what, why), names in groups.items():
        on_host = {setting for h, setting in ran if h == host}
        where = ", ".join(names)
        if len(names) > 1 and set(names) in (every, on_host):
            where = "every setting" if set(names) == every else "every setting it ran"
        out.append(f"{host}: {where}: {what}, {why}")
    return "\n".join(out)


def with_config(case: ResumeCase, **changes: Any) -> ResumeCase:
    """The same case with config fields changed (e.g. the exactly-once extension on)."""
    scenario = dataclasses.replace(case.scenario, config=dataclasses.replace(case.scenario.config, **changes))
    return dataclasses.replace(case, scenario=scenario)
