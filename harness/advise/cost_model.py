"""The simulator's cost model of one engine and one trainer (``CostModel``), as fitted by
``harness.advise.costs`` and read by ``harness.advise.predict``.

This module holds the model and its file format only; fitting it (which simulates runs
through ``harness.advise.predict``) lives in ``harness.advise.costs``, so the predictor
and the fit each import this module and neither imports the other back.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miles_async_core.errors import ConfigError
from harness.sim.engine import LengthDist, SimEngineConfig
from harness.sim.trainer import SimTrainerConfig


@dataclass
class CostModel:
    """Costs of one engine and one trainer in the calibrated layout (``reference``)."""

    decode_base_s: float
    decode_per_seq_s: float
    prefill_per_token_s: float
    max_running: int
    prompt_tokens: int
    max_new_tokens: int
    response_length: dict[str, Any]
    train_base_s: float
    train_per_token_s: float
    weight_sync_s: float
    pause_resume_s: float = 0.0
    # one prefill batch's fixed cost, paid by each engine step that admits requests (fit_costs, from
    # the calibration engine's own step times: admitting steps minus decode-only ones); 0: not measured
    prefill_base_s: float = 0.0
    # contention (harness.sim.contention, fitted by fit_contention): while the trainer trains
    # an engine step costs (1 + contention_engine) times as much; while an engine decodes a
    # training step runs at 1 / (1 + contention_trainer) of its rate. 0: the sides are independent
    contention_engine: float = 0.0
    contention_trainer: float = 0.0
    # the same two factors fitted on one overlapped mode's repeats alone ({"one-step": {"engine":
    # .., "trainer": ..}, "fully-async": ..}): a mode found here uses its own, others the joint ones
    contention_by_mode: dict[str, dict[str, float]] = field(default_factory=dict)
    # engines sharing the calibrated host (fit_engine_sharing, from a run with several engines):
    # k > 1 engines decoding at once each step at max(1, k / engine_slots) times the cost (0: every
    # engine has its own hardware, as on a cluster); each engine past the first adds
    # weight_sync_per_engine_s to a weight update (its load and the calls that reach it)
    engine_slots: float = 0.0
    weight_sync_per_engine_s: float = 0.0
    # the host's cores (harness.advise.host_share): per mode, what the one engine of the calibration
    # run took while generating; what N engines took together in the N-engine run's sync mode (0:
    # not recorded). From them the engines share more in an overlapped mode than engine_slots says
    engine_cores_by_mode: dict[str, float] = field(default_factory=dict)
    host_engine_cores: float = 0.0
    reference: dict[str, Any] = field(default_factory=lambda: {"engine_gpus": 1, "trainer_gpus": 1})
    fit: dict[str, Any] = field(default_factory=dict)

    def contention_for(self, config: Any) -> tuple[float, float]:
        """(engine, trainer) contention factors for a run of ``config``: its mode's own
        (``contention_by_mode``) where fitted, else the joint ones."""
        own = self.contention_by_mode.get(mode_of(config))
        if own is None:
            return self.contention_engine, self.contention_trainer
        return own["engine"], own["trainer"]

    def length_dist(self) -> LengthDist:
        return LengthDist(**self.response_length)

    def engine_config(self, gpus_per_engine: int = 1, seed: int = 0) -> SimEngineConfig:
        """The engine on ``gpus_per_engine`` GPUs, relative to the calibrated engine:
        step costs / g and ``max_running`` x g (ideal tensor parallel: optimistic)."""
        g = gpus_per_engine / self.reference.get("engine_gpus", 1)
        return SimEngineConfig(
            max_running=max(1, int(round(self.max_running * g))),
            decode_base_s=max(self.decode_base_s / g, 1e-12),
            decode_per_seq_s=self.decode_per_seq_s / g,
            prefill_per_token_s=self.prefill_per_token_s / g,
            prefill_base_s=self.prefill_base_s / g,
            prompt_tokens=self.prompt_tokens,
            response_length=self.length_dist(),
            seed=seed,
        )

    def trainer_config(self, trainer_gpus: int = 1) -> SimTrainerConfig:
        """The trainer on ``trainer_gpus``: per-token cost / t (ideal data parallel), the
        per-step base unchanged."""
        t = trainer_gpus / self.reference.get("trainer_gpus", 1)
        return SimTrainerConfig(step_base_s=self.train_base_s, per_token_s=self.train_per_token_s / t)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CostModel:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"cost model: unknown field {unknown[0]!r}; allowed: {', '.join(sorted(names))}")
        return cls(**data)

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")
        return path


def mode_of(config: Any) -> str:
    """The main job's name for the mode ``config`` runs: sync, one-step or fully-async."""
    return "fully-async" if config.fully_async else "one-step" if config.driver == "train_async" else "sync"


def load_costs(path: str | Path) -> CostModel:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(
            f"--costs {path}: cannot read it ({exc.strerror}); fix: pass a file written by "
            "python -m harness.advise.costs"
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--costs {path}: not valid JSON ({exc})") from None
    return CostModel.from_json(data)
