"""A main-job mode's row, typed, and the run results' table keyed by mode name.

``ModeRow`` is one row of ``miles-harness run``'s table: either one repeat of one mode
(``harness.main_job.rows.summarize_mode``) or a mode's repeats aggregated
(``aggregate_repeats``: medians, with ``<key>_min`` / ``<key>_max`` for the noisy
figures, ``repeats``, ``checks_passed`` and ``losses_repeat``). A run's results file
stores, in ``extra``:

* ``table``: ``{mode: aggregated row}``, keyed by mode name (``extra.table["one-step"]``);
* ``repeats``: ``{mode: [row of each repeat]}``.

Layouts. ``schema_version`` 1 stored ``extra.table`` as a list of rows in the order the
modes ran; ``schema_version`` 2 keys it by mode name. ``table_of`` and ``repeats_of``
read both into ``ModeRow``s, so a file written in either layout loads.
``python -m harness.results.mode_rows FILE...`` rewrites run files of the old layout in
the new one: only the table's container changes (each row is kept key for key, value
for value) and ``schema_version`` becomes 2; a file already in the new layout is left as
it is.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from miles_async_core.errors import ConfigError

# figures whose spread over the repeats an aggregated row carries as <key>_min / <key>_max
SPREAD_KEYS = ("speedup", "overlap_efficiency", "wall_s", "run_s", "reward_start", "reward_end")
TABLE_LAYOUT_VERSION = 2  # the results schema_version from which extra.table is keyed by mode


@dataclass(frozen=True, kw_only=True)
class ModeRow:
    """One mode's figures (one repeat, or the repeats aggregated). Every field is the
    value of the results file's key of the same name; None: not measured in this row
    (a run that failed early, a figure only overlapped or aggregated rows carry)."""

    mode: str
    steps: int | None = None
    # harness.measure.overlap.overlap_metrics over the measurement window
    wall_s: float | None = None
    rollout_busy_s: float | None = None
    train_busy_s: float | None = None
    weight_sync_s: float | None = None
    train_waiting_s: float | None = None
    decode_busy_s: float | None = None
    both_busy_s: float | None = None
    both_busy_fraction: float | None = None
    rollout_idle_ratio: float | None = None
    train_idle_ratio: float | None = None
    wait_time_ratio: float | None = None
    run_s: float | None = None  # the driver's run, t1 - t0
    # mean train/reward_mean of the first / last reward_window steps; the task's chance level
    reward_start: float | None = None
    reward_end: float | None = None
    reward_window: int | None = None
    chance_level: float | None = None
    # sample ages (weight versions) and lags (steps): {value: count}
    age_hist: dict[int, int] = dataclasses.field(default_factory=dict)
    lag_hist: dict[int, int] = dataclasses.field(default_factory=dict)
    dropped_share: float = 0.0  # dropped / taken samples
    retried_share: float = 0.0  # recycled / taken samples
    lr: float | None = None  # the last step's learning rate
    error: str | None = None
    worker_error: str | None = None  # a fully-async worker that died after the last drain
    self_cost_share: float | None = None  # harness.measure.self_cost: the recording's share of the run
    # harness.measure.memory peaks (bytes)
    peak_rss_run_bytes: float | None = None
    peak_rss_after_run_bytes: float | None = None
    peak_rss_engine_process_bytes: float | None = None
    # harness.measure.cpu_use.cores over the run
    cpu_cores_main: float | None = None
    cpu_cores_per_engine: list[float | None] | None = None
    cpu_cores_engines: float | None = None
    cpu_cores_total: float | None = None
    host_cpu_count: int | None = None
    # against the sync run of the same repeat (overlapped modes only)
    speedup: float | None = None
    ideal_speedup: float | None = None
    overlap_efficiency: float | None = None
    sync_rollout_s: float | None = None
    sync_train_s: float | None = None
    losses: dict[str, Any] | None = None  # harness.measure.overlap_loss.loss_table
    # one repeat only: harness.checking.invariants.check_report, private keys removed
    checks: dict[str, Any] | None = None
    # aggregated rows only
    repeats: int | None = None
    checks_passed: bool | None = None
    losses_repeat: int | None = None  # the repeat whose loss table is shown (median efficiency)
    speedup_min: float | None = None
    speedup_max: float | None = None
    overlap_efficiency_min: float | None = None
    overlap_efficiency_max: float | None = None
    wall_s_min: float | None = None
    wall_s_max: float | None = None
    run_s_min: float | None = None
    run_s_max: float | None = None
    reward_start_min: float | None = None
    reward_start_max: float | None = None
    reward_end_min: float | None = None
    reward_end_max: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as a results file stores it: every field by name, None kept only for
        the fields a row always carries (``mode``, ``error``, ``worker_error``...)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None or f.name in ALWAYS_WRITTEN:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "row") -> ModeRow:
        """A row from a results file's object; raises ``ConfigError`` naming ``where`` and
        the key on a key this row does not know or a missing ``mode``."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(
                f"{where}: unknown key {unknown[0]!r}; a mode row has: {', '.join(sorted(names))}. "
                "Fix: regenerate the file with miles-harness run"
            )
        if "mode" not in data:
            raise ConfigError(
                f"{where}: key 'mode' is missing; a mode row names its mode. "
                "Fix: regenerate the file with miles-harness run"
            )
        for f in dataclasses.fields(cls):
            if f.name in data and not _fits(data[f.name], str(f.type)):
                raise ConfigError(
                    f"{where}.{f.name} is {data[f.name]!r}; expected {f.type}. "
                    "Fix: regenerate the file with miles-harness run"
                )
        values = dict(data)
        for key in ("age_hist", "lag_hist"):  # JSON object keys are strings
            if key in values:
                values[key] = {int(k): int(v) for k, v in values[key].items()}
        return cls(**values)


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "float": (int, float),
    "int": (int, float),
    "str": (str,),
    "bool": (bool,),
    "dict": (dict,),
    "list": (list,),
}


