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
``--repeats``, default 2): each repeat's speedup is against the sync run of the same repeat
(whichever order ``--modes`` names them in), and the table shows the median over the repeats with its min-max spread; results.json keeps
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

The last line printed is one JSON document for scripts (``harness.main_job.report.script_line``):
the results and timeline paths, each mode's headline figures, the runs with invariant
violations and the exit code.

The pipeline: ``harness.main_job.job.run_mode`` runs one mode of one repeat and returns a
frozen ``ModeResult``; ``harness.main_job.rows`` turns the runs so far into each repeat's
``ModeRow`` (``rows_by_mode``) and a mode's repeats into its table row; ``outputs`` writes
them (``extra`` is ``harness.results.run_extras.RunExtras``) and ``report`` prints them.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from miles_async_core.config import AsyncConfig
from miles_async_core.errors import ConfigError

if TYPE_CHECKING:  # imported where used: `miles-harness --help` does not load torch
    from harness.main_job.result import ModeResult
    from harness.main_job.spec import RunSpec
    from harness.results.run_extras import JSONDict

DEFAULT_MILES_ARGS = ["--rollout-batch-size", "16", "--n-samples-per-prompt", "8"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The main job's flags: one per ``RunSpec`` field, built from the field's metadata
    (flag, help, choices, type; the default is the field's), then the command's own."""
    from harness.main_job.spec import RunSpec, flag_of

    p.add_argument("--modes", default="sync,one-step,fully-async", help="comma list of sync, one-step, fully-async")
    for f in dataclasses.fields(RunSpec):
        meta, flag = f.metadata, flag_of(f)
        if meta["type"] is bool:  # a switch turns the default over: --use-tis on, --no-gap off
            p.add_argument(flag, dest=f.name, action="store_false" if f.default else "store_true", help=meta["help"])
            continue
        metavar = "{" + ",".join(meta["choices"]) + "}" if meta["choices"] else flag[2:].upper().replace("-", "_")
        p.add_argument(flag, dest=f.name, type=meta["type"], default=f.default, metavar=metavar, help=meta["help"])
    p.add_argument(
        "--allow-violations",
        action="store_true",
        help="exit 0 even when a trace violates an invariant (the violations are still printed)",
    )
    p.add_argument(
        "--telemetry-interval",
        type=float,
        default=0.25,
        help="NVML sampling interval in seconds (GPU machines; says 'no telemetry' once elsewhere)",
    )
    p.add_argument("--out", default=None, help="output folder (default results/runs/<UTC time>)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs")


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    """The ``RunSpec`` a command line asks for (``--task-length`` and ``--task-symbols``
    apply to the copy task only)."""
    from harness.main_job.spec import RunSpec

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunSpec)}
    if values["task"] != "copy":
        values["task_length"] = values["task_symbols"] = None
    return RunSpec(**values)


def main(args: argparse.Namespace) -> int:
    from harness.main_job.spec import mode_config

    from harness.commands.miles_args import parse

    base = parse(list(args.miles_args), allow_unknown=args.allow_unknown_miles_flags, base=DEFAULT_MILES_ARGS)
    spec = spec_from_args(args)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:  # refuse a forbidden mode before any work is done
        mode_config(mode, base, spec)
    _check_model(spec)
    out = Path(args.out or f"results/runs/{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    t_start = time.monotonic()
    runs, telemetry = _run_repeats(spec, base, modes, out, args.telemetry_interval)
    return _finish(args, spec, base, modes, out, runs, telemetry, time.monotonic() - t_start)


def _run_repeats(
    spec: RunSpec, base: AsyncConfig, modes: list[str], out: Path, telemetry_interval: float
) -> tuple[dict[str, list[ModeResult]], JSONDict]:
    """Every mode once per repeat, in the order ``modes`` names them; results.json is
    rewritten after each run (finished runs are never lost); stops at the first failed
    run. Returns each mode's runs and the telemetry summary."""
    from harness.main_job.job import run_mode
    from harness.main_job.outputs import write_outputs
    from harness.main_job.rows import rows_by_mode
    from harness.measure.telemetry import TelemetrySampler

    runs: dict[str, list[ModeResult]] = {m: [] for m in modes}
    progress = _progress(spec.repeats * len(modes) * spec.steps)
    phase: list[str | None] = [None]  # the mode running now, read by the telemetry sampler's thread
    telemetry = TelemetrySampler(interval_s=telemetry_interval, phase_fn=lambda: phase[0]).start()
    try:
        for rep in range(spec.repeats):
            for mode in modes:
                phase[0] = mode
                progress.set_description(f"{mode} {rep + 1}/{spec.repeats}")
                r = run_mode(
                    mode, base, spec, on_step=lambda _m: progress.update(1), gap=spec.gap_decomposition and rep == 0
                )
                runs[mode].append(r)
                write_outputs(out, spec, base, runs, rows_by_mode(runs), plots=False)
                if r.error:
                    break
            else:
                continue
            break  # a failed run ends the command
    finally:
        progress.close()
        telemetry.stop()
        if spec.layout == "ray":
            from harness.backends.ray_engine import shutdown_ray

            shutdown_ray()  # stops a local cluster this command started; leaves --ray-address's running
    return runs, telemetry.summary()


def _finish(
    args: argparse.Namespace,
    spec: RunSpec,
    base: AsyncConfig,
    modes: list[str],
    out: Path,
    runs: dict[str, list[ModeResult]],
    telemetry: JSONDict,
    total_s: float,
) -> int:
    """Summarize every repeat (after all of them ran, so mode order does not matter),
    write the outputs, print the report, and return the exit code; the last line printed
    is ``script_line``."""
    from harness.main_job import report
    from harness.main_job.outputs import host_record, write_outputs
    from harness.main_job.rows import aggregate_repeats, rows_by_mode
    from harness.measure.host_load import describe

    repeat_rows = rows_by_mode(runs)
    paths = write_outputs(
        out, spec, base, runs, repeat_rows, plots=not args.no_plots, telemetry=telemetry, total_s=total_s
    )
    rows = [aggregate_repeats(rs) for rs in repeat_rows.values() if rs]
    print(report.format_table(rows))
    losses = {r.mode: r.losses for r in rows if r.losses}
    if losses:
        from harness.measure.overlap_loss import format_loss_table

        print(
            "\nwhere the overlap is lost (the repeat with the median overlap efficiency; parts sum to the gap, "
            "see harness.measure.overlap_loss):"
        )
        print(format_loss_table(losses))
    if spec.layout == "ray":
        report.print_engines(runs)
    violated = report.print_checks(runs)
    report.print_self_cost(rows)
    report.print_cpu_use(rows)
    host = host_record(runs)
    print("\n" + describe(host))
    print(f"\ntotal wall time {total_s:.1f} s ({spec.repeats} repeat(s) of {', '.join(modes)})")
    report.print_memory(rows)
    for p in paths:
        print(f"wrote {p}")
    for r in rows:
        if r.error:
            print(f"mode {r.mode} failed: {r.error}")
        if r.worker_error:
            print(f"mode {r.mode}: the fully-async rollout worker died after the last drain: {r.worker_error}")
    rc = 1 if any(r.error for r in rows) else 0
    if violated and not args.allow_violations:
        print(
            f"FAILED: invariant violations in {', '.join(violated)}; the run's figures are not trustworthy. "
            "Pass --allow-violations to explore anyway."
        )
        rc = 1
    elif violated:
        print(f"warning: invariant violations in {', '.join(violated)} (--allow-violations given)")
    print(report.script_line(paths, rows, violated, rc, total_s, bool(host["busy"]) if host else None))
    return rc


def _check_model(spec: RunSpec) -> None:
    if spec.model not in ("tiny", "smollm2") and not Path(spec.model).is_dir():
        raise ConfigError(
            f"--model {spec.model!r}: no such directory. Allowed: tiny, smollm2 or a local Hugging "
            "Face model directory (config.json + weights). Fix: pass an existing path or --model tiny"
        )


class _Progress(Protocol):
    def update(self, n: int) -> object: ...  # tqdm's returns whether it redrew

    def set_description(self, desc: str) -> None: ...

    def close(self) -> None: ...


class _Plain:
    """The progress report without tqdm (a nicety the run does not need)."""

    n = 0

    def update(self, n: int) -> None:
        self.n += n

    def set_description(self, desc: str) -> None:
        print(f"running {desc} ...")

    def close(self) -> None:
        return None


def _progress(total: int) -> _Progress:
    try:
        from tqdm import tqdm
    except ImportError:
        return _Plain()
    bar: _Progress = tqdm(total=total, unit="step", dynamic_ncols=True)
    return bar
