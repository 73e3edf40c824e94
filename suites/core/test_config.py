"""AsyncConfig: Miles' defaults, resolved values, serialisation and Miles command-line parsing."""

from __future__ import annotations

import dataclasses

import pytest

from miles_async_core.config import AsyncConfig, flag_of, parse_miles_args
from miles_async_core.errors import ConfigError


def test_defaults_are_miles_defaults_except_the_documented_ones():
    c = AsyncConfig()
    assert c.to_dict() == {
        "rollout_batch_size": 8,  # required in Miles; harness default
        "n_samples_per_prompt": 1,
        "update_weights_interval": 1,
        "max_weight_staleness": None,
        "async_unused_samples_handler": "drop",
        "async_max_concurrent_samples": None,
        "pause_generation_mode": "retract",
        "over_sampling_batch_size": None,
        "async_data_buffer_capacity_factor": 2.0,
        "rollout_submission_granularity": None,
        "colocate": False,
        "fully_async": False,
        "train_backend": "megatron",
        "driver": "train_async",
        "num_rollout": 10,
        "start_rollout_id": 0,
        "async_max_retries": None,
        "allow_async_colocate": False,  # harness extension: off = upstream refuses async --colocate
        "cancel_orphaned_tasks": False,  # harness extension: off = upstream leaves a dead worker's groups running
        "exactly_once_resume": False,  # harness extension: off = a resume loads what upstream saves
        "save_interval": None,  # Miles: no periodic save
        "debug_exit_after_rollout": None,
        "use_tis": False,
        "tis_clip": 2.0,
        "tis_clip_low": 0.0,
        "partial_rollout": False,
        "use_rollout_logprobs": False,
        "keep_old_actor": False,
        "use_critic": False,
        "seed": 0,
    }


def test_config_is_frozen_and_keyword_only():
    c = AsyncConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.rollout_batch_size = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        AsyncConfig(4)  # type: ignore[misc]


@pytest.mark.parametrize(("factor", "b", "capacity"), [(2.0, 8, 16), (1.5, 3, 4), (0.4, 2, 0), (0.5, 3, 1)])
def test_capacity_is_int_of_factor_times_batch(factor, b, capacity):
    c = AsyncConfig(async_data_buffer_capacity_factor=factor, rollout_batch_size=b)
    assert c.capacity == capacity


@pytest.mark.parametrize(("x", "n", "b", "g"), [(None, 4, 8, 8), (10, 4, 8, 2), (3, 4, 8, 1), (128, 8, 2, 16)])
def test_group_budget_is_concurrent_samples_over_n_or_batch_size(x, n, b, g):
    c = AsyncConfig(async_max_concurrent_samples=x, n_samples_per_prompt=n, rollout_batch_size=b)
    assert c.group_budget == g


def test_group_budget_with_zero_samples_per_prompt_is_a_config_error_not_a_crash():
    c = AsyncConfig(async_max_concurrent_samples=4, n_samples_per_prompt=0)
    with pytest.raises(ConfigError, match="--n-samples-per-prompt 0"):
        _ = c.group_budget
    assert c.resolved_dict()["group_budget"] is None


def test_unset_over_sampling_resolves_to_batch_size():
    assert AsyncConfig(rollout_batch_size=5).resolved_over_sampling_batch_size == 5
    assert AsyncConfig(over_sampling_batch_size=12).resolved_over_sampling_batch_size == 12


@pytest.mark.parametrize(
    ("fully_async", "given", "resolved"),
    [(True, None, "sample"), (False, None, "group"), (True, "group", "group"), (False, "sample", "sample")],
)
def test_submission_granularity_resolution(fully_async, given, resolved):
    c = AsyncConfig(fully_async=fully_async, rollout_submission_granularity=given)
    assert c.resolved_rollout_submission_granularity == resolved


def test_resolved_dict_carries_the_derived_values():
    d = AsyncConfig(fully_async=True, rollout_batch_size=4).resolved_dict()
    assert (d["capacity"], d["group_budget"], d["over_sampling_batch_size"]) == (8, 4, 4)
    assert d["rollout_submission_granularity"] == "sample"


def test_to_dict_from_dict_round_trips():
    c = AsyncConfig(fully_async=True, max_weight_staleness=2, pause_generation_mode="in_place", seed=7)
    assert AsyncConfig.from_dict(c.to_dict()) == c


def test_from_dict_rejects_an_unknown_key_by_name():
    with pytest.raises(ConfigError, match="'rollout_batchsize'") as err:
        AsyncConfig.from_dict({"rollout_batchsize": 8})
    assert "rollout_batch_size" in str(err.value)  # lists what is allowed


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rollout_batch_size", "8"),
        ("rollout_batch_size", True),
        ("max_weight_staleness", 1.5),
        ("async_data_buffer_capacity_factor", float("nan")),
        ("async_data_buffer_capacity_factor", float("inf")),
        ("colocate", 1),
        ("pause_generation_mode", "pause"),
        ("rollout_submission_granularity", "token"),
        ("train_backend", "deepspeed"),
        ("driver", "train_multi_lora_async"),
    ],
)
def test_wrong_type_or_choice_names_the_field_and_flag(field, value):
    with pytest.raises(ConfigError) as err:
        AsyncConfig.from_dict({field: value})
    message = str(err.value)
    assert field in message and flag_of(field) in message and repr(value) in message


