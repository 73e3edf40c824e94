"""Validation: calibrate on one measured run's sync mode, predict the other measured
runs, and put the closed-form formulas next to the simulator on the same inputs.

    python -m harness.advise.validate --calibrate RUN/results.json \\
        [--predict RUN2/results.json ...] --out results/advise

For every (results file, mode) it predicts the per-step wall time and the speedup over
that file's own sync mode, and compares with the measured medians over the run's repeats
(``extra.repeats``, else the mode's row of ``extra.table``, read in either layout by
``harness.results.mode_rows``). Writes ``validation.json``,
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
from collections.abc import Mapping
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

from miles_async_core.config import AsyncConfig
from harness.advise import host_share
from harness.advise.costs import (
    CostModel,
    fit_costs,
    fit_engine_sharing,
    mode_of,
    observations_from_results,
    replay_steps,
)
from harness.advise.predict import Layout, predict, predict_sync
from harness.results.run_extras import RunExtras, load_run
from harness.sim.contention import Contention

MODES = ("sync", "one-step", "fully-async")


def _config_of(raw: Mapping[str, object]) -> AsyncConfig:
    """A mode's resolved config as a results file stores it (``config.modes.<mode>``)."""
    names = set(AsyncConfig().to_dict())
    return AsyncConfig.from_dict({k: v for k, v in raw.items() if k in names})


def measured(doc: Mapping[str, object], mode: str) -> dict[str, Any]:
    """Median per-step wall and speedup over the repeats (one value without repeats)."""
    extras = RunExtras.from_doc(doc)
    rows = extras.repeats.get(mode) or [extras.table[mode]]
    per_step = sorted(r.wall_s / r.steps for r in rows if r.steps and r.wall_s is not None)
    speed = sorted(r.speedup for r in rows if r.speedup is not None)
    ages = extras.sample_ages(mode)
    med = lambda xs: xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])  # noqa
    busy = {
        side: med(sorted(getattr(r, key) / r.steps for r in rows if r.steps and getattr(r, key) is not None))
        for side, key in (
            ("generating", "rollout_busy_s"),
            ("training", "train_busy_s"),
            ("weight_sync", "weight_sync_s"),
        )
        if all(getattr(r, key) is not None for r in rows)
    }
    cpu = sorted(r.cpu_cores_total for r in rows if r.cpu_cores_total is not None)
    return {
        "cpu_cores_total": med(cpu) if cpu and len(cpu) == len(rows) else None,
        # each engine's share of the host while the rollout generates
        "engine_cores_generating": host_share.engine_cores_generating(rows),
        "host_cpu_count": next((int(r.host_cpu_count) for r in rows if r.host_cpu_count), None),
        "step_s": med(per_step),
        "step_s_min": per_step[0],
        "step_s_max": per_step[-1],
        "speedup": med(speed) if speed else (1.0 if mode == "sync" else None),
        "repeats": len(rows),
        "age_mean": sum(ages) / len(ages) if ages else None,
        "age_max": max(ages) if ages else None,
        "busy_per_step_s": busy,
    }


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
    return {
        "R": R,
        "T": T,
        "W": W,
        "sync_step_s": sync,
        "one_step_step_s": one,
        "fully_async_step_s": fa,
        "ideal_speedup": (R + T) / max(R, T),
        "one_step_speedup": sync / one,
        "fully_async_speedup": sync / fa,
        "one_step_age": 1,
        "fully_async_age_bound": bound,
        "fully_async_age_mean_trainer_bound": cap_groups if T + W >= R_stream else None,
    }


def layout_of(spec: dict[str, Any]) -> Layout:
    """The run's layout as the advisor sees it: the Ray layout's ``--num-engines`` engines
    (each of the calibrated size), else one engine."""
    return Layout(engines=int(spec.get("num_engines", 1)) if spec.get("layout") == "ray" else 1)


