"""`miles-harness advise`: predict a layout and a Miles command line from calibrated costs.

    miles-harness advise [--costs FILE] [--engines N] [--gpus-per-engine G]
                         [--trainer-gpus T] [--steps N] [--target "fastest with age <= S"]
                         [--lr LR] [--plot FILE] [--json] -- <miles args>

Simulates the flags on the layout on virtual time (``harness.advise.predict``) with the
costs fitted from a measured run (``harness.advise.costs``; default: the committed CPU
calibration, ``results/advise/cpu_costs.json`` of this checkout, whatever the working
directory) and prints the predicted step time, speedup over sync, overlap
efficiency, sample ages (Miles' recorded version and the true oldest-token version),
drop and retry shares and buffer occupancy. With ``--target`` it also searches sync,
one-step (interval 1, 2, 4) and fully-async (max staleness 0..S, drop or retry) for the
fastest settings within the age bound, with the learning rate the rule gives them.
``--plot`` draws predicted speedup and age against the number of engines.
An impossible layout (zero engines, a tensor-parallel size that is not 1/2/4/8 or whole
nodes, a batch that does not split over the trainer ranks, colocation with different GPU
counts) or flags the rule profile refuses are an error naming the flag and the fix.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

# The committed CPU calibration, found from this file (not from the working directory).
DEFAULT_COSTS = str(Path(__file__).resolve().parents[2] / "results" / "advise" / "cpu_costs.json")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--costs",
        default=DEFAULT_COSTS,
        help="fitted cost model (default: the committed results/advise/cpu_costs.json)",
    )
    p.add_argument("--engines", type=int, default=1, help="rollout engines")
    p.add_argument("--gpus-per-engine", type=int, default=1, help="GPUs per engine (tensor-parallel size)")
    p.add_argument("--trainer-gpus", type=int, default=1, help="trainer GPUs (data-parallel ranks)")
    p.add_argument("--steps", type=int, default=None, help="training steps to simulate (default: --num-rollout)")
    p.add_argument("--target", default=None, help="'fastest' or 'fastest with age <= S': recommend settings")
    p.add_argument("--lr", type=float, default=1e-3, help="the base learning rate the recommendation scales")
    p.add_argument("--plot", default=None, help="write a PNG of predicted speedup and age vs number of engines")
    p.add_argument(
        "--profile",
        default="manual",
        help="rule profile: manual (Miles' manual page on async training) or the pinned "
        "upstream Miles profile (miles-<pinned commit>; miles_async_core.rules.PROFILES)",
    )
    p.add_argument("--json", action="store_true", help="print everything as one JSON document")


def _fmt_hist(h: dict[int, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted(h.items())) or "-"


def format_prediction(p: dict[str, Any]) -> str:
    lay = p["layout"]
    pct = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731
    rows = [
        (
            "layout",
            f"{lay['engines']} engine(s) x {lay['gpus_per_engine']} GPU(s), trainer {lay['trainer_gpus']} GPU(s)",
        ),
        ("steps simulated", p["steps"]),
        ("predicted step time", f"{p['step_s']:.4g} s (sync: {p['sync_step_s']:.4g} s)"),
        ("speedup over sync", f"{p['speedup']:.3f}x (ideal {p['ideal_speedup']:.3f}x)"),
        ("overlap efficiency", "-" if p["overlap_efficiency"] is None else f"{p['overlap_efficiency']:.3f}"),
        (
            "age, Miles recorded (versions)",
            f"mean {p['age_recorded']['mean']:.2f}, max {p['age_recorded']['max']}  "
            f"[{_fmt_hist(p['age_recorded']['hist'])}]",
        ),
        (
            "age, true oldest token",
            f"mean {p['age_true']['mean']:.2f}, max {p['age_true']['max']}  [{_fmt_hist(p['age_true']['hist'])}]",
        ),
        (
            "policy lag, optimizer steps",
            f"mean {p['lag_steps']['mean']:.2f}, max {p['lag_steps']['max']}  [{_fmt_hist(p['lag_steps']['hist'])}]",
        ),
        ("dropped / retried share", f"{pct(p['dropped_share'])} / {pct(p['retried_share'])}"),
        (
            "buffer occupancy mean / max",
            "-"
            if p["queue_size_mean"] is None
            else f"{p['queue_size_mean']:.1f} / {p['queue_size_max']} groups (capacity {p['capacity']})",
        ),
        (
            "both busy / engine idle / trainer idle",
            f"{pct(p['both_busy_fraction'])} / {pct(p['rollout_idle_ratio'])} / {pct(p['train_idle_ratio'])}",
        ),
        ("simulation cost", f"{p['cpu_s']:.2f} CPU-s, {p['samples_per_cpu_s']:.0f} samples per CPU-s"),
    ]
    w = max(len(r[0]) for r in rows)
    return "\n".join(f"{a:<{w}}  {b}" for a, b in rows)


def format_validation(v: dict[str, Any] | None) -> str:
    """How well this calibration predicted the runs it was not fitted on
    (``harness.advise.validate`` stores it in the costs file), or '' if it was not validated."""
    if not v or not v.get("held_out"):
        return ""
    lines = [
        f"this calibration on held-out measured runs (one validation, {v['report']}; a shared host's "
        "run-to-run spread can move these by several points: python -m harness.advise.validate_runs):"
    ]
    for layout, s in v["held_out"].items():
        lines.append(
            f"  {layout} layout, {s['rows']} row(s): worst s/step error {s['worst_step_error']:+.1%} "
            f"({s['worst_step_row']}), worst speedup error {s['worst_speedup_error']:+.1%} "
            f"({s['worst_speedup_row']}); "
            + ("all within 10%" if s["within_target"] else "NOT all within 10%: treat this kind of prediction as rough")
        )
    return "\n".join(lines)


def format_recommendation(r: dict[str, Any]) -> str:
    lines = [f"target: {r['target']} ({r['steps_simulated']} steps simulated per candidate)"]
    for c in sorted(r["candidates"], key=lambda c: c["step_s"]):
        mark = "*" if c is r["best"] else (" " if c["ok"] else "x")
        lines.append(
            f" {mark} {c['step_s']:.4g} s/step  {c['speedup']:.2f}x  lag/age<={c['age_true_max']}  "
            f"dropped {c['dropped_share']:.1%}  lr {c['lr']:.3g}  {c['settings']}"
        )
    if r["best"] is None:
        lines.append("no candidate meets the target")
    else:
        b = r["best"]
        lines.append(f"recommended: {b['settings']}, lr {b['lr']:.3g} (base lr / {b['lr_factor']})")
    lines.append(f"learning rate: {r['lr_rule']}; {r['lr_note']}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    import dataclasses

    from harness.advise.costs import load_costs
    from harness.advise.predict import (
        Layout,
        check_layout,
        engine_counts,
        plot_sweep,
        predict,
        recommend,
        sweep_engines,
    )

    from harness.commands.miles_args import parse

    config = parse(list(args.miles_args), allow_unknown=args.allow_unknown_miles_flags)
    if args.steps is not None:
        config = dataclasses.replace(config, num_rollout=args.steps)
    layout = Layout(engines=args.engines, gpus_per_engine=args.gpus_per_engine, trainer_gpus=args.trainer_gpus)
    check_layout(layout, config, args.profile)  # refuse before loading or simulating anything
    costs = load_costs(args.costs)
    prediction = predict(costs, config, layout, profile=args.profile)
    recommendation = (
        recommend(costs, config, layout, args.target, base_lr=args.lr, profile=args.profile) if args.target else None
    )
    out: dict[str, object] = {
        "costs": args.costs,
        "prediction": prediction,
        "calibration_validation": costs.fit.get("validation"),
    }
    if recommendation is not None:
        out["recommendation"] = recommendation
    if args.plot:
        rows = sweep_engines(costs, config, layout, engine_counts(layout.engines))
        out["engines_sweep"] = rows
        title = (
            f"predicted speedup and age vs engines ({layout.gpus_per_engine} GPU/engine, "
            f"trainer {layout.trainer_gpus} GPU); costs {Path(args.costs).name}"
        )
        out["plot"] = str(plot_sweep(rows, args.plot, title))
    if args.json:
        print(json.dumps(out, indent=1, sort_keys=True, default=str))
        return 0
    print(format_prediction(prediction))
    accuracy = format_validation(costs.fit.get("validation"))
    if accuracy:
        print(accuracy)
    if recommendation is not None:
        print()
        print(format_recommendation(recommendation))
    if "plot" in out:
        print(f"\nwrote {out['plot']}")
    return 0
