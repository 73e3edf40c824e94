"""PNG plots from results files (matplotlib, Agg backend).

Contract. ``make_report(results, out_dir)`` draws every plot whose data are present and
returns the files written plus one line per plot skipped; it never raises on missing
or malformed ``extra`` data (a plot it cannot draw is skipped with the reason). Every
figure has a title, axis labels with units, and a legend when it shows more than one
series.

The plots read these keys of a results document's ``extra`` section (written by the
``run`` and ``gap`` commands):

``extra["modes"]``: ``{mode_name: {...}}`` with, per mode, any of
    ``phases``: ``[[side, phase, t0_s, t1_s], ...]``; side in ``rollout``/``train``,
    phase in ``generating``/``training``/``weight_sync``/``waiting``, times in seconds
    from the start of the run  -> ``<file>_phase_timeline.png`` (one panel per mode);
    ``sample_ages``: ``[int, ...]``, one per trained sample, in weight versions behind
    the trainer  -> ``<file>_sample_ages.png`` (grouped bars, share of samples);
    ``speedup`` (x, against sync), ``overlap_efficiency`` (0..1), ``wall_s``
    -> ``<file>_mode_summary.png`` (one bar panel per quantity present).
``extra["gap_steps"]``: ``[{"step": int, "kernel": float, "staleness": float,
    "total": float}, ...]`` -> ``<file>_gap_steps.png``; the y label is
    ``extra["gap_unit"]`` when given, else "mean |log-prob gap| (nats/token)".

Across files: ``metric_history.png``, each benchmark's median (with its q1..q3 band)
against the run's ``created_utc``; in the benchmark's unit when all share one unit,
otherwise normalised to each benchmark's first run. Needs at least two files.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from harness.results.schema import Results  # noqa: E402
from harness.typing_aliases import JSONDict, JSONValue  # noqa: E402

SIDES = ("rollout", "train")
PHASE_COLORS = {
    "generating": "#4C72B0",
    "training": "#DD8452",
    "weight_sync": "#C44E52",
    "waiting": "#C8C8C8",
}
DPI = 110
DEFAULT_GAP_UNIT = "mean |log-prob gap| (nats/token)"


class Skip(Exception):
    """A plot cannot be drawn from these data; the message says why."""


def _step_of(row: JSONValue) -> float:
    """Sort key of an ``extra.gap_steps`` row: its step, 0 where it has none (the loop
    that reads the rows then names the bad one)."""
    step = row.get("step", 0) if isinstance(row, dict) else 0
    return float(step) if isinstance(step, (int, float)) else 0.0


def _num(v: object, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise Skip(f"{where} is {v!r}, not a finite number")
    return float(v)


def _modes(res: Results, key: str, what: str) -> JSONDict:
    modes = res.extra.get("modes")
    if not isinstance(modes, dict) or not modes:
        raise Skip(f"no {what}")
    found = {name: m[key] for name, m in modes.items() if isinstance(m, dict) and m.get(key) is not None}
    if not found:
        raise Skip(f"no {what}")
    return found


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


# --- per-file plots -----------------------------------------------------------------------


def plot_phase_timeline(res: Results, label: str, path: Path) -> Path:
    modes = _modes(res, "phases", "extra.modes.*.phases")
    bars: dict[str, list[tuple[str, str, float, float]]] = {}
    for mode, phases in modes.items():
        rows = []
        for i, item in enumerate(phases if isinstance(phases, list) else [None]):
            where = f"extra.modes.{mode}.phases[{i}]"
            if not isinstance(item, (list, tuple)) or len(item) != 4:
                raise Skip(f"{where} is {item!r}, expected [side, phase, t0_s, t1_s]")
            side, phase = item[0], item[1]
            if side not in SIDES or phase not in PHASE_COLORS:
                raise Skip(f"{where} has side {side!r} / phase {phase!r}; allowed {SIDES} / {tuple(PHASE_COLORS)}")
            t0, t1 = _num(item[2], where + "[2]"), _num(item[3], where + "[3]")
            if t1 < t0:
                raise Skip(f"{where} ends before it starts ({t0} > {t1})")
            rows.append((side, phase, t0, t1))
        if rows:
            bars[mode] = rows
    if not bars:
        raise Skip("no extra.modes.*.phases entries")
    fig, axes = plt.subplots(len(bars), 1, figsize=(10, 1.0 + 1.5 * len(bars)), sharex=True, squeeze=False)
    used: set[str] = set()
    for ax, (mode, rows) in zip(axes[:, 0], bars.items()):
        for y, side in enumerate(SIDES):
            for phase in PHASE_COLORS:
                spans = [(t0, t1 - t0) for s, p, t0, t1 in rows if s == side and p == phase]
                if spans:
                    ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=PHASE_COLORS[phase], edgecolor="none")
                    used.add(phase)
        ax.set_yticks(range(len(SIDES)), list(SIDES))
        ax.set_ylim(-0.6, len(SIDES) - 0.4)
        ax.invert_yaxis()
        timelines = res.extra["modes"]  # an object: _modes read the phases from it
        timeline = timelines.get(mode) if isinstance(timelines, dict) else None
        wall = timeline.get("wall_s") if isinstance(timeline, dict) else None
        suffix = f" (wall {wall:.3g} s)" if isinstance(wall, (int, float)) and not isinstance(wall, bool) else ""
        ax.set_title(f"{mode}{suffix}", fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("time since start of run (s)")
    handles = [Patch(facecolor=PHASE_COLORS[p], label=p) for p in PHASE_COLORS if p in used]
    fig.legend(handles=handles, loc="upper right", ncols=len(handles), fontsize=9, frameon=False)
    fig.suptitle(f"Phase timeline per mode: {label}", x=0.01, ha="left", fontsize=11)
    return _save(fig, path)


def plot_sample_ages(res: Results, label: str, path: Path) -> Path:
    modes = _modes(res, "sample_ages", "extra.modes.*.sample_ages")
    ages: dict[str, list[int]] = {}
    for mode, found in modes.items():
        items = found if isinstance(found, list) else [None]
        values = [a for a in items if isinstance(a, int) and not isinstance(a, bool) and a >= 0]
        if len(values) != len(items):
            raise Skip(f"extra.modes.{mode}.sample_ages is not a list of non-negative integers")
        if values:
            ages[mode] = values
    if not ages:
        raise Skip("no non-empty extra.modes.*.sample_ages")
    top = max(max(v) for v in ages.values())
    width = 0.8 / len(ages)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 + 0.6 * (top + 1) * len(ages) ** 0.5), 4))
    for i, (mode, mode_ages) in enumerate(ages.items()):
        xs = [a + (i - (len(ages) - 1) / 2) * width for a in range(top + 1)]
        share = [100.0 * mode_ages.count(a) / len(mode_ages) for a in range(top + 1)]
        ax.bar(xs, share, width=width, label=f"{mode} (n={len(mode_ages)})")
    ax.set_xticks(range(top + 1))
    ax.set_ylim(0, 118)  # headroom so the legend never covers a 100% bar
    ax.set_xlabel("sample age at training (weight versions behind)")
    ax.set_ylabel("share of trained samples (%)")
    ax.set_title(f"Sample age per mode: {label}")
    ax.grid(axis="y", alpha=0.3)
    if len(ages) > 1:
        ax.legend()
    return _save(fig, path)


_SUMMARY = (
    ("speedup", "speedup vs sync (x)", 1.0),
    ("overlap_efficiency", "overlap efficiency (%)", 100.0),
    ("wall_s", "wall time (s)", 1.0),
)


def plot_mode_summary(res: Results, label: str, path: Path) -> Path:
    modes = res.extra.get("modes")
    if not isinstance(modes, dict) or not modes:
        raise Skip("no extra.modes")
    panels = []
    for key, ylabel, scale in _SUMMARY:
        vals = {
            m: _num(d[key], f"extra.modes.{m}.{key}") * scale
            for m, d in modes.items()
            if isinstance(d, dict) and d.get(key) is not None
        }
        if vals:
            panels.append((key, ylabel, vals))
    if not panels:
        raise Skip("no extra.modes.*.speedup / overlap_efficiency / wall_s")
    n_modes = max(len(v) for _, _, v in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(1.5 + len(panels) * (1.2 + 0.9 * n_modes), 4), squeeze=False)
    for ax, (key, ylabel, vals) in zip(axes[0], panels):
        bars = ax.bar(list(vals), list(vals.values()), color="#4C72B0")
        ax.bar_label(bars, fmt="%.3g", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_xlabel("mode")
        ax.set_title(key)
        ax.margins(y=0.25)
        ax.tick_params(axis="x", labelrotation=20)
        if key == "speedup":
            ax.axhline(1.0, color="#444444", linestyle="--", linewidth=1, label="1x (sync)")
            ax.legend(fontsize=8, loc="upper right")
        if key == "overlap_efficiency":
            ax.set_ylim(0, 110)
    fig.suptitle(f"Speedup, overlap efficiency and wall time per mode: {label}", fontsize=11)
    return _save(fig, path)


def plot_gap_steps(res: Results, label: str, path: Path) -> Path:
    steps = res.extra.get("gap_steps")
    if not isinstance(steps, list) or not steps:
        raise Skip("no extra.gap_steps")
    series: dict[str, list[float]] = {"kernel": [], "staleness": [], "total": []}
    xs = []
    for i, row in enumerate(sorted(steps, key=_step_of)):
        if not isinstance(row, dict):
            raise Skip(f"extra.gap_steps[{i}] is {row!r}, expected an object")
        xs.append(_num(row.get("step"), f"extra.gap_steps[{i}].step"))
        for key in series:
            series[key].append(_num(row.get(key), f"extra.gap_steps[{i}].{key}"))
    fig, ax = plt.subplots(figsize=(8, 4))
    styles = {"kernel": ("#4C72B0", "-"), "staleness": ("#DD8452", "-"), "total": ("#222222", "--")}
    for key, ys in series.items():
        color, ls = styles[key]
        ax.plot(xs, ys, color=color, linestyle=ls, marker="o", markersize=3, label=key)
    unit = res.extra.get("gap_unit")
    ax.set_ylabel(unit if isinstance(unit, str) and unit else DEFAULT_GAP_UNIT)
    ax.set_xlabel("training step")
    positive = [abs(v) for ys in series.values() for v in ys if v]
    if positive and max(positive) / min(positive) > 1e3:
        # a kernel gap of 1e-7 next to a staleness gap of 0.3 vanishes on a linear axis
        ax.set_yscale("symlog", linthresh=min(positive))
        ax.set_ylabel(ax.get_ylabel() + " (symlog)")
    ax.set_title(f"Trainer-engine gap: kernel vs staleness: {label}")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


PER_FILE: tuple[tuple[str, str, Callable[[Results, str, Path], Path]], ...] = (
    ("phase_timeline", "phase timeline", plot_phase_timeline),
    ("sample_ages", "sample-age histogram", plot_sample_ages),
    ("mode_summary", "speedup and overlap efficiency", plot_mode_summary),
    ("gap_steps", "gap decomposition", plot_gap_steps),
)


# --- across files -------------------------------------------------------------------------


def _time_scale(unit: str, values: list[float]) -> tuple[str, float]:
    """Seconds shown in s/ms/us/ns so tick labels need no 1e-7 offset."""
    top = max((abs(v) for v in values), default=0.0)
    if unit != "s" or top == 0 or top >= 1:
        return unit, 1.0
    for name, factor in (("ms", 1e3), ("µs", 1e6), ("ns", 1e9)):
        if top * factor >= 1:
            return name, factor
    return "ns", 1e9


def plot_metric_history(results: list[tuple[str, Results]], path: Path) -> Path:
    if len(results) < 2:
        raise Skip("fewer than 2 results files")
    runs = sorted(results, key=lambda lr: lr[1].created_utc)
    names = sorted({n for _, r in runs for n in r.benchmarks})
    if not names:
        raise Skip("no benchmarks")
    units = {r.benchmarks[n]["unit"] for _, r in runs for n in r.benchmarks}
    normalise = len(units) > 1
    unit, factor = (
        (None, 1.0)
        if normalise
        else _time_scale(
            units.copy().pop(), [r.benchmarks[n]["stats"]["median"] for _, r in runs for n in r.benchmarks]
        )
    )
    fig, ax = plt.subplots(figsize=(9, 4.5))
    drawn = 0
    for name in names:
        pts = [
            (datetime.fromisoformat(r.created_utc.replace("Z", "+00:00")), r.benchmarks[name]["stats"])
            for _, r in runs
            if name in r.benchmarks
        ]
        first = pts[0][1]["median"]
        scale = 1.0 / first if normalise and first else factor
        if normalise and not first:
            continue  # cannot normalise to a zero median
        t = [p[0] for p in pts]
        med = [p[1]["median"] * scale for p in pts]
        higher = next(r.benchmarks[name]["higher_is_better"] for _, r in reversed(runs) if name in r.benchmarks)
        better = "higher is better" if higher else "lower is better"
        (line,) = ax.plot(t, med, marker="o", label=f"{name} ({better})")
        ax.fill_between(
            t, [p[1]["q1"] * scale for p in pts], [p[1]["q3"] * scale for p in pts], color=line.get_color(), alpha=0.15
        )
        drawn += 1
    if not drawn:
        raise Skip("no benchmark with a non-zero first median")
    ax.set_xlabel("run time (UTC)")
    ax.set_ylabel("median / first run's median (ratio)" if normalise else f"median ({unit})")
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
    ax.set_title(f"Benchmark medians across {len(runs)} runs (band: q1..q3)")
    ax.grid(alpha=0.3)
    if drawn > 1:
        ax.legend(fontsize=8)
    return _save(fig, path)


# --- driver -------------------------------------------------------------------------------


def make_report(
    results: list[tuple[str, Results]], out_dir: str | Path, *, log: Callable[[str], None] = print
) -> list[Path]:
    """Draw every plot the data allow into ``out_dir``; ``results`` is ``[(file, Results)]``.
    Returns the PNGs written; a skipped plot is reported through ``log``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stems = [Path(f).stem for f, _ in results]
    written = []
    for (file, res), stem in zip(results, stems):
        prefix = stem if stems.count(stem) == 1 else f"{stem}-{res.run_id[:8]}"
        for key, what, plot in PER_FILE:
            try:
                written.append(plot(res, Path(file).name, out / f"{prefix}_{key}.png"))
            except Skip as why:
                log(f"report: {why} in {file}, skipped {what}")
            except Exception as exc:  # an observer never crashes the report: skip and say why
                plt.close("all")
                log(f"report: could not draw {what} from {file} ({type(exc).__name__}: {exc}), skipped {what}")
    try:
        written.append(plot_metric_history(results, out / "metric_history.png"))
    except Skip as why:
        log(f"report: {why} in {', '.join(f for f, _ in results)}, skipped metric history")
    return written
