"""`miles-harness run`: the main job. Real generation and real training, sync vs
one-step-ahead vs fully-async, on a process layout; one table, a results JSON, a
Chrome-trace timeline and PNGs.

    miles-harness run [--modes sync,one-step,fully-async] [--layout split|colocate|ray]
                      [--num-engines N] [--ray-address ADDR] [--broadcast put_once|per_engine]
                      [--model tiny|smollm2|PATH] [--task copy|arithmetic] [--steps N]
                      [--repeats N] [--allow-violations] [--out DIR] [-- MILES ARGS]

The built-in default needs nothing but the install: the tiny model (d_model 256, 4
layers) learns the ``copy`` task (4 symbols, copy 2; chance level 0.25) on the split
layout, B = 16 prompts x n = 8 samples, 40 steps at lr 1e-3, with the engine's batch
capped at 16 requests so rollout and training take comparable time (within a factor 2
on a 2-core CPU), which is where overlap can pay. Miles flags after ``--``
(``--rollout-batch-size``, ``--update-weights-interval``, ``--max-weight-staleness``,
...) apply to every mode.

The modes run in interleaved repeats (sync, one-step, fully-async, sync, one-step, ...;
``--repeats``, default 2): each repeat's speedup is against the sync run of the same repeat, and
the table shows the median over the repeats with its min-max spread; results.json keeps
every repeat's row (``extra.repeats``). The first repeat carries the per-step gap
decomposition, the timeline and the per-step history.

Every run's trace is checked by every applicable invariant checker
(``harness.checking.invariants``) after its timed window; the verdicts are printed and
stored (``extra.checks``), and a violation makes the command exit 1 unless
``--allow-violations`` is given. The loss table splits each overlapped mode's gap to the
ideal speedup into parts (``harness.measure.overlap_loss``).

``--layout ray`` runs ``--num-engines`` engines as Ray actors (``harness.backends.ray_engine``):
on ``--ray-address`` or on a local cluster it starts (and stops at the end); the table gains
per-engine rows (``harness.measure.engines``) and the Ray start-up seconds, which are
outside every timed window.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from miles_async_core import events as ev
from miles_async_core.config import AsyncConfig, parse_miles_args
from miles_async_core.errors import ConfigError
from harness.results.mode_rows import ModeRow

DEFAULT_MILES_ARGS = ["--rollout-batch-size", "16", "--n-samples-per-prompt", "8"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The main job's flags: one per ``RunSpec`` field, built from the field's metadata
    (flag, help, choices, type; the default is the field's), then the command's own."""
    from harness.main_job.job import RunSpec, flag_of

    p.add_argument("--modes", default="sync,one-step,fully-async", help="comma list of sync, one-step, fully-async")
    for f in dataclasses.fields(RunSpec):
        meta, flag = f.metadata, flag_of(f)
        if meta["type"] is bool:  # a switch turns the default over: --use-tis on, --no-gap off
            p.add_argument(flag, dest=f.name, action="store_false" if f.default else "store_true", help=meta["help"])
            continue
        metavar = "{" + ",".join(meta["choices"]) + "}" if meta["choices"] else flag[2:].upper().replace("-", "_")
        p.add_argument(flag, dest=f.name, type=meta["type"], default=f.default, metavar=metavar, help=meta["help"])
    p.add_argument("--allow-violations", action="store_true",
                   help="exit 0 even when a trace violates an invariant (the violations are still printed)")
    p.add_argument("--telemetry-interval", type=float, default=0.25,
                   help="NVML sampling interval in seconds (GPU machines; says 'no telemetry' once elsewhere)")
    p.add_argument("--out", default=None, help="output folder (default results/runs/<UTC time>)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    p.add_argument("miles_args", nargs=argparse.REMAINDER, help="Miles flags after --")


def spec_from_args(args: argparse.Namespace) -> Any:
    """The ``RunSpec`` a command line asks for (``--task-length`` and ``--task-symbols``
    apply to the copy task only)."""
    from harness.main_job.job import RunSpec

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunSpec)}
    if values["task"] != "copy":
        values["task_length"] = values["task_symbols"] = None
    return RunSpec(**values)


