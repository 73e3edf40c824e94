"""Results files: one JSON document per run (schema ``miles-async-harness/results``).

Contract. A results document holds, for one run: what ran (``kind``, the resolved
``config``), where (``machine``: CPU model and count, GPUs through NVML; never the
host name), with what (``software`` versions, ``git`` commit and dirtiness), and every
raw sample of every benchmark with its summary ``stats`` and the ``definition`` of what
was measured. ``compare`` refuses to compare a benchmark whose definition changed.

Invariants guaranteed by this module:

* every benchmark written has ``n >= 1`` finite samples and ``stats`` computed from
  exactly those samples, or (only when converted from a pytest-benchmark file saved
  without data) ``samples == []``, ``samples_missing == true`` and the original stats;
* ``load_results`` returns a document that passed the full field-by-field check below,
  or raises ``ConfigError`` naming the file and the offending field;
* files are written with sorted keys and ``indent=1``, atomically (temp file + rename).

Layout (``schema_version`` 3)::

    schema, schema_version, run_id, created_utc, kind,
    machine  {cpu_model, cpu_count, gpus: [{name, memory_total_bytes}], driver_version}
    software {python, numpy, torch, sglang, miles_async_harness}   (null when absent)
    git      {commit, dirty} | null
    config   {...}                     the resolved run config
    benchmarks {name: {unit, higher_is_better, definition, samples, stats, [samples_missing]}}
    host     {cores, busy, why, windows: {name: figures}, ...}   real-time runs only
    extra    {...}                     free: tables, trace paths, series for plots

Versions: 3 adds ``host``, the share of the machine a real-time run had over each timed
window and whether its figures are comparable (``harness.measure.host_load.summary``);
a file without it (any version) reads as ``host`` unknown. 2 keys a run document's
``extra.table`` by mode name (``{"one-step": row}``); 1 stored it as a list.
``harness.results.mode_rows`` reads both into typed rows and upgrades a version 1 file in
place; every other field is the same in all three.

``stats`` = ``{min, max, median, mean, stddev, q1, q3, n}``; ``stddev`` is the sample
standard deviation (ddof=1, 0 for one sample) and ``q1``/``q3`` are numpy's linear
25th/75th percentiles.

pytest-benchmark: ``from_pytest_benchmark`` converts ``--benchmark-json`` output
(checked against pytest-benchmark 5.3.1). ``--benchmark-json`` always stores every
round's time in ``stats.data``; files saved with ``--benchmark-save``/``--benchmark-autosave``
only do so with ``--benchmark-save-data``, so pass that flag when saving. Each raw
sample is seconds per call of one round (lower is better).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import subprocess
import tempfile
import uuid
from datetime import datetime, UTC
from pathlib import Path
from collections.abc import Iterable, Mapping
from typing import NotRequired, SupportsFloat, TypeAlias, TypedDict, TypeVar, cast

import numpy as np

from miles_async_core.errors import ConfigError
from harness.typing_aliases import JSONDict, JSONValue

SCHEMA = "miles-async-harness/results"
SCHEMA_VERSION = 3  # 3: host (the share of the machine); 2: a run's extra.table keyed by mode name
STAT_KEYS = ("min", "max", "median", "mean", "stddev", "q1", "q3", "n")
T = TypeVar("T")
_REPO_DIR = Path(__file__).resolve().parents[2]  # the checkout: harness/results/schema.py -> root


class GPUInfo(TypedDict):
    name: str
    memory_total_bytes: int


class MachineInfo(TypedDict):
    cpu_model: str
    cpu_count: int | None
    gpus: list[GPUInfo]
    driver_version: str | None


# ``{"commit": str | None, "dirty": bool}``; a plain dict so that ``git_info() or {}`` types.
GitInfo: TypeAlias = dict[str, str | bool | None]


class Stats(TypedDict):
    """``summarize``'s output; a pytest-benchmark file without data keeps its own."""

    min: float
    max: float
    median: float
    mean: float
    stddev: float
    q1: float
    q3: float
    n: int


