"""Gap metrics match Miles' definitions (``loss_hub/losses.py``, ``corrections.py``, ``mis.py``).

Expected numbers are computed by hand in each test from the formula, never by
calling the code under test. Random inputs come from seeded torch generators.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.measure import logprob_metrics as gap
from miles_async_core.errors import ConfigError

SEEDS = range(8)


def random_batch(seed: int, *, n_samples: int = 5, scale: float = 0.5):
    """Per-sample train/rollout log-probs and masks with ragged lengths."""
    g = torch.Generator().manual_seed(seed)
    train, rollout, masks = [], [], []
    for _ in range(n_samples):
        n = int(torch.randint(1, 12, (1,), generator=g))
        r = -torch.rand(n, generator=g, dtype=torch.float64) * 4
        t = r + torch.randn(n, generator=g, dtype=torch.float64) * scale
        m = (torch.rand(n, generator=g) > 0.2).double()
        m[0] = 1.0  # at least one counted token per sample
        train.append(t)
        rollout.append(r)
        masks.append(m)
    return train, rollout, masks


def k3(r: float) -> float:
    """Schulman's k3 estimator term, by hand."""
    return math.exp(r) - 1 - r


def with_raw(raw: list[float], base: float = -2.0) -> tuple[list[float], list[float]]:
    """(train, rollout) whose per-token difference train - rollout is ``raw``."""
    return [base + x for x in raw], [base] * len(raw)


# --- identical log-probs (invariant 42) ---------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_identical_logprobs_give_zero_gap_and_unit_ratios(seed):
    train, _, masks = random_batch(seed)
    m = gap.gap_metrics(train, [t.clone() for t in train], masks)
    assert m["train_rollout_logprob_abs_diff"] == 0.0
    assert m["train_rollout_kl"] == 0.0
    assert m["abs_diff_mean"] == 0.0 and m["abs_diff_max"] == 0.0
    assert m["tis"] == pytest.approx(1.0, abs=1e-12)
    for key in ("tis_p01", "tis_p10", "tis_p50", "tis_p90", "tis_p99", "tis_max"):
        assert m[key] == 1.0
    assert m["tis_clipfrac"] == 0.0 and m["tis_abs"] == 0.0
    assert m["k3_kl"] == 0.0 and m["mis_k3_kl"] == 0.0
    assert m["mis_chi2_token"] == pytest.approx(0.0, abs=1e-12)
    assert m["mis_chi2_seq"] == pytest.approx(0.0, abs=1e-12)
    assert m["mis_ppl_ratio"] == pytest.approx(1.0, abs=1e-12)
    assert m["mis_tis_weight_before_bound"] == pytest.approx(1.0, abs=1e-12)


def test_identical_logprobs_give_unit_mis_weights_before_normalisation():
    train, _, masks = random_batch(3)
    weights, new_masks, _ = gap.compute_mis_weights(
        train, train, masks, tis_mode="clip", tis_batch_normalize=False, rs_veto_threshold=1e-4
    )
    for w, m, nm in zip(weights, masks, new_masks):
        assert torch.equal(w, m)  # weight 1 on counted tokens, 0 on padding
        assert torch.equal(nm, m)


def test_rollout_logprobs_used_as_train_logprobs_give_identically_zero_gap():
    # Invariant 43: --use-rollout-logprobs scores the rollout log-probs against themselves.
    _, rollout, masks = random_batch(11)
    assert gap.train_rollout_logprob_abs_diff(rollout, rollout, masks) == 0.0
    assert gap.train_rollout_kl(rollout, rollout, masks) == 0.0


# --- hand-computed headline metrics ---------------------------------------------------


def test_abs_diff_is_a_mean_of_per_sample_masked_means():
    train = [[-1.0, -2.0, -3.0], [-0.5]]
    rollout = [[-1.5, -2.0, -3.0], [-0.25]]
    # sample 0: (0.5 + 0 + 0) / 3, sample 1: 0.25 / 1; mean over the 2 samples
    assert gap.train_rollout_logprob_abs_diff(train, rollout) == pytest.approx((0.5 / 3 + 0.25) / 2)
    # per-token: pooled (0.5 + 0.25) / 4 tokens
    assert gap.train_rollout_logprob_abs_diff(train, rollout, calculate_per_token_loss=True) == pytest.approx(0.75 / 4)
    # masking the two zero-difference tokens: sample 0 becomes 0.5 / 1
    masks = [[1, 0, 0], [1]]
    assert gap.train_rollout_logprob_abs_diff(train, rollout, masks) == pytest.approx((0.5 + 0.25) / 2)


