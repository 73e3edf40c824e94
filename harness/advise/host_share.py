"""The host's cores as the engines and the main process share them (the Ray layout on one host).

``fit_engine_sharing`` fits ``engine_slots`` on a several-engine run's sync mode, where the
main process (driver and trainer) is idle while the engines decode. In an overlapped mode
the main process trains and drives while they decode, so the engines share more of the
host than in sync: on the kept Ray pairs each fully-async engine kept 0.53-0.54 cores with
2 engines against 0.89-0.92 alone, where sync's kept 0.90-0.93 against 1.16-1.19. This
module reads the cores the runs recorded (``cpu_cores_engines`` per repeat) and gives the
contention model (``harness.sim.contention.host_growth``) the three figures of a host
shared in proportion to demand:

* ``engine_cores``: what one engine takes alone while it generates (the one-engine
  calibration run's sync mode): its demand;
* ``host_cores``: what N engines take together while they generate in the N-engine run's
  sync mode: the host's capacity for them;
* ``main_cores``: the main process's demand in an overlapped mode, inferred from the cores
  the one engine kept in that mode of the calibration run: shared in proportion to demand,
  an engine wanting ``e`` keeps ``e * H / (e + main)``, so ``main = e * H / kept - e``
  (0 where it kept as much as in sync: no sign of sharing).

Only the calibration run (one engine, every mode) and the several-engine run's sync mode
are read, so that run's overlapped modes stay held out. A figure the runs did not record
(a simulated calibration, the split layout, older results files) is 0, and then the
growth is 1: the model is the sync sharing alone, as before.
"""

from __future__ import annotations

import statistics
from typing import Any

from harness.results.mode_rows import ModeRow


def engine_cores_generating(rows: list[ModeRow]) -> float | None:
    """Each engine's cores while the rollout generates, median over the repeats: the
    engines' cores over the run, per engine, over the share of the run they generated
    (``rollout_busy_s``: their union). None unless every repeat recorded them."""
    share = [
        r.cpu_cores_engines / len(r.cpu_cores_per_engine) * r.wall_s / r.rollout_busy_s
        for r in rows
        if r.cpu_cores_engines is not None and r.cpu_cores_per_engine and r.rollout_busy_s and r.wall_s is not None
    ]
    return statistics.median(share) if share and len(share) == len(rows) else None


def engine_cores_by_mode(repeats: dict[str, list[ModeRow]] | None) -> dict[str, float]:
    """Per mode of a one-engine run, its engine's cores while generating (modes without
    them, or a run with several engines, left out)."""
    out = {}
    for mode, rows in (repeats or {}).items():
        rows = [r for r in rows if r.steps]
        if rows and all(len(r.cpu_cores_per_engine or ()) == 1 for r in rows):
            cores = engine_cores_generating(rows)
            if cores:
                out[mode] = cores
    return out


def host_cores(rows: list[ModeRow], engines: int) -> float:
    """What ``engines`` engines take together while generating in a sync mode's repeats (0
    when not recorded)."""
    cores = engine_cores_generating([r for r in rows if r.steps])
    return engines * cores if cores else 0.0


def main_cores(costs: Any, mode: str) -> float:
    """The main process's demand in ``mode`` (``e * H / kept - e``; 0 where not identified)."""
    by = costs.engine_cores_by_mode
    e, kept, host = by.get("sync", 0.0), by.get(mode, 0.0), costs.host_engine_cores
    if not (e > 0 and host > 0 and 0 < kept < e):
        return 0.0
    return e * host / kept - e


def figures(costs: Any, mode: str) -> dict[str, float]:
    """``Contention``'s keyword arguments for ``mode`` (all 0: off)."""
    main = main_cores(costs, mode)
    if main <= 0:
        return {"engine_cores": 0.0, "main_cores": 0.0, "host_cores": 0.0}
    return {
        "engine_cores": costs.engine_cores_by_mode["sync"],
        "main_cores": main,
        "host_cores": costs.host_engine_cores,
    }
