"""Rule profiles: every rule of every profile fires on a config that breaks it, names its
flags, values, what is allowed and the fix; valid configs pass."""

from __future__ import annotations

import pytest

from miles_async_core.config import AsyncConfig
from miles_async_core.errors import ConfigError
from miles_async_core.rules import MILES_PROFILE, PROFILES, validate

FA = {"fully_async": True}
# the upstream profile, named after the pinned Miles commit

# (profile, rule id, config fields that break exactly that rule's condition)
TRIGGERS: list[tuple[str, str, dict]] = [
    ("manual", "manual-colocate-needs-fully-async", {"colocate": True}),
    ("manual", "manual-fully-async-no-abort", {**FA, "pause_generation_mode": "abort"}),
    (
        "manual",
        "manual-fully-async-colocate-no-in-place",
        {**FA, "colocate": True, "pause_generation_mode": "in_place"},
    ),
    ("manual", "manual-colocated-fully-async-needs-megatron", {**FA, "colocate": True, "train_backend": "fsdp"}),
    ("manual", "manual-fully-async-over-sampling-no-effect", {**FA, "over_sampling_batch_size": 16}),
    ("manual", "rollout-batch-size-positive", {"rollout_batch_size": 0}),
    ("manual", "n-samples-per-prompt-positive", {"n_samples_per_prompt": 0}),
    ("manual", "capacity-factor-positive", {"async_data_buffer_capacity_factor": 0.0}),
    ("manual", "capacity-at-least-one", {"async_data_buffer_capacity_factor": 0.1}),
    (MILES_PROFILE, "miles-colocate-not-async", {"colocate": True}),
    (MILES_PROFILE, "miles-fully-async-no-colocate", {**FA, "colocate": True, "driver": "train"}),
    (MILES_PROFILE, "miles-fully-async-no-abort", {**FA, "pause_generation_mode": "abort"}),
    (MILES_PROFILE, "capacity-factor-positive", {**FA, "async_data_buffer_capacity_factor": -1.0}),
    (MILES_PROFILE, "capacity-at-least-one", {**FA, "async_data_buffer_capacity_factor": 0.1}),
]
# Rules in both profiles: same id, same trigger.
for _profile in PROFILES:
    TRIGGERS += [
        (_profile, "fully-async-needs-async-driver", {**FA, "driver": "train"}),
        (_profile, "fully-async-no-partial-rollout", {**FA, "partial_rollout": True}),
        (_profile, "update-weights-interval-positive", {"update_weights_interval": 0}),
        (_profile, "max-weight-staleness-non-negative", {"max_weight_staleness": -1}),
        (
            _profile,
            "async-max-concurrent-samples-at-least-n",
            {"async_max_concurrent_samples": 3, "n_samples_per_prompt": 4},
        ),
        (_profile, "over-sampling-at-least-batch", {"over_sampling_batch_size": 4, "rollout_batch_size": 8}),
        (_profile, "async-max-retries-non-negative", {"async_max_retries": -1}),
        (_profile, "rollout-logprobs-tis-exclusive", {"use_rollout_logprobs": True, "use_tis": True}),
        (_profile, "async-ppo-needs-correction", {"use_critic": True}),
        (_profile, "critic-needs-megatron", {"use_critic": True, "use_tis": True, "train_backend": "fsdp"}),
    ]

VALID: list[dict] = [
    {},
    {**FA},
    {
        **FA,
        "pause_generation_mode": "in_place",
        "max_weight_staleness": 0,
        "async_unused_samples_handler": "retry",
        "async_max_concurrent_samples": 4,
        "n_samples_per_prompt": 4,
        "async_max_retries": 0,
    },
    {"driver": "train", "colocate": True, "pause_generation_mode": "abort"},
    {"over_sampling_batch_size": 8, "rollout_batch_size": 8, "update_weights_interval": 3},
    {"use_critic": True, "keep_old_actor": True},
    {"use_critic": True, "use_rollout_logprobs": True},
    {"use_critic": True, "driver": "train"},
    {"async_data_buffer_capacity_factor": 0.125, "rollout_batch_size": 8},
]


def _ids(profile: str, **fields) -> set[str]:
    return {v.rule_id for v in validate(AsyncConfig(**fields), profile)}


def test_every_rule_of_every_profile_has_a_trigger():
    for profile, rules in PROFILES.items():
        covered = {rule_id for p, rule_id, _ in TRIGGERS if p == profile}
        assert covered == {r.id for r in rules}, profile


def test_rule_ids_are_unique_within_a_profile():
    for rules in PROFILES.values():
        assert len({r.id for r in rules}) == len(rules)