def _fits(value: object, annotation: str) -> bool:
    """Whether a JSON value fits a ``ModeRow`` field's annotation (``"float | None"``,
    ``"dict[int, int]"``...): None where the annotation allows it, a number (never a
    boolean) for ``int`` and ``float`` (aggregated counts are medians), else the kind."""
    kinds = [a.strip().split("[")[0] for a in annotation.split("|")]
    if value is None:
        return "None" in kinds
    if isinstance(value, bool):
        return "bool" in kinds
    return any(isinstance(value, _JSON_TYPES[k]) for k in kinds if k in _JSON_TYPES)


ALWAYS_WRITTEN = frozenset(
    {
        "mode",
        "steps",
        "wall_s",
        "rollout_busy_s",
        "train_busy_s",
        "weight_sync_s",
        "train_waiting_s",
        "decode_busy_s",
        "both_busy_s",
        "both_busy_fraction",
        "rollout_idle_ratio",
        "train_idle_ratio",
        "wait_time_ratio",
        "run_s",
        "reward_start",
        "reward_end",
        "reward_window",
        "chance_level",
        "age_hist",
        "lag_hist",
        "dropped_share",
        "retried_share",
        "lr",
        "error",
        "worker_error",
    }
)


def _extra(doc: Mapping[str, object], source: str) -> dict[str, Any]:
    """The ``extra`` of a run document (one without a ``kind``, built by hand, is read as one)."""
    if doc.get("kind", "run") != "run":
        raise ConfigError(
            f"results file {source}: kind {doc.get('kind')!r} has no mode table; expected a "
            "miles-harness run results file (kind 'run')"
        )
    extra = doc.get("extra", {})
    if not isinstance(extra, dict):
        raise ConfigError(
            f"results file {source}: extra is {type(extra).__name__}; expected an object. "
            "Fix: regenerate the file with miles-harness run"
        )
    return extra


def table_of(doc: Mapping[str, object], source: str = "<results>") -> dict[str, ModeRow]:
    """The aggregated row of each mode, by mode name; reads ``extra.table`` as a list
    (schema_version 1) or keyed by mode (2; files are written with sorted keys, so the
    order is the names', not the run's)."""
    table = _extra(doc, source).get("table", {})
    if isinstance(table, list):
        table = {row["mode"]: row for row in table}
    return {mode: ModeRow.from_dict(row, f"results file {source}: extra.table.{mode}") for mode, row in table.items()}


def repeats_of(doc: Mapping[str, object], source: str = "<results>") -> dict[str, list[ModeRow]]:
    """Each repeat's row of each mode (``extra.repeats``; the same in both layouts)."""
    return {
        mode: [ModeRow.from_dict(r, f"results file {source}: extra.repeats.{mode}.{i}") for i, r in enumerate(rows)]
        for mode, rows in _extra(doc, source).get("repeats", {}).items()
    }


def upgrade_layout(doc: dict[str, Any]) -> bool:
    """Rewrite a run document of the old layout (``extra.table`` a list) in place into the
    new one (keyed by mode name, ``schema_version`` 2). Every row is kept as it was, key
    for key; returns whether anything changed."""
    if doc.get("kind") != "run" or not isinstance(doc.get("extra", {}).get("table"), list):
        return False
    rows = doc["extra"]["table"]
    modes = [row["mode"] for row in rows]
    if len(set(modes)) != len(modes):
        raise ConfigError(f"extra.table names a mode twice ({modes}); it cannot be keyed by mode name")
    doc["extra"]["table"] = {row["mode"]: row for row in rows}
    doc["schema_version"] = max(int(doc.get("schema_version", 1)), TABLE_LAYOUT_VERSION)
    return True


def upgrade_file(path: str | os.PathLike[str]) -> bool:
    """``upgrade_layout`` on one file, written back in the results files' format (sorted
    keys, ``indent=1``) only when it changed."""
    path = Path(path)
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not upgrade_layout(doc):
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m harness.results.mode_rows",
        description="rewrite run results files of the old layout (extra.table a list) "
        "with the table keyed by mode name; values are not changed",
    )
    p.add_argument("files", nargs="+", help="results.json files of miles-harness run")
    args = p.parse_args(argv)
    for f in args.files:
        print(f"{'upgraded' if upgrade_file(f) else 'unchanged'} {f}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