def main(args: argparse.Namespace) -> int:
    from harness.main_job.job import aggregate_repeats, mode_config, run_mode, summarize_mode

    miles = [a for a in args.miles_args if a != "--"] or []
    base, notes = parse_miles_args(DEFAULT_MILES_ARGS + miles)
    for note in notes:
        print(f"note: {note}")
    spec = spec_from_args(args)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:  # refuse a forbidden mode before any work is done
        mode_config(mode, base, spec)
    _check_model(spec)
    out = Path(args.out or f"results/runs/{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    runs: dict[str, list[Any]] = {m: [] for m in modes}  # ModeResult per repeat
    repeat_rows: dict[str, list[ModeRow]] = {m: [] for m in modes}
    progress = _progress(spec.repeats * len(modes) * spec.steps)
    from harness.measure.telemetry import TelemetrySampler

    current = {"mode": None}
    telemetry = TelemetrySampler(interval_s=args.telemetry_interval, phase_fn=lambda: current["mode"]).start()
    t_start = time.monotonic()
    failed = False
    try:
        for rep in range(spec.repeats):
            for mode in modes:
                current["mode"] = mode
                progress.set_description(f"{mode} {rep + 1}/{spec.repeats}")
                r = run_mode(mode, base, spec, on_step=lambda _m: progress.update(1),
                             gap=spec.gap_decomposition and rep == 0)
                runs[mode].append(r)
                sync = runs["sync"][rep] if "sync" in runs and len(runs["sync"]) > rep else None
                repeat_rows[mode].append(summarize_mode(r, sync))
                _write_outputs(out, spec, base, runs, repeat_rows, plots=False)  # finished runs are never lost
                failed = failed or bool(r.error)
                if failed:
                    break
            if failed:
                break
    finally:
        progress.close()
        telemetry.stop()
        if spec.layout == "ray":
            from harness.backends.ray_engine import shutdown_ray

            shutdown_ray()  # stops a local cluster this command started; leaves --ray-address's running
    total_s = time.monotonic() - t_start
    paths = _write_outputs(out, spec, base, runs, repeat_rows, plots=not args.no_plots, telemetry=telemetry.summary(),
                           total_s=total_s)
    rows = [aggregate_repeats(rs) for rs in repeat_rows.values() if rs]
    print(format_table(rows))
    losses = {r.mode: r.losses for r in rows if r.losses}
    if losses:
        from harness.measure.overlap_loss import format_loss_table

        print("\nwhere the overlap is lost (the repeat with the median overlap efficiency; parts sum to the gap, "
              "see harness.measure.overlap_loss):")
        print(format_loss_table(losses))
    if spec.layout == "ray":
        _print_engines(runs)
    violated = _print_checks(runs)
    _print_self_cost(rows)
    _print_cpu_use(rows)
    print(f"\ntotal wall time {total_s:.1f} s ({spec.repeats} repeat(s) of {', '.join(modes)})")
    _print_memory(rows)
    for p in paths:
        print(f"wrote {p}")
    for r in rows:
        if r.error:
            print(f"mode {r.mode} failed: {r.error}")
        if r.worker_error:
            print(f"mode {r.mode}: the fully-async rollout worker died after the last drain: {r.worker_error}")
    if violated and not args.allow_violations:
        print(f"FAILED: invariant violations in {', '.join(violated)}; the run's figures are not trustworthy. "
              "Pass --allow-violations to explore anyway.")
        return 1
    if violated:
        print(f"warning: invariant violations in {', '.join(violated)} (--allow-violations given)")
    return 1 if any(r.error for r in rows) else 0


def _print_memory(rows: list[ModeRow]) -> None:
    """Peak resident memory per mode (``harness.measure.memory``, median over repeats)."""
    def gib(v: Any) -> str:
        return f"{v / 2**30:.2f}" if isinstance(v, (int, float)) else "-"

    if not any(r.peak_rss_run_bytes for r in rows):
        print("\npeak resident memory: not readable on this system (needs Linux /proc)")
        return
    print("\npeak resident memory, GiB (harness.measure.memory; run: model builds + timed run; after run: gap "
          "replay + checkers; engine: the split layout's engine process):")
    for r in rows:
        print(f"  {r.mode:<12} run {gib(r.peak_rss_run_bytes)}  after run {gib(r.peak_rss_after_run_bytes)}  "
              f"engine {gib(r.peak_rss_engine_process_bytes)}")


def _print_self_cost(rows: list[ModeRow]) -> None:
    """The recording's own time inside the timed runs (``harness.measure.self_cost``)."""
    shares = {r.mode: r.self_cost_share for r in rows if r.self_cost_share is not None}
    if shares:
        print("\nthe harness's recording inside the timed runs (trace sink + age observer, median over repeats): "
              + ", ".join(f"{m} {100 * v:.2f}%" for m, v in shares.items())
              + "; the gap decomposition and the checkers run after the timed window")


def _print_cpu_use(rows: list[ModeRow]) -> None:
    """Cores the run's processes kept busy (``harness.measure.cpu_use``, median over repeats)."""
    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.2f}"

    if not any(r.cpu_cores_main is not None for r in rows):
        return
    host = next((int(r.host_cpu_count) for r in rows if r.host_cpu_count), None)
    print(f"\nCPU use over the timed runs, cores of this host's {host or '?'} (harness.measure.cpu_use; median over "
          "repeats; main: driver + trainer):")
    for r in rows:
        print(f"  {r.mode:<12} main {f(r.cpu_cores_main)}  engines {f(r.cpu_cores_engines)}  "
              f"total {f(r.cpu_cores_total)}")