@pytest.mark.parametrize(("profile", "rule_id", "fields"), TRIGGERS, ids=lambda x: str(x)[:40])
def test_rule_fires_and_its_message_names_flags_allowed_and_fix(profile, rule_id, fields):
    violations = {v.rule_id: v for v in validate(AsyncConfig(**fields), profile)}
    assert rule_id in violations
    v = violations[rule_id]
    for flag in v.flags:
        assert flag in v.message, (flag, v.message)
    assert "Allowed" in v.message and "Fix:" in v.message
    rule = next(r for r in PROFILES[profile] if r.id == rule_id)
    assert (v.flags, v.severity) == (rule.flags, rule.severity)


@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("fields", VALID, ids=lambda d: ",".join(d) or "defaults")
def test_valid_configs_pass(profile, fields):
    assert validate(AsyncConfig(**fields), profile) == []


def test_only_the_over_sampling_rule_is_a_note():
    notes = {r.id for rules in PROFILES.values() for r in rules if r.severity == "note"}
    assert notes == {"manual-fully-async-over-sampling-no-effect"}


def test_manual_allows_colocated_fully_async_and_upstream_refuses_it():
    fields = {**FA, "colocate": True}
    assert _ids("manual", **fields) == set()
    assert _ids(MILES_PROFILE, **fields) == {"miles-colocate-not-async", "miles-fully-async-no-colocate"}


def test_one_step_colocate_fails_both_profiles():
    assert _ids("manual", colocate=True) == {"manual-colocate-needs-fully-async"}
    assert _ids(MILES_PROFILE, colocate=True) == {"miles-colocate-not-async"}


def test_colocate_with_the_sync_driver_passes_both_profiles():
    for profile in PROFILES:
        assert _ids(profile, colocate=True, driver="train") == set()


def test_upstream_has_no_in_place_or_backend_rule_for_colocation():
    ids = _ids(MILES_PROFILE, **FA, colocate=True, pause_generation_mode="in_place", train_backend="fsdp")
    assert ids == {"miles-colocate-not-async", "miles-fully-async-no-colocate"}


def test_fully_async_with_in_place_or_fsdp_is_fine_without_colocate():
    assert _ids("manual", **FA, pause_generation_mode="in_place", train_backend="fsdp") == set()


def test_abort_is_fine_in_one_step_mode():
    for profile in PROFILES:
        assert _ids(profile, pause_generation_mode="abort") == set()


def test_upstream_checks_capacity_only_under_fully_async():
    assert _ids(MILES_PROFILE, async_data_buffer_capacity_factor=0.0) == set()
    assert _ids("manual", async_data_buffer_capacity_factor=0.0) == {"capacity-factor-positive"}


def test_upstream_profile_does_not_check_batch_size_in_one_step_mode():
    # Upstream never validates B; with --fully-async B=0 is caught through the capacity.
    assert _ids(MILES_PROFILE, rollout_batch_size=0) == set()
    assert _ids(MILES_PROFILE, **FA, rollout_batch_size=0) == {"capacity-at-least-one"}


def test_negative_interval_is_reported_too():
    assert "update-weights-interval-positive" in _ids("manual", update_weights_interval=-2)


def test_upstream_messages_are_quoted_verbatim():
    def message(rule_id: str, **fields) -> str:
        return next(v.message for v in validate(AsyncConfig(**fields), MILES_PROFILE) if v.rule_id == rule_id)

    assert '"Colocation is not supported for async training."' in message("miles-colocate-not-async", colocate=True)
    assert '"--fully-async cannot colocate: rollout must keep generating while training runs"' in message(
        "miles-fully-async-no-colocate", **FA, colocate=True
    )
    assert (
        '"--fully-async cannot use --pause-generation-mode abort: generation is always in flight, '
        'so every weight update would kill it and force a full regeneration"'
    ) in message("miles-fully-async-no-abort", **FA, pause_generation_mode="abort")
    assert (
        '"--async-max-concurrent-samples (3) must be at least --n-samples-per-prompt (4): the '
        "worker submits whole groups, so one group already puts n_samples_per_prompt "
        'trajectories in flight"'
    ) in message("async-max-concurrent-samples-at-least-n", async_max_concurrent_samples=3, n_samples_per_prompt=4)
    assert '"over_sampling_batch_size 4 should be greater than or equal to rollout_batch_size 8"' in message(
        "over-sampling-at-least-batch", over_sampling_batch_size=4
    )
    assert '"--fully-async requires the async driver: run train_async.py"' in message(
        "fully-async-needs-async-driver", **FA, driver="train"
    )
    interval = message("update-weights-interval-positive", update_weights_interval=0)
    assert "ZeroDivisionError" in interval and "train_async.py" in interval


def test_messages_carry_the_values_given():
    v = validate(AsyncConfig(max_weight_staleness=-3, update_weights_interval=0), "manual")
    text = " ".join(x.message for x in v)
    assert "--max-weight-staleness -3" in text and "--update-weights-interval 0" in text


def test_unknown_profile_names_the_flag_value_and_choices():
    with pytest.raises(ConfigError) as err:
        validate(AsyncConfig(), "miles-main")
    message = str(err.value)
    assert "--profile" in message and "'miles-main'" in message
    assert "manual" in message and MILES_PROFILE in message
