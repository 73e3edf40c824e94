"""Validation: calibrate on one measured run's sync mode, predict the other measured
runs, and put the closed-form formulas next to the simulator on the same inputs.

    python -m harness.advise.validate --calibrate RUN/results.json \\
        [--predict RUN2/results.json ...] --out results/advise

For every (results file, mode) it predicts the per-step wall time and the speedup over
that file's own sync mode, and compares with the measured medians over the run's repeats
(``extra.table``; a file without repeats has one). Writes ``validation.json``,
``validation.md`` and the fitted ``cpu_costs.json`` into ``--out``.

Closed forms, from sync-step costs R (generation), T (training), W (weight sync) that
the simulator's fitted costs give for the file's batch (``closed_form``):

* throughput: sync step ``R + T + W``; one-step ``max(R, T) + W`` (the next batch is
  generated during training; the update waits for both, slime's / Miles' one-step);
  fully-async ``max(R_stream, T + W)`` with ``R_stream`` the generation time without
  the per-step tail (the engine never drains); ideal speedup ``(R + T) / max(R, T)``
  (``harness.measure.overlap``, the bound the peers quote against);
* staleness: one-step age 1 (PRIME-RL's "step n samples with pi_{n-1}"); fully-async
  age bound ``min(max_staleness, C/B + 1)`` where ``C`` is the buffer capacity in groups
  (AReaL's admission bound ``accepted + running <= (eta + v + 1) B`` with
  ``eta = C/B``), and a Little's-law mean ``C/B`` when the trainer is the bottleneck
  (the buffer stays full, a group waits C/B steps). The anchors' other closed form
  (Applied Compute's mean staleness vs utilisation) is cited without its formula, so it
  is not evaluated here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

from miles_async_core.config import AsyncConfig
from harness.advise.costs import CostModel, fit_costs, observations_from_results, replay_steps
from harness.advise.predict import Layout, predict, predict_sync

MODES = ("sync", "one-step", "fully-async")


def _config_of(doc: dict[str, Any], mode: str) -> AsyncConfig:
    names = set(AsyncConfig().to_dict())
    raw = doc["config"]["modes"][mode]
    return AsyncConfig.from_dict({k: v for k, v in raw.items() if k in names})


def measured(doc: dict[str, Any], mode: str) -> dict[str, Any]:
    """Median per-step wall and speedup over the repeats (one value without repeats)."""
    rows = doc["extra"].get("repeats", {}).get(mode) or [r for r in doc["extra"]["table"] if r["mode"] == mode]
    per_step = sorted(r["wall_s"] / r["steps"] for r in rows if r.get("steps"))
    speed = sorted(r["speedup"] for r in rows if r.get("speedup") is not None)
    ages = [a for h in doc["extra"].get("per_step", {}).get(mode, []) for a in h.get("age_versions", [])]
    med = lambda xs: xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])  # noqa
    return {"step_s": med(per_step), "step_s_min": per_step[0], "step_s_max": per_step[-1],
            "speedup": med(speed) if speed else (1.0 if mode == "sync" else None), "repeats": len(rows),
            "age_mean": sum(ages) / len(ages) if ages else None, "age_max": max(ages) if ages else None}


def closed_form(costs: CostModel, config: AsyncConfig) -> dict[str, Any]:
    n = config.rollout_batch_size * config.n_samples_per_prompt
    L = costs.length_dist().median if costs.response_length["kind"] == "fixed" else None
    mean_len = L if L is not None else costs.length_dist().median * math.exp(costs.response_length["sigma"] ** 2 / 2)
    mean_len = min(mean_len, costs.max_new_tokens)
    step_cost = costs.decode_base_s + costs.decode_per_seq_s * costs.max_running
    waves = replay_steps([int(round(mean_len))] * n, costs.max_running)
    R = waves * step_cost + costs.prefill_per_token_s * costs.prompt_tokens * n
    R_stream = n * mean_len / costs.max_running * step_cost + costs.prefill_per_token_s * costs.prompt_tokens * n
    T = costs.train_base_s + costs.train_per_token_s * n * mean_len
    W = costs.weight_sync_s
    sync = R + T + W
    one = max(R, T) + W
    fa = max(R_stream, T + W)
    # groups that wait in front of a new one when the trainer is the bottleneck: the
    # buffer (capacity C) and the groups in flight (budget G), B consumed per step
    cap_groups = (config.capacity + config.group_budget) / max(1, config.rollout_batch_size)
    bound = cap_groups + 1 if config.max_weight_staleness is None else min(config.max_weight_staleness, cap_groups + 1)
    return {"R": R, "T": T, "W": W, "sync_step_s": sync, "one_step_step_s": one, "fully_async_step_s": fa,
            "ideal_speedup": (R + T) / max(R, T), "one_step_speedup": sync / one, "fully_async_speedup": sync / fa,
            "one_step_age": 1, "fully_async_age_bound": bound,
            "fully_async_age_mean_trainer_bound": cap_groups if T + W >= R_stream else None}


def validate(calibration: str, others: list[str]) -> dict[str, Any]:
    costs = fit_costs(observations_from_results(calibration))
    rows = []
    for path in [calibration] + others:
        doc = json.loads(Path(path).read_text())
        spec = doc["config"].get("spec", {})
        c = dataclasses.replace(costs, max_running=int(spec.get("max_running", costs.max_running)))
        modes = [m for m in MODES if m in doc["config"].get("modes", {})]
        for mode in modes:
            cfg = _config_of(doc, mode)
            meas = measured(doc, mode)
            pred = predict(c, cfg, Layout())
            base = predict_sync(c, cfg, Layout(), cfg.num_rollout)
            cf = closed_form(c, cfg)
            cf_step = {"sync": cf["sync_step_s"], "one-step": cf["one_step_step_s"],
                       "fully-async": cf["fully_async_step_s"]}[mode]
            row = {
                "file": path, "mode": mode, "calibration": path == calibration and mode == "sync",
                "B": cfg.rollout_batch_size, "n": cfg.n_samples_per_prompt, "interval": cfg.update_weights_interval,
                "max_staleness": cfg.max_weight_staleness, "steps": cfg.num_rollout,
                "measured_step_s": meas["step_s"], "measured_step_s_range": [meas["step_s_min"], meas["step_s_max"]],
                "measured_speedup": meas["speedup"] if "sync" in modes else None, "repeats": meas["repeats"],
                "predicted_step_s": pred["step_s"], "predicted_speedup": base["step_s"] and base["step_s"] / pred["step_s"],
                "closed_form_step_s": cf_step,
                "closed_form_speedup": cf["sync_step_s"] / cf_step,
                "measured_age_mean": meas["age_mean"], "measured_age_max": meas["age_max"],
                "predicted_age_mean": pred["age_recorded"]["mean"], "predicted_age_max": pred["age_recorded"]["max"],
                "closed_form_age": {"sync": 0, "one-step": cf["one_step_age"],
                                    "fully-async": cf["fully_async_age_mean_trainer_bound"]}[mode],
                "closed_form_age_bound": {"sync": 0, "one-step": 1, "fully-async": cf["fully_async_age_bound"]}[mode],
            }
            row["step_error"] = row["predicted_step_s"] / row["measured_step_s"] - 1
            row["closed_form_step_error"] = cf_step / row["measured_step_s"] - 1
            if row["measured_speedup"] is not None:
                row["speedup_error"] = row["predicted_speedup"] / row["measured_speedup"] - 1
                row["closed_form_speedup_error"] = row["closed_form_speedup"] / row["measured_speedup"] - 1
            rows.append(row)
    return {"calibration": calibration, "costs": costs.to_json(), "rows": rows}


def to_markdown(report: dict[str, Any], command: str) -> str:
    pct = lambda x: "-" if x is None else f"{x:+.1%}"  # noqa: E731
    f3 = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    c = report["costs"]
    lines = [
        "# advise: predicted vs measured (CPU main job)", "",
        f"Made by: `{command}`", "",
        f"Calibration: the sync mode of `{report['calibration']}` (first repeat's timeline). Fitted costs: decode "
        f"step {c['decode_base_s'] * 1e3:.2f} ms + {c['decode_per_seq_s'] * 1e6:.1f} us/seq, train "
        f"{c['train_base_s']:.3f} s + {c['train_per_token_s'] * 1e6:.1f} us/token, weight sync "
        f"{c['weight_sync_s'] * 1e3:.1f} ms, pause/resume {c['pause_resume_s'] * 1e3:.1f} ms; engine fit RMS error "
        f"{c['fit']['engine']['rms_rel_error']:.1%}, trainer {c['fit']['trainer']['rms_rel_error']:.1%}.", "",
        "Measured: median over the run's repeats of wall/step and of the per-repeat speedup (against the same "
        "repeat's sync). Predicted: `harness.advise.predict` (simulator, fitted costs). Closed form: "
        "`harness.advise.validate.closed_form` on the same fitted costs.", "",
        "| file | mode | B | k | s | measured s/step (range) | sim s/step (err) | closed-form s/step (err) | "
        "measured speedup | sim speedup (err) | closed-form speedup (err) | age mean/max: measured | sim | "
        "closed form |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lo, hi = r["measured_step_s_range"]
        lines.append(
            f"| {Path(r['file']).parent.name}{' (calib.)' if r['calibration'] else ''} | {r['mode']} | {r['B']} | "
            f"{r['interval']} | {'-' if r['max_staleness'] is None else r['max_staleness']} | "
            f"{r['measured_step_s']:.4f} ({lo:.3f}-{hi:.3f}) | {r['predicted_step_s']:.4f} ({pct(r['step_error'])}) | "
            f"{r['closed_form_step_s']:.4f} ({pct(r['closed_form_step_error'])}) | {f3(r['measured_speedup'])} | "
            f"{f3(r['predicted_speedup'])} ({pct(r.get('speedup_error'))}) | {f3(r['closed_form_speedup'])} "
            f"({pct(r.get('closed_form_speedup_error'))}) | "
            f"{f3(r['measured_age_mean'])}/{r['measured_age_max']} | {f3(r['predicted_age_mean'])}/"
            f"{r['predicted_age_max']} | {r['closed_form_age']} (bound {r['closed_form_age_bound']}) |")
    lines += [
        "", "## Reading the table", "",
        "* Simulator vs closed form: on these runs lengths are fixed (every copy response hits max_new_tokens) and "
        "the trainer is the bottleneck, so both agree within a few percent. The closed form is lower because it "
        "counts every weight sync (the measurement window ends with the last training step, so the simulator, like "
        "the main job, leaves the last one out) and treats one-step as max(R, T) + W exactly; they part ways when "
        "lengths vary (the closed form has no wave tail: a step's generation ends with its longest request), when "
        "the engine is the bottleneck (fully-async streaming vs one-step's drain per step), with pause/resume cost "
        "under retract, and with drops (the closed form assumes every generated group is trained).",
        "* Ages: the closed-form fully-async mean (C + G)/B assumes a full buffer from the first step; the measured "
        "and simulated means are a little higher because a group also ages while it is generated and lower in the "
        "first steps (empty buffer); the closed-form bound (C + G)/B + 1 is one below the observed max for the same "
        "reason (generation time spans a version).",
        "* Runs measured on a loaded machine (other jobs on the same 2 cores; see each file's measured range) are "
        "outside the model: the simulator assumes the engine and the trainer each own their core, and under "
        "contention overlapping them only moves the wait. Such rows show how far from the model contention puts a "
        "run; they are not a test of the calibration.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.advise.validate", description=__doc__.split("\n")[0])
    p.add_argument("--calibrate", required=True, help="results.json whose sync mode calibrates the costs")
    p.add_argument("--predict", nargs="*", default=[], help="more results.json files to predict")
    p.add_argument("--out", default="results/advise")
    args = p.parse_args(argv)
    command = "python -m harness.advise.validate " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    report = validate(args.calibrate, args.predict)
    report["command"] = command
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    CostModel.from_json(report["costs"]).write(out / "cpu_costs.json")
    (out / "validation.json").write_text(json.dumps(report, indent=1, sort_keys=True, default=str) + "\n")
    md = to_markdown(report, command)
    (out / "validation.md").write_text(md)
    print(md)
    print(f"wrote {out / 'validation.json'}, {out / 'validation.md'}, {out / 'cpu_costs.json'}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