def test_abs_diff_mean_and_max_are_pooled_over_masked_tokens():
    m = gap.gap_metrics([[-1.0, -2.0, -3.0], [-0.5]], [[-1.5, -2.0, -2.0], [-0.25]], [[1, 1, 0], [1]])
    assert m["abs_diff_mean"] == pytest.approx((0.5 + 0.0 + 0.25) / 3)
    assert m["abs_diff_max"] == 0.5  # the masked |-3 - -2| = 1 does not count
    assert m["num_tokens"] == 3 and m["num_samples"] == 2


def test_train_rollout_kl_is_low_var_kl_with_r_equal_train_minus_rollout():
    train, rollout = with_raw([0.5, -0.25])
    assert gap.train_rollout_kl([train], [rollout]) == pytest.approx((k3(0.5) + k3(-0.25)) / 2)
    # The direction matters: swapping train and rollout flips r.
    assert gap.train_rollout_kl([rollout], [train]) == pytest.approx((k3(-0.5) + k3(0.25)) / 2)


def test_low_var_kl_clamps_the_log_ratio_to_20_and_the_result_to_10():
    kl = gap.low_var_kl(torch.tensor([-2.0, -2.0, -2.0, 0.0]), torch.tensor([-2.5, 28.0, -32.0, 0.0]))
    # r = base - log_probs = [-0.5, 30 -> 20, -30 -> -20, 0]
    assert kl[0].item() == pytest.approx(math.exp(-0.5) - 1 + 0.5)
    assert kl[1].item() == 10.0  # exp(20) - 21 clamped
    assert kl[2].item() == 10.0  # exp(-20) + 19 clamped
    assert kl[3].item() == 0.0


def test_non_finite_logprobs_follow_miles():
    # NaN -> abs diff 0 and r = 0 (kl 0); train = -inf -> abs diff 0 but r = -20 so kl = 10.
    train = [[float("nan"), float("-inf"), -1.0]]
    rollout = [[-1.0, -1.0, -1.0]]
    assert gap.train_rollout_logprob_abs_diff(train, rollout) == 0.0
    assert gap.train_rollout_kl(train, rollout) == pytest.approx(10.0 / 3)


def test_vanilla_tis_clips_to_the_range_and_counts_clipped_tokens():
    train, rollout = with_raw([0.0, math.log(0.5), math.log(3.0), math.log(1.5)])
    m = gap.gap_metrics([train], [rollout], tis_clip=2.0, tis_clip_low=0.0)
    ratios = [1.0, 0.5, 3.0, 1.5]
    assert m["tis"] == pytest.approx(sum(ratios) / 4)
    assert m["tis_clipfrac"] == pytest.approx(1 / 4)  # only 3.0 is clipped (to 2.0)
    assert m["tis_abs"] == pytest.approx((0 + 0.5 + 2.0 + 0.5) / 4)
    assert m["tis_max"] == pytest.approx(3.0)
    # linear-interpolated median of [0.5, 1, 1.5, 3] is (1 + 1.5) / 2
    assert m["tis_p50"] == pytest.approx(1.25)
    assert m["tis_p01"] == pytest.approx(0.5 + 0.03 * (1.0 - 0.5))  # position 0.03 of 3 gaps
    weights, _ = gap.vanilla_tis([torch.tensor(train)], [torch.tensor(rollout)], tis_clip=2.0, tis_clip_low=0.0)
    assert weights[0].tolist() == pytest.approx([1.0, 0.5, 2.0, 1.5])


def test_icepop_zeroes_tokens_outside_the_range():
    train, rollout = with_raw([0.0, math.log(0.4), math.log(3.0)])
    weights, metrics = gap.icepop([torch.tensor(train)], [torch.tensor(rollout)], tis_clip=2.0, tis_clip_low=0.5)
    assert weights[0].tolist() == pytest.approx([1.0, 0.0, 0.0])
    assert metrics["tis_clipfrac"][0].tolist() == [0.0, 1.0, 1.0]


