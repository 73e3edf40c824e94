"""A results file's summary for people and scripts, read through the schema.

    python -m harness.results.summary FILE [FILE ...]
    python -m harness.results.summary --gpu-checks OUTDIR --run-rc N --gap-rc N [--record-rc N]

``FILE``: any results file ``load_any`` reads (``harness.results.schema``). A main-job
file (kind ``run``) prints one line per mode from its typed extras
(``harness.results.run_extras.RunExtras``: steps, wall seconds, speedup, overlap
efficiency, checker verdict, error); any other kind prints each benchmark's median.

``--gpu-checks OUTDIR``: the summary of ``suites/gpu/run_gpu_checks.sh``: each stage's
exit status, the main job's modes from ``OUTDIR/run.json``, the gap table
(``OUTDIR/gap/gap_table.md``) and the GPU telemetry per stage (``OUTDIR/telemetry.json``).

Exit status: 0; 2 when a file is missing or does not pass the schema (the message names
the file and the field).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.results.run_extras import RunExtras
from harness.results.schema import Results, load_any
from miles_async_core.errors import ConfigError


def mode_lines(extras: RunExtras) -> list[str]:
    """One line per mode of a run's aggregated table (medians over its repeats)."""
    lines = []
    for mode, row in extras.table.items():
        wall = f"{row.wall_s:.1f} s" if row.wall_s is not None else "-"
        line = f"{mode:<12} steps {int(row.steps) if row.steps is not None else '-':>3}  wall {wall}"
        if row.speedup is not None:
            line += f"  speedup {row.speedup:.2f}"
        if row.overlap_efficiency is not None:
            line += f"  overlap eff {row.overlap_efficiency:.2f}"
        if row.checks_passed is not None:
            line += f"  checkers {'pass' if row.checks_passed else 'FAIL'}"
        if row.error:
            line += f"  ERROR {row.error}"
        lines.append(line)
    return lines


def benchmark_lines(res: Results) -> list[str]:
    """Each benchmark's median and sample count, in its unit."""
    return [
        f"{name}: median {b['stats']['median']:.6g} {b['unit']} (n={b['stats']['n']})"
        for name, b in sorted(res.benchmarks.items())
    ]


def file_lines(path: str) -> list[str]:
    """The summary of one results file (``load_any``: the schema's check first)."""
    res = load_any(path)
    head = f"{path}: kind {res.kind}, created {res.created_utc}"
    if res.kind == "run":
        return [head, *(f"  {line}" for line in mode_lines(RunExtras.from_doc(res.doc, path)))]
    return [head, *(f"  {line}" for line in benchmark_lines(res))]


def _status(rc: int) -> str:
    return "ok" if rc == 0 else ("timed out" if rc == 124 else f"failed (exit {rc})")


def _telemetry_lines(path: Path) -> list[str]:
    """``run_gpu_checks.sh``'s telemetry file: ``{"summary": TelemetrySampler.summary(), ...}``."""
    if not path.exists():
        return ["  (c) telemetry: MISSING"]
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))["summary"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"telemetry file {path}: no readable 'summary' ({exc!r}). Fix: rerun the script; the "
            "telemetry sampler writes it when the script stops it"
        ) from None
    if not summary.get("available"):
        return [f"  (c) telemetry: unavailable ({summary.get('reason')}); {path} records that"]
    return [
        f"  (c) telemetry {name}: {agg['records']} samples, util {agg['util_gpu_pct_mean']} %, "
        f"SM active {agg['sm_active_pct_mean']} %, peak mem {agg['mem_used_bytes_max']} B"
        for name, agg in summary.get("phases", {}).items()
    ]


def gpu_checks_lines(out: Path, run_rc: int, gap_rc: int, record_rc: int | None) -> list[str]:
    """The GPU script's summary: stage statuses, the main job's modes, the gap table, telemetry."""
    run_json = out / "run.json"
    lines = [f"  (a) miles-harness run: {_status(run_rc)}; run.json {'present' if run_json.exists() else 'MISSING'}"]
    if run_json.exists():
        res = load_any(run_json)
        lines += [f"      {line}" for line in mode_lines(RunExtras.from_doc(res.doc, str(run_json)))]
    lines.append(f"  (b) miles-harness gap: {_status(gap_rc)}")
    table = out / "gap" / "gap_table.md"
    if table.exists():
        lines.append("      " + table.read_text(encoding="utf-8").replace("\n", "\n      ").rstrip())
    lines += _telemetry_lines(out / "telemetry.json")
    if record_rc is not None:
        lines.append(f"  (e) recorder on a Miles run: {_status(record_rc)}")
    lines.append(f"  outputs in {out}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.results.summary", description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="*", help="results files (results.json of any harness command)")
    p.add_argument("--gpu-checks", metavar="OUTDIR", default=None, help="summarize run_gpu_checks.sh's OUTDIR")
    p.add_argument("--run-rc", type=int, default=0, help="with --gpu-checks: stage (a)'s exit status")
    p.add_argument("--gap-rc", type=int, default=0, help="with --gpu-checks: stage (b)'s exit status")
    p.add_argument("--record-rc", type=int, default=None, help="with --gpu-checks: stage (e)'s exit status, if it ran")
    args = p.parse_args(argv)
    if not args.files and args.gpu_checks is None:
        p.error("give results files or --gpu-checks OUTDIR")
    try:
        lines = [line for f in args.files for line in file_lines(f)]
        if args.gpu_checks is not None:
            lines += gpu_checks_lines(Path(args.gpu_checks), args.run_rc, args.gap_rc, args.record_rc)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