class BenchmarkEntry(TypedDict):
    unit: str
    higher_is_better: bool
    definition: JSONDict
    samples: list[float]
    stats: Stats
    samples_missing: NotRequired[bool]
    # a history base's entry (harness.results.rank_test.HISTORY_UNITS): what its samples are
    units_what: NotRequired[str]


class ResultsDoc(TypedDict):
    """One results document (layout in the module docstring)."""

    schema: str
    schema_version: int
    run_id: str
    created_utc: str
    kind: str
    machine: MachineInfo
    software: dict[str, str | None]  # distribution name -> version, None when not installed
    git: GitInfo | None
    config: JSONDict
    benchmarks: dict[str, BenchmarkEntry]
    host: NotRequired[JSONDict]  # harness.measure.host_load.summary
    extra: NotRequired[JSONDict]


# --- environment capture ----------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _gpus() -> tuple[list[GPUInfo], str | None]:
    """GPU names and memory through NVML; ``([], None)`` without a driver or pynvml."""
    try:
        import pynvml
    except ImportError:
        return [], None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return [], None
    try:

        def text(v: object) -> str:
            return v.decode() if isinstance(v, bytes) else str(v)

        gpus: list[GPUInfo] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append({"name": text(pynvml.nvmlDeviceGetName(handle)), "memory_total_bytes": int(mem.total)})
        return gpus, text(pynvml.nvmlSystemGetDriverVersion())
    except pynvml.NVMLError:
        return [], None
    finally:
        pynvml.nvmlShutdown()


def machine_info() -> MachineInfo:
    gpus, driver = _gpus()
    return {"cpu_model": _cpu_model(), "cpu_count": os.cpu_count(), "gpus": gpus, "driver_version": driver}


def _dist_version(name: str) -> str | None:
    # Installed-distribution metadata, not an import: importing torch or sglang only to
    # read a version string would cost seconds per results file.
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def software_info() -> dict[str, str | None]:
    return {
        "python": platform.python_version(),
        "numpy": _dist_version("numpy"),
        "torch": _dist_version("torch"),
        "sglang": _dist_version("sglang"),
        "miles_async_harness": _dist_version("miles-async-harness"),
    }


def git_info(repo_dir: Path = _REPO_DIR) -> GitInfo | None:
    """``{commit, dirty}`` of the repository holding this package; None outside git.
    ``commit`` is None in a repository without commits yet. ``dirty`` says whether the
    *code* differs from the commit: files under ``results/`` are outputs, so ``make
    results`` rewriting one file does not mark the files made after it as dirty."""

    def git(*argv: str) -> subprocess.CompletedProcess[str] | None:
        try:
            return subprocess.run(
                ["git", "-C", str(repo_dir), *argv], capture_output=True, text=True, timeout=20, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None

    inside = git("rev-parse", "--is-inside-work-tree")
    if inside is None or inside.returncode != 0 or inside.stdout.strip() != "true":
        return None
    head = git("rev-parse", "--verify", "-q", "HEAD")
    status = git("status", "--porcelain", "--", ".", ":(exclude)results")
    commit = head.stdout.strip() if head is not None and head.returncode == 0 else None
    dirty = status is None or status.returncode != 0 or bool(status.stdout.strip())
    return {"commit": commit or None, "dirty": dirty}


def portable(text: str) -> str:
    """``text`` with this machine's paths as any reader of a committed file can follow them:
    the checkout's own files relative to it, the folder beside it as ``..`` (where the Miles
    trees live, ``../shared/third_party``), the temp dir as ``$TMPDIR``."""
    text = text.replace(str(_REPO_DIR) + os.sep, "").replace(str(_REPO_DIR.parent) + os.sep, ".." + os.sep)
    return text.replace(tempfile.gettempdir() + os.sep, "$TMPDIR" + os.sep)


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- statistics -------------------------------------------------------------------------


def summarize(samples: list[float]) -> Stats:
    a = np.asarray(samples, dtype=np.float64)
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    return {
        "min": float(a.min()),
        "max": float(a.max()),
        "median": float(med),
        "mean": float(a.mean()),
        "stddev": float(a.std(ddof=1)) if a.size > 1 else 0.0,
        "q1": float(q1),
        "q3": float(q3),
        "n": int(a.size),
    }


def _check_samples(name: str, samples: Iterable[SupportsFloat | str]) -> list[float]:
    try:
        values = [float(s) for s in samples]
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"benchmark {name!r}: samples must be a sequence of numbers ({exc}). Pass raw measurements as floats."
        ) from None
    if not values:
        raise ConfigError(f"benchmark {name!r}: samples is empty; record at least one measurement.")
    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        raise ConfigError(
            f"benchmark {name!r}: samples contain non-finite values {bad[:3]}; only finite numbers are allowed. "
            "Drop failed rounds or fix the measurement."
        )
    return values


