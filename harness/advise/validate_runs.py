"""The Ray-layout validation, made several times over: how much its verdict moves from run to run.

On a shared 2-core host the same pair of runs (the Ray layout with 1 engine, then with 2)
measures differently each time, so one validation's held-out errors are one draw. This
makes ``--runs`` fresh pairs back to back (each as ``make results`` makes
``results/advise/runs/ray-1`` and ``results/cpu/ray-2``: 4 interleaved repeats of sync,
one-step and fully-async), validates each exactly as ``harness.advise.validate`` does
(calibrate on the 1-engine run and the 2-engine run's sync mode, predict the 2-engine
run's overlapped modes), and writes every run's held-out errors and their range.

With ``--keep DIR`` each pair's results files are kept (gzipped, ``DIR/run<i>/ray-<n>.json.gz``)
after the pairs already kept there, and the report covers every kept pair: the earlier ones
validated again with the current model, the new ones marked ``new`` (each pair records the
commit its runs were measured at; the pairs are measurements of the main job, which the
model does not change). ``--rescore DIR`` (the same as ``--keep DIR --runs 0``) validates the
kept pairs again without running anything, so a change of the model is judged on the same
measurements as the model before it (the pairs measured before a model change are what it
was developed on, not a held-out test of it).

Each held-out row also says how far its own measurement moves: the s/step range of its
repeats over their median (``repeat_spread``) and whether the prediction lies inside that
range (``predicted_within_repeats``); the report counts those rows per mode and gives each
error's spread over the pairs (``sd``). A miss outside the repeats is the model's; one
inside them is as close as the measurement can tell.

    python -m harness.advise.validate_runs --runs 3 --keep results/advise/ray_pairs \
        --out results/advise/validation_ray_runs.json
    python -m harness.advise.validate_runs --rescore results/advise/ray_pairs --out /tmp/rescored.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness.advise.validate import mode_vs_sync, summary, validate
from harness.results.regenerate import RAY_RUN
from harness.results.schema import git_info, utc_now

RUN = ["-m", "harness.cli"] + RAY_RUN  # the flags make results' own Ray runs have


def one_run(work: Path, keep: Path | None = None) -> dict[str, Any]:
    """One pair of runs and its validation: per held-out row, the s/step and speedup errors.
    With ``keep`` the pair's results files are kept there, gzipped."""
    paths = {}
    for n in (1, 2):
        out = work / f"ray-{n}"
        subprocess.run(
            [sys.executable] + RUN + ["--num-engines", str(n), "--out", str(out)], check=True, stdout=subprocess.DEVNULL
        )
        paths[n] = str(out / "results.json")
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            with open(paths[n], "rb") as src, gzip.open(keep / f"ray-{n}.json.gz", "wb", compresslevel=9) as dst:
                shutil.copyfileobj(src, dst)
    return score(paths[1], paths[2])


def score(one_engine: str, two_engines: str) -> dict[str, Any]:
    """The validation of one pair of results files (1 engine, 2 engines)."""
    report = validate(one_engine, [], two_engines)
    measured = {f"ray-{r['engines']}": {"commit": r["commit"], "dirty": r["dirty"]} for r in report["rows"]}
    rows = [
        {
            "engines": r["engines"],
            "mode": r["mode"],
            "step_error": r["step_error"],
            "speedup_error": r.get("speedup_error"),
            "measured_step_s": r["measured_step_s"],
            "predicted_step_s": r["predicted_step_s"],
            "measured_speedup": r["measured_speedup"],
            "predicted_speedup": r["predicted_speedup"],
            # each side's busy time per step, simulated over measured, minus 1 (validate's busy table)
            **{
                f"{side}_error": r["predicted_busy_per_step_s"][side] / r["measured_busy_per_step_s"][side] - 1
                for side in ("generating", "training", "weight_sync")
                if r["measured_busy_per_step_s"].get(side) and side in r["predicted_busy_per_step_s"]
            },
            "admitting_share_measured": r.get("admitting_share_measured"),
            "admitting_share_simulated": r.get("admitting_share_simulated"),
            **_noise(r),
        }
        for r in report["rows"]
        if r["engines"] == 2 and r["mode"] != "sync"
    ]
    return {
        "rows": rows,
        "summary": summary(report).get("ray"),
        "measured_at": measured,
        "prefill_base_s": report["costs"]["prefill_base_s"],
        "engine_slots": report["costs"]["engine_slots"],
        "mode_vs_sync": mode_vs_sync(report["rows"]),
    }