def validate(calibration: str, others: list[str], engines_from: str | None = None) -> dict[str, Any]:
    costs = fit_costs(observations_from_results(calibration))
    if engines_from is not None:
        costs = fit_engine_sharing(costs, engines_from)
    rows = []
    paths = [calibration] + ([engines_from] if engines_from and engines_from not in others else []) + others
    for path in dict.fromkeys(paths):
        run = load_run(path)
        doc = run.doc
        spec = run.spec
        git = doc.get("git") or {}
        c = dataclasses.replace(costs, max_running=int(spec.get("max_running", costs.max_running)))
        layout = layout_of(spec)
        modes = [m for m in MODES if m in run.mode_configs]
        for mode in modes:
            cfg = _config_of(run.mode_configs[mode])
            meas = measured(doc, mode)
            pred = predict(c, cfg, layout)
            base = predict_sync(c, cfg, layout, cfg.num_rollout)
            alone = dataclasses.replace(c, contention_engine=0.0, contention_trainer=0.0, contention_by_mode={})
            pred0 = predict(alone, cfg, layout, baseline=base)["step_s"] if mode != "sync" else pred["step_s"]
            engines = run.extras.engine_rows(mode)
            cf = closed_form(c, cfg)
            cf_step = {
                "sync": cf["sync_step_s"],
                "one-step": cf["one_step_step_s"],
                "fully-async": cf["fully_async_step_s"],
            }[mode]
            row = {
                "file": path,
                "mode": mode,
                "calibration": path in (calibration, engines_from) and mode == "sync",
                "layout": spec.get("layout", "split"),
                "engines": layout.engines,
                "commit": git.get("commit"),
                "dirty": git.get("dirty"),
                "B": cfg.rollout_batch_size,
                "n": cfg.n_samples_per_prompt,
                "interval": cfg.update_weights_interval,
                "max_staleness": cfg.max_weight_staleness,
                "steps": cfg.num_rollout,
                "measured_step_s": meas["step_s"],
                "measured_step_s_range": [meas["step_s_min"], meas["step_s_max"]],
                "measured_speedup": meas["speedup"] if "sync" in modes else None,
                "repeats": meas["repeats"],
                "predicted_step_s": pred["step_s"],
                "predicted_speedup": base["step_s"] and base["step_s"] / pred["step_s"],
                "closed_form_step_s": cf_step,
                "closed_form_speedup": cf["sync_step_s"] / cf_step,
                "measured_busy_per_step_s": meas["busy_per_step_s"],
                "cpu_cores_total": meas["cpu_cores_total"],
                "host_cpu_count": meas["host_cpu_count"],
                "engine_cores_generating": meas["engine_cores_generating"],
                "predicted_busy_per_step_s": pred["busy_per_step_s"],
                "measured_age_mean": meas["age_mean"],
                "measured_age_max": meas["age_max"],
                "predicted_age_mean": pred["age_recorded"]["mean"],
                "predicted_age_max": pred["age_recorded"]["max"],
                "closed_form_age": {
                    "sync": 0,
                    "one-step": cf["one_step_age"],
                    "fully-async": cf["fully_async_age_mean_trainer_bound"],
                }[mode],
                "closed_form_age_bound": {"sync": 0, "one-step": 1, "fully-async": cf["fully_async_age_bound"]}[mode],
            }
            row["predicted_step_s_no_contention"] = pred0
            row["step_error_no_contention"] = pred0 / row["measured_step_s"] - 1
            # each engine's decode speed while busy: its tokens over its own decode-step time
            row["engine_busy_tokens_per_s"] = [
                e["tokens"] / e["decode_busy_s"] for e in engines if e.get("decode_busy_s")
            ]
            row["engine_steps"] = _engine_steps(engines, c, cfg, layout.engines)
            # the engines' steps that admitted requests, of all their steps: measured (first repeat, every
            # engine) and simulated; a real engine admits requests as they arrive, the simulated one a group's
            # requests at once
            counted = [e for e in engines if e.get("steps_admitting") is not None and e.get("decode_steps")]
            row["admitting_share_measured"] = (
                (sum(e["steps_admitting"] for e in counted) / sum(e["decode_steps"] for e in counted))
                if counted
                else None
            )
            row["admitting_share_simulated"] = pred["admitting_share"]
            row["step_error"] = row["predicted_step_s"] / row["measured_step_s"] - 1
            row["closed_form_step_error"] = cf_step / row["measured_step_s"] - 1
            if row["measured_speedup"] is not None:
                row["speedup_error"] = row["predicted_speedup"] / row["measured_speedup"] - 1
                row["speedup_error_no_contention"] = base["step_s"] / pred0 / row["measured_speedup"] - 1
                row["closed_form_speedup_error"] = row["closed_form_speedup"] / row["measured_speedup"] - 1
            rows.append(row)
    return {"calibration": calibration, "engines_from": engines_from, "costs": costs.to_json(), "rows": rows}