def test_mis_monitoring_metrics_by_hand():
    # one sequence, raw = train - rollout = [ln 2, 0]; train = [-1 + ln 2, -1], rollout = [-1, -1]
    ln2 = math.log(2.0)
    train, rollout = [[-1.0 + ln2, -1.0]], [[-1.0, -1.0]]
    m = gap.mis_metrics(train, rollout, use_tis=False)
    assert m["mis_training_log_ppl"] == pytest.approx(-(-2.0 + ln2) / 2)
    assert m["mis_training_ppl"] == pytest.approx(math.exp(-(-2.0 + ln2) / 2))
    assert m["mis_rollout_log_ppl"] == pytest.approx(1.0)
    assert m["mis_rollout_ppl"] == pytest.approx(math.e)
    assert m["mis_kl"] == pytest.approx(-ln2 / 2)  # rollout - train, token mean
    assert m["mis_k3_kl"] == pytest.approx((2.0 - ln2 - 1) / 2)  # exp(raw) - raw - 1
    assert m["mis_log_ppl_diff"] == pytest.approx(-ln2 / 2)
    assert m["mis_log_ppl_abs_diff"] == pytest.approx(ln2 / 2)
    assert m["mis_ppl_ratio"] == pytest.approx(2.0**-0.5)
    assert m["mis_chi2_token"] == pytest.approx((4.0 + 1.0) / 2 - 1)  # mean(rho^2) - 1
    assert m["mis_chi2_seq"] == pytest.approx(4.0 - 1)  # exp(2 * sum raw) - 1
    assert not any(k.startswith("mis_tis_") for k in m)  # use_tis=False: monitoring only


def test_mis_chi2_uses_the_safety_bound():
    m = gap.mis_metrics([[-1.0 + 30.0]], [[-1.0]], use_tis=False)
    assert m["mis_chi2_token"] == pytest.approx(math.exp(40.0) - 1)
    assert m["mis_chi2_seq"] == pytest.approx(math.exp(40.0) - 1)


# --- compute_mis_weights bounds (invariant 44) ------------------------------------------

RAW = [math.log(4.0), math.log(0.25), 0.0, math.log(1.5)]
MASK = [1.0, 1.0, 1.0, 0.0]
NO_RS = dict(use_rs=False, tis_batch_normalize=False)


def mis_one(**kwargs):
    train, rollout = with_raw(RAW)
    weights, masks, metrics = gap.compute_mis_weights([train], [rollout], [MASK], **kwargs)
    return weights[0].tolist(), masks[0].tolist(), metrics


def test_truncate_caps_at_upper_and_zeroes_padding():
    w, mask, metrics = mis_one(tis_mode="truncate", tis_upper_bound=2.0, **NO_RS)
    assert w == pytest.approx([2.0, 0.25, 1.0, 0.0])
    assert mask == MASK
    assert metrics["tis_truncate_fraction"][0].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_clip_bounds_both_sides_and_lower_defaults_to_one_over_upper():
    w, mask, _ = mis_one(tis_mode="clip", tis_lower_bound=0.5, tis_upper_bound=2.0, **NO_RS)
    assert w == pytest.approx([2.0, 0.5, 1.0, 0.0])
    w, _, _ = mis_one(tis_mode="clip", tis_lower_bound=None, tis_upper_bound=3.0, **NO_RS)
    assert w == pytest.approx([3.0, 1 / 3, 1.0, 0.0])


