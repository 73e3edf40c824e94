"""Scenarios: what ``miles-harness simulate`` runs.

A scenario file is TOML or JSON with these tables (every key optional)::

    name = "fully-async-default"
    miles_args = ["--fully-async", "--rollout-batch-size", "16"]   # a pasted Miles command line
    max_new_tokens = 512
    [config]   # AsyncConfig fields, applied after miles_args (e.g. num_rollout = 20)
    [engine]   # SimEngineConfig fields; [engine.response_length] a LengthDist
    [trainer]  # SimTrainerConfig fields
    [faults]   # a FaultSchedule (harness.sim.faults) injected into every run of the scenario
    [watchdog] # WatchdogLimits (harness.sim.watchdog): hang_after_s, max_events, max_events_per_step,
               # max_rss_growth_mb, max_tasks;
               # each left out is derived from the scenario's own time scale and size

Any unknown key, wrong type or bad value gives a ``ConfigError`` naming the file and the
field (``engine.decode_base_s``), the value, and what is allowed.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miles_async_core.config import AsyncConfig, parse_miles_args
from miles_async_core.errors import ConfigError
from harness.sim.engine import LengthDist, SimEngineConfig
from harness.sim.fault_schedule import FaultSchedule
from harness.sim.trainer import SimTrainerConfig
from harness.sim.watchdog import WatchdogLimits


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str = "default"
    config: AsyncConfig = field(default_factory=AsyncConfig)
    engine: SimEngineConfig = field(default_factory=SimEngineConfig)
    trainer: SimTrainerConfig = field(default_factory=SimTrainerConfig)
    max_new_tokens: int = 512
    watchdog: WatchdogLimits = field(default_factory=WatchdogLimits)
    faults: Any = None  # a harness.sim.faults.FaultSchedule, applied by simulate()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "config": self.config.to_dict(),
            "engine": dataclasses.asdict(self.engine),
            "trainer": dataclasses.asdict(self.trainer),
            "max_new_tokens": self.max_new_tokens,
            "watchdog": dataclasses.asdict(self.watchdog),
        }


DEFAULT_SCENARIO = Scenario(
    name="default: fully-async B=16 n=4, rollout-bound engine",
    config=AsyncConfig(
        rollout_batch_size=16,
        n_samples_per_prompt=4,
        fully_async=True,
        num_rollout=20,
        max_weight_staleness=2,
        async_unused_samples_handler="retry",
    ),
    trainer=SimTrainerConfig(step_base_s=3.0),
)


def _build(cls: type, data: Any, where: str, source: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: field {where}: expected a table of keys, got {data!r}")
    names = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"{source}: unknown field {where}.{key}; allowed: {', '.join(sorted(names))}")
        ftype = str(names[key].type)
        if "float" in ftype and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        expected = {"float": float, "int": int, "str": str, "bool": bool}.get(ftype.split(" ")[0].strip())
        if expected is not None and (not isinstance(value, expected) or (expected is int and isinstance(value, bool))):
            raise ConfigError(f"{source}: field {where}.{key} = {value!r}: expected {ftype}; fix the value's type")
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: field {where}: {exc}") from None


def scenario_from_dict(data: dict[str, Any], source: str = "<scenario>") -> Scenario:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a scenario is a table of keys, got {type(data).__name__}")
    allowed = {"name", "miles_args", "max_new_tokens", "config", "engine", "trainer", "watchdog", "faults"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{source}: unknown field {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")
    base: dict[str, Any] = {}
    if "miles_args" in data:
        args = data["miles_args"]
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ConfigError(f"{source}: field miles_args: expected a list of strings, got {args!r}")
        base = parse_miles_args(args)[0].to_dict()
    overrides = data.get("config", {})
    if not isinstance(overrides, dict):
        raise ConfigError(f"{source}: field config: expected a table, got {overrides!r}")
    unknown_cfg = sorted(set(overrides) - set(AsyncConfig().to_dict()))
    if unknown_cfg:
        raise ConfigError(f"{source}: unknown field config.{unknown_cfg[0]}; see AsyncConfig for the allowed fields")
    try:
        config = AsyncConfig.from_dict({**base, **overrides})
    except ConfigError as exc:
        raise ConfigError(f"{source}: field config: {exc}") from None
    engine_data = dict(data.get("engine", {}) or {})
    if "response_length" in engine_data:
        engine_data["response_length"] = _build(
            LengthDist, engine_data["response_length"], "engine.response_length", source
        )
    engine = _build(SimEngineConfig, engine_data, "engine", source) if engine_data else SimEngineConfig()
    trainer = _build(SimTrainerConfig, data.get("trainer", {}), "trainer", source)
    watchdog = _build(WatchdogLimits, data.get("watchdog", {}), "watchdog", source)
    faults = None
    if "faults" in data:
        faults = _build(FaultSchedule, data["faults"], "faults", source)
        try:
            faults.check_applies(config)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        for name in ("cancel_at_s", "dynamic_filter_reject_rate"):
            if getattr(faults, name):
                raise ConfigError(
                    f"{source}: field faults.{name} = {getattr(faults, name)!r}: a scenario file "
                    "injects only engine and trainer faults; fix: leave it out (the property suites "
                    "draw it, through harness.sim.faults.run_with_faults)"
                )
    max_new = data.get("max_new_tokens", 512)
    if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 1:
        raise ConfigError(f"{source}: field max_new_tokens = {max_new!r}: expected an integer >= 1")
    return Scenario(
        name=str(data.get("name", Path(source).stem)),
        config=config,
        engine=engine,
        trainer=trainer,
        max_new_tokens=max_new,
        watchdog=watchdog,
        faults=faults,
    )


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"scenario file {path}: cannot read it ({exc.strerror}); fix: pass an existing "
            ".toml or .json file to --scenario"
        ) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(
            f"scenario file {path}: not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {exc}"
        ) from None
    return scenario_from_dict(data, str(path))
