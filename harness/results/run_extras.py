"""What a ``miles-harness run`` results file holds in ``extra``, typed.

``RunExtras`` is the contract between the main job (``harness.commands.run``, which
builds one and writes ``to_dict()``) and every reader of a run's results file (the
advisor, ``harness.results.summary``, the GPU script's summary): readers call
``RunExtras.from_doc(doc)`` and read fields, never string keys. The keys, all under
``extra``:

* ``modes``: ``{mode: ModeTimeline}``, the first repeat's phase timeline and sample
  ages, with the aggregated row's headline figures (what ``harness.results.plots``
  draws);
* ``table``: ``{mode: ModeRow}`` aggregated over the repeats; ``repeats``: ``{mode:
  [ModeRow per repeat]}``; ``checks``: ``{mode: [check report per repeat]}``
  (``harness.results.mode_rows`` reads both table layouts);
* ``per_step``: ``{mode: [the first repeat's per-step history]}``;
* ``gap_steps`` / ``gap_mode`` / ``gap_unit`` / ``gap_summary``: the per-step gap
  decomposition (present when the run decomposed it);
* ``telemetry``, ``total_wall_s``; ``engines`` (ray layout only).

A results file written before a key existed loads with that key's empty value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.results.mode_rows import ModeRow, repeats_of, table_of
from harness.typing_aliases import JSONDict, JSONValue
from miles_async_core.errors import ConfigError

if TYPE_CHECKING:
    from harness.results.schema import ResultsDoc


PhaseSpan = tuple[str, str, float, float]  # (side, phase, start s, end s), harness.measure.overlap.phase_spans
EngineRow = dict[str, Any]  # harness.measure.engines.per_engine_rows: figures, None where unmeasured


def _float(v: object, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{where} is {v!r}; expected a number. Fix: regenerate the file with miles-harness run")
    return float(v)


def _opt_float(v: object, where: str) -> float | None:
    return None if v is None else _float(v, where)


def _opt_str(v: object) -> str | None:
    return None if v is None else str(v)


def _obj(v: object, where: str) -> JSONDict:
    if not isinstance(v, dict):
        raise ConfigError(
            f"{where} is {type(v).__name__}; expected an object. Fix: regenerate the file with miles-harness run"
        )
    return v


def _list(v: object, where: str) -> list[JSONValue]:
    if not isinstance(v, list):
        raise ConfigError(
            f"{where} is {type(v).__name__}; expected an array. Fix: regenerate the file with miles-harness run"
        )
    return v


@dataclass(frozen=True, kw_only=True)
class ModeTimeline:
    """``extra.modes[mode]``: the first repeat's phases and sample ages, and the mode's
    aggregated headline figures (None: the row has no such figure)."""

    phases: list[PhaseSpan]
    sample_ages: list[int]
    wall_s: float | None = None
    speedup: float | None = None
    overlap_efficiency: float | None = None
    error: str | None = None
    worker_error: str | None = None
    chance_level: float | None = None
    reward_start: float | None = None
    reward_end: float | None = None
    checks_passed: bool | None = None

    HEADLINE = (
        "speedup",
        "overlap_efficiency",
        "error",
        "worker_error",
        "chance_level",
        "reward_start",
        "reward_end",
        "checks_passed",
    )

    @classmethod
    def of(cls, phases: list[PhaseSpan], sample_ages: list[int], row: ModeRow) -> ModeTimeline:
        return cls(
            phases=phases,
            sample_ages=sample_ages,
            wall_s=row.wall_s,
            speedup=row.speedup,
            overlap_efficiency=row.overlap_efficiency,
            error=row.error,
            worker_error=row.worker_error,
            chance_level=row.chance_level,
            reward_start=row.reward_start,
            reward_end=row.reward_end,
            checks_passed=row.checks_passed,
        )

    def to_dict(self) -> JSONDict:
        out: JSONDict = {
            "phases": [list(p) for p in self.phases],
            "sample_ages": list(self.sample_ages),
            "wall_s": self.wall_s,
        }
        for key in self.HEADLINE:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, d: JSONDict, where: str) -> ModeTimeline:
        phases: list[PhaseSpan] = []
        for i, p in enumerate(_list(d.get("phases", []), f"{where}.phases")):
            side, phase, a, b = _list(p, f"{where}.phases[{i}]")
            phases.append((str(side), str(phase), _float(a, f"{where}.phases[{i}]"), _float(b, f"{where}.phases[{i}]")))
        ages = [int(_float(a, f"{where}.sample_ages")) for a in _list(d.get("sample_ages", []), f"{where}.sample_ages")]
        passed = d.get("checks_passed")
        return cls(
            phases=phases,
            sample_ages=ages,
            wall_s=_opt_float(d.get("wall_s"), f"{where}.wall_s"),
            speedup=_opt_float(d.get("speedup"), f"{where}.speedup"),
            overlap_efficiency=_opt_float(d.get("overlap_efficiency"), f"{where}.overlap_efficiency"),
            error=_opt_str(d.get("error")),
            worker_error=_opt_str(d.get("worker_error")),
            chance_level=_opt_float(d.get("chance_level"), f"{where}.chance_level"),
            reward_start=_opt_float(d.get("reward_start"), f"{where}.reward_start"),
            reward_end=_opt_float(d.get("reward_end"), f"{where}.reward_end"),
            checks_passed=None if passed is None else bool(passed),
        )


@dataclass(frozen=True, kw_only=True)
class GapStep:
    """One step of the gap decomposition (``extra.gap_steps``), mean |log-prob gap|."""

    step: int
    kernel: float
    staleness: float
    total: float

    def to_dict(self) -> JSONDict:
        return {"step": self.step, "kernel": self.kernel, "staleness": self.staleness, "total": self.total}


@dataclass(frozen=True, kw_only=True)
class EngineTable:
    """``extra.engines[mode]`` (ray layout): per-engine rows and the group's stats."""

    rows: list[EngineRow]
    stats: JSONDict | None

    def to_dict(self) -> JSONDict:
        return {"rows": [dict(r) for r in self.rows], "stats": self.stats}


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One step of ``extra.per_step[mode]`` as the readers use it: the step's id, its
    generated tokens and the ages (weight versions behind) of the samples it trained
    on. The full record (every metric the driver logged) stays in ``raw``."""

    rollout_id: int
    tokens: int
    age_versions: list[int]
    raw: JSONDict

    @classmethod
    def from_dict(cls, d: JSONDict, where: str) -> StepRecord:
        rid = d.get("rollout_id", -1)
        tokens = d.get("tokens", 0)
        ages = _list(d.get("age_versions", []), f"{where}.age_versions")
        return cls(
            rollout_id=int(_float(rid, f"{where}.rollout_id")),
            tokens=int(_float(tokens, f"{where}.tokens")),
            age_versions=[int(_float(a, f"{where}.age_versions")) for a in ages],
            raw=d,
        )


@dataclass(frozen=True, kw_only=True)
class RunExtras:
    """Everything a run's results file keeps in ``extra`` (see the module docstring)."""

    modes: dict[str, ModeTimeline]
    table: dict[str, ModeRow]
    repeats: dict[str, list[ModeRow]]
    checks: dict[str, list[JSONDict | None]] = field(default_factory=dict)
    per_step: dict[str, list[JSONDict]] = field(default_factory=dict)
    gap_steps: list[GapStep] = field(default_factory=list)
    gap_mode: str | None = None
    gap_summary: dict[str, JSONDict] = field(default_factory=dict)
    telemetry: JSONDict | None = None
    total_wall_s: float | None = None
    engines: dict[str, EngineTable] | None = None

    @property
    def gap_unit(self) -> str | None:
        return f"mean |log-prob gap| (nats/token), {self.gap_mode}" if self.gap_mode is not None else None

    def steps(self, mode: str) -> list[StepRecord]:
        """The first repeat's per-step records of ``mode`` (empty when it has none)."""
        return [
            StepRecord.from_dict(d, f"extra.per_step.{mode}[{i}]") for i, d in enumerate(self.per_step.get(mode, []))
        ]

    def sample_ages(self, mode: str) -> list[int]:
        return [a for s in self.steps(mode) for a in s.age_versions]

    def engine_rows(self, mode: str) -> list[EngineRow]:
        return self.engines[mode].rows if self.engines and mode in self.engines else []

    def to_dict(self) -> JSONDict:
        """The ``extra`` object as results files store it (keys as the module docstring)."""
        out: JSONDict = {
            "modes": {m: t.to_dict() for m, t in self.modes.items()},
            "table": {m: _row_json(r) for m, r in self.table.items()},
            "repeats": {m: [_row_json(r) for r in rs] for m, rs in self.repeats.items()},
            "checks": {m: list(cs) for m, cs in self.checks.items()},
            "per_step": {m: list(h) for m, h in self.per_step.items()},
            "gap_summary": dict(self.gap_summary),
        }
        if self.gap_steps:
            out["gap_steps"] = [s.to_dict() for s in self.gap_steps]
            out["gap_mode"] = self.gap_mode
            out["gap_unit"] = self.gap_unit
        if self.telemetry is not None:
            out["telemetry"] = self.telemetry
        if self.total_wall_s is not None:
            out["total_wall_s"] = self.total_wall_s
        if self.engines is not None:
            out["engines"] = {m: e.to_dict() for m, e in self.engines.items()}
        return out

    @classmethod
    def from_doc(cls, doc: Mapping[str, object], source: str = "<results>") -> RunExtras:
        """A run document's extras; raises ``ConfigError`` naming ``source`` and the key for
        a document of another kind or a value of the wrong type. Keys a file lacks load
        empty (files written before them)."""
        if doc.get("kind", "run") != "run":
            raise ConfigError(
                f"results file {source}: kind {doc.get('kind')!r} is not a miles-harness run results "
                "file (kind 'run'); fix: pass the results.json of `miles-harness run`"
            )
        where = f"results file {source}: extra"
        extra = _obj(doc.get("extra", {}), where)
        modes = {
            m: ModeTimeline.from_dict(_obj(v, f"{where}.modes.{m}"), f"{where}.modes.{m}")
            for m, v in _obj(extra.get("modes", {}), f"{where}.modes").items()
        }
        checks = {
            m: [None if c is None else _obj(c, f"{where}.checks.{m}") for c in _list(v, f"{where}.checks.{m}")]
            for m, v in _obj(extra.get("checks", {}), f"{where}.checks").items()
        }
        per_step = {
            m: [_obj(h, f"{where}.per_step.{m}") for h in _list(v, f"{where}.per_step.{m}")]
            for m, v in _obj(extra.get("per_step", {}), f"{where}.per_step").items()
        }
        gap_steps = [
            GapStep(
                step=int(_float(s.get("step"), f"{where}.gap_steps")),
                kernel=_float(s.get("kernel"), f"{where}.gap_steps"),
                staleness=_float(s.get("staleness"), f"{where}.gap_steps"),
                total=_float(s.get("total"), f"{where}.gap_steps"),
            )
            for s in (_obj(x, f"{where}.gap_steps") for x in _list(extra.get("gap_steps", []), f"{where}.gap_steps"))
        ]
        engines = None
        if "engines" in extra:
            engines = {}
            for m, v in _obj(extra["engines"], f"{where}.engines").items():
                e = _obj(v, f"{where}.engines.{m}")
                rows = [
                    _engine_row(_obj(r, f"{where}.engines.{m}.rows"))
                    for r in _list(e.get("rows") or [], f"{where}.engines.{m}.rows")
                ]
                stats = e.get("stats")
                engines[m] = EngineTable(rows=rows, stats=None if stats is None else _obj(stats, f"{where}.engines"))
        telemetry = extra.get("telemetry")
        return cls(
            modes=modes,
            table=table_of(doc, source),
            repeats=repeats_of(doc, source),
            checks=checks,
            per_step=per_step,
            gap_steps=gap_steps,
            gap_mode=_opt_str(extra.get("gap_mode")),
            gap_summary={
                m: _obj(v, f"{where}.gap_summary.{m}")
                for m, v in _obj(extra.get("gap_summary", {}), f"{where}.gap_summary").items()
            },
            telemetry=None if telemetry is None else _obj(telemetry, f"{where}.telemetry"),
            total_wall_s=_opt_float(extra.get("total_wall_s"), f"{where}.total_wall_s"),
            engines=engines,
        )