def test_mask_mode_keeps_weights_and_rejects_out_of_range_tokens():
    w, mask, metrics = mis_one(tis_mode="mask", tis_lower_bound=0.5, tis_upper_bound=2.0, **NO_RS)
    assert w == pytest.approx([4.0, 0.25, 1.0, 0.0])
    assert mask == [0.0, 0.0, 1.0, 0.0]
    assert metrics["tis_mask_fraction_low"][0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert metrics["tis_mask_fraction_high"][0].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_clip_with_lower_not_below_upper_is_a_config_error():
    with pytest.raises(ConfigError, match="tis_lower_bound"):
        mis_one(tis_mode="clip", tis_lower_bound=2.0, tis_upper_bound=2.0, **NO_RS)
    with pytest.raises(ConfigError, match="rs_lower_bound"):
        mis_one(use_rs=True, rs_lower_bound=3.0, rs_upper_bound=1.0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", gap.TIS_MODES)
def test_mis_bounds_hold_on_random_batches(seed, mode):
    train, rollout, masks = random_batch(seed, scale=1.5)
    lower, upper = 0.5, 2.0
    weights, new_masks, _ = gap.compute_mis_weights(
        train, rollout, masks, tis_mode=mode, tis_lower_bound=lower, tis_upper_bound=upper, tis_batch_normalize=False
    )
    for w, m, nm in zip(weights, masks, new_masks):
        on = m.bool()
        assert torch.all(w[~on] == 0)
        assert torch.all(nm <= m)  # rejection only removes tokens
        if mode == "truncate":
            assert torch.all((w[on] >= 0) & (w[on] <= upper))
        if mode == "clip":
            assert torch.all((w[on] >= lower) & (w[on] <= upper))
        if mode == "mask":
            kept = nm.bool()
            assert torch.all((w[kept] >= lower) & (w[kept] <= upper))


def test_rs_rejects_tokens_outside_rs_bounds():
    train, rollout = with_raw(RAW)
    _, masks, _ = gap.compute_mis_weights(
        [train],
        [rollout],
        [MASK],
        use_rs=True,
        rs_lower_bound=0.2,
        rs_upper_bound=3.0,
        rs_veto_threshold=None,
        tis_batch_normalize=False,
    )
    assert masks[0].tolist() == [0.0, 1.0, 1.0, 0.0]  # 4.0 > 3.0 rejected; 0.25 kept


def test_veto_zeroes_the_whole_sequence_iff_a_masked_token_is_catastrophic():
    veto = 1e-4  # log(veto) ~ -9.21
    raws = [[0.0, -10.0, 0.0], [0.0, -10.0, 0.0], [0.0, -9.0, 0.0]]
    masks = [[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
    train, rollout = zip(*(with_raw(r) for r in raws))
    _, new_masks, metrics = gap.compute_mis_weights(
        list(train),
        list(rollout),
        masks,
        use_rs=True,
        rs_lower_bound=0.0,
        rs_upper_bound=math.inf,
        rs_veto_threshold=veto,
        tis_batch_normalize=False,
    )
    assert new_masks[0].tolist() == [0.0, 0.0, 0.0]  # catastrophic counted token
    assert new_masks[1].tolist() == [1.0, 0.0, 1.0]  # the catastrophic token is padding
    assert new_masks[2].tolist() == [1.0, 1.0, 1.0]  # -9 is above log(1e-4)
    m = gap.mis_metrics(
        list(train),
        list(rollout),
        masks,
        use_rs=True,
        rs_lower_bound=0.0,
        rs_upper_bound=math.inf,
        rs_veto_threshold=veto,
        tis_batch_normalize=False,
    )
    assert m["mis_rs_catastrophic_seq_fraction"] == pytest.approx(1 / 3)
    assert m["mis_rs_catastrophic_token_fraction"] == pytest.approx((1 / 3 + 0 + 0) / 3)


# --- batch normalisation --------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_token_batch_normalisation_gives_masked_mean_one(seed):
    train, rollout, masks = random_batch(seed)
    weights, _, metrics = gap.compute_mis_weights(train, rollout, masks, tis_level="token", tis_batch_normalize=True)
    total = sum(float((w * m).sum()) for w, m in zip(weights, masks))
    count = sum(float(m.sum()) for m in masks)
    assert total / count == pytest.approx(1.0, abs=1e-12)
    assert "batch_norm_factor" in metrics


@pytest.mark.parametrize("seed", SEEDS)
def test_sequence_batch_normalisation_gives_mean_of_sequence_means_one(seed):
    train, rollout, masks = random_batch(seed)
    weights, _, _ = gap.compute_mis_weights(train, rollout, masks, tis_level="sequence", tis_batch_normalize=True)
    seq_means = [float((w * m).sum() / m.sum()) for w, m in zip(weights, masks)]
    assert sum(seq_means) / len(seq_means) == pytest.approx(1.0, abs=1e-12)


def test_sequence_level_weight_is_exp_of_the_masked_log_ratio_sum():
    train, rollout = with_raw([0.5, 0.25, 3.0])
    weights, _, _ = gap.compute_mis_weights(
        [train],
        [rollout],
        [[1, 1, 0]],
        tis_level="sequence",
        tis_upper_bound=10.0,
        use_rs=False,
        tis_batch_normalize=False,
    )
    assert weights[0].tolist() == pytest.approx([math.exp(0.75), math.exp(0.75), 0.0])


def test_geometric_level_weight_is_exp_of_the_masked_mean_and_cannot_be_normalised():
    train, rollout = with_raw([0.5, 0.25, 3.0])
    weights, _, _ = gap.compute_mis_weights(
        [train], [rollout], [[1, 1, 0]], tis_level="geometric", use_rs=False, tis_batch_normalize=False
    )
    assert weights[0].tolist() == pytest.approx([math.exp(0.375), math.exp(0.375), 0.0])
    with pytest.raises(ValueError, match="Unsupported tis_level: geometric"):
        gap.compute_mis_weights([train], [rollout], tis_level="geometric", tis_batch_normalize=True)


@pytest.mark.parametrize(
    ("param", "value", "allowed"),
    [
        ("tis_level", "tokens", "token, sequence, geometric"),
        ("tis_mode", "cap", "truncate, clip, mask"),
        ("rs_level", "seq", "token, sequence, geometric"),
    ],
)
def test_unknown_level_or_mode_is_a_config_error_naming_param_value_and_choices(param, value, allowed):
    with pytest.raises(ConfigError) as info:
        gap.compute_mis_weights([[-1.0]], [[-1.0]], **{param: value})
    msg = str(info.value)
    assert param in msg and repr(value) in msg and allowed in msg


def test_misaligned_inputs_are_config_errors():
    with pytest.raises(ConfigError, match="align token for token"):
        gap.gap_metrics([[-1.0, -2.0]], [[-1.0]])
    with pytest.raises(ConfigError, match="one entry per sample"):
        gap.gap_metrics([[-1.0]], [[-1.0], [-2.0]])


# --- properties on random batches (invariants 42, 45) ------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_low_var_kl_is_nonnegative_and_at_most_10(seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(500, generator=g, dtype=torch.float64) * 15
    b = torch.randn(500, generator=g, dtype=torch.float64) * 15
    kl = gap.low_var_kl(a, b)
    assert torch.all(kl >= 0) and torch.all(kl <= 10)
    train, rollout, masks = random_batch(seed, scale=5.0)
    assert 0.0 <= gap.train_rollout_kl(train, rollout, masks) <= 10.0


@pytest.mark.parametrize("seed", SEEDS)
def test_tis_weights_lie_in_range_and_clipfrac_in_unit_interval(seed):
    train, rollout, masks = random_batch(seed, scale=1.5)
    weights, metrics = gap.vanilla_tis(train, rollout, tis_clip=2.0, tis_clip_low=0.2)
    assert all(torch.all((w >= 0.2) & (w <= 2.0)) for w in weights)
    clipfrac = gap.sum_of_sample_mean(metrics["tis_clipfrac"], masks)
    assert 0.0 <= clipfrac <= 1.0
    assert gap.gap_metrics(train, rollout, masks)["tis_clipfrac"] == pytest.approx(
        gap.sum_of_sample_mean(gap.vanilla_tis(train, rollout)[1]["tis_clipfrac"], masks)
    )


def test_k3_kl_equals_mis_k3_kl_and_tis_quantiles_are_ordered():
    train, rollout, masks = random_batch(5, scale=1.0)
    m = gap.gap_metrics(train, rollout, masks)
    assert m["k3_kl"] == m["mis_k3_kl"] >= 0
    qs = [m[k] for k in ("tis_p01", "tis_p10", "tis_p50", "tis_p90", "tis_p99", "tis_max")]
    assert qs == sorted(qs)


def test_gap_report_keys_are_stable():
    m = gap.gap_metrics(*random_batch(0))
    headline = {
        "train_rollout_logprob_abs_diff",
        "train_rollout_kl",
        "abs_diff_mean",
        "abs_diff_max",
        "k3_kl",
        "tis",
        "tis_p01",
        "tis_p10",
        "tis_p50",
        "tis_p90",
        "tis_p99",
        "tis_max",
        "tis_clipfrac",
        "tis_abs",
        "icepop_clipfrac",
        "mis_k3_kl",
        "mis_chi2_token",
        "mis_chi2_seq",
        "mis_ppl_ratio",
        "mis_tis_truncate_fraction",
        "mis_rs_catastrophic_seq_fraction",
        "mis_is_ratio_mean_final",
        "mis_is_ratio_min_final",
        "mis_is_ratio_max_final",
        "mis_batch_norm_factor",
    }
    assert headline <= set(m)
    assert all(isinstance(v, (int, float)) for v in m.values())


# --- decomposition ----------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_kernel_plus_staleness_equals_total_for_every_token(seed):
    g = torch.Generator().manual_seed(seed)
    cur = -torch.rand(64, generator=g, dtype=torch.float64) * 5
    gen = cur + torch.randn(64, generator=g, dtype=torch.float64) * 0.3
    eng = gen + torch.randn(64, generator=g, dtype=torch.float64) * 0.01
    d = gap.decompose_gap(eng, gen, cur)
    torch.testing.assert_close(d.kernel + d.staleness, d.total, rtol=0, atol=1e-12)
    agg = d.aggregates()
    assert agg["kernel_mean"] + agg["staleness_mean"] == pytest.approx(agg["total_mean"], abs=1e-12)


def test_decomposition_by_hand_with_categories():
    d = gap.decompose_gap(
        engine_lp=[-1.0, -2.0, -0.5],
        lp_generating_weights=[-1.25, -2.0, -0.5],
        lp_current_weights=[-1.0, -1.5, -0.5],
        token_categories=["fresh", "stale", "stale"],
    )
    assert d.kernel.tolist() == [0.25, 0.0, 0.0]
    assert d.staleness.tolist() == [-0.25, -0.5, 0.0]
    assert d.total.tolist() == [0.0, -0.5, 0.0]
    agg = d.aggregates()
    assert agg["kernel_abs_mean"] == pytest.approx(0.25 / 3)
    assert agg["staleness_abs_mean"] == pytest.approx(0.75 / 3)
    # k3 with r = -d: staleness d = [-0.25, -0.5, 0] -> r = [0.25, 0.5, 0]
    assert agg["staleness_k3_kl"] == pytest.approx((k3(0.25) + k3(0.5)) / 3)
    by_cat = d.aggregates_by_category()
    assert set(by_cat) == {"fresh", "stale"}
    assert by_cat["fresh"]["kernel_abs_mean"] == 0.25 and by_cat["fresh"]["num_tokens"] == 1
    assert by_cat["stale"]["staleness_abs_mean"] == pytest.approx(0.25)
    assert by_cat["stale"]["total_abs_mean"] == pytest.approx(0.25)


def test_total_k3_kl_matches_train_rollout_kl_when_current_is_the_trainer():
    train, rollout, _ = random_batch(2)
    d = gap.decompose_gap(rollout[0], rollout[0] - 0.1, train[0])
    assert d.aggregates()["total_k3_kl"] == pytest.approx(gap.train_rollout_kl([train[0]], [rollout[0]]))


def test_decomposition_mask_drops_tokens_and_their_categories():
    d = gap.decompose_gap([-1.0, -9.0], [-1.0, -1.0], [-1.5, -1.0], ["a", "b"], mask=[1, 0])
    assert d.total.tolist() == [0.5] and d.categories == ("a",)


def test_aggregate_by_groups_and_pools_tokens():
    decomps = [
        gap.decompose_gap([-1.0], [-1.0], [-1.5], ["fresh"], meta={"step": 0}),
        gap.decompose_gap([-1.0, -1.0], [-1.0, -1.0], [-1.0, -2.0], ["fresh", "stale"], meta={"step": 0}),
        gap.decompose_gap([-2.0], [-1.0], [-1.0], ["fresh"], meta={"step": 1}),
    ]
    out = gap.aggregate_by(decomps, lambda d: d.meta["step"])
    assert set(out) == {0, 1}
    assert out[0]["num_samples"] == 2 and out[0]["num_tokens"] == 3
    assert out[0]["total_abs_mean"] == pytest.approx((0.5 + 0.0 + 1.0) / 3)  # pooled tokens
    assert out[0]["by_category"]["stale"]["total_abs_mean"] == 1.0
    assert out[1]["kernel_abs_mean"] == 1.0 and out[1]["staleness_abs_mean"] == 0.0


def test_decomposition_rejects_misaligned_inputs():
    with pytest.raises(ConfigError, match="lp_current_weights"):
        gap.decompose_gap([-1.0, -2.0], [-1.0, -2.0], [-1.0])
    with pytest.raises(ConfigError, match="token_categories"):
        gap.decompose_gap([-1.0], [-1.0], [-1.0], ["a", "b"])
