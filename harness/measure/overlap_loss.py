"""Where an overlapped mode loses against the ideal speedup: the loss table.

Everything is in per-step time units (seconds per training step, over the
``measurement_window``, divided by the steps trained). From a trace:

* ``R``: the rollout side generating (``rollout``/``generating``);
* ``T``: the trainer training (``train``/``training``);
* ``W``: weight sync proper: each ``train``/``weight_sync`` interval from the engine's
  ``ENGINE_PAUSE`` event to the ``ENGINE_VERSION`` event inside it (taking the weights
  and loading them into the engine);
* ``P``: pause and resume: the rest of each ``weight_sync`` interval (start to
  ``ENGINE_PAUSE``, ``ENGINE_VERSION`` to end; the whole interval is ``W`` when either
  event is missing), so ``W + P`` is the ``weight_sync`` busy time;
* ``S``: the step time, window / steps; in sync ``O = S - R - T - W - P`` is what
  neither side's busy time explains (driver overhead, waiting).

Sync (subscript s) defines the ideal: ``ideal_speedup = (R_s + T_s + W_s + P_s) /
max(R_s, T_s + W_s + P_s)`` (``harness.measure.overlap.ideal_speedup``, the trainer side
carrying the weight sync), the ideal step time is ``I = S_s / ideal_speedup`` and the
overlapped mode (subscript a) reaches ``overlap_efficiency = I / S_a``. The gap
``S_a - I`` is split into five parts that sum to it exactly (a telescoping sum), on the
model ``S_a = max(R_a, T_a) + W_a + P_a + residual`` (generation stops while weights
sync):

1. ``rollout slower``: ``max(R_a, T_s) - max(R_s, T_s)``, rollout's slow-down against
   sync (contention), counted where it lengthens the longer side;
2. ``train slower``: ``max(R_a, T_a) - max(R_a, T_s)``, likewise for training;
3. ``weight sync``: ``W_a - A_W`` with ``A_W = max(R_s, T_s + W_s) - max(R_s, T_s)``,
   the weight sync the ideal already charges (it sits on the trainer side there, hidden
   under rollout when rollout is longer);
4. ``pause and resume``: ``P_a - A_P`` with ``A_P = max(R_s, T_s + W_s + P_s) -
   max(R_s, T_s + W_s)``;
5. ``waiting and other``: ``S_a - max(R_a, T_a) - W_a - P_a - O_s * C / (R_s + T_s +
   W_s + P_s)`` with ``C = max(R_s, T_s + W_s + P_s)``: the trainer waiting for
   generate (or rollout waiting for the trainer) beyond the two sides' busy times, and
   overhead, less the ideal's share of sync's own overhead.

Since ``I = C + O_s * C / (R_s + T_s + W_s + P_s)``, the parts sum to ``S_a - I``. In
efficiency points each part is divided by ``S_a``; they sum to ``1 -
overlap_efficiency``. A negative part is time the overlapped mode gained against sync
(e.g. a side that ran faster than it did alone).
"""

from __future__ import annotations

from typing import Any

from harness.measure.overlap import intervals, total
from miles_async_core import events as ev

PARTS = ("rollout slower", "train slower", "weight sync", "pause and resume", "waiting and other")


def step_parts(events: list[Any], window: tuple[float, float], steps: int) -> dict[str, float]:
    """``{"R", "T", "W", "P", "S", "O"}`` per step of one run's trace (see the module docstring)."""
    lo, hi = window
    n = max(1, steps)
    gen = intervals(events, "rollout", "generating", hi)
    train = intervals(events, "train", "training", hi)
    syncs = intervals(events, "train", "weight_sync", hi)
    pauses = [e.t for e in events if e.kind == ev.ENGINE_PAUSE]
    loads = [e.t for e in events if e.kind == ev.ENGINE_VERSION]
    weight = pause = 0.0
    for a, b in syncs:
        a, b = max(a, lo), min(b, hi)
        if a >= b:
            continue
        tp = next((t for t in pauses if a <= t <= b), None)
        tv = next((t for t in loads if tp is not None and tp <= t <= b), None)
        if tp is None or tv is None:
            weight += b - a
        else:
            weight += tv - tp
            pause += (tp - a) + (b - tv)
    parts = {
        "R": total(gen, window) / n,
        "T": total(train, window) / n,
        "W": weight / n,
        "P": pause / n,
        "S": (hi - lo) / n,
    }
    parts["O"] = parts["S"] - parts["R"] - parts["T"] - parts["W"] - parts["P"]
    return parts


def loss_table(sync: dict[str, float], mode: dict[str, float]) -> dict[str, Any]:
    """The gap between the mode's step time and the ideal one, in parts (seconds per step
    and efficiency points), from ``step_parts`` of the sync run and of the mode's run."""
    Rs, Ts, Ws, Ps, Ss, Os = (sync[k] for k in ("R", "T", "W", "P", "S", "O"))
    Ra, Ta, Wa, Pa, Sa = (mode[k] for k in ("R", "T", "W", "P", "S"))
    busy = max(Rs + Ts + Ws + Ps, 1e-12)
    C = max(Rs, Ts + Ws + Ps)
    ideal_step = Ss * C / busy
    seconds = {
        "rollout slower": max(Ra, Ts) - max(Rs, Ts),
        "train slower": max(Ra, Ta) - max(Ra, Ts),
        "weight sync": Wa - (max(Rs, Ts + Ws) - max(Rs, Ts)),
        "pause and resume": Pa - (C - max(Rs, Ts + Ws)),
        "waiting and other": Sa - max(Ra, Ta) - Wa - Pa - Os * C / busy,
    }
    return {
        "step_s": Sa,
        "ideal_step_s": ideal_step,
        "gap_s": Sa - ideal_step,
        "overlap_efficiency": ideal_step / Sa if Sa > 0 else None,
        "parts_s": seconds,
        "parts_points": {k: v / Sa if Sa > 0 else 0.0 for k, v in seconds.items()},
        "sync": dict(sync),
        "mode": dict(mode),
    }


def format_loss_table(tables: dict[str, dict[str, Any]]) -> str:
    """One column per mode: each part in ms per step and in efficiency points, then the sum."""
    modes = list(tables)
    if not modes:
        return ""
    head = ["loss (per step)"] + [f"{m} ms" for m in modes] + [f"{m} eff pts" for m in modes]
    rows = [head]
    for name in PARTS:
        rows.append(
            [name]
            + [f"{tables[m]['parts_s'][name] * 1e3:+.1f}" for m in modes]
            + [f"{tables[m]['parts_points'][name]:+.3f}" for m in modes]
        )
    rows.append(
        ["= measured - ideal"]
        + [f"{tables[m]['gap_s'] * 1e3:+.1f}" for m in modes]
        + [f"{1 - tables[m]['overlap_efficiency']:+.3f}" for m in modes]
    )
    rows.append(
        ["(measured, ideal step)"]
        + [f"{tables[m]['step_s'] * 1e3:.1f}, {tables[m]['ideal_step_s'] * 1e3:.1f}" for m in modes]
        + ["" for _ in modes]
    )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows
    )
