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


def test_the_defaults_are_what_make_run_ran_before_they_were_unified():
    # the CLI's values won where RunSpec's differed: the run users know
    spec = RunSpec()
    assert (spec.max_running, spec.tiny_d_model, spec.tiny_layers, spec.task_length) == (16, 256, 4, 3)
    assert (spec.steps, spec.layout, spec.model, spec.task) == (30, "split", "tiny", "copy")


def test_flags_reach_the_spec_and_task_length_is_for_the_copy_task_only():
    spec = spec_from_args(_parse("--d-model", "32", "--layers", "1", "--max-running", "4", "--steps", "5"))
    assert (spec.tiny_d_model, spec.tiny_layers, spec.max_running, spec.steps) == (32, 1, 4, 5)
    assert spec_from_args(_parse("--task", "arithmetic")).task_length is None
