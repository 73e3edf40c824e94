"""What ``miles-harness run`` prints: the table (medians over the repeats), the checker
verdicts, the recording's self-cost, CPU use, peak memory, per-engine rows (ray layout),
and the last line, one JSON document for scripts (``script_line``)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.main_job.result import ModeResult
from harness.results.mode_rows import ModeRow
from harness.results.run_extras import EngineRow


def print_memory(rows: list[ModeRow]) -> None:
    """Peak resident memory per mode (``harness.measure.memory``, median over repeats)."""

    def gib(v: float | None) -> str:
        return f"{v / 2**30:.2f}" if isinstance(v, (int, float)) else "-"

    if not any(r.peak_rss_run_bytes for r in rows):
        print("\npeak resident memory: not readable on this system (needs Linux /proc)")
        return
    print(
        "\npeak resident memory, GiB (harness.measure.memory; run: model builds + timed run; after run: gap "
        "replay + checkers; engine: the split layout's engine process):"
    )
    for r in rows:
        print(
            f"  {r.mode:<12} run {gib(r.peak_rss_run_bytes)}  after run {gib(r.peak_rss_after_run_bytes)}  "
            f"engine {gib(r.peak_rss_engine_process_bytes)}"
        )


def print_self_cost(rows: list[ModeRow]) -> None:
    """The recording's own time inside the timed runs (``harness.measure.self_cost``)."""
    shares = {r.mode: r.self_cost_share for r in rows if r.self_cost_share is not None}
    if shares:
        print(
            "\nthe harness's recording inside the timed runs (trace sink + age observer, median over repeats): "
            + ", ".join(f"{m} {100 * v:.2f}%" for m, v in shares.items())
            + "; the gap decomposition and the checkers run after the timed window"
        )


def print_cpu_use(rows: list[ModeRow]) -> None:
    """Cores the run's processes kept busy (``harness.measure.cpu_use``, median over repeats)."""

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    if not any(r.cpu_cores_main is not None for r in rows):
        return
    host = next((int(r.host_cpu_count) for r in rows if r.host_cpu_count), None)
    print(
        f"\nCPU use over the timed runs, cores of this host's {host or '?'} (harness.measure.cpu_use; median over "
        "repeats; main: driver + trainer):"
    )
    for r in rows:
        print(
            f"  {r.mode:<12} main {f(r.cpu_cores_main)}  engines {f(r.cpu_cores_engines)}  total {f(r.cpu_cores_total)}"
        )


def engine_rows(runs: dict[str, list[ModeResult]]) -> dict[str, list[EngineRow]]:
    """Each mode's per-engine rows of its first repeat (``harness.measure.engines``)."""
    from harness.measure.engines import per_engine_rows

    return {m: per_engine_rows(rs[0].events, rs[0].window) for m, rs in runs.items() if rs}


def print_engines(runs: dict[str, list[ModeResult]]) -> None:
    from harness.measure.engines import format_engine_rows

    print("\nper engine (first repeat of each mode; harness.measure.engines):")
    print(format_engine_rows(engine_rows(runs)))
    first = next((rs[0] for rs in runs.values() if rs and rs[0].engine_stats), None)
    if first is not None and first.engine_stats is not None:
        st = first.engine_stats["startup"]
        print(
            f"Ray start-up, outside the timed windows: ray.init {st['ray_init_s']:.1f} s, engine actors "
            f"{st['actors_start_s']:.1f} s, first model build {st['reset_s']:.1f} s; weights by "
            f"{first.engine_stats['broadcast']}"
        )


def print_checks(runs: dict[str, list[ModeResult]], *, per_invariant: int = 3) -> list[str]:
    """Print each run's checker verdicts; return ``mode#repeat`` of every run with a violation."""
    print("\ninvariant checkers on each run's trace (harness.checking.invariants):")
    violated: list[str] = []
    for mode, results in runs.items():
        for rep, r in enumerate(results, 1):
            c = r.checks
            if c is None:
                continue
            what = "complete run" if c["complete"] else "prefix of a failed run"
            if c["passed"]:
                print(f"  {mode} #{rep}: PASS, {len(c['checkers'])} checkers ({what})")
                continue
            violated.append(f"{mode}#{rep}")
            bad = {k: n for k, n in c["checkers"].items() if n}
            print(
                f"  {mode} #{rep}: FAIL ({what}): "
                + ", ".join(f"{k} ({n})" for k, n in bad.items())
                + f"; passed: {', '.join(k for k, n in c['checkers'].items() if not n)}"
            )
            shown: dict[str, int] = {}
            for v in c["violations"]:
                if shown.get(v["invariant"], 0) < per_invariant:
                    shown[v["invariant"]] = shown.get(v["invariant"], 0) + 1
                    print(f"      [{v['invariant']}] {v['message']}")
    return violated