def _engine_rows(runs: dict[str, list[Any]]) -> dict[str, list[dict[str, Any]]]:
    from harness.measure.engines import per_engine_rows

    return {m: per_engine_rows(rs[0].events, rs[0].window) for m, rs in runs.items() if rs}


def _print_engines(runs: dict[str, list[Any]]) -> None:
    from harness.measure.engines import format_engine_rows

    print("\nper engine (first repeat of each mode; harness.measure.engines):")
    print(format_engine_rows(_engine_rows(runs)))
    first = next((rs[0] for rs in runs.values() if rs and rs[0].engine_stats), None)
    if first is not None:
        st = first.engine_stats["startup"]
        print(f"Ray start-up, outside the timed windows: ray.init {st['ray_init_s']:.1f} s, engine actors "
              f"{st['actors_start_s']:.1f} s, first model build {st['reset_s']:.1f} s; weights by "
              f"{first.engine_stats['broadcast']}")


def _print_checks(runs: dict[str, list[Any]], *, per_invariant: int = 3) -> list[str]:
    """Print each run's checker verdicts; return ``mode#repeat`` of every run with a violation."""
    print("\ninvariant checkers on each run's trace (harness.checking.invariants):")
    violated = []
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
            print(f"  {mode} #{rep}: FAIL ({what}): " + ", ".join(f"{k} ({n})" for k, n in bad.items())
                  + f"; passed: {', '.join(k for k, n in c['checkers'].items() if not n)}")
            shown: dict[str, int] = {}
            for v in c["violations"]:
                if shown.get(v["invariant"], 0) < per_invariant:
                    shown[v["invariant"]] = shown.get(v["invariant"], 0) + 1
                    print(f"      [{v['invariant']}] {v['message']}")
    return violated


def _check_model(spec: Any) -> None:
    if spec.model not in ("tiny", "smollm2") and not Path(spec.model).is_dir():
        raise ConfigError(f"--model {spec.model!r}: no such directory. Allowed: tiny, smollm2 or a local Hugging "
                          "Face model directory (config.json + weights). Fix: pass an existing path or --model tiny")


def _progress(total: int) -> Any:
    try:
        from tqdm import tqdm

        return tqdm(total=total, unit="step", dynamic_ncols=True)
    except ImportError:  # the progress bar is a nicety; the run does not need it
        class _Plain:
            n = 0

            def update(self, k: int) -> None:
                self.n += k

            def set_description(self, d: str) -> None:
                print(f"running {d} ...")

            def close(self) -> None:
                return None

        return _Plain()


def _phases(r: Any) -> list[list[Any]]:
    """The mode's timeline, as ``harness.measure.overlap`` pairs and clips the phases."""
    from harness.measure.overlap import phase_spans

    return phase_spans(r.events, r.window)


def _step_times(r: Any) -> list[float]:
    ends = [e.t for e in r.events if e.kind == ev.PHASE_END and e["side"] == "train" and e["phase"] == "training"]
    starts = [r.window[0]] + ends[:-1]
    return [b - a for a, b in zip(starts, ends)]


def _tokens_per_s(r: Any) -> list[float]:
    tokens = [h.get("tokens", 0) for h in r.history]
    return [t / s for t, s in zip(tokens, _step_times(r)) if s > 0]