def _noise(row: dict[str, Any]) -> dict[str, Any]:
    """How far the held-out measurement moves by itself: its repeats' s/step range, that range
    over the median (``repeat_spread``), and whether the prediction lies inside it (the
    measured median is one draw of such a run; a prediction inside its repeats is as close
    as the measurement can tell)."""
    lo, hi = row["measured_step_s_range"]
    return {
        "measured_step_s_range": [lo, hi],
        "repeat_spread": (hi - lo) / row["measured_step_s"],
        "predicted_within_repeats": lo <= row["predicted_step_s"] <= hi,
    }


def ranges(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per held-out mode, the range and mean of each error over the runs (s/step, speedup, and
    the busy time per step of each side), and how many runs had every held-out row within 10%."""
    out: dict[str, Any] = {}
    for mode in ("one-step", "fully-async"):
        for key in (
            "step_error",
            "speedup_error",
            "generating_error",
            "training_error",
            "weight_sync_error",
            "admitting_share_measured",
            "admitting_share_simulated",
            "repeat_spread",
        ):
            _put_range(
                out,
                f"{mode}/{key}",
                [r[key] for run in runs for r in run["rows"] if r["mode"] == mode and r.get(key) is not None],
            )
        inside = [
            r["predicted_within_repeats"]
            for run in runs
            for r in run["rows"]
            if r["mode"] == mode and "predicted_within_repeats" in r
        ]
        if inside:
            out[f"{mode}/predicted_within_repeats"] = {"rows": sum(inside), "of": len(inside)}
        for key, name in (
            ("growth", "engine_step_vs_sync_growth"),
            ("growth_model", "engine_step_vs_sync_growth_model"),
        ):
            _put_range(
                out,
                f"{mode}/{name}",
                [
                    run["mode_vs_sync"][mode][key]
                    for run in runs
                    if run.get("mode_vs_sync", {}).get(mode, {}).get(key) is not None
                ],
            )
    out["runs_within_10pct"] = sum(1 for run in runs if run["summary"] and run["summary"]["within_target"])
    out["runs"] = len(runs)
    return out


def _put_range(out: dict[str, Any], key: str, vals: list[float]) -> None:
    if vals:
        out[key] = {
            "min": min(vals),
            "max": max(vals),
            "mean": sum(vals) / len(vals),
            "sd": statistics.stdev(vals) if len(vals) > 1 else None,
            "n": len(vals),
        }


def kept_pairs(kept: Path) -> list[Path]:
    """The pair folders under ``kept`` (``run<i>`` with both files), by ``i``."""
    dirs = [
        d
        for d in kept.glob("run*")
        if d.name[3:].isdigit() and (d / "ray-1.json.gz").is_file() and (d / "ray-2.json.gz").is_file()
    ]
    return sorted(dirs, key=lambda d: int(d.name[3:]))


def rescore(kept: Path, work: Path) -> list[dict[str, Any]]:
    """``score`` of every pair kept under ``kept`` (``run<i>/ray-{1,2}.json.gz``), in run order (none: [])."""
    dirs = kept_pairs(kept)
    runs = []
    for d in dirs:
        paths = []
        for n in (1, 2):
            path = work / d.name / f"ray-{n}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(d / f"ray-{n}.json.gz", "rb") as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
            paths.append(str(path))
        runs.append({"pair": d.name, **score(*paths)})
    return runs


def _print_run(i: int, total: int, run: dict[str, Any]) -> None:
    s = run["summary"]
    print(
        f"run {i + 1}/{total}: "
        + ", ".join(f"{r['mode']} s/step {r['step_error']:+.1%} speedup {r['speedup_error']:+.1%}" for r in run["rows"])
        + ("; all within 10%" if s and s["within_target"] else "; NOT all within 10%"),
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.advise.validate_runs", description=__doc__.split("\n")[0])
    p.add_argument(
        "--runs", type=int, default=None, help="fresh pairs of Ray runs to make and validate (default 3; 0 with --keep)"
    )
    p.add_argument("--out", default="results/advise/validation_ray_runs.json")
    p.add_argument("--keep", default=None, help="keep each pair's results files (gzipped) under this folder")
    p.add_argument(
        "--rescore",
        default=None,
        help="validate the pairs kept under this folder again and make none (--keep DIR --runs 0)",
    )
    args = p.parse_args(argv)
    if args.keep and args.rescore:
        raise SystemExit("--keep and --rescore: give one (--keep makes new pairs, --rescore reads kept ones)")
    if args.rescore:
        if args.runs:
            raise SystemExit(
                f"--rescore with --runs {args.runs}: --rescore makes no runs; fix: drop --runs, or use "
                "--keep DIR --runs N to add pairs"
            )
        args.keep, args.runs = args.rescore, 0
    elif args.runs is None:
        args.runs = 3
    if args.runs < (0 if args.keep else 1):
        raise SystemExit(
            f"--runs {args.runs}: must be >= 1 (>= 0 with --keep: 0 validates the kept pairs again and "
            "makes none); fix: e.g. --runs 3"
        )
    earlier = kept_pairs(Path(args.keep)) if args.keep else []
    if args.runs == 0 and not earlier:
        flag = f"--rescore {args.rescore}" if args.rescore else f"--keep {args.keep} --runs 0"
        raise SystemExit(
            f"{flag}: no kept pairs (run<i>/ray-1.json.gz and ray-2.json.gz) there, so nothing to "
            "validate; fix: make them with --keep DIR, or name the folder that holds them"
        )
    runs = []
    with tempfile.TemporaryDirectory(prefix="ray-validation-") as tmp:
        if earlier:  # validated again with this model; the new pairs follow them
            runs = [{**run, "new": False} for run in rescore(Path(args.keep), Path(tmp) / "kept")]
            for i, run in enumerate(runs):
                _print_run(i, len(runs), run)
            if args.runs:
                print(f"{len(runs)} kept pair(s) above; {args.runs} new below", flush=True)
        first = int(earlier[-1].name[3:]) + 1 if earlier else 0
        for i in range(first, first + args.runs):
            keep = Path(args.keep) / f"run{i}" if args.keep else None
            runs.append({**({"pair": f"run{i}"} if keep else {}), "new": True, **one_run(Path(tmp) / f"run{i}", keep)})
            _print_run(i - first, args.runs, runs[-1])
    git = git_info()
    spread = ranges(runs)
    doc = {
        "command": "python -m harness.advise.validate_runs " + " ".join(argv if argv is not None else sys.argv[1:]),
        "created_utc": utc_now(),
        "git_commit": git["commit"] if git else None,
        "git_dirty": git["dirty"] if git else None,
        "runs": runs,
        "range": spread,
        **(
            {"range_new": ranges([r for r in runs if r.get("new")])}
            if any(r.get("new") is False for r in runs) and any(r.get("new") for r in runs)
            else {}
        ),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    r = spread
    for k, v in r.items():
        if isinstance(v, dict) and "_growth" in k:
            print(f"{k}: x{v['min']:.2f} .. x{v['max']:.2f} (mean x{v['mean']:.2f}) over {v['n']} run(s)")
        elif isinstance(v, dict) and "rows" in v:
            print(f"{k}: {v['rows']} of {v['of']} held-out rows")
        elif isinstance(v, dict) and ("_share_" in k or k.endswith("_spread")):
            print(f"{k}: {v['min']:.1%} .. {v['max']:.1%} (mean {v['mean']:.1%}) over {v['n']} run(s)")
        elif isinstance(v, dict):
            print(f"{k}: {v['min']:+.1%} .. {v['max']:+.1%} (mean {v['mean']:+.1%}) over {v['n']} run(s)")
    print(f"runs with every held-out row within 10%: {r['runs_within_10pct']} of {r['runs']}; wrote {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
