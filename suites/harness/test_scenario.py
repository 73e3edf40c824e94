"""Scenario files: valid ones load; malformed ones give an error naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main as cli
from harness.sim.scenario import load_scenario, scenario_from_dict
from miles_async_core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "fixtures/scenarios").glob("*.toml")))
def test_committed_scenarios_load(name):
    scenario = load_scenario(ROOT / "fixtures/scenarios" / name)
    assert scenario.config.num_rollout >= 1


@pytest.mark.parametrize(
    "data,field",
    [
        ({"engine": {"decode_base_s": "fast"}}, "engine.decode_base_s"),
        ({"engine": {"decode_base_s": 0}}, "engine.decode_base_s"),
        ({"engine": {"warp": 9}}, "engine.warp"),
        ({"engine": {"response_length": {"kind": "zipf"}}}, "engine.response_length.kind"),
        ({"trainer": {"step_base_s": -1.0}}, "trainer.step_base_s"),
        ({"config": {"rollout_batch_size": "8"}}, "rollout_batch_size"),
        ({"config": {"bogus": 1}}, "config.bogus"),
        ({"miles_args": "--fully-async"}, "miles_args"),
        ({"miles_args": ["--rollout-batch-size", "x"]}, "--rollout-batch-size"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"turbo": True}, "turbo"),
    ],
)
def test_malformed_scenario_names_the_field(data, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        scenario_from_dict(data, "s.toml")


def test_unparseable_and_missing_files_are_clear_errors(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[engine\n")
    assert cli(["simulate", "--scenario", str(bad), "--trace", ""]) == 2
    assert "bad.toml: not valid TOML" in capsys.readouterr().err
    assert cli(["simulate", "--scenario", str(tmp_path / "none.toml"), "--trace", ""]) == 2
    assert "cannot read it" in capsys.readouterr().err


def test_simulate_cli_prints_the_summary_and_writes_the_trace(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    rc = cli(["simulate", "--scenario", str(ROOT / "fixtures/scenarios/one_step_k3.toml"), "--trace", str(trace)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "policy lag, optimizer steps" in out and "0:4 1:12 2:12 3:8" in out
    assert trace.read_text().count("\n") > 100


def test_simulate_cli_refuses_a_forbidden_mode_with_the_rule(capsys):
    assert cli(["simulate", "--trace", "", "--", "--fully-async", "--pause-generation-mode", "abort"]) == 2
    err = capsys.readouterr().err
    assert "--pause-generation-mode" in err and "--fully-async" in err
