"""`miles-harness run`'s flags take their defaults from ``RunSpec``: one set of main-job
defaults, and ``make run`` (no arguments) runs ``RunSpec()``."""

from __future__ import annotations

import dataclasses

from harness.cli import build_parser
from harness.commands.run import RUNSPEC_FLAGS, spec_from_args
from harness.main_job.job import RunSpec


def _parse(*argv: str):
    return build_parser("run").parse_args(["run", *argv])


def test_an_empty_command_line_is_runspec_defaults():
    args = _parse()
    assert spec_from_args(args) == RunSpec()
    for dest, field in RUNSPEC_FLAGS.items():
        assert getattr(args, dest) == RunSpec.__dataclass_fields__[field].default, dest


def test_every_runspec_field_has_a_flag():
    fields = {f.name for f in dataclasses.fields(RunSpec)}
    assert fields == set(RUNSPEC_FLAGS.values()) | {"gap_decomposition"}
    assert spec_from_args(_parse("--no-gap")).gap_decomposition is False


def test_the_defaults_are_the_run_that_learns_above_chance():
    # copy 2 of 4 symbols (chance 0.25) at lr 1e-3 for 40 steps: sync and one-step end well above chance;
    # lr 3e-3 collapsed the policy to a prompt-blind constant
    spec = RunSpec()
    assert (spec.max_running, spec.tiny_d_model, spec.tiny_layers) == (16, 256, 4)
    assert (spec.task_length, spec.task_symbols, spec.lr, spec.steps) == (2, 4, 1e-3, 40)
    assert (spec.layout, spec.model, spec.task, spec.repeats) == ("split", "tiny", "copy", 2)


def test_flags_reach_the_spec_and_task_length_and_symbols_are_for_the_copy_task_only():
    spec = spec_from_args(_parse("--d-model", "32", "--layers", "1", "--max-running", "4", "--steps", "5",
                                 "--task-symbols", "3", "--repeats", "2"))
    assert (spec.tiny_d_model, spec.tiny_layers, spec.max_running, spec.steps) == (32, 1, 4, 5)
    assert (spec.task_symbols, spec.repeats) == (3, 2)
    assert spec.task_kwargs() == {"length": 2, "n_symbols": 3}
    arithmetic = spec_from_args(_parse("--task", "arithmetic"))
    assert (arithmetic.task_length, arithmetic.task_symbols, arithmetic.task_kwargs()) == (None, None, {})


def test_repeats_below_one_are_refused():
    import pytest

    from miles_async_core.errors import ConfigError

    with pytest.raises(ConfigError, match="--repeats 0"):
        RunSpec(repeats=0)