# --- the document -----------------------------------------------------------------------


class Results:
    """One run's results document. Build with ``Results.new`` then ``add_benchmark``."""

    def __init__(self, doc: ResultsDoc) -> None:
        self.doc = doc
        self._definition_common: JSONDict = {}

    @classmethod
    def new(cls, kind: str, config: Mapping[str, object], definition_common: JSONDict | None = None) -> Results:
        """A fresh document for this machine and checkout. ``definition_common`` is merged
        into the definition of every benchmark added later (benchmark keys win)."""
        if not isinstance(kind, str) or not kind:
            raise ConfigError(f"results kind {kind!r} must be a non-empty string such as 'run' or 'simulate'.")
        if not isinstance(config, dict):
            raise ConfigError(f"results config must be a dict (the resolved config), got {type(config).__name__}.")
        res = cls(
            {
                "schema": SCHEMA,
                "schema_version": SCHEMA_VERSION,
                "run_id": uuid.uuid4().hex,
                "created_utc": utc_now(),
                "kind": kind,
                "machine": machine_info(),
                "software": software_info(),
                "git": git_info(),
                "config": json.loads(json.dumps(config, default=str)),
                "benchmarks": {},
                "extra": {},
            }
        )
        res._definition_common = dict(definition_common or {})
        return res

    # Accessors used by compare and plots.
    @property
    def kind(self) -> str:
        return self.doc["kind"]

    @property
    def run_id(self) -> str:
        return self.doc["run_id"]

    @property
    def created_utc(self) -> str:
        return self.doc["created_utc"]

    @property
    def machine(self) -> MachineInfo:
        return self.doc["machine"]

    @property
    def benchmarks(self) -> dict[str, BenchmarkEntry]:
        return self.doc["benchmarks"]

    @property
    def extra(self) -> JSONDict:
        return self.doc.setdefault("extra", {})

    @property
    def host(self) -> JSONDict | None:
        """The share of the machine the run had (None: not recorded)."""
        return self.doc.get("host")

    @host.setter
    def host(self, record: JSONDict) -> None:
        self.doc["host"] = record

    def add_benchmark(
        self,
        name: str,
        samples: Iterable[SupportsFloat | str],
        unit: str,
        higher_is_better: bool,
        definition: Mapping[str, object] | None = None,
    ) -> BenchmarkEntry:
        """Record every raw sample of one benchmark; returns its entry."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"benchmark name {name!r} must be a non-empty string such as 'tokens_per_s'.")
        if name in self.benchmarks:
            raise ConfigError(f"benchmark {name!r} was already added to this results document; names must be unique.")
        if not isinstance(higher_is_better, bool):
            raise ConfigError(f"benchmark {name!r}: higher_is_better must be True or False, got {higher_is_better!r}.")
        values = _check_samples(name, samples)
        entry: BenchmarkEntry = {
            "unit": str(unit),
            "higher_is_better": higher_is_better,
            "definition": json.loads(json.dumps({**self._definition_common, **(definition or {})}, default=str)),
            "samples": values,
            "stats": summarize(values),
        }
        self.benchmarks[name] = entry
        return entry

    def to_dict(self) -> ResultsDoc:
        copy: ResultsDoc = json.loads(json.dumps(self.doc))
        return copy

    def write(self, path: str | os.PathLike[str]) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.doc, sort_keys=True, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path


# --- loading and validation -------------------------------------------------------------

_NUM = (int, float)
_TOP: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("run_id", (str,), "a string"),
    ("created_utc", (str,), "an ISO 8601 UTC time string"),
    ("kind", (str,), "a string"),
    ("machine", (dict,), "an object"),
    ("software", (dict,), "an object"),
    ("git", (dict, type(None)), "an object or null"),
    ("config", (dict,), "an object"),
    ("benchmarks", (dict,), "an object"),
)


def _type_name(v: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number" if isinstance(v, _NUM) else type(v).__name__
    )


class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, problem: str) -> ConfigError:
        return ConfigError(
            f"results file {self.source}: field {field!r} {problem}. "
            "Fix: regenerate the file with miles-harness, or repair that field."
        )

    def get(self, obj: Mapping[str, object], key: str, field: str, types: tuple[type[T], ...], what: str) -> T:
        if key not in obj:
            raise self.fail(field, f"is missing; expected {what}")
        value = obj[key]
        # bool is an int subclass: a boolean is never accepted where a number is expected.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise self.fail(field, f"is {_type_name(value)} {json.dumps(value)[:60]}; expected {what}")
        return value


def _check_benchmark(chk: _Checker, name: str, b: object) -> None:
    f = f"benchmarks.{name}"
    if not isinstance(b, dict):
        raise chk.fail(f, f"is {_type_name(b)}; expected an object")
    chk.get(b, "unit", f + ".unit", (str,), "a string")
    chk.get(b, "higher_is_better", f + ".higher_is_better", (bool,), "true or false")
    chk.get(b, "definition", f + ".definition", (dict,), "an object")
    samples = chk.get(b, "samples", f + ".samples", (list,), "an array of numbers")
    for i, s in enumerate(samples):
        if isinstance(s, bool) or not isinstance(s, _NUM) or not math.isfinite(s):
            raise chk.fail(f"{f}.samples[{i}]", f"is {json.dumps(s)}; expected a finite number")
    missing = (
        chk.get(b, "samples_missing", f + ".samples_missing", (bool,), "true or false")
        if "samples_missing" in b
        else False
    )
    if not samples and not missing:
        raise chk.fail(f + ".samples", "is empty; expected at least one sample (or samples_missing: true)")
    stats = chk.get(b, "stats", f + ".stats", (dict,), "an object")
    for key in STAT_KEYS:
        chk.get(
            stats, key, f"{f}.stats.{key}", (int,) if key == "n" else _NUM, "an integer" if key == "n" else "a number"
        )


def results_from_dict(doc: object, source: str = "<dict>") -> Results:
    """Validate a parsed document; raise ``ConfigError`` naming ``source`` and the field."""
    chk = _Checker(source)
    if not isinstance(doc, dict):
        raise chk.fail("<top level>", f"is {_type_name(doc)}; expected a JSON object")
    schema = doc.get("schema")
    if schema != SCHEMA:
        hint = (
            " It looks like pytest-benchmark output; miles-harness compare/report read it directly, "
            "or convert it with harness.results.schema.from_pytest_benchmark."
            if looks_like_pytest_benchmark(doc)
            else ""
        )
        raise ConfigError(f"results file {source}: field 'schema' is {json.dumps(schema)}; expected {SCHEMA!r}.{hint}")
    version = chk.get(doc, "schema_version", "schema_version", (int,), "an integer")
    if version > SCHEMA_VERSION:
        raise ConfigError(
            f"results file {source} was written by schema_version {version}; this harness reads up to "
            f"{SCHEMA_VERSION}: upgrade miles-async-harness."
        )
    if version < 1:
        raise chk.fail("schema_version", f"is {version}; expected 1..{SCHEMA_VERSION}")
    for key, types, what in _TOP:
        chk.get(doc, key, key, types, what)
    try:
        datetime.fromisoformat(doc["created_utc"].replace("Z", "+00:00"))
    except ValueError:
        raise chk.fail(
            "created_utc", f"is {doc['created_utc']!r}; expected ISO 8601 such as 2025-01-31T12:00:00Z"
        ) from None
    m = doc["machine"]
    chk.get(m, "cpu_model", "machine.cpu_model", (str,), "a string")
    chk.get(m, "cpu_count", "machine.cpu_count", (int, type(None)), "an integer or null")
    gpus = chk.get(m, "gpus", "machine.gpus", (list,), "an array")
    for i, g in enumerate(gpus):
        if not isinstance(g, dict):
            raise chk.fail(f"machine.gpus[{i}]", f"is {_type_name(g)}; expected an object")
        chk.get(g, "name", f"machine.gpus[{i}].name", (str,), "a string")
    if doc["git"] is not None:
        chk.get(doc["git"], "dirty", "git.dirty", (bool,), "true or false")
    if "extra" in doc:
        chk.get(doc, "extra", "extra", (dict,), "an object")
    if "host" in doc:
        chk.get(doc, "host", "host", (dict,), "an object")
        chk.get(doc["host"], "busy", "host.busy", (bool,), "true or false")
        chk.get(doc["host"], "windows", "host.windows", (dict,), "an object")
    for name, b in doc["benchmarks"].items():
        _check_benchmark(chk, name, b)
    return Results(cast(ResultsDoc, doc))  # checked field by field above


def read_json(path: str | os.PathLike[str]) -> JSONValue:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read results file {path}: {exc}. Check the path.") from None
    try:
        doc: JSONValue = json.loads(text)
    except json.JSONDecodeError as exc:
        if _is_jsonl(text):
            raise ConfigError(
                f"{path} is a JSONL trace (one JSON event per line), not a results file. Allowed: a "
                "results.json (miles-harness run, gap, the benchmarks write one) or pytest-benchmark JSON. "
                f"Fix: pass a results file; check a trace with miles-harness check-trace {path}"
            ) from None
        raise ConfigError(
            f"results file {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
            f"(char {exc.pos}); the file is damaged or truncated. Regenerate it."
        ) from None
    if isinstance(doc, dict) and "schema" not in doc and isinstance(doc.get("config"), dict):
        raise ConfigError(
            f"{path} is a trace's config (what simulate writes next to its trace), not a results file. "
            "Fix: pass a results.json (miles-harness run, gap, the benchmarks write one)"
        )
    return doc


def _is_jsonl(text: str) -> bool:
    """More than one line, and every non-blank line one JSON object: a trace."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        return False
    try:
        return all(isinstance(json.loads(line), dict) for line in lines)
    except json.JSONDecodeError:
        return False


