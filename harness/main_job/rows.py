"""The main job's table rows: one per repeat of each mode (``summarize_mode``), each
mode's repeats aggregated (``aggregate_repeats``), and every repeat's rows from the runs
so far (``rows_by_mode``: an overlapped mode's speedup is against the sync run of its
repeat, whichever order the modes ran in)."""

from __future__ import annotations

import dataclasses
import statistics

from harness.main_job.result import CpuUse, ModeResult
from harness.measure.overlap import ideal_speedup
from harness.results.mode_rows import SPREAD_KEYS, ModeRow
from harness.sim.run_scenario import histogram
from miles_async_core import events as ev

_Field = str | int | float | bool | None | dict[int, int] | dict[str, object]  # an aggregated row's value

REWARD_WINDOW = 5  # reward start / end: the mean of the first / last 5 steps (fewer in runs under 10 steps)


def summarize_mode(r: ModeResult, sync: ModeResult | None) -> ModeRow:
    """One row of the main job's table (one repeat of one mode). With ``sync`` (the sync
    run of the same repeat): speedup, ideal speedup, overlap efficiency and the loss
    table (``harness.measure.overlap_loss``)."""
    rewards = r.per_step("train/reward_mean")
    k = max(1, min(REWARD_WINDOW, len(rewards) // 2))
    ages = [a for h in r.history for a in h.get("age_versions", [])]
    lags = [a for h in r.history for a in h.get("lag_steps", [])]
    taken = sum(1 for e in r.events if e.kind == ev.TAKEN)
    dropped = sum(1 for e in r.events if e.kind == ev.DROPPED)
    retried = sum(1 for e in r.events if e.kind == ev.RECYCLED)
    checks = {k2: v for k2, v in r.checks.items() if not k2.startswith("_")} if r.checks is not None else None
    o, cpu, peaks = r.overlap, r.cpu_use or CpuUse(), r.peak_rss_bytes
    row = ModeRow(
        mode=r.mode,
        steps=len(r.history),
        run_s=r.run_s,
        wall_s=o.get("wall_s"),
        rollout_busy_s=o.get("rollout_busy_s"),
        train_busy_s=o.get("train_busy_s"),
        weight_sync_s=o.get("weight_sync_s"),
        train_waiting_s=o.get("train_waiting_s"),
        decode_busy_s=o.get("decode_busy_s"),
        both_busy_s=o.get("both_busy_s"),
        both_busy_fraction=o.get("both_busy_fraction"),
        rollout_idle_ratio=o.get("rollout_idle_ratio"),
        train_idle_ratio=o.get("train_idle_ratio"),
        wait_time_ratio=o.get("wait_time_ratio"),
        reward_start=sum(rewards[:k]) / k if rewards else None,
        reward_end=sum(rewards[-k:]) / k if rewards else None,
        reward_window=k,
        chance_level=r.chance_level,
        age_hist=histogram(ages),
        lag_hist=histogram(lags),
        dropped_share=dropped / taken if taken else 0.0,
        retried_share=retried / taken if taken else 0.0,
        lr=r.per_step("train/lr")[-1] if r.per_step("train/lr") else None,
        error=r.error,
        worker_error=r.worker_error,
        checks=checks,
        self_cost_share=r.self_cost["share_of_run"] if r.self_cost else None,
        peak_rss_run_bytes=peaks.get("run"),
        peak_rss_after_run_bytes=peaks.get("after_run"),
        peak_rss_engine_process_bytes=peaks.get("engine_process"),
        cpu_cores_main=cpu.cpu_cores_main,
        cpu_cores_per_engine=cpu.cpu_cores_per_engine,
        cpu_cores_engines=cpu.cpu_cores_engines,
        cpu_cores_total=cpu.cpu_cores_total,
        host_cpu_count=cpu.host_cpu_count,
    )
    if sync is None or not sync.history or not r.history or r is sync:
        return row
    return _against_sync(row, r, sync)


def _against_sync(row: ModeRow, r: ModeResult, sync: ModeResult) -> ModeRow:
    """``row`` with the figures against the sync run of the same repeat: speedup (sync's
    wall seconds per step over this mode's), the ideal speedup from sync's rollout and
    train seconds per step, overlap efficiency, and the loss table."""
    from harness.measure.overlap_loss import loss_table, step_parts

    per_step_sync = sync.overlap["wall_s"] / len(sync.history)
    per_step = r.overlap["wall_s"] / len(r.history)
    R = sync.overlap["rollout_busy_s"] / len(sync.history)
    T = (sync.overlap["train_busy_s"] + sync.overlap["weight_sync_s"]) / len(sync.history)
    ideal = ideal_speedup(R, T)
    return dataclasses.replace(
        row,
        speedup=per_step_sync / per_step,
        ideal_speedup=ideal,
        overlap_efficiency=(per_step_sync / per_step) / ideal,
        sync_rollout_s=R,
        sync_train_s=T,
        losses=loss_table(
            step_parts(sync.events, sync.window, len(sync.history)), step_parts(r.events, r.window, len(r.history))
        ),
    )


# not a median: a list, the per-repeat verdicts, the aggregate's own fields, or the spreads
_NOT_AGGREGATED = frozenset(
    {
        "mode",
        "cpu_cores_per_engine",
        "checks",
        "repeats",
        "checks_passed",
        "losses_repeat",
        *(f"{k}_{end}" for k in SPREAD_KEYS for end in ("min", "max")),
    }
)


def aggregate_repeats(rows: list[ModeRow]) -> ModeRow:
    """One mode's table row from its repeats' rows (``summarize_mode``): every numeric
    figure is the median over the repeats that have it; ``SPREAD_KEYS`` also get
    ``<key>_min`` and ``<key>_max``; the age and lag histograms add up over the repeats;
    the loss table is the one of the repeat whose overlap efficiency is the median (the
    lower middle one for an even count), so its parts sum to that repeat's gap;
    ``checks_passed`` is whether every repeat's trace passed every checker; ``error`` is
    the first error."""
    if not rows:
        raise ValueError("aggregate_repeats needs at least one row")
    out: dict[str, _Field] = {"mode": rows[0].mode, "repeats": len(rows)}
    for f in dataclasses.fields(ModeRow):
        if f.name in _NOT_AGGREGATED:
            continue
        values = [getattr(r, f.name) for r in rows]
        values = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if values:
            out[f.name] = statistics.median(values)
            if f.name in SPREAD_KEYS:
                out[f"{f.name}_min"], out[f"{f.name}_max"] = min(values), max(values)
    for key in ("age_hist", "lag_hist"):
        merged: dict[int, int] = {}
        for r in rows:
            for a, n in getattr(r, key).items():
                merged[a] = merged.get(a, 0) + n
        out[key] = dict(sorted(merged.items()))
    with_losses = sorted(
        (r for r in rows if r.losses and r.overlap_efficiency is not None), key=lambda r: r.overlap_efficiency or 0.0
    )
    if with_losses:
        median_row = with_losses[(len(with_losses) - 1) // 2]
        out["losses"] = median_row.losses
        out["losses_repeat"] = rows.index(median_row)
    out["checks_passed"] = all(r.checks["passed"] for r in rows if r.checks is not None)
    out["error"] = next((r.error for r in rows if r.error), None)
    out["worker_error"] = next((r.worker_error for r in rows if r.worker_error), None)
    return ModeRow(**out)  # type: ignore[arg-type]  # keys are ModeRow's field names


def rows_by_mode(runs: dict[str, list[ModeResult]]) -> dict[str, list[ModeRow]]:
    """Each mode's row of every repeat that ran (``summarize_mode``), computed from all the
    runs so far: an overlapped mode's row is against the sync run of its own repeat
    whether sync ran before or after it in that repeat (without a sync run in the repeat,
    it has no speedup)."""
    syncs = runs.get("sync", [])
    return {
        mode: [summarize_mode(r, syncs[rep] if rep < len(syncs) else None) for rep, r in enumerate(results)]
        for mode, results in runs.items()
    }
