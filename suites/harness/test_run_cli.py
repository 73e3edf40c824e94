"""`miles-harness run`'s flags are generated from ``RunSpec``: one definition of each
flag (name, help, choices, type, default), and ``make run`` (no arguments) runs ``RunSpec()``."""

from __future__ import annotations

import dataclasses

from harness.cli import command_parser, parse
import pytest

from harness.commands.run import spec_from_args
from harness.main_job.spec import RunSpec, flag_of
from miles_async_core.errors import ConfigError


def _parse(*argv: str):
    return parse(["run", *argv])


def test_an_empty_command_line_is_runspec_defaults():
    args = _parse()
    assert spec_from_args(args) == RunSpec()
    for f in dataclasses.fields(RunSpec):
        assert getattr(args, f.name) == f.default, f.name


def test_every_runspec_field_has_one_flag_with_its_help_and_choices():
    run = command_parser("run")
    by_dest = {}
    for action in run._actions:
        by_dest.setdefault(action.dest, []).extend(action.option_strings)
    for f in dataclasses.fields(RunSpec):
        assert by_dest.get(f.name) == [flag_of(f)], f.name
        assert f.metadata["help"], f.name
    help_text = " ".join(run.format_help().split())
    assert "--d-model" in help_text and "{split,colocate,ray}" in help_text and "{put_once,per_engine}" in help_text


def test_switches_turn_their_default_over():
    assert spec_from_args(_parse("--no-gap")).gap_decomposition is False
    assert spec_from_args(_parse("--use-tis")).use_tis is True


@pytest.mark.parametrize(
    "argv,flag,allowed",
    [
        (("--layout", "mesh"), "--layout 'mesh'", "split, colocate, ray"),
        (("--broadcast", "gossip"), "--broadcast 'gossip'", "put_once, per_engine"),
        (("--lr-scaling", "cosine"), "--lr-scaling 'cosine'", "none, interval, staleness"),
    ],
)
def test_a_value_outside_a_fields_choices_names_the_flag_and_what_is_allowed(argv, flag, allowed):
    with pytest.raises(ConfigError, match=f"{flag}: allowed {allowed}; fix"):
        spec_from_args(_parse(*argv))


def test_the_defaults_are_the_run_that_learns_above_chance():
    # copy 2 of 4 symbols (chance 0.25) at lr 1e-3 for 40 steps: sync and one-step end well above chance;
    # lr 3e-3 collapsed the policy to a prompt-blind constant
    spec = RunSpec()
    assert (spec.max_running, spec.tiny_d_model, spec.tiny_layers) == (16, 256, 4)
    assert (spec.task_length, spec.task_symbols, spec.lr, spec.steps) == (2, 4, 1e-3, 40)
    assert (spec.layout, spec.model, spec.task, spec.repeats) == ("split", "tiny", "copy", 2)


def test_flags_reach_the_spec_and_task_length_and_symbols_are_for_the_copy_task_only():
    spec = spec_from_args(
        _parse(
            "--d-model",
            "32",
            "--layers",
            "1",
            "--max-running",
            "4",
            "--steps",
            "5",
            "--task-symbols",
            "3",
            "--repeats",
            "2",
        )
    )
    assert (spec.tiny_d_model, spec.tiny_layers, spec.max_running, spec.steps) == (32, 1, 4, 5)
    assert (spec.task_symbols, spec.repeats) == (3, 2)
    assert spec.task_kwargs() == {"length": 2, "n_symbols": 3}
    arithmetic = spec_from_args(_parse("--task", "arithmetic"))
    assert (arithmetic.task_length, arithmetic.task_symbols, arithmetic.task_kwargs()) == (None, None, {})
    assert spec_from_args(_parse("--ray-address", "10.0.0.1:6379", "--layout", "ray")).ray_address == "10.0.0.1:6379"


def test_repeats_below_one_are_refused():
    with pytest.raises(ConfigError, match="--repeats 0"):
        RunSpec(repeats=0)


def test_the_colocate_layout_runs_async_modes_only_with_the_extension_the_user_turns_on():
    from miles_async_core.config import AsyncConfig

    from harness.main_job.spec import mode_config

    spec = RunSpec(layout="colocate")
    with pytest.raises(ConfigError, match="add --allow-async-colocate after --"):
        mode_config("fully-async", AsyncConfig(), spec)
    config = mode_config("fully-async", AsyncConfig(allow_async_colocate=True), spec)
    assert config.colocate and config.allow_async_colocate
    assert mode_config("sync", AsyncConfig(), spec).allow_async_colocate is False
