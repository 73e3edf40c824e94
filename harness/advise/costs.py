"""Calibrated costs: fit the simulator's cost model from a measured run.

Input: a main-job results file (``miles-harness run``'s ``results.json``: per mode the
phase timeline ``extra.modes[m].phases`` and the per-step history ``extra.per_step[m]``
with ``tokens``), optionally with an event trace (JSONL, ``harness.trace``) that adds
per-request response lengths and prompt lengths; or a simulated run (``SimResult``).
The fit reads the **sync** mode (nothing overlaps, so each phase is a clean measurement
of one cost), and, when present, the fully-async mode for the pause/resume cost.

The model is the simulator's (``harness.sim.engine`` / ``trainer``):

* engine: one decode step costs ``decode_base_s + decode_per_seq_s * running``; admitting
  requests adds ``prefill_per_token_s`` per prompt token. A sync step's generating time
  is then ``a*S + b*tokens + p*prefill_tokens``, where ``S`` (engine steps) comes from
  replaying the engine's schedule (FIFO admission into ``max_running`` slots) on the
  step's response lengths. ``a, b, p`` are fitted by least squares over the steps;
* trainer: ``train_base_s + train_per_token_s * tokens`` per step (least squares);
* output lengths: a ``LengthDist`` fitted to the per-request lengths (lognormal, or
  fixed when they do not vary), capped at ``max_new_tokens``;
* weight sync: the mean weight-sync phase of sync mode (the engine is idle there);
* pause/resume: fully-async's mean weight-sync phase minus the sync-mode cost and minus
  the half decode step a pause waits for the step boundary (0 without fully-async);
* repeats (a results file with several): the costs above come from the first repeat's
  timeline and are scaled to the median repeat's busy time per step (``repeat_scale``);
* contention (``harness.sim.contention``): from the overlapped modes' repeats, each
  against the sync repeat of the same index, how much slower the engine's decode time
  and the trainer's training time were per second of overlap (``fit_contention``); 0
  without overlapped modes.

A coefficient the run cannot identify (its column is, within noise, a multiple of the
others: e.g. every step had the same batch and lengths, so per-step and per-sequence
decode cost move together) is dropped from the fit and its cost is folded into the kept
ones; ``fit.notes`` says which, and which extrapolations that makes uncertain. Fit
errors: per component the RMS and max relative residual over the steps, and the
relative standard error of each kept coefficient.

The model itself (``CostModel``, its file format, ``load_costs``) is in
``harness.advise.cost_model``; this module fits it, simulating runs through
``harness.advise.predict`` for the contention and engine-sharing fits.

``python -m harness.advise.costs RESULTS.json [--trace EVENTS.jsonl] --out COSTS.json``
writes the fitted model (``CostModel.to_json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from miles_async_core import events as ev
from miles_async_core.errors import ConfigError
from harness.advise import host_share
from harness.advise.cost_model import CostModel, load_costs, mode_of  # noqa: F401  (load_costs, mode_of: re-exported)
from harness.advise.predict import Layout, simulate_layout
from harness.results.mode_rows import ModeRow
from harness.results.run_extras import load_run
from harness.sim.run_scenario import summarize

# Drop a coefficient whose relative standard error exceeds this (not identifiable).
MAX_REL_SE = 0.5


# --- observations -------------------------------------------------------------------------


@dataclass
class StepObs:
    generating_s: float
    waiting_s: float
    training_s: float
    weight_sync_s: float
    tokens: int
    lengths: list[int]  # per request (exact from a trace, else the step's tokens spread evenly)


@dataclass
class Observations:
    mode: str
    steps: list[StepObs]
    max_running: int
    prompt_tokens: int
    max_new_tokens: int
    lengths_exact: bool
    source: str
    fully_async_sync_s: list[float] | None = None  # weight-sync spans of a fully-async run, if any
    # per mode, each repeat's row (a results file's extra.repeats; mode_rows of a simulated
    # run) and the mode's resolved flags: what repeat_scale and fit_contention read
    repeats: dict[str, list[ModeRow]] | None = None
    configs: dict[str, dict[str, Any]] | None = None
    # the calibration mode's engine, timed by itself (a results file's extra.engines[mode].rows,
    # harness.measure.engines) when the run had one engine and recorded its admitting steps
    engine_steps: dict[str, Any] | None = None


def _per_step_spans(phases: list[list[Any]]) -> list[dict[str, float]]:
    """Split a sync-mode timeline into steps at each training end: step i gets the
    generating and waiting time before its training, its training, and the weight sync
    after it."""
    trains = sorted((a, b) for side, ph, a, b in phases if side == "train" and ph == "training")
    out = []
    for i, (a, b) in enumerate(trains):
        lo = trains[i - 1][1] if i else -math.inf
        hi = trains[i + 1][0] if i + 1 < len(trains) else math.inf

        def within(side: str, phase: str, x0: float, x1: float) -> float:
            return sum(max(0.0, min(q, x1) - max(p, x0)) for s, ph, p, q in phases if s == side and ph == phase)

        out.append(
            {
                "generating_s": within("rollout", "generating", lo, a),
                "waiting_s": within("train", "waiting", lo, a),
                "training_s": b - a,
                "weight_sync_s": within("train", "weight_sync", b, hi),
            }
        )
    return out


def _spread(tokens: int, n: int) -> list[int]:
    q, r = divmod(int(tokens), max(1, n))
    return [q + 1] * r + [q] * (n - r)


def _lengths_by_step(events: list[Any], phases_t0: float, step_bounds: list[tuple[float, float]]) -> list[list[int]]:
    """Per step, the response lengths of the requests that finished in it, in the order
    the engine first admitted them (the order the schedule replay needs)."""
    first_admit: dict[int, int] = {}
    for e in events:
        if e.kind == ev.ADMITTED and e["index"] not in first_admit:
            first_admit[e["index"]] = len(first_admit)
    fin = sorted(
        (e.t - phases_t0, first_admit.get(e["index"], 1 << 60), int(e["response_length"]))
        for e in events
        if e.kind == ev.FINISHED
    )
    out: list[list[tuple[int, int]]] = [[] for _ in step_bounds]
    j = 0
    for t, order, n in fin:
        while j < len(step_bounds) and t > step_bounds[j][1]:
            j += 1
        if j < len(step_bounds):
            out[j].append((order, n))
    return [[n for _, n in sorted(step)] for step in out]


def observations_from_events(
    events: list[Any],
    *,
    mode: str,
    samples_per_step: int,
    max_running: int,
    prompt_tokens: int | None,
    max_new_tokens: int,
    history: list[dict] | None = None,
    source: str = "trace",
    fully_async_events: list[Any] | None = None,
) -> Observations:
    """Observations from a recorded trace (a ``SimResult``'s events or a JSONL trace)."""
    from harness.measure.overlap import measurement_window, phase_spans

    t_end = max((e.t for e in events), default=0.0)
    window = measurement_window(events, 0.0, t_end)
    phases = phase_spans(events, window)
    spans = _per_step_spans(phases)
    trains = sorted((a, b) for side, ph, a, b in phases if side == "train" and ph == "training")
    bounds = [((trains[i - 1][1] if i else -math.inf), b) for i, (a, b) in enumerate(trains)]
    lengths = _lengths_by_step(events, window[0], bounds)
    if prompt_tokens is None:
        pre = [int(e["prefix_tokens"]) for e in events if e.kind == ev.ADMITTED]
        prompt_tokens = int(round(min(pre))) if pre else 0
    steps = [StepObs(tokens=sum(ls), lengths=ls, **sp) for sp, ls in zip(spans, lengths)]
    fa = None
    if fully_async_events is not None:
        w = measurement_window(fully_async_events, 0.0, max((e.t for e in fully_async_events), default=0.0))
        fa = [b - a for s, ph, a, b in phase_spans(fully_async_events, w) if s == "train" and ph == "weight_sync"]
    return Observations(
        mode=mode,
        steps=steps,
        max_running=max_running,
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_new_tokens,
        lengths_exact=True,
        source=source,
        fully_async_sync_s=fa,
    )


def observations_from_results(path: str | Path, *, mode: str = "sync", trace: str | Path | None = None) -> Observations:
    """Observations from a main-job ``results.json`` (and optionally its event trace)."""
    run = load_run(path)
    extras, spec = run.extras, run.spec
    modes = extras.modes
    if mode not in modes or not modes[mode].phases:
        raise ConfigError(
            f"results file {path}: no phase timeline for mode {mode!r} (has: {', '.join(modes) or '-'});"
            f" fix: calibrate on a run with --modes {mode}"
        )
    base = run.doc["config"].get("base")
    # config values as the file stores them (numbers or numeric strings), read with int()
    mcfg: dict[str, Any] = run.mode_configs.get(mode) or (base if isinstance(base, dict) else {})
    n_samples = int(mcfg.get("rollout_batch_size", 16)) * int(mcfg.get("n_samples_per_prompt", 1))
    max_running = int(spec.get("max_running", 16))
    task_length = spec.get("task_length")
    max_new = (
        int(task_length) + 1 if spec.get("task") == "copy" and task_length else int(spec.get("max_new_tokens", 0) or 0)
    )
    prompt = int(task_length) + 2 if spec.get("task") == "copy" and task_length else None
    history = extras.steps(mode)
    spans = _per_step_spans([list(p) for p in modes[mode].phases])
    fa_sync = None
    if "fully-async" in modes and modes["fully-async"].phases:
        fa_sync = [b - a for s, ph, a, b in modes["fully-async"].phases if s == "train" and ph == "weight_sync"]
    if trace is not None:
        from harness.trace import read_jsonl

        obs = observations_from_events(
            read_jsonl(trace),
            mode=mode,
            samples_per_step=n_samples,
            max_running=max_running,
            prompt_tokens=prompt,
            max_new_tokens=max_new,
            source=f"{path} + {trace}",
        )
        obs.fully_async_sync_s = fa_sync
        return obs
    steps = []
    for sp, h in zip(spans, history):
        tokens = h.tokens
        steps.append(StepObs(tokens=tokens, lengths=_spread(tokens, n_samples), **sp))
    if not steps:
        raise ConfigError(f"results file {path}: mode {mode!r} has no per-step history with tokens")
    if not max_new:
        max_new = max(max(s.lengths) for s in steps)
    engine_rows = extras.engine_rows(mode)
    engine_steps = engine_rows[0] if len(engine_rows) == 1 and engine_rows[0].get("step_ms_admitting") else None
    return Observations(
        mode=mode,
        steps=steps,
        max_running=max_running,
        prompt_tokens=prompt or 0,
        max_new_tokens=max_new,
        lengths_exact=False,
        source=str(path),
        fully_async_sync_s=fa_sync,
        repeats=extras.repeats,
        configs=run.mode_configs,
        engine_steps=engine_steps,
    )


# --- the fit ------------------------------------------------------------------------------


def _replay(lengths: Iterable[int], max_running: int) -> tuple[int, int]:
    """The simulator's schedule for ``lengths`` submitted at once (FIFO admission into
    ``max_running`` slots, one token per running request per step): its engine steps and
    how many of them admit requests (the distinct start steps; each runs one prefill batch)."""
    slots: list[int] = []
    starts: set[int] = set()
    makespan = 0
    for n in lengths:
        start = heapq.heappop(slots) if len(slots) >= max_running else 0
        starts.add(start)
        end = start + max(1, int(n))
        heapq.heappush(slots, end)
        makespan = max(makespan, end)
    return makespan, len(starts)


def replay_steps(lengths: Iterable[int], max_running: int) -> int:
    """Engine steps to serve ``lengths`` submitted at once (``_replay``)."""
    return _replay(lengths, max_running)[0]


def replay_admissions(lengths: Iterable[int], max_running: int) -> int:
    """Of the engine steps ``replay_steps`` counts, those that admit requests (``_replay``)."""
    return _replay(lengths, max_running)[1]


def _prefill_base(obs: Observations, per_token_kept: bool) -> tuple[float, dict[str, Any]]:
    """One prefill batch's fixed cost from the engine's own step times: a step that admits
    runs a prefill forward before its decode (``harness.backends.torch_engine``, as an
    SGLang prefill batch), so admitting minus decode-only steps is its cost. Not
    identifiable from phase times alone: with equal lengths every wave admits once and has
    the same number of decode steps, so the two costs move together."""
    es = obs.engine_steps
    if not es or es.get("step_ms_decode_only") is None or not es.get("steps_admitting"):
        return 0.0, {
            "source": "none: the input has no engine step times split by admission (the split layout, or a "
            "run recorded before them): 0, folded into decode_base_s"
        }
    if per_token_kept:
        return 0.0, {
            "source": "not fitted: prefill_per_token_s was identifiable and already carries the admitting "
            "steps' extra time"
        }
    value = max(0.0, (es["step_ms_admitting"] - es["step_ms_decode_only"]) / 1e3)
    return value, {
        "source": "the calibration engine's mean admitting step minus its mean decode-only step "
        "(harness.measure.engines, first repeat)",
        "step_ms_admitting": es["step_ms_admitting"],
        "step_ms_decode_only": es["step_ms_decode_only"],
        "steps_admitting": es["steps_admitting"],
        "value_s": value,
    }


def _lstsq(columns: dict[str, list[float]], y: list[float], drop_order: list[str]) -> dict[str, Any]:
    """Least squares with non-negative coefficients; drops unidentifiable columns (relative
    standard error above ``MAX_REL_SE``, or a negative estimate) in ``drop_order``."""
    names = list(columns)
    dropped: list[str] = []
    yv = np.asarray(y, dtype=float)
    while True:
        X = np.column_stack([np.asarray(columns[n], dtype=float) for n in names])
        coef, *_ = np.linalg.lstsq(X, yv, rcond=None)
        resid = yv - X @ coef
        dof = max(1, len(yv) - len(names))
        sigma2 = float(resid @ resid) / dof
        try:
            cov = sigma2 * np.linalg.inv(X.T @ X)
            se = np.sqrt(np.maximum(np.diag(cov), 0.0))
        except np.linalg.LinAlgError:
            se = np.full(len(names), np.inf)
        rank = np.linalg.matrix_rank(X, tol=1e-9 * max(1.0, float(np.abs(X).max())))
        rel = [float(s / abs(c)) if c != 0 else math.inf for s, c in zip(se, coef)]
        deficient = rank < len(names)
        bad = [n for n, c, r in zip(names, coef, rel) if deficient or c < 0 or r > MAX_REL_SE]
        if not bad or len(names) == 1:
            break
        # anything unidentifiable: drop the first column of ``drop_order`` still in the fit
        victim = next((n for n in drop_order if n in names), bad[0])
        names.remove(victim)
        dropped.append(victim)
    coef = np.maximum(coef, 0.0)
    pred = X @ coef
    relres = np.abs(yv - pred) / np.maximum(np.abs(yv), 1e-12)
    return {
        "coef": {n: float(c) for n, c in zip(names, coef)},
        "dropped": dropped,
        "rel_se": {n: (None if not math.isfinite(r) else round(r, 6)) for n, r in zip(names, rel)},
        "rms_rel_error": float(np.sqrt(np.mean(relres**2))),
        "max_rel_error": float(relres.max()),
        "n": len(yv),
    }


def fit_length_dist(lengths: list[int], max_new_tokens: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ``LengthDist`` for the lengths: lognormal on the untruncated ones (median, sigma
    from their logs), ``fixed`` when they do not vary. Lengths at ``max_new_tokens`` are
    truncated draws; the fit reports their share."""
    xs = [int(x) for x in lengths if x > 0]
    if not xs:
        raise ConfigError("cost fit: no response lengths in the input")
    cap = sum(1 for x in xs if x >= max_new_tokens)
    free = [x for x in xs if x < max_new_tokens]
    stats = {"n": len(xs), "mean": sum(xs) / len(xs), "truncated_share": cap / len(xs)}
    if len(set(xs)) == 1 or len(free) < 2 or cap / len(xs) >= 0.5:
        # constant, or mostly truncated (the median is at or above the cap): every draw hits the cap
        med = max_new_tokens if cap / len(xs) >= 0.5 else float(np.median(xs))
        return {"kind": "fixed", "median": float(med)}, stats
    logs = np.log(np.asarray(sorted(xs), dtype=float))
    # Quantile matching on all lengths (truncated ones are the top, below the median here):
    # median from the 50th percentile, sigma from the 50th-25th percentile spread.
    median = float(np.exp(np.quantile(logs, 0.5)))
    sigma = float((np.quantile(logs, 0.5) - np.quantile(logs, 0.25)) / 0.6744897501960817)
    if sigma <= 0:
        sigma = float(np.std(logs))
    return {"kind": "lognormal", "median": median, "sigma": max(sigma, 1e-6)}, stats


def fit_costs(obs: Observations, *, warmup_steps: int = 1) -> CostModel:
    """Fit on the steps after ``warmup_steps`` (the first step pays one-off costs:
    allocation, first kernels, page faults)."""
    steps = obs.steps[warmup_steps:]
    if len(steps) < 3:
        raise ConfigError(f"cost fit: {len(steps)} steps in mode {obs.mode}; need at least 3")
    notes: list[str] = []
    S = [float(replay_steps(s.lengths, obs.max_running)) for s in steps]
    tok = [float(sum(s.lengths)) for s in steps]
    pre = [float(obs.prompt_tokens * len(s.lengths)) for s in steps]
    cols = {"decode_base_s": S, "decode_per_seq_s": tok}
    if obs.prompt_tokens > 0:
        cols["prefill_per_token_s"] = pre
    eng = _lstsq(cols, [s.generating_s for s in steps], ["prefill_per_token_s", "decode_per_seq_s", "decode_base_s"])
    prefill_base, prefill_base_fit = _prefill_base(obs, "prefill_per_token_s" in eng["coef"])
    if prefill_base > 0:  # the decode costs are what is left of each step's generating time
        admits = [float(replay_admissions(s.lengths, obs.max_running)) for s in steps]
        eng = _lstsq(
            cols,
            [s.generating_s - prefill_base * a for s, a in zip(steps, admits)],
            ["prefill_per_token_s", "decode_per_seq_s", "decode_base_s"],
        )
    for name in eng["dropped"]:
        notes.append(
            f"engine {name}: not identifiable from this run (its column moves with the others), set to 0 "
            "and its cost folded into the kept coefficients; extrapolation in "
            + {
                "decode_per_seq_s": "running batch size (max_running, GPUs per engine)",
                "decode_base_s": "lengths / waves",
                "prefill_per_token_s": "prompt length",
            }[name]
            + " is uncertain"
        )
    trn = _lstsq(
        {"train_base_s": [1.0] * len(steps), "train_per_token_s": tok},
        [s.training_s for s in steps],
        ["train_base_s", "train_per_token_s"],
    )
    if "train_base_s" in trn["dropped"]:
        notes.append(
            "trainer train_base_s: not identifiable (tokens per step hardly vary), so training time is "
            "taken as proportional to tokens (base 0); other batch sizes scale linearly"
        )
    length, lstats = fit_length_dist([x for s in steps for x in s.lengths], obs.max_new_tokens)
    if not obs.lengths_exact:
        notes.append(
            "no per-request lengths in the input (results file without a trace): lengths are each step's "
            "tokens spread evenly over its samples"
        )
    # the last step's weight sync falls after the measurement window (it ends with training)
    sync = np.asarray([s.weight_sync_s for s in steps[:-1]], dtype=float)
    ws = float(sync.mean())
    a, b = eng["coef"].get("decode_base_s", 0.0), eng["coef"].get("decode_per_seq_s", 0.0)
    pause = 0.0
    pause_fit: dict[str, Any] = {"source": "none (no fully-async mode in the input): 0"}
    if obs.fully_async_sync_s:
        fa = float(np.mean(obs.fully_async_sync_s))
        half_step = 0.5 * (a + b * obs.max_running)
        pause = max(0.0, fa - ws - half_step)
        pause_fit = {
            "source": "fully-async weight-sync spans - sync-mode weight sync - half a full decode step",
            "fully_async_weight_sync_mean_s": fa,
            "n": len(obs.fully_async_sync_s),
        }
    rollout_latency = float(np.mean([max(0.0, s.waiting_s - s.generating_s) for s in steps]))
    fit = {
        "source": obs.source,
        "mode": obs.mode,
        "steps": len(steps),
        "warmup_steps_skipped": warmup_steps,
        "engine": eng,
        "prefill_base": prefill_base_fit,
        "trainer": trn,
        "response_length": lstats,
        "weight_sync": {"mean_s": ws, "cv": float(sync.std() / ws) if ws else 0.0, "n": len(sync)},
        "pause_resume": pause_fit,
        "rollout_latency_s": {
            "mean_s": rollout_latency,
            "note": "trainer waiting minus engine busy per sync step (request dispatch, reward, IPC); not simulated",
        },
        "notes": notes,
    }
    costs = CostModel(
        decode_base_s=a if a > 0 else 1e-9,
        decode_per_seq_s=b,
        prefill_per_token_s=eng["coef"].get("prefill_per_token_s", 0.0),
        prefill_base_s=prefill_base,
        max_running=obs.max_running,
        prompt_tokens=obs.prompt_tokens,
        max_new_tokens=obs.max_new_tokens,
        response_length=length,
        train_base_s=trn["coef"].get("train_base_s", 0.0),
        train_per_token_s=trn["coef"].get("train_per_token_s", 0.0),
        weight_sync_s=ws,
        pause_resume_s=pause,
        fit=fit,
    )
    if obs.repeats:
        costs = repeat_scale(obs, costs)
        costs = fit_contention(obs, costs)
        costs = dataclasses.replace(costs, engine_cores_by_mode=host_share.engine_cores_by_mode(obs.repeats))
    return costs


# --- repeats and contention ----------------------------------------------------------------

OVERLAPPED = ("one-step", "fully-async")


def config_of(configs: dict[str, dict[str, Any]], mode: str) -> Any:
    """The ``AsyncConfig`` of ``mode`` from a results file's ``config.modes``."""
    from miles_async_core.config import AsyncConfig

    names = set(AsyncConfig().to_dict())
    return AsyncConfig.from_dict({k: v for k, v in configs[mode].items() if k in names})


def mode_rows(result: Any) -> ModeRow:
    """A simulated run's busy totals as a results file's ``extra.repeats`` row (the
    simulated engine records no decode steps: its generating phase stands in)."""
    s = summarize(result)
    return ModeRow(
        mode=mode_of(result.config),
        steps=s["steps"],
        wall_s=s["window_s"],
        rollout_busy_s=s["rollout_generating_s"],
        decode_busy_s=0.0,
        train_busy_s=s["train_training_s"],
        weight_sync_s=s["weight_sync_s"],
        both_busy_s=s["both_busy_fraction"] * s["window_s"],
    )


def repeat_scale(obs: Observations, costs: CostModel) -> CostModel:
    """The fit reads the first repeat's timeline (the only one a results file keeps), but a
    run's figures are medians over its repeats, and repeats differ by the machine's load
    (run-a's two sync repeats: 0.642 and 0.707 s/step). So each component's costs are
    scaled by the median over the calibration mode's repeats of its busy time per step
    (engine generating, trainer training, weight sync) over the first repeat's."""
    rows = [r for r in (obs.repeats or {}).get(obs.mode) or [] if r.steps]
    if len(rows) < 2:
        return costs

    def ratio(key: str) -> float:
        per = [getattr(r, key) / r.steps for r in rows]
        return float(np.median(per) / per[0]) if per[0] > 0 else 1.0

    e, t, w = ratio("rollout_busy_s"), ratio("train_busy_s"), ratio("weight_sync_s")
    fit = {
        **costs.fit,
        "repeat_scale": {
            "engine": e,
            "trainer": t,
            "weight_sync": w,
            "repeats": len(rows),
            "source": "median over the repeats of the busy time per step / the first "
            "repeat's (whose timeline the fit read)",
        },
    }
    return dataclasses.replace(
        costs,
        decode_base_s=costs.decode_base_s * e,
        decode_per_seq_s=costs.decode_per_seq_s * e,
        prefill_per_token_s=costs.prefill_per_token_s * e,
        prefill_base_s=costs.prefill_base_s * e,
        train_base_s=costs.train_base_s * t,
        train_per_token_s=costs.train_per_token_s * t,
        weight_sync_s=costs.weight_sync_s * w,
        fit=fit,
    )


def _engine_busy_s(row: ModeRow) -> float:
    """The engine's own decode-step time where it recorded it, else its generating phase."""
    busy = row.decode_busy_s or row.rollout_busy_s
    if busy is None:
        raise ConfigError(
            f"mode row {row.mode!r}: decode_busy_s and rollout_busy_s are both missing; the contention fit "
            "needs one. Fix: calibrate on a results file written by miles-harness run"
        )
    return float(busy)


def _engine_steps_ratio(costs: CostModel, configs: dict[str, dict[str, Any]], mode: str, sync_mode: str) -> float:
    """Engine steps per trained step in ``mode`` over those in ``sync_mode``, from the
    simulator's schedule (fully-async decodes more per trained step than sync: it fills
    the buffer ahead and re-prefills what a pause retracted)."""

    per = {}
    for m in (mode, sync_mode):
        res = simulate_layout(costs, config_of(configs, m), Layout())
        if res.error is not None or not res.history:
            raise RuntimeError(f"contention fit: the simulated {m} run failed: {res.error!r}")
        per[m] = res.engine_stats["steps"] / len(res.history)
    return per[mode] / per[sync_mode]


def _through_origin(points: list[dict[str, Any]], measured: str, alone: str) -> dict[str, Any]:
    """Fit ``measured - alone = k * both_busy_s`` (least squares through 0) and turn the
    slope into the contention factor ``c = k / (1 - k)``: a side slowed by ``1 + c`` for
    ``o`` seconds of overlap loses ``o * c / (1 + c)``. Errors: the standard error of
    ``c`` and the relative residuals of the busy time it predicts."""
    x = np.asarray([p["both_busy_s"] for p in points], dtype=float)
    y = np.asarray([p[measured] - p[alone] for p in points], dtype=float)
    sxx = float(x @ x)
    k = float(x @ y) / sxx if sxx > 0 else 0.0
    resid = y - k * x
    se = math.sqrt(float(resid @ resid) / (len(y) - 1) / sxx) if len(y) > 1 and sxx > 0 else None
    notes = []
    if k < 0:
        notes.append(f"slope {k:.4f} < 0 (the side ran faster when overlapped): taken as 0")
    if k > 0.95:
        notes.append(f"slope {k:.4f} near 1 (no progress while overlapped): capped at 0.95")
    k_used = min(max(k, 0.0), 0.95)
    c = k_used / (1 - k_used)
    c_se = se / (1 - k_used) ** 2 if se is not None else None
    pred = np.asarray([p[alone] for p in points]) + k_used * x
    meas = np.asarray([p[measured] for p in points])
    rel = (pred - meas) / np.maximum(meas, 1e-12)
    return {
        "c": c,
        "slope": k,
        "c_se": c_se,
        "c_rel_se": c_se / c if c_se is not None and c > 0 else None,
        "rms_rel_error": float(np.sqrt(np.mean(rel**2))),
        "max_rel_error": float(np.abs(rel).max()),
        "n": len(points),
        "notes": notes,
    }


def fit_contention(obs: Observations, costs: CostModel, *, iterations: int = 4) -> CostModel:
    """Fit ``contention_engine`` and ``contention_trainer`` (``harness.sim.contention``)
    from the overlapped modes beside the calibration's sync mode.

    Each repeat of an overlapped mode is paired with the sync repeat of the same index
    (interleaved, so measured under the same load). Alone costs come from that sync
    repeat: the trainer's training time per step (the same batch), the engine's decode
    time per step times the ratio of engine steps per trained step the simulator's
    schedule gives the mode over sync. The overlap is the time the engine's decode steps
    (its own timestamps) fall inside the trainer's training intervals (``both_busy_s``).
    Then per side ``busy - alone = k * overlap`` through the origin, ``c = k / (1 - k)``.
    The step ratio depends on the timing, so fit and simulation alternate until the
    factors settle (``iterations`` at most). The same fit on each overlapped mode's
    repeats alone gives ``contention_by_mode``, which predictions of that mode use: the
    modes contend differently (on the CPU main job fully-async's engine slows several
    times more under training than one-step's; its driver, in the trainer's process,
    submits per sample and stores groups while the trainer trains)."""
    sync_rows = (obs.repeats or {}).get(obs.mode) or []
    modes = [m for m in OVERLAPPED if (obs.repeats or {}).get(m) and m in (obs.configs or {})]
    if obs.mode != "sync" or not sync_rows or not modes or obs.mode not in (obs.configs or {}):
        return dataclasses.replace(
            costs, fit={**costs.fit, "contention": {"source": "none (no overlapped mode beside sync in the input): 0"}}
        )
    costs = dataclasses.replace(costs, contention_by_mode={})
    fitted, result, points, ratio = _fit_factors(obs, costs, modes, sync_rows, iterations)
    by_mode, per_mode = {}, {}
    for m in modes:  # the factors go to contention_by_mode, the fit records (errors) to the fit info
        own, res, _, _ = _fit_factors(obs, costs, [m], sync_rows, iterations)
        by_mode[m] = {"engine": res["engine"], "trainer": res["train"]}
        per_mode[m] = {"engine": own.contention_engine, "trainer": own.contention_trainer}
    info = {
        "source": "overlapped repeats vs the sync repeat of the same index: busy time per step minus alone "
        "time = slope x overlap (engine decode inside training), c = slope / (1 - slope); jointly "
        "over the overlapped modes, and on each mode's repeats alone (contention_by_mode)",
        "engine": result["engine"],
        "trainer": result["train"],
        "by_mode": by_mode,
        "engine_steps_ratio": ratio,
        "points": points,
    }
    return dataclasses.replace(fitted, contention_by_mode=per_mode, fit={**costs.fit, "contention": info})


def _fit_factors(
    obs: Observations, costs: CostModel, modes: list[str], sync_rows: list[ModeRow], iterations: int
) -> tuple[CostModel, dict[str, Any], list[dict[str, Any]], dict[str, float]]:
    """One contention fit on the repeats of ``modes``: (costs with the factors, the fit per
    side, the points, the engine steps ratio per mode)."""
    fitted, result, ratio = costs, {}, {}
    points: list[dict[str, Any]] = []
    repeats, configs = obs.repeats or {}, obs.configs or {}  # fit_contention passes modes that have both
    for _ in range(iterations):
        ratio = {m: _engine_steps_ratio(fitted, configs, m, obs.mode) for m in modes}
        points = []
        for m in modes:
            for i, a in enumerate(repeats[m]):
                s = sync_rows[i] if i < len(sync_rows) else None
                if s is None or not a.steps or not s.steps:
                    continue
                if a.both_busy_s is None or a.train_busy_s is None or s.train_busy_s is None:
                    continue  # a row without the busy figures (a run always writes them) has no point
                n, ns = a.steps, s.steps
                points.append(
                    {
                        "mode": m,
                        "repeat": i,
                        "both_busy_s": a.both_busy_s / n,
                        "train_s": a.train_busy_s / n,
                        "train_alone_s": s.train_busy_s / ns,
                        "engine_s": _engine_busy_s(a) / n,
                        "engine_alone_s": _engine_busy_s(s) / ns * ratio[m],
                    }
                )
        result = {side: _through_origin(points, f"{side}_s", f"{side}_alone_s") for side in ("engine", "train")}
        new = dataclasses.replace(
            fitted, contention_engine=result["engine"]["c"], contention_trainer=result["train"]["c"]
        )
        settled = (
            abs(new.contention_engine - fitted.contention_engine) < 1e-4
            and abs(new.contention_trainer - fitted.contention_trainer) < 1e-4
        )
        fitted = new
        if settled:
            break
    return fitted, result, points, ratio


def _median_per_step(rows: list[ModeRow], key: str) -> float:
    return float(np.median([getattr(r, key) / r.steps for r in rows if r.steps]))


def fit_engine_sharing(costs: CostModel, path: str | Path) -> CostModel:
    """Fit ``engine_slots`` and ``weight_sync_per_engine_s`` from the sync mode of a run with
    N > 1 engines of the calibrated size on the calibrated host (``costs`` came from the
    same layout with one engine).

    * Weight sync: the per-engine cost at which the simulated sync run with N engines
      spends as long in weight sync per trained step as the run did (median over its sync
      repeats); the calibrated ``weight_sync_s`` is the first engine's share.
    * Slots: the value at which the simulated sync run with N engines spends as long
      generating per step as the run measured (median over its sync repeats), found by
      bisection on [0.5, N] (more slots, faster; the simulated time falls monotonically).
      At N (or more) the engines do not slow each other and the field stays 0 (off).

    Only sync steps are read, so the run's overlapped modes stay held out."""

    run = load_run(path)
    spec = run.spec
    n = int(spec.get("num_engines", 1))
    rows = [r for r in run.extras.repeats.get("sync", []) if r.steps]
    if n < 2 or not rows:
        raise ConfigError(
            f"engine-sharing run {path}: needs a sync mode run with --num-engines >= 2 (has "
            f"{n} engine(s), {len(rows)} sync repeat(s)); fix: run miles-harness run --layout ray "
            "--num-engines 2 --modes sync,..."
        )
    configs = run.mode_configs
    # as many steps as the run's repeats had: per-step figures depend on the count (the
    # last step's weight sync falls after the measurement window)
    steps = rows[0].steps
    assert steps, "rows keeps the sync repeats that ran steps"
    cfg = dataclasses.replace(config_of(configs, "sync"), num_rollout=int(steps))
    base = dataclasses.replace(
        costs,
        max_running=int(spec.get("max_running", costs.max_running)),
        contention_engine=0.0,
        contention_trainer=0.0,
        contention_by_mode={},
    )
    target = _median_per_step(rows, "rollout_busy_s")

    def per_step(slots: float, per_engine: float = 0.0) -> dict[str, float]:
        res = simulate_layout(
            dataclasses.replace(base, engine_slots=slots, weight_sync_per_engine_s=per_engine), cfg, Layout(engines=n)
        )
        if res.error is not None or not res.history:
            raise RuntimeError(f"engine-sharing fit: the simulated sync run failed: {res.error!r}")
        s = summarize(res)
        return {"generating": s["rollout_generating_s"] / s["steps"], "weight_sync": s["weight_sync_s"] / s["steps"]}

    lo, hi = 0.5, float(n)
    own = per_step(0.0)
    if target <= own["generating"] * (1 + 1e-9):
        slots = 0.0
    elif target >= per_step(lo)["generating"]:
        slots = lo
    else:
        for _ in range(30):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if per_step(mid)["generating"] < target else (mid, hi)
        slots = 0.5 * (lo + hi)
        if slots >= n * (1 - 1e-6):
            slots = 0.0
    # weight sync per step is linear in the per-engine cost (the same updates, each longer):
    # read the slope off two simulations, measured the same way as the run (per trained step)
    w_n = _median_per_step(rows, "weight_sync_s")
    probe = max(costs.weight_sync_s, 1e-3)
    w0, w1 = own["weight_sync"], per_step(0.0, probe)["weight_sync"]
    per_engine = max(0.0, (w_n - w0) / (w1 - w0) * probe) if w1 > w0 else 0.0
    host = host_share.host_cores(rows, n) if costs.engine_cores_by_mode.get("sync") else 0.0
    info = {
        "source": str(path),
        "engines": n,
        "sync_repeats": len(rows),
        "host_engine_cores": host,
        "measured_generating_per_step_s": target,
        "simulated_generating_own_hardware_s": own["generating"],
        "slots": slots,
        "weight_sync_per_step_s": w_n,
        "weight_sync_one_engine_s": costs.weight_sync_s,
        "note": "slots by bisection of the simulated sync generating time per step against the measured "
        "median; per-engine weight sync: the simulated weight sync per step matched to the measured median; the run's overlapped modes are "
        "not read",
    }
    return dataclasses.replace(
        costs,
        engine_slots=slots,
        weight_sync_per_engine_s=per_engine,
        host_engine_cores=host,
        fit={**costs.fit, "engine_sharing": info},
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.advise.costs", description=__doc__.split("\n")[0])
    p.add_argument("results", help="a main-job results.json")
    p.add_argument("--trace", help="the run's event trace (JSONL) for per-request lengths, optional")
    p.add_argument("--mode", default="sync")
    p.add_argument("--out", required=True, help="where to write the cost model (JSON)")
    args = p.parse_args(argv)
    costs = fit_costs(observations_from_results(args.results, mode=args.mode, trace=args.trace))
    path = costs.write(args.out)
    print(json.dumps({k: v for k, v in costs.to_json().items() if k != "fit"}, indent=1, sort_keys=True))
    cont = costs.fit.get("contention", {})
    if "engine" in cont:
        print(
            f"contention: engine {costs.contention_engine:.3f} (se {cont['engine']['c_se']}), trainer "
            f"{costs.contention_trainer:.3f} (se {cont['trainer']['c_se']}), from {cont['engine']['n']} repeats"
        )
    print("notes:\n  " + "\n  ".join(costs.fit["notes"]) if costs.fit["notes"] else "notes: none")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