# ---- parse_miles_args -----------------------------------------------------------------


def test_parses_a_miles_command_line_verbatim():
    config, notes = parse_miles_args(
        "--fully-async --pause-generation-mode in_place --rollout-batch-size 32 "
        "--max-weight-staleness 2 --n-samples-per-prompt=4 --async-unused-samples-handler retry "
        "--async-data-buffer-capacity-factor 1.5".split()
    )
    assert notes == []
    assert config == AsyncConfig(
        fully_async=True,
        pause_generation_mode="in_place",
        rollout_batch_size=32,
        max_weight_staleness=2,
        n_samples_per_prompt=4,
        async_unused_samples_handler="retry",
        async_data_buffer_capacity_factor=1.5,
    )


def test_every_field_but_the_driver_is_reachable_by_its_miles_flag():
    target = AsyncConfig(
        rollout_batch_size=3,
        n_samples_per_prompt=2,
        update_weights_interval=4,
        max_weight_staleness=-1,
        async_unused_samples_handler="retry",
        async_max_concurrent_samples=6,
        pause_generation_mode="abort",
        over_sampling_batch_size=5,
        async_data_buffer_capacity_factor=0.5,
        rollout_submission_granularity="group",
        colocate=True,
        fully_async=True,
        train_backend="fsdp",
        num_rollout=3,
        start_rollout_id=1,
        async_max_retries=2,
        use_tis=True,
        tis_clip=3.0,
        tis_clip_low=0.1,
        partial_rollout=True,
        use_rollout_logprobs=True,
        keep_old_actor=True,
        use_critic=True,
        seed=9,
        save_interval=2,
        debug_exit_after_rollout=5,
    )
    argv: list[str] = []
    for name, value in target.to_dict().items():
        if name == "driver":
            continue
        if isinstance(value, bool):
            argv += [flag_of(name)] if value else []
        else:
            argv += [flag_of(name), str(value)]
    assert parse_miles_args(argv) == (target, [])


def test_flags_not_modelled_are_ignored_and_reported_with_their_values():
    config, notes = parse_miles_args(
        ["--hf-checkpoint", "/x", "--lr", "1e-6", "--colocate", "--eval-prompt-data", "aime", "a.jsonl"]
    )
    assert config == AsyncConfig(colocate=True)
    assert notes == [
        "ignored, not modelled by the harness: --hf-checkpoint /x",
        "ignored, not modelled by the harness: --lr 1e-6",
        "ignored, not modelled by the harness: --eval-prompt-data aime a.jsonl",
    ]


@pytest.mark.parametrize(
    ("argv", "driver"),
    [
        (["train.py"], "train"),
        (["train_async.py"], "train_async"),
        (["python", "train.py", "--colocate"], "train"),
        (["python3", "some/dir/train.py"], "train"),
        ([], "train_async"),
        (["--lr", "1e-6", "train.py"], "train"),  # the script ends an unknown flag's values
    ],
)
def test_the_script_token_selects_the_driver(argv, driver):
    config, _ = parse_miles_args(argv)
    assert config.driver == driver


def test_an_unmodelled_driver_script_is_rejected():
    with pytest.raises(ConfigError, match="train_multi_lora_async.py") as err:
        parse_miles_args(["train_multi_lora_async.py"])
    assert "train.py or train_async.py" in str(err.value)


def test_a_type_error_names_the_flag_the_value_and_what_is_allowed():
    with pytest.raises(ConfigError) as err:
        parse_miles_args(["--rollout-batch-size", "abc"])
    message = str(err.value)
    assert "--rollout-batch-size" in message and "'abc'" in message and "integer" in message


def test_a_bad_choice_names_the_flag_the_value_and_the_choices():
    with pytest.raises(ConfigError) as err:
        parse_miles_args(["--pause-generation-mode=pause"])
    message = str(err.value)
    assert "--pause-generation-mode" in message and "'pause'" in message
    assert "abort, retract, in_place" in message


def test_non_finite_float_is_rejected():
    with pytest.raises(ConfigError, match="--tis-clip 'inf'"):
        parse_miles_args(["--tis-clip", "inf"])


def test_a_flag_without_a_value_is_rejected():
    with pytest.raises(ConfigError, match="--rollout-batch-size needs a value"):
        parse_miles_args(["--rollout-batch-size", "--fully-async"])
    with pytest.raises(ConfigError, match="--max-weight-staleness needs a value"):
        parse_miles_args(["--max-weight-staleness"])


def test_a_presence_flag_takes_no_value():
    with pytest.raises(ConfigError, match="--fully-async='true'"):
        parse_miles_args(["--fully-async=true"])


def test_negative_numbers_are_values_and_the_last_flag_wins():
    config, _ = parse_miles_args(
        ["--max-weight-staleness", "-1", "--rollout-batch-size", "2", "--rollout-batch-size=3"]
    )
    assert (config.max_weight_staleness, config.rollout_batch_size) == (-1, 3)