def _fmt(v: float | int | str | None, spec: str = ".3f") -> str:
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, float) else str(v)


def _spread(r: ModeRow, key: str, spec: str) -> str:
    value, low, high = getattr(r, key), getattr(r, f"{key}_min", None), getattr(r, f"{key}_max", None)
    if value is None:
        return "-"
    if (r.repeats or 1) > 1 and low is not None:
        return f"{value:{spec}} ({low:{spec}}-{high:{spec}})"
    return format(value, spec)


def format_table(rows: list[ModeRow]) -> str:
    """The aggregated rows (``aggregate_repeats``): medians over the repeats, min-max in
    brackets for speedup and overlap efficiency."""
    repeats = max((r.repeats or 1 for r in rows), default=1)
    window = next((int(r.reward_window) for r in rows if r.reward_window), None)
    cols = [
        ("mode", "mode", "s"),
        ("steps", "steps", "d"),
        ("wall s", "wall_s", ".2f"),
        ("speedup", "speedup", "spread.2f"),
        ("ideal", "ideal_speedup", ".2f"),
        ("overlap eff", "overlap_efficiency", "spread.2f"),
        ("both busy", "both_busy_fraction", ".1%"),
        ("rollout idle", "rollout_idle_ratio", ".1%"),
        ("train idle", "train_idle_ratio", ".1%"),
        ("wait ratio", "wait_time_ratio", ".1%"),
        ("dropped", "dropped_share", ".1%"),
        ("retried", "retried_share", ".1%"),
        ("chance", "chance_level", ".3f"),
        ("reward start", "reward_start", ".3f"),
        ("reward end", "reward_end", ".3f"),
        ("lr", "lr", ".2e"),
    ]
    header = [c[0] for c in cols] + ["age (versions: count)"]
    body = []
    for r in rows:
        cells = []
        for _, k, f in cols:
            if f == "d":
                cells.append(_fmt(None if getattr(r, k) is None else int(getattr(r, k)), "d"))
            elif f.startswith("spread"):
                cells.append(_spread(r, k, f[len("spread") :]))
            else:
                cells.append(_fmt(getattr(r, k), f))
        body.append(cells + [" ".join(f"{a}:{n}" for a, n in r.age_hist.items()) or "-"])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    lines = [
        f"medians over {repeats} interleaved repeat(s), (min-max) where shown; reward start / end: mean "
        f"train/reward_mean of the first / last {window or '-'} steps; chance: the best prompt-blind "
        "policy's reward"
    ]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


# each mode's figures in the JSON line (the aggregated row's fields of the same name)
SCRIPT_FIELDS = (
    "steps",
    "wall_s",
    "speedup",
    "ideal_speedup",
    "overlap_efficiency",
    "reward_start",
    "reward_end",
    "chance_level",
    "checks_passed",
    "error",
    "worker_error",
)


def script_line(
    paths: list[Path], rows: list[ModeRow], violated: list[str], rc: int, total_s: float, host_busy: bool | None = None
) -> str:
    """The last line of ``miles-harness run``: one JSON document (no newline inside) with
    the files written (``results``: results.json, ``timeline``, ``plots``), each mode's
    median figures (``modes``: ``SCRIPT_FIELDS``, null where the row has none, e.g. sync's
    speedup), the runs whose trace violated an invariant (``violations``: ``mode#repeat``),
    the wall time, whether the host was busy (``host_busy``: the figures are not comparable
    with a clean run's, ``harness.measure.host_load``; null: not measured) and the
    command's exit code."""
    files = [str(p) for p in paths]
    doc = {
        "results": next((f for f in files if f.endswith("results.json")), None),
        "timeline": next((f for f in files if f.endswith(".trace.json")), None),
        "plots": [f for f in files if f.endswith(".png")],
        "modes": {r.mode: {k: _whole(getattr(r, k)) for k in SCRIPT_FIELDS} for r in rows},
        "violations": violated,
        "total_wall_s": round(total_s, 3),
        "host_busy": host_busy,
        "exit_code": rc,
    }
    return json.dumps(doc, sort_keys=True)


def _whole(v: float | int | str | bool | None) -> float | int | str | bool | None:
    """A median that is a whole number (a step count over equal repeats) as an int."""
    return int(v) if isinstance(v, float) and v.is_integer() else v
