"""What ``miles-harness run`` writes: ``results.json`` (every repeat's rows, the
aggregated table, checks, losses, the first repeat's timeline and per-step history, as
``harness.results.run_extras.RunExtras``), the Chrome-trace timeline of the first repeat,
and the PNGs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.main_job.report import engine_rows
from harness.main_job.result import ModeResult
from harness.main_job.rows import aggregate_repeats
from harness.main_job.spec import RunSpec
from harness.results.mode_rows import ModeRow
from harness.results.run_extras import (
    EngineTable,
    GapStep,
    JSONDict,
    ModeTimeline,
    PhaseSpan,
    RunExtras,
)
from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig


def phases(r: ModeResult) -> list[PhaseSpan]:
    """The mode's timeline, as ``harness.measure.overlap`` pairs and clips the phases."""
    from harness.measure.overlap import phase_spans

    return [(str(side), str(phase), float(a), float(b)) for side, phase, a, b in phase_spans(r.events, r.window)]


def _step_times(r: ModeResult) -> list[float]:
    ends = [e.t for e in r.events if e.kind == ev.PHASE_END and e["side"] == "train" and e["phase"] == "training"]
    starts = [r.window[0]] + ends[:-1]
    return [b - a for a, b in zip(starts, ends)]


def _tokens_per_s(r: ModeResult) -> list[float]:
    tokens = [h.get("tokens", 0) for h in r.history]
    return [t / s for t, s in zip(tokens, _step_times(r)) if s > 0]


def run_extras(
    spec: RunSpec,
    runs: dict[str, list[ModeResult]],
    repeat_rows: dict[str, list[ModeRow]],
    *,
    telemetry: JSONDict | None = None,
    total_s: float | None = None,
) -> RunExtras:
    """The results file's ``extra`` for these runs: the aggregated table, every repeat's
    rows and checks, and the first repeat's timeline, history and gap decomposition."""
    first = {m: rs[0] for m, rs in runs.items() if rs}
    table = {rs[0].mode: aggregate_repeats(rs) for rs in repeat_rows.values() if rs}
    modes = {
        m: ModeTimeline.of(phases(first[m]), [a for h in first[m].history for a in h.get("age_versions", [])], row)
        for m, row in table.items()
    }
    gap_mode = "one-step" if "one-step" in first else next(iter(first), None)
    gap_steps = (
        []
        if gap_mode is None
        else [
            GapStep(
                step=h["rollout_id"],
                kernel=h["gap/kernel_abs_mean"],
                staleness=h["gap/staleness_abs_mean"],
                total=h["gap/total_abs_mean"],
            )
            for h in first[gap_mode].history
            if "gap/total_abs_mean" in h
        ]
    )
    engines = None
    if spec.layout == "ray":
        rows = engine_rows(runs)
        engines = {m: EngineTable(rows=rows.get(m, []), stats=r.engine_stats) for m, r in first.items()}
    return RunExtras(
        modes=modes,
        table=table,
        repeats={m: list(rs) for m, rs in repeat_rows.items()},
        checks={m: [x.checks for x in rs] for m, rs in repeat_rows.items()},
        per_step={m: r.history for m, r in first.items()},
        gap_steps=gap_steps,
        gap_mode=gap_mode if gap_steps else None,
        gap_summary={m: r.gap_summary for m, r in first.items() if r.gap_summary},
        telemetry=telemetry,
        total_wall_s=total_s,
        engines=engines,
    )


def host_record(runs: dict[str, list[ModeResult]]) -> JSONDict | None:
    """The results file's ``host``: each run's share of the machine (``mode#repeat``), and
    whether any was on a busy host (``harness.measure.host_load.summary``)."""
    from harness.measure.host_load import summary

    windows = {f"{m}#{i}": r.host for m, rs in runs.items() for i, r in enumerate(rs, 1) if r.host is not None}
    return summary(windows) if windows else None


def write_outputs(
    out: Path,
    spec: RunSpec,
    base: AsyncConfig,
    runs: dict[str, list[ModeResult]],
    repeat_rows: dict[str, list[ModeRow]],
    *,
    plots: bool,
    telemetry: JSONDict | None = None,
    total_s: float | None = None,
) -> list[Path]:
    """results.json (benchmarks: step seconds, tokens per second and, per repeat, the
    overlapped modes' speedup, overlap efficiency and both-busy fraction; ``extra``:
    ``run_extras``; ``host``: ``host_record``), the timeline of the first repeat, and the PNGs."""
    from harness.results.chrome_trace import write_chrome_trace
    from harness.results.schema import Results

    first = {m: rs[0] for m, rs in runs.items() if rs}
    config = {
        "spec": dataclasses.asdict(spec),
        "base": base.to_dict(),
        "modes": {m: r.config.resolved_dict() for m, r in first.items()},
    }
    res = Results.new(
        "run",
        config,
        definition_common={
            "task": spec.task,
            "model": spec.model,
            "layout": spec.layout,
            "steps": spec.steps,
            "repeats": spec.repeats,
        },
    )
    extras = run_extras(spec, runs, repeat_rows, telemetry=telemetry, total_s=total_s)
    for mode in extras.table:
        times = [t for r in runs[mode] for t in _step_times(r)]
        if times:
            res.add_benchmark(f"{mode}/step_s", times, unit="s", higher_is_better=False)
        tps = [t for r in runs[mode] for t in _tokens_per_s(r)]
        if tps:
            res.add_benchmark(f"{mode}/tokens_per_s", tps, unit="tokens/s", higher_is_better=True)
        for key, better in (("speedup", True), ("overlap_efficiency", True), ("both_busy_fraction", True)):
            values = [getattr(x, key) for x in repeat_rows[mode] if getattr(x, key) is not None]
            if values and mode != "sync":  # one sample per repeat
                res.add_benchmark(f"{mode}/{key}", values, unit="ratio", higher_is_better=better)
    res.extra.update(extras.to_dict())
    host = host_record(runs)
    if host is not None:
        res.host = host
    paths = [
        res.write(out / "results.json"),
        write_chrome_trace(
            {m: [list(p) for p in t.phases] for m, t in extras.modes.items()}, out / "timeline.trace.json"
        ),
    ]
    if plots:
        from harness.results.plots import make_report

        paths += make_report([(str(out / "results.json"), res)], out)
    return paths