def _engine_steps(
    engines: list[dict[str, Any]], costs: CostModel, config: AsyncConfig, n: int
) -> dict[str, Any] | None:
    """The engines' own decode-step times of the first repeat (``harness.measure.engines``:
    mean over the engines of each part, milliseconds) with the factor the simulator applies
    to a step in each part when all ``n`` engines decode (``Contention.engine_factor``: the
    sharing ``max(1, n / engine_slots)`` times the mode's host growth (``host_growth`` of
    ``host_share.figures``), times
    ``1 + engine contention`` of the mode under training). None for a results file without
    them (the split layout, or a run made before they were recorded)."""
    rows = [e for e in engines if e.get("step_ms") is not None]
    if not rows:
        return None

    def mean(key: str) -> float | None:
        vals = [e[key] for e in rows if e.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    model = Contention(
        engine=costs.contention_for(config)[0] if config.driver != "train" else 0.0,
        trainer=0.0,
        engine_slots=costs.engine_slots,
        **host_share.figures(costs, mode_of(config)),
    )
    model.busy = n
    factor_not_training = model.engine_factor()
    model.training = True
    return {
        "step_ms": mean("step_ms"),
        "step_ms_training": mean("step_ms_training"),
        "step_ms_not_training": mean("step_ms_not_training"),
        "model_factor_training": model.engine_factor(),
        "model_factor_not_training": factor_not_training,
    }


def _steps_table(rows: list[dict[str, Any]]) -> list[str]:
    """Decode steps as the engines timed them, against the step the calibration fitted."""
    with_steps = [r for r in rows if r.get("engine_steps")]
    if not with_steps:
        return []
    ref = next((r["engine_steps"]["step_ms"] for r in with_steps if r["calibration"] and r["engines"] == 1), None)
    if ref is None:
        return []
    lines = [
        f"Decode steps as the engines timed them (first repeat, mean over engines; "
        f"`harness.measure.engines`), in ms and as a factor of the one-engine sync step ({ref:.2f} ms): "
        "under training (at least half of the step overlaps a training step) and not; beside each, the "
        "factor the simulator applies to such a step when all the layout's engines decode.",
        "",
        "| file | layout | mode | all steps | under training: measured | model | not training: measured | model |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in with_steps:
        s = r["engine_steps"]

        def cell(key: str, s: dict[str, Any] = s) -> str:
            return "-" if s[key] is None else f"{s[key]:.2f} (x{s[key] / ref:.2f})"

        lines.append(
            f"| {_label(r)} | {_layout(r)} | {r['mode']} | {cell('step_ms')} | {cell('step_ms_training')} "
            f"| x{s['model_factor_training']:.2f} | {cell('step_ms_not_training')} | "
            f"x{s['model_factor_not_training']:.2f} |"
        )
    return lines


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _f3(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _label(r: dict[str, Any]) -> str:
    return f"{Path(r['file']).parent.name}{' (calib.)' if r['calibration'] else ''}"


def _layout(r: dict[str, Any]) -> str:
    return f"ray x{r['engines']}" if r.get("layout") == "ray" else r.get("layout", "split")


def _calibration_text(report: dict[str, Any]) -> list[str]:
    c = report["costs"]
    fit = c["fit"]
    scale = fit.get("repeat_scale")
    cont = fit.get("contention", {})
    lines = [
        f"Calibration: the sync mode of `{report['calibration']}` (first repeat's timeline"
        + (
            f", costs scaled to the median repeat: engine x{scale['engine']:.3f}, trainer x{scale['trainer']:.3f}, "
            f"weight sync x{scale['weight_sync']:.3f}"
            if scale
            else ""
        )
        + f"). Fitted costs: decode step {c['decode_base_s'] * 1e3:.2f} ms + {c['decode_per_seq_s'] * 1e6:.1f} us/seq, "
        f"train {c['train_base_s']:.3f} s + {c['train_per_token_s'] * 1e6:.1f} us/token, weight sync "
        f"{c['weight_sync_s'] * 1e3:.1f} ms, pause/resume {c['pause_resume_s'] * 1e3:.1f} ms; engine fit RMS error "
        f"{fit['engine']['rms_rel_error']:.1%}, trainer {fit['trainer']['rms_rel_error']:.1%}.",
        "",
    ]
    if "engine" in cont:
        e, t = cont["engine"], cont["trainer"]
        se = lambda x: "-" if x["c_se"] is None else f"{x['c_se']:.3f}"  # noqa: E731
        by = "; ".join(
            f"{m} alone: engine {v['engine']:.3f}, trainer {v['trainer']:.3f}"
            for m, v in c["contention_by_mode"].items()
        )
        lines += [
            f"Contention (`harness.sim.contention`, fitted by `harness.advise.costs.fit_contention` on the same run's "
            f"{e['n']} overlapped repeats, each against the sync repeat of the same index): while the trainer trains "
            f"an engine step costs 1 + **{c['contention_engine']:.3f}** (standard error {se(e)}; the engine busy time "
            f"it predicts is off by {e['rms_rel_error']:.1%} RMS) times as much; while the engine decodes a training "
            f"step costs 1 + **{c['contention_trainer']:.3f}** (standard error {se(t)}; {t['rms_rel_error']:.1%} RMS) "
            f"times as much. Fitted on each mode alone (what predictions of that mode use): {by}.",
            "",
        ]
    else:
        lines += [f"Contention: {cont.get('source', 'not fitted')}.", ""]
    return lines


def _main_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| file | layout | mode | B | k | s | measured s/step (range) | sim s/step (err) | "
        "closed-form s/step (err) | measured speedup | sim speedup (err) | closed-form speedup (err) | age mean/max: measured | sim | "
        "closed form |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = r["measured_step_s_range"]
        lines.append(
            f"| {_label(r)} | {_layout(r)} | {r['mode']} | {r['B']} | "
            f"{r['interval']} | {'-' if r['max_staleness'] is None else r['max_staleness']} | "
            f"{r['measured_step_s']:.4f} ({lo:.3f}-{hi:.3f}) | {r['predicted_step_s']:.4f} ({_pct(r['step_error'])}) | "
            f"{r['closed_form_step_s']:.4f} ({_pct(r['closed_form_step_error'])}) | {_f3(r['measured_speedup'])} | "
            f"{_f3(r['predicted_speedup'])} ({_pct(r.get('speedup_error'))}) | {_f3(r['closed_form_speedup'])} "
            f"({_pct(r.get('closed_form_speedup_error'))}) | "
            f"{_f3(r['measured_age_mean'])}/{r['measured_age_max']} | {_f3(r['predicted_age_mean'])}/"
            f"{r['predicted_age_max']} | {r['closed_form_age']} (bound {r['closed_form_age_bound']}) |"
        )
    return lines


def _busy_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "Busy time per training step, measured (median over repeats) / simulated, seconds: the engine "
        "generating, the trainer training, weight sync; and the simulator's prediction with the contention "
        "factors set to 0 (the model before them); and the host's cores the run's processes kept busy "
        "(`harness.measure.cpu_use`, median over repeats; '-': not recorded).",
        "",
        "| file | layout | mode | generating | training | weight sync | sim without contention: s/step (err), "
        "speedup (err) | host cores busy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, p = r.get("measured_busy_per_step_s") or {}, r.get("predicted_busy_per_step_s") or {}
        cells = [
            f"{m[k]:.4f} / {p[k]:.4f}" if k in m and k in p else "-" for k in ("generating", "training", "weight_sync")
        ]
        sp0 = r.get("speedup_error_no_contention")
        cells.append(
            f"{r['predicted_step_s_no_contention']:.4f} ({_pct(r['step_error_no_contention'])}), "
            f"{_pct(sp0) if sp0 is not None else '-'}"
        )
        cores = r.get("cpu_cores_total")
        cells.append("-" if cores is None else f"{cores:.2f} of {r.get('host_cpu_count') or '?'}")
        lines.append(f"| {_label(r)} | {_layout(r)} | {r['mode']} | " + " | ".join(cells) + " |")
    return lines


def summary(report: dict[str, Any], target: float = 0.10) -> dict[str, Any]:
    """The largest errors of the held-out rows (not the calibration file), split layout
    and Ray layout apart, and whether they are within ``target``."""
    out = {}
    for name in ("split", "ray"):
        rows = _held_out(report, name)
        if not rows:
            continue
        step = max(rows, key=lambda r: abs(r["step_error"]))
        speed = max(rows, key=lambda r: abs(r.get("speedup_error") or 0.0))
        out[name] = {
            "rows": len(rows),
            "worst_step_error": step["step_error"],
            "worst_step_row": f"{_label(step)} {step['mode']}",
            "worst_speedup_error": speed.get("speedup_error") or 0.0,
            "worst_speedup_row": f"{_label(speed)} {speed['mode']}",
            "within_target": all(
                abs(r["step_error"]) <= target and abs(r.get("speedup_error") or 0.0) <= target for r in rows
            ),
        }
    return out


def to_markdown(report: dict[str, Any], command: str) -> str:
    lines = ["# advise: predicted vs measured (CPU main job)", "", f"Made by: `{command}`", ""]
    lines += _calibration_text(report)
    lines += [
        "Measured: median over the run's repeats of wall/step and of the per-repeat speedup (against the same "
        "repeat's sync). Predicted: `harness.advise.predict` (simulator, fitted costs, `--engines N` for a Ray "
        "run of N engines). Closed form: `harness.advise.validate.closed_form` on the same fitted costs "
        "(no contention term).",
        "",
    ]
    lines += _main_table(report["rows"]) + [""]
    for name, s in summary(report).items():
        lines.append(
            f"Held-out {'split-layout' if name == 'split' else 'Ray-layout'} rows ({s['rows']}): largest "
            f"s/step error {_pct(s['worst_step_error'])} ({s['worst_step_row']}), largest speedup error "
            f"{_pct(s['worst_speedup_error'])} ({s['worst_speedup_row']}); "
            + ("all within 10%." if s["within_target"] else "**not all within 10%**.")
        )
    steps = _steps_table(report["rows"])
    lines += (
        [""]
        + _busy_table(report["rows"])
        + ([""] + steps if steps else [])
        + ["", "## Reading the table", ""]
        + [f"* {t}" for t in reading(report)]
    )
    return "\n".join(lines) + "\n"


STATIC_READING = [
    "Simulator vs closed form: on these runs lengths are fixed (every copy response hits max_new_tokens) and "
    "the trainer is the bottleneck or close to it. The closed form is lower on the overlapped rows mainly because "
    "it has no contention term; it also counts every weight sync (the measurement window ends with the last "
    "training step, so the simulator, like the main job, leaves the last one out) and treats one-step as "
    "max(R, T) + W exactly; they part ways when lengths vary (the closed form has no wave tail: a step's "
    "generation ends with its longest request), when the engine is the bottleneck (fully-async streaming vs "
    "one-step's drain per step), with pause/resume cost under retract, and with drops (the closed form assumes "
    "every generated group is trained).",
    "Ages: the closed-form fully-async mean (C + G)/B assumes a full buffer from the first step; the simulated "
    "means are a little higher because a group also ages while it is generated and lower in the first steps "
    "(empty buffer); the closed-form bound (C + G)/B + 1 is one below the observed max for the same reason "
    "(generation time spans a version). Where the engine is the bottleneck (the Ray rows) the buffer runs "
    "empty and the measured ages fall well below the simulated ones.",
]


def _held_out(report: dict[str, Any], layout: str) -> list[dict[str, Any]]:
    """Rows not used by the calibration: the calibration file's rows (its overlapped modes
    fit the contention) and the engine-sharing file's sync row are not held out."""
    return [
        r
        for r in report["rows"]
        if r["file"] != report["calibration"]
        and not r["calibration"]
        and (r.get("layout") == "ray") == (layout == "ray")
    ]


def _worst(rows: list[dict[str, Any]], key: str) -> str:
    rows = [r for r in rows if r.get(key) is not None]
    if not rows:
        return "-"
    r = max(rows, key=lambda r: abs(r[key]))
    return f"{_pct(r[key])} ({_label(r)} {r['mode']})"


def _contention_reading(report: dict[str, Any]) -> list[str]:
    cont = report["costs"]["fit"].get("contention", {})
    if "engine" not in cont:
        return []
    held = [
        r for r in report["rows"] if r["mode"] != "sync" and not r["calibration"] and r["file"] != report["calibration"]
    ]
    if not held:
        return []
    by = report["costs"]["contention_by_mode"]
    out = [
        "Contention: the simulator without it has the engines and the trainer each own hardware and never slow "
        "each other; on 2 cores (engines in their own processes, trainer and driver in the main one) each side runs "
        "slower while the other works. Without the factors the held-out overlapped rows miss by up to "
        f"{_worst(held, 'step_error_no_contention')} on s/step and {_worst(held, 'speedup_error_no_contention')} on "
        f"speedup (last column of the busy table); with them by up to {_worst(held, 'step_error')} and "
        f"{_worst(held, 'speedup_error')}. The factors and the median-repeat scaling come from the calibration run "
        "alone; nothing is tuned on the held-out runs."
    ]
    if "one-step" in by and "fully-async" in by:
        out.append(
            "The slow-down is not one number per side: fitted on each mode alone the engine is "
            f"{by['one-step']['engine']:.0%} slower under training in one-step and {by['fully-async']['engine']:.0%} "
            f"in fully-async, the trainer {by['one-step']['trainer']:.0%} and {by['fully-async']['trainer']:.0%} (jointly: "
            f"engine {report['costs']['contention_engine']:.0%}, trainer {report['costs']['contention_trainer']:.0%}). "
            "So each mode is predicted with its own factors (`contention_by_mode`); the joint ones made one-step too "
            "slow and fully-async's engine too fast. " + _why_fully_async(report)
        )
    return out


def _why_fully_async(report: dict[str, Any]) -> str:
    """Why fully-async contends more: from the calibration run's own step times where it
    recorded them, else what the busy times cannot settle."""
    ref = _reference_step_ms(report["rows"])
    steps = {
        r["mode"]: r["engine_steps"]
        for r in report["rows"]
        if r["file"] == report["calibration"] and r.get("engine_steps") and r["mode"] != "sync"
    }
    if ref and all(
        m in steps and steps[m]["step_ms_training"] and steps[m]["step_ms_not_training"]
        for m in ("one-step", "fully-async")
    ):
        f = {m: (steps[m]["step_ms_training"] / ref, steps[m]["step_ms_not_training"] / ref) for m in steps}
        return (
            "The calibration run's own decode steps (steps table) show where: its engine's steps take "
            f"x{f['one-step'][0]:.2f} of its sync step under training and x{f['one-step'][1]:.2f} otherwise in "
            f"one-step, x{f['fully-async'][0]:.2f} and x{f['fully-async'][1]:.2f} in fully-async. So "
            "fully-async's engine is slower even while the trainer does not train (its driver, in the "
            "trainer's process, submits, collects and stores groups throughout), and the simulator, which "
            "slows an engine only under training, folds that into the fully-async factor."
        )
    return (
        "The results files keep per repeat the engine's decode-step time and its overlap with training, not "
        "the steps themselves, so why fully-async contends more is not settled from them; candidates are its "
        "admissions spread over more engine steps (per-sample submission, re-prefill of retracted requests: "
        "the simulator has no per-admission cost, and a sync calibration cannot identify one since every wave "
        "admits a full batch at once) and the driver, which shares the trainer's process, submitting and "
        "storing groups while the trainer trains."
    )


def _sharing_reading(report: dict[str, Any]) -> list[str]:
    """The reading of a calibration with several engines (``--engines-from``)."""
    info = report["costs"]["fit"].get("engine_sharing")
    if not info:
        return []
    c = report["costs"]
    ray = _held_out(report, "ray")
    n = info["engines"]
    sharing = (
        f"together decode as fast as **{c['engine_slots']:.2f}** of them alone"
        if c["engine_slots"]
        else "do not slow each other (slots off)"
    )
    return [
        f"Engines on one host (`harness.advise.costs.fit_engine_sharing`, from the sync mode of "
        f"`{info['source']}` only): its {n} engines spent {info['measured_generating_per_step_s']:.3f} s generating "
        f"per step, where {n} engines with their own hardware would take "
        f"{info['simulated_generating_own_hardware_s']:.3f} s; so {n} engines of the calibrated size on this host "
        f"{sharing}. Weight sync: {info['weight_sync_per_step_s']:.3f} s per step with {n} engines against "
        f"{info['weight_sync_one_engine_s']:.3f} s per update with one, {c['weight_sync_per_engine_s'] * 1e3:.1f} ms "
        "more per engine (each engine's load and the calls that reach it). The contention factors come from the "
        "one-engine calibration run's overlapped modes, so the held-out rows here are the several-engine run's "
        f"overlapped modes ({len(ray)}): largest s/step error {_worst(ray, 'step_error')}, largest speedup error "
        f"{_worst(ray, 'speedup_error')}. "
        + _generating_gap(ray, _reference_step_ms(report["rows"]))
        + _step_types_reading([r for r in report["rows"] if r.get("layout") == "ray"])
        + "On a cluster each engine has its own GPUs "
        "and the fit would find no sharing; the per-engine weight sync is the part that carries over to a real "
        "broadcast."
    ]


def mode_vs_sync(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the model says of the engines' sharing, tested on one pair, per overlapped mode.

    The simulator slows an engine by its mode's factor (fitted on one engine) times the
    engines' sharing (fitted on the two-engine sync mode) times the mode's host growth
    (``harness.advise.host_share``: the main process's demand on the host's cores makes the
    engines share more than in sync). ``growth`` = (2-engine mode step / 2-engine sync
    step) / (1-engine mode step / 1-engine sync step), measured; ``growth_model``, the same
    ratio of the factors the model applies to a step when both engines decode and the
    trainer does not train (the rows' ``engine_steps``; 1 without the host's cores, the
    model before them). Steps are the engines' own mean decode step of the first
    repeat (``harness.measure.engines``); within one run both steps meet the same host, so
    the ratios cancel the host's state at the time. Beside it, each engine's cores while the
    rollout generates (median over repeats; over their union, so where the engines are
    staggered, as one-step's are, a lower bound of each engine's share), with 1 and 2 engines."""
    by = {(r["engines"], r["mode"]): r for r in rows}
    out = {}
    for mode in ("one-step", "fully-async"):
        steps, model = {}, {}
        for n in (1, 2):
            a, s = by.get((n, mode)), by.get((n, "sync"))
            if a and s and a.get("engine_steps") and s.get("engine_steps"):
                steps[n] = a["engine_steps"]["step_ms"] / s["engine_steps"]["step_ms"]
                if "model_factor_not_training" in a["engine_steps"]:
                    model[n] = (
                        a["engine_steps"]["model_factor_not_training"] / s["engine_steps"]["model_factor_not_training"]
                    )
        if len(steps) == 2:
            out[mode] = {
                "step_vs_sync_1_engine": steps[1],
                "step_vs_sync_2_engines": steps[2],
                "growth": steps[2] / steps[1],
                "growth_model": model[2] / model[1] if len(model) == 2 else None,
                "engine_cores_generating_1_engine": by[(1, mode)].get("engine_cores_generating"),
                "engine_cores_generating_2_engines": by[(2, mode)].get("engine_cores_generating"),
            }
    return out


def _reference_step_ms(rows: list[dict[str, Any]]) -> float | None:
    """The one-engine calibration run's sync decode step, as its engine timed it."""
    return next(
        (
            r["engine_steps"]["step_ms"]
            for r in rows
            if r.get("engine_steps") and r["calibration"] and r["engines"] == 1
        ),
        None,
    )


def _generating_gap(rows: list[dict[str, Any]], ref: float | None) -> str:
    """Where the several-engine rows miss: the engines' generating time per step, and
    (where the runs recorded them) the engines' own step times against the model's."""
    gaps = [
        (r, r["measured_busy_per_step_s"]["generating"], r["predicted_busy_per_step_s"]["generating"])
        for r in rows
        if r["mode"] != "sync" and "generating" in (r.get("measured_busy_per_step_s") or {})
    ]
    if not gaps:
        return ""
    text = "; ".join(f"{_label(r)} {r['mode']} {m:.3f} s measured vs {p:.3f} s simulated" for r, m, p in gaps)
    out = f"The engines' generating time per step (busy table): {text}. "
    steps = [
        (r, r["engine_steps"])
        for r, _m, _p in gaps
        if r.get("engine_steps") and r["engine_steps"].get("step_ms_training") is not None
    ]
    if steps and ref:

        def part(s: dict[str, Any], key: str, model: str) -> str:
            return "-" if s[key] is None else f"x{s[key] / ref:.2f} measured vs x{s[model]:.2f} modelled"

        out += (
            "The engines' own step times (steps table), as factors of the one-engine sync step: "
            + "; ".join(
                f"{_label(r)} {r['mode']} under training "
                f"{part(s, 'step_ms_training', 'model_factor_training')}, not training "
                f"{part(s, 'step_ms_not_training', 'model_factor_not_training')}"
                for r, s in steps
            )
            + ". The model multiplies one engine's slow-down under training (fitted per mode on the "
            "one-engine run) by the engines' sharing (fitted on the several-engine sync mode) and, in an "
            "overlapped mode, by the host's growth (`harness.advise.host_share`: the main process's demand "
            "on the host, inferred from the one-engine run); where a measured factor exceeds the modelled "
            "one, the engines, the trainer and the driver together want more of the host than that "
            "product allows. "
        )
    return out


def _step_types_reading(rows: list[dict[str, Any]]) -> str:
    """The Ray rows' admission shares, measured vs simulated, and ``mode_vs_sync``'s growth."""
    out = ""
    shares = [
        r
        for r in rows
        if r.get("admitting_share_measured") is not None and r.get("admitting_share_simulated") is not None
    ]
    if shares:
        out += (
            "Steps that admitted requests (a prefill batch before the decode), of the engines' steps, measured vs "
            "simulated: "
            + "; ".join(
                f"{_layout(r)} {r['mode']} {r['admitting_share_measured']:.0%} vs {r['admitting_share_simulated']:.0%}"
                for r in shares
            )
            + ". A real engine admits requests as they arrive, the simulated one a group's requests together, "
            "so in fully-async the simulated engines run a prefill batch in fewer of their steps and the "
            "fully-async factor fitted on one engine carries the difference. "
        )
    growth = mode_vs_sync(rows)
    if growth:
        out += (
            "A mode's engine step over the sync step of the same run, with 1 engine and with 2 "
            "(`harness.advise.validate.mode_vs_sync`), measured (each engine's own mean step, first repeat), "
            "and how much it grows with the second engine, measured and in the model (a mode's factor times the "
            "sharing times the host growth of `harness.advise.host_share`): "
            + "; ".join(
                f"{m} x{g['step_vs_sync_1_engine']:.2f} with 1 engine, "
                f"x{g['step_vs_sync_2_engines']:.2f} with 2 (x{g['growth']:.2f}; model "
                + ("-" if g.get("growth_model") is None else f"x{g['growth_model']:.2f}")
                + ")"
                for m, g in growth.items()
            )
            + ". "
        )
    return out


def reading(report: dict[str, Any]) -> list[str]:
    """The reading of the table, its figures computed from the report."""
    return _contention_reading(report) + _sharing_reading(report) + STATIC_READING


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.advise.validate", description=__doc__.split("\n")[0])
    p.add_argument("--calibrate", required=True, help="results.json whose sync mode calibrates the costs")
    p.add_argument("--predict", nargs="*", default=[], help="more results.json files to predict")
    p.add_argument(
        "--engines-from",
        default=None,
        help="results.json of the calibration's layout with N > 1 engines: its sync mode fits how the "
        "engines share the host and the weight sync per engine (harness.advise.costs."
        "fit_engine_sharing); its overlapped modes are predicted, held out",
    )
    p.add_argument("--out", default="results/advise")
    p.add_argument(
        "--name",
        default="",
        help="suffix of the written files: validation<NAME>.json/.md and cpu_costs<NAME>.json (default none)",
    )
    args = p.parse_args(argv)
    command = "python -m harness.advise.validate " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    report = validate(args.calibrate, args.predict, args.engines_from)
    report["command"] = command
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    costs_path, json_path, md_path = (
        out / f"cpu_costs{args.name}.json",
        out / f"validation{args.name}.json",
        out / f"validation{args.name}.md",
    )
    fitted = CostModel.from_json(report["costs"])
    fitted.fit["validation"] = {"report": str(md_path), "held_out": summary(report)}  # advise prints it
    fitted.write(costs_path)
    json_path.write_text(json.dumps(report, indent=1, sort_keys=True, default=str) + "\n")
    md = to_markdown(report, command)
    md_path.write_text(md)
    print(md)
    print(f"wrote {json_path}, {md_path}, {costs_path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
