"""The fakes the harness puts at upstream's leaves say so when upstream reaches past them:
a run that reads a member a fake lacks stops with a harness error naming the leaf, the
member and the upstream file:line, never upstream's error (the engine leaf's own check is
``test_orchestration.py``; the ``args`` namespace Miles' parser fills, here)."""

from __future__ import annotations

import pytest

from harness.sim.engine import SimEngineConfig
from harness.sim.scenario import Scenario
from harness.sim.trainer import SimTrainerConfig
from harness.upstream.harness_errors import RunnerSeamError
from miles_async_core.config import AsyncConfig


def _scenario(**cfg) -> Scenario:
    return Scenario(
        name="leaf-fake",
        config=AsyncConfig(rollout_batch_size=2, n_samples_per_prompt=2, num_rollout=2, seed=1, **cfg),
        engine=SimEngineConfig(seed=1),
        trainer=SimTrainerConfig(),
        max_new_tokens=16,
    )


def test_an_argument_neither_miles_parser_nor_the_runner_sets_is_a_harness_error_naming_it(miles_src, monkeypatch):
    """``args`` is filled by Miles' own parser and the runner: a plain read of an argument
    neither sets is a harness error naming the argument and the line;
    ``getattr(args, name, default)`` keeps upstream's default."""
    from harness.upstream import runner

    make = runner.upstream_args

    def without_seed(*a, **k):
        args = make(*a, **k)
        del args.rollout_seed
        assert getattr(args, "rollout_seed", "default") == "default" and not hasattr(args, "rollout_seed")
        return args

    monkeypatch.setattr(runner, "upstream_args", without_seed)
    with pytest.raises(RunnerSeamError) as err:
        runner.run_upstream(_scenario())
    assert err.value.seams == ["leaf args.rollout_seed"]
    assert "upstream reads at miles/" in str(err.value)