def _engine_row(d: JSONDict) -> EngineRow:
    return {k: v for k, v in d.items() if v is None or isinstance(v, (int, float, str))}


def _row_json(row: ModeRow) -> JSONDict:
    return row.to_dict()


@dataclass(frozen=True, kw_only=True)
class RunFile:
    """A ``miles-harness run`` results file, checked by the schema: the document, its
    typed extras, and the run's settings (``config.spec``: the ``RunSpec`` fields) and
    each mode's resolved Miles config (``config.modes``)."""

    doc: ResultsDoc
    extras: RunExtras
    spec: dict[str, Any]  # RunSpec's fields as stored (older files lack the newer ones)
    mode_configs: dict[str, dict[str, Any]]  # AsyncConfig.resolved_dict() of each mode


def load_run(path: str | os.PathLike[str]) -> RunFile:
    """Read a run's results file through ``harness.results.schema.load_results`` (a file
    that fails the schema raises ``ConfigError`` naming the file and the field)."""
    from harness.results.schema import load_results

    doc = load_results(path).doc
    extras = RunExtras.from_doc(doc, str(path))
    config = _obj(doc.get("config", {}), f"results file {path}: config")
    modes = _obj(config.get("modes", {}), f"results file {path}: config.modes")
    return RunFile(
        doc=doc,
        extras=extras,
        spec=_obj(config.get("spec", {}), f"results file {path}: config.spec"),
        mode_configs={m: _obj(c, f"results file {path}: config.modes.{m}") for m, c in modes.items()},
    )