def load_results(path: str | os.PathLike[str]) -> Results:
    """Read and validate a results file (strict: our schema only)."""
    return results_from_dict(read_json(path), source=str(path))


def load_any(path: str | os.PathLike[str]) -> Results:
    """Read a results file, or a pytest-benchmark JSON file converted on the fly."""
    doc = read_json(path)
    if isinstance(doc, dict) and doc.get("schema") is None and looks_like_pytest_benchmark(doc):
        return from_pytest_benchmark(doc, source=str(path))
    return results_from_dict(doc, source=str(path))


# --- pytest-benchmark conversion --------------------------------------------------------


def _kept_stats(chk: _Checker, stats: Mapping[str, object], field: str) -> Stats:
    """A pytest-benchmark entry's own stats (``rounds`` as ``n``), checked in ``STAT_KEYS``
    order, so the first missing field is the one named."""

    def kept(key: str) -> float:
        return chk.get(stats, key, f"{field}.{key}", _NUM, "a number")

    return {
        "min": kept("min"),
        "max": kept("max"),
        "median": kept("median"),
        "mean": kept("mean"),
        "stddev": kept("stddev"),
        "q1": kept("q1"),
        "q3": kept("q3"),
        "n": chk.get(stats, "rounds", f"{field}.rounds", (int,), "a number"),
    }