def _write_outputs(out: Path, spec: Any, base: AsyncConfig, runs: dict[str, list[Any]],
                   repeat_rows: dict[str, list[ModeRow]], *, plots: bool,
                   telemetry: dict[str, Any] | None = None, total_s: float | None = None) -> list[Path]:
    """results.json (every repeat's rows, the aggregated table, checks, losses), the
    timeline of the first repeat, and the PNGs."""
    from harness.main_job.job import aggregate_repeats
    from harness.results.chrome_trace import write_chrome_trace
    from harness.results.schema import Results

    first = {m: rs[0] for m, rs in runs.items() if rs}
    config = {"spec": dataclasses.asdict(spec), "base": base.to_dict(),
              "modes": {m: r.config.resolved_dict() for m, r in first.items()}}
    res = Results.new("run", config, definition_common={"task": spec.task, "model": spec.model,
                                                         "layout": spec.layout, "steps": spec.steps,
                                                         "repeats": spec.repeats})
    rows = [aggregate_repeats(rs) for rs in repeat_rows.values() if rs]
    modes_extra: dict[str, Any] = {}
    for row in rows:
        mode = row.mode
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
        r = first[mode]
        ages = [a for h in r.history for a in h.get("age_versions", [])]
        modes_extra[mode] = {"phases": _phases(r), "sample_ages": ages, "wall_s": row.wall_s,
                             **{k: getattr(row, k) for k in ("speedup", "overlap_efficiency", "error", "worker_error",
                                                             "chance_level", "reward_start", "reward_end",
                                                             "checks_passed") if getattr(row, k) is not None}}
    res.extra["modes"] = modes_extra
    gap_mode = "one-step" if "one-step" in first else next(iter(first), None)
    if gap_mode is not None:
        steps = [{"step": h["rollout_id"], "kernel": h["gap/kernel_abs_mean"], "staleness": h["gap/staleness_abs_mean"],
                  "total": h["gap/total_abs_mean"]} for h in first[gap_mode].history if "gap/total_abs_mean" in h]
        if steps:
            res.extra["gap_steps"] = steps
            res.extra["gap_mode"] = gap_mode
            res.extra["gap_unit"] = f"mean |log-prob gap| (nats/token), {gap_mode}"
    res.extra["gap_summary"] = {m: r.gap_summary for m, r in first.items() if r.gap_summary}
    if telemetry is not None:
        res.extra["telemetry"] = telemetry
    if total_s is not None:
        res.extra["total_wall_s"] = total_s
    res.extra["table"] = {row.mode: row.to_dict() for row in rows}  # keyed by mode (harness.results.mode_rows)
    res.extra["repeats"] = {m: [x.to_dict() for x in rs] for m, rs in repeat_rows.items()}
    res.extra["checks"] = {m: [x.checks for x in rs] for m, rs in repeat_rows.items()}
    res.extra["per_step"] = {m: r.history for m, r in first.items()}
    if spec.layout == "ray":
        engine_rows = _engine_rows(runs)
        res.extra["engines"] = {m: {"rows": engine_rows.get(m, []), "stats": r.engine_stats}
                                for m, r in first.items()}
    paths = [res.write(out / "results.json"),
             write_chrome_trace({m: e["phases"] for m, e in modes_extra.items()}, out / "timeline.trace.json")]
    if plots:
        from harness.results.plots import make_report

        paths += make_report([(str(out / "results.json"), res)], out)
    return paths


def _fmt(v: Any, spec: str = ".3f") -> str:
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
    cols = [("mode", "mode", "s"), ("steps", "steps", "d"), ("wall s", "wall_s", ".2f"),
            ("speedup", "speedup", "spread.2f"), ("ideal", "ideal_speedup", ".2f"),
            ("overlap eff", "overlap_efficiency", "spread.2f"), ("both busy", "both_busy_fraction", ".1%"),
            ("rollout idle", "rollout_idle_ratio", ".1%"), ("train idle", "train_idle_ratio", ".1%"),
            ("wait ratio", "wait_time_ratio", ".1%"), ("dropped", "dropped_share", ".1%"),
            ("retried", "retried_share", ".1%"), ("chance", "chance_level", ".3f"),
            ("reward start", "reward_start", ".3f"), ("reward end", "reward_end", ".3f"), ("lr", "lr", ".2e")]
    header = [c[0] for c in cols] + ["age (versions: count)"]
    body = []
    for r in rows:
        cells = []
        for _, k, f in cols:
            if f == "d":
                cells.append(_fmt(None if getattr(r, k) is None else int(getattr(r, k)), "d"))
            elif f.startswith("spread"):
                cells.append(_spread(r, k, f[len("spread"):]))
            else:
                cells.append(_fmt(getattr(r, k), f))
        body.append(cells + [" ".join(f"{a}:{n}" for a, n in r.age_hist.items()) or "-"])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    lines = [f"medians over {repeats} interleaved repeat(s), (min-max) where shown; reward start / end: mean "
             f"train/reward_mean of the first / last {window or '-'} steps; chance: the best prompt-blind "
             "policy's reward"]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)