def looks_like_pytest_benchmark(doc: Mapping[str, object]) -> bool:
    return isinstance(doc.get("benchmarks"), list) and "machine_info" in doc


def from_pytest_benchmark(
    path_or_dict: str | os.PathLike[str] | Mapping[str, object], source: str | None = None
) -> Results:
    """Convert pytest-benchmark JSON. Benchmarks are keyed by ``fullname``; samples are
    ``stats.data`` (seconds per call per round). Without data the pytest-benchmark stats
    are kept, ``samples`` is ``[]`` and ``samples_missing`` is true: nothing is invented."""
    doc: object
    if isinstance(path_or_dict, (str, os.PathLike)):
        doc, source = read_json(path_or_dict), source or str(path_or_dict)
    else:
        doc, source = path_or_dict, source or "<pytest-benchmark dict>"
    chk = _Checker(source)
    if not isinstance(doc, dict) or not looks_like_pytest_benchmark(doc):
        raise chk.fail("benchmarks", "is not a pytest-benchmark list; expected --benchmark-json output")
    mi = doc.get("machine_info") or {}
    cpu = mi.get("cpu") or {}
    ci = doc.get("commit_info") or {}
    commit = ci.get("id")
    git = (
        None
        if "error" in ci or not ci
        else {
            "commit": None if commit in (None, "unversioned") else str(commit),
            "dirty": bool(ci.get("dirty", False)),
        }
    )
    stamp = doc.get("datetime")
    try:
        created = datetime.fromisoformat(str(stamp)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        raise chk.fail("datetime", f"is {stamp!r}; expected an ISO 8601 time") from None
    canonical = json.dumps(doc, sort_keys=True, default=str)
    pytest_benchmark: JSONDict = {}  # extra.pytest_benchmark: fullname -> what the conversion leaves out
    res = Results(
        {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            # Deterministic: converting the same file twice gives the same run_id.
            "run_id": uuid.uuid5(uuid.NAMESPACE_OID, canonical).hex,
            "created_utc": created,
            "kind": "pytest-benchmark",
            "machine": {
                "cpu_model": str(cpu.get("brand_raw") or mi.get("processor") or mi.get("machine") or "unknown"),
                "cpu_count": cpu.get("count") if isinstance(cpu.get("count"), int) else None,
                "gpus": [],
                "driver_version": None,
            },
            "software": {
                "python": mi.get("python_version"),
                "numpy": None,
                "torch": None,
                "sglang": None,
                "miles_async_harness": None,
                "pytest_benchmark": doc.get("version"),
            },
            "git": git,
            "config": {"source": "pytest-benchmark", "pytest_benchmark_version": doc.get("version")},
            "benchmarks": {},
            "extra": {"pytest_benchmark": pytest_benchmark},
        }
    )
    for i, b in enumerate(doc["benchmarks"]):
        field = f"benchmarks[{i}]"
        if not isinstance(b, dict):
            raise chk.fail(field, f"is {_type_name(b)}; expected an object")
        name = chk.get(b, "fullname", field + ".fullname", (str,), "a string")
        stats = chk.get(b, "stats", field + ".stats", (dict,), "an object")
        options = b.get("options") or {}
        definition = {
            "source": "pytest-benchmark",
            "fullname": name,
            "params": b.get("params"),
            "timer": options.get("timer"),
            "disable_gc": options.get("disable_gc"),
        }
        data = stats.get("data")
        if isinstance(data, list) and data:
            res.add_benchmark(name, data, "s", False, definition)
        else:
            res.benchmarks[name] = {
                "unit": "s",
                "higher_is_better": False,
                "definition": json.loads(json.dumps(definition, default=str)),
                "samples": [],
                "samples_missing": True,
                "stats": _kept_stats(chk, stats, f"{field}.stats"),
            }
        pytest_benchmark[name] = {
            "extra_info": b.get("extra_info"),
            "options": options,
            "stats": {k: v for k, v in stats.items() if k != "data"},
        }
    return res
