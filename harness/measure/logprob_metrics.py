"""Train/inference gap metrics with Miles' definitions, as pure functions.

Inputs are per-sample sequences of per-token log-probs (1-D tensors or lists of
floats) plus optional per-sample loss masks (1 = token counts). Everything is
computed in float64 on CPU; nothing here touches a model, an engine or a clock.

Contract: each function reproduces the upstream Miles formula it names, so a number
from this module is comparable with the same key in a Miles run:

* ``train_rollout_logprob_abs_diff`` and ``train_rollout_kl`` mirror
  ``policy_loss_function`` in ``backends/training_utils/loss_hub/losses.py``
  (non-finite values on masked tokens count as 0, reduced with ``sum_of_sample_mean``);
  the KL is ``compute_approx_kl(rollout, train, "low_var_kl")`` from ``math_utils.py``.
* ``vanilla_tis`` / ``icepop`` mirror ``loss_hub/corrections.py``.
* ``compute_mis_weights`` mirrors
  ``examples/train_infer_mismatch_helper/mis.py`` (weights, rejection masks and
  per-token metric lists); ``mis_metrics`` reduces them and prefixes ``mis_`` like
  ``compute_mis_weights_with_cp``.

``sum_of_sample_mean`` returns what Miles *logs*: the per-sample masked mean averaged
over samples (Miles' closure returns the sum and the logger divides by the sample
count), or the pooled per-token mean with ``calculate_per_token_loss=True``.

``decompose_gap`` splits an engine-vs-trainer difference into a kernel part and a
staleness part whose per-token sum equals the total exactly up to float rounding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from miles_async_core.errors import ConfigError

SAFETY_BOUND = 20.0  # log-ratio clamp before exp (math_utils._LOG_RATIO_EXP_CLAMP, mis.SAFETY_BOUND)
LOW_VAR_KL_CLAMP = 10.0  # compute_approx_kl clamps low_var_kl to [-10, 10]
BATCH_NORM_EPS = 1e-8  # mis.py: normalise only when the batch mean weight exceeds this
TIS_LEVELS = ("token", "sequence", "geometric")
TIS_MODES = ("truncate", "clip", "mask")
TIS_QUANTILES = (("p01", 0.01), ("p10", 0.10), ("p50", 0.50), ("p90", 0.90), ("p99", 0.99))

LogProbs = Sequence[torch.Tensor | Sequence[float]]
Masks = Sequence[torch.Tensor | Sequence[float]] | None


# --- input handling -------------------------------------------------------------------


def _vec(x: torch.Tensor | Sequence[float], *, name: str, i: int) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=torch.float64).detach().cpu()
    if t.dim() != 1:
        raise ConfigError(
            f"{name}[{i}] has shape {tuple(t.shape)}; each sample must be a 1-D sequence of "
            "per-token values. Pass one 1-D tensor or list per sample."
        )
    return t


def as_samples(
    train_logprobs: LogProbs, rollout_logprobs: LogProbs, masks: Masks = None
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Validate and convert inputs to lists of float64 1-D tensors (mask default: all 1)."""
    train = [_vec(x, name="train_logprobs", i=i) for i, x in enumerate(train_logprobs)]
    rollout = [_vec(x, name="rollout_logprobs", i=i) for i, x in enumerate(rollout_logprobs)]
    if masks is None:
        mask_list = [torch.ones_like(t) for t in train]
    else:
        mask_list = [_vec(m, name="masks", i=i) for i, m in enumerate(masks)]
    if not len(train) == len(rollout) == len(mask_list):
        raise ConfigError(
            f"got {len(train)} train_logprobs, {len(rollout)} rollout_logprobs and "
            f"{len(mask_list)} masks samples; the three lists must have one entry per sample."
        )
    for i, (t, r, m) in enumerate(zip(train, rollout, mask_list)):
        if not t.shape == r.shape == m.shape:
            raise ConfigError(
                f"sample {i}: train_logprobs has {t.numel()} tokens, rollout_logprobs "
                f"{r.numel()}, masks {m.numel()}; they must align token for token."
            )
    return train, rollout, mask_list


def _check_choice(param: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(
            f"{param}={value!r} is not supported; allowed values: {', '.join(allowed)}. Set {param} to one of them."
        )


# --- reductions (cp_utils.get_sum_of_sample_mean, cp_size == 1) ---------------------


def sum_of_sample_mean(
    values: Sequence[torch.Tensor], masks: Sequence[torch.Tensor], *, calculate_per_token_loss: bool = False
) -> float:
    """Miles' logged reduction of a per-token metric: mean over samples of the masked
    per-sample mean (empty masks count as a sample with value 0, as upstream's
    ``clamp_min(mask.sum(), 1)`` does), or the pooled masked token mean."""
    if not values:
        return 0.0
    if calculate_per_token_loss:
        total = sum(float((v * m).sum()) for v, m in zip(values, masks))
        count = sum(float(m.sum()) for m in masks)
        return total / max(count, 1.0)
    per_sample = [float((v * m).sum() / torch.clamp_min(m.sum(), 1)) for v, m in zip(values, masks)]
    return sum(per_sample) / len(per_sample)


def _masked_zero_nonfinite(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # losses.py: torch.where(active_tokens, nan_to_num(x, 0, 0, 0), 0)
    return torch.where(mask.bool(), torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0), x.new_zeros(()))


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / torch.clamp_min(mask.sum(), 1)


def _masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum()


def _masked_extreme(x: torch.Tensor, mask: torch.Tensor, *, use_max: bool) -> torch.Tensor:
    sel = mask.bool()
    if not sel.any():  # mis.masked_min/max return 0 on an empty mask
        return x.new_zeros(())
    return x[sel].max() if use_max else x[sel].min()


# --- headline metrics (losses.py, math_utils.py, corrections.py) ----------------------


def low_var_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor) -> torch.Tensor:
    """``compute_approx_kl(log_probs, log_probs_base, "low_var_kl")``: with
    ``r = base - log_probs`` (NaN -> 0, +-inf -> +-20, clamped to +-20),
    ``exp(r) - 1 - r`` clamped to [-10, 10]. Non-negative before the clamp."""
    r = -(log_probs.double() - log_probs_base.double())
    r = torch.nan_to_num(r, nan=0.0, posinf=SAFETY_BOUND, neginf=-SAFETY_BOUND)
    r = torch.clamp(r, -SAFETY_BOUND, SAFETY_BOUND)
    return torch.clamp(r.exp() - 1 - r, -LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)


def train_rollout_logprob_abs_diff(
    train_logprobs: LogProbs, rollout_logprobs: LogProbs, masks: Masks = None, *, calculate_per_token_loss: bool = False
) -> float:
    """``train/train_rollout_logprob_abs_diff``: ``|train - rollout|`` on masked tokens."""
    train, rollout, mask = as_samples(train_logprobs, rollout_logprobs, masks)
    vals = [_masked_zero_nonfinite((t - r).abs(), m) for t, r, m in zip(train, rollout, mask)]
    return sum_of_sample_mean(vals, mask, calculate_per_token_loss=calculate_per_token_loss)


def train_rollout_kl(
    train_logprobs: LogProbs, rollout_logprobs: LogProbs, masks: Masks = None, *, calculate_per_token_loss: bool = False
) -> float:
    """``train/train_rollout_kl``: ``compute_approx_kl(rollout, train, "low_var_kl")``,
    a k3 estimate of KL(pi_rollout || pi_train) with ``r = train - rollout``."""
    train, rollout, mask = as_samples(train_logprobs, rollout_logprobs, masks)
    vals = [_masked_zero_nonfinite(low_var_kl(r, t), m) for t, r, m in zip(train, rollout, mask)]
    return sum_of_sample_mean(vals, mask, calculate_per_token_loss=calculate_per_token_loss)


def vanilla_tis(
    train: Sequence[torch.Tensor], rollout: Sequence[torch.Tensor], *, tis_clip: float = 2.0, tis_clip_low: float = 0.0
) -> tuple[list[torch.Tensor], dict[str, list[torch.Tensor]]]:
    """``corrections.vanilla_tis_function``: ``tis = exp(train - rollout)``, weights
    ``clamp(tis, tis_clip_low, tis_clip)``; per-token metrics ``tis``, ``tis_clipfrac``
    (weight != tis) and ``tis_abs`` (``|tis - 1|``). Returns (weights, metrics)."""
    weights: list[torch.Tensor] = []
    metrics: dict[str, list[torch.Tensor]] = {"tis": [], "tis_clipfrac": [], "tis_abs": []}
    for t, r in zip(train, rollout):
        tis = torch.exp(t - r)
        w = torch.clamp(tis, min=tis_clip_low, max=tis_clip)
        weights.append(w)
        metrics["tis"].append(tis)
        metrics["tis_clipfrac"].append((w != tis).double())
        metrics["tis_abs"].append((tis - 1).abs())
    return weights, metrics


def icepop(
    train: Sequence[torch.Tensor], rollout: Sequence[torch.Tensor], *, tis_clip: float = 2.0, tis_clip_low: float = 0.0
) -> tuple[list[torch.Tensor], dict[str, list[torch.Tensor]]]:
    """``corrections.icepop_function``: the ratio where it lies in
    ``[tis_clip_low, tis_clip]`` and 0 elsewhere; same metric keys as ``vanilla_tis``."""
    weights: list[torch.Tensor] = []
    metrics: dict[str, list[torch.Tensor]] = {"tis": [], "tis_clipfrac": [], "tis_abs": []}
    for t, r in zip(train, rollout):
        ratio = torch.exp(t - r)
        w = torch.where((ratio >= tis_clip_low) & (ratio <= tis_clip), ratio, torch.zeros_like(ratio))
        weights.append(w)
        metrics["tis"].append(ratio)
        metrics["tis_clipfrac"].append((w != ratio).double())
        metrics["tis_abs"].append((ratio - 1).abs())
    return weights, metrics


# --- MIS (examples/train_infer_mismatch_helper/mis.py) -------------------------------


def _append(metrics: dict[str, list[torch.Tensor]], key: str, value: torch.Tensor) -> None:
    metrics.setdefault(key, []).append(value.detach().clone().double())


def add_ppl_metrics(
    train: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, metrics: dict[str, list[torch.Tensor]]
) -> None:
    """mis.add_ppl_metrics: always-on monitoring metrics for one sequence, each a
    per-token tensor (sequence-level ones broadcast to every token)."""
    ones = torch.ones_like(train)
    mean_train = _masked_mean(train, mask)
    mean_rollout = _masked_mean(rollout, mask)
    _append(metrics, "training_log_ppl", -mean_train * ones)
    _append(metrics, "training_ppl", torch.exp(-mean_train) * ones)
    _append(metrics, "rollout_log_ppl", -mean_rollout * ones)
    _append(metrics, "rollout_ppl", torch.exp(-mean_rollout) * ones)
    _append(metrics, "kl", rollout - train)
    raw = train - rollout
    _append(metrics, "k3_kl", torch.exp(raw) - raw - 1)
    log_ppl_diff = mean_rollout - mean_train
    _append(metrics, "log_ppl_diff", log_ppl_diff * ones)
    _append(metrics, "log_ppl_abs_diff", log_ppl_diff.abs() * ones)
    _append(metrics, "ppl_ratio", torch.exp(log_ppl_diff) * ones)
    rho = torch.exp(torch.clamp(raw, -SAFETY_BOUND, SAFETY_BOUND))
    _append(metrics, "chi2_token", (_masked_mean(rho.square(), mask) - 1.0) * ones)
    seq_sum = torch.clamp(_masked_sum(raw, mask), -SAFETY_BOUND, SAFETY_BOUND)
    _append(metrics, "chi2_seq", (torch.exp(2.0 * seq_sum) - 1.0) * ones)


def _level_log_ratio(raw: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    if level == "token":
        return raw
    if level == "sequence":
        return _masked_sum(raw, mask).expand_as(raw)
    return _masked_mean(raw, mask).expand_as(raw)  # geometric


def _bound_weights(
    w: torch.Tensor, mask: torch.Tensor, metrics: dict, *, mode: str, lower: float, upper: float, prefix: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """mis.truncate / mis.clip / mis.mask. Returns (weights, modified mask)."""
    if mode == "truncate":
        _append(metrics, f"{prefix}truncate_fraction", (w > upper).double())
        return w.clamp(0, upper) * mask, mask
    if mode == "clip":
        _append(metrics, f"{prefix}clip_fraction_low", (w < lower).double())
        _append(metrics, f"{prefix}clip_fraction_high", (w > upper).double())
        return w.clamp(lower, upper) * mask, mask
    _append(metrics, f"{prefix}mask_fraction_low", (w < lower).double())
    _append(metrics, f"{prefix}mask_fraction_high", (w > upper).double())
    in_range = ((w >= lower) & (w <= upper)).double()
    return w * mask, mask * in_range


def _veto_mask(raw: torch.Tensor, mask: torch.Tensor, veto_threshold: float, metrics: dict) -> torch.Tensor:
    """mis.calculate_veto_mask: a sequence with any masked ``raw < log(veto)`` is dropped."""
    catastrophic = (raw < math.log(veto_threshold)) & mask.bool()
    has_catastrophic = bool(catastrophic.any())
    _append(metrics, "rs_catastrophic_token_fraction", catastrophic.double())
    _append(metrics, "rs_catastrophic_seq_fraction", torch.full_like(raw, float(has_catastrophic)))
    return torch.full_like(raw, 0.0 if has_catastrophic else 1.0)


def _validate_mis_args(
    *,
    use_rs: bool,
    tis_level: str,
    rs_level: str,
    tis_mode: str,
    tis_lower_bound: float | None,
    tis_upper_bound: float | None,
    rs_lower_bound: float | None,
    rs_upper_bound: float | None,
    rs_veto_threshold: float | None,
) -> tuple[float, float, float]:
    _check_choice("tis_level", tis_level, TIS_LEVELS)
    _check_choice("rs_level", rs_level, TIS_LEVELS)
    _check_choice("tis_mode", tis_mode, TIS_MODES)
    if tis_upper_bound is None or not tis_upper_bound > 0:
        raise ConfigError(f"tis_upper_bound={tis_upper_bound!r}; it must be a number > 0 (mis.yaml uses 2.0).")
    # mis.py: `tis_lower_bound if tis_lower_bound is not None else 1 / tis_upper_bound`
    lower = tis_lower_bound if tis_lower_bound is not None else 1.0 / tis_upper_bound
    if tis_mode in ("clip", "mask") and not lower < tis_upper_bound:
        raise ConfigError(
            f"tis_mode={tis_mode!r} needs tis_lower_bound < tis_upper_bound; got {lower!r} and "
            f"{tis_upper_bound!r}. Lower tis_lower_bound or raise tis_upper_bound."
        )
    rs_lower = rs_lower_bound if rs_lower_bound is not None else lower
    rs_upper = rs_upper_bound if rs_upper_bound is not None else tis_upper_bound
    if use_rs and not rs_lower < rs_upper:
        raise ConfigError(
            f"use_rs needs rs_lower_bound < rs_upper_bound; got {rs_lower!r} and {rs_upper!r} (unset bounds "
            "default to the TIS bounds). Fix the RS bounds or set use_rs=False."
        )
    if rs_veto_threshold is not None and not rs_veto_threshold > 0:
        raise ConfigError(f"rs_veto_threshold={rs_veto_threshold!r}; it must be > 0 or None (mis.yaml: 1e-4).")
    return lower, rs_lower, rs_upper


def compute_mis_weights(
    train_logprobs: LogProbs,
    rollout_logprobs: LogProbs,
    masks: Masks = None,
    *,
    use_tis: bool = True,
    use_rs: bool = True,
    tis_level: str = "token",
    rs_level: str = "token",
    tis_mode: str = "truncate",
    tis_lower_bound: float | None = 0.5,
    tis_upper_bound: float | None = 2.0,
    rs_lower_bound: float | None = None,
    rs_upper_bound: float | None = None,
    rs_veto_threshold: float | None = 1e-4,
    tis_batch_normalize: bool = True,
) -> tuple[list[torch.Tensor] | None, list[torch.Tensor], dict[str, list[torch.Tensor]]]:
    """mis.compute_mis_weights; defaults are the reference ``mis.yaml``.

    Returns ``(weights, modified_masks, metrics)``: ``weights`` is None when
    ``use_tis`` is false (then the masks come back unchanged, as upstream), and every
    metric value is a list of per-token tensors, one per sample, for ``sum_of_sample_mean``.
    """
    train, rollout, loss_masks = as_samples(train_logprobs, rollout_logprobs, masks)
    lower, rs_lower, rs_upper = _validate_mis_args(
        use_rs=use_rs,
        tis_level=tis_level,
        rs_level=rs_level,
        tis_mode=tis_mode,
        tis_lower_bound=tis_lower_bound,
        tis_upper_bound=tis_upper_bound,
        rs_lower_bound=rs_lower_bound,
        rs_upper_bound=rs_upper_bound,
        rs_veto_threshold=rs_veto_threshold,
    )
    assert tis_upper_bound is not None, "_validate_mis_args refuses a missing tis_upper_bound"
    metrics: dict[str, list[torch.Tensor]] = {}
    for t, r, m in zip(train, rollout, loss_masks):
        add_ppl_metrics(t, r, m, metrics)
    if not use_tis:
        return None, loss_masks, metrics

    all_weights: list[torch.Tensor] = []
    all_masks: list[torch.Tensor] = []
    for t, r, m in zip(train, rollout, loss_masks):
        raw = t - r
        log_ratio_tis = _level_log_ratio(raw, m, tis_level)
        w = torch.exp(torch.clamp(log_ratio_tis, -SAFETY_BOUND, SAFETY_BOUND))
        _append(metrics, "tis_weight_before_bound", w)
        w, modified = _bound_weights(w, m, metrics, mode=tis_mode, lower=lower, upper=tis_upper_bound, prefix="tis_")
        modified = modified.clone()
        _append(metrics, "tis_weight_after_bound", w)
        if use_rs:
            log_ratio_rs = log_ratio_tis if rs_level == tis_level else _level_log_ratio(raw, m, rs_level)
            rs_w = torch.exp(torch.clamp(log_ratio_rs, -SAFETY_BOUND, SAFETY_BOUND))
            _, modified = _bound_weights(
                rs_w, modified, metrics, mode="mask", lower=rs_lower, upper=rs_upper, prefix="rs_"
            )
            if rs_veto_threshold is not None:
                modified = modified * _veto_mask(raw, m, rs_veto_threshold, metrics)
        _append(metrics, "is_ratio_mean_after_tis_rs", w)
        all_weights.append(w)
        all_masks.append(modified)

    if tis_batch_normalize and all_weights:
        all_weights = _batch_normalize(all_weights, loss_masks, tis_level, metrics)

    for w, m in zip(all_weights, loss_masks):
        ones = torch.ones_like(w)
        _append(metrics, "is_ratio_mean_final", _masked_mean(w, m) * ones)
        _append(metrics, "is_ratio_min_final", _masked_extreme(w, m, use_max=False) * ones)
        _append(metrics, "is_ratio_max_final", _masked_extreme(w, m, use_max=True) * ones)
    return all_weights, all_masks, metrics


def _batch_normalize(
    weights: list[torch.Tensor], loss_masks: list[torch.Tensor], tis_level: str, metrics: dict
) -> list[torch.Tensor]:
    """Normalise the batch to mean weight 1 (token: global masked mean; sequence: mean
    of per-sequence means). Uses the pre-rejection loss masks, as mis.py does."""
    if tis_level == "token":
        total = sum(_masked_sum(w, m) for w, m in zip(weights, loss_masks))
        count = sum(m.sum() for m in loss_masks)
        mean = total / torch.clamp_min(torch.as_tensor(count, dtype=torch.float64), 1)
    elif tis_level == "sequence":
        mean = sum(_masked_mean(w, m) for w, m in zip(weights, loss_masks)) / len(weights)
    else:
        # mis.py raises ValueError("Unsupported tis_level: geometric"); ConfigError is a ValueError.
        raise ConfigError(
            f"Unsupported tis_level: {tis_level} with tis_batch_normalize=True (mis.py only normalises "
            "token and sequence levels). Set tis_batch_normalize=False or tis_level to token or sequence."
        )
    if float(mean) > BATCH_NORM_EPS:
        for w in weights:
            _append(metrics, "batch_norm_factor", mean * torch.ones_like(w))
        return [w / mean for w in weights]
    for w in weights:
        _append(metrics, "batch_norm_factor", torch.ones_like(w))
    return weights


def mis_metrics(
    train_logprobs: LogProbs,
    rollout_logprobs: LogProbs,
    masks: Masks = None,
    *,
    calculate_per_token_loss: bool = False,
    **mis_kwargs: Any,
) -> dict[str, float]:
    """Reduced ``compute_mis_weights`` metrics with the ``mis_`` prefix, reduced over the
    pre-rejection loss masks (losses.py ``sum_of_sample_mean_for_mismatch_metrics``)."""
    _, _, loss_masks = as_samples(train_logprobs, rollout_logprobs, masks)
    _, _, per_token = compute_mis_weights(train_logprobs, rollout_logprobs, masks, **mis_kwargs)
    return {
        f"mis_{key}": sum_of_sample_mean(values, loss_masks, calculate_per_token_loss=calculate_per_token_loss)
        for key, values in per_token.items()
    }


# --- the flat report -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GapReport:
    """Every gap metric of one batch. ``as_dict`` gives the flat, stable key set."""

    num_samples: int
    num_tokens: int  # masked tokens
    train_rollout_logprob_abs_diff: float
    train_rollout_kl: float
    abs_diff_mean: float  # pooled mean of |train - rollout| over masked tokens
    abs_diff_max: float
    k3_kl: float  # mis' exp(raw) - raw - 1, sample-mean reduced (== mis_k3_kl)
    tis: float  # sample-mean of exp(train - rollout), Miles' train/tis
    tis_p01: float
    tis_p10: float
    tis_p50: float
    tis_p90: float
    tis_p99: float
    tis_max: float
    tis_clipfrac: float
    tis_abs: float
    icepop_clipfrac: float
    mis: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        flat = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "mis"}
        flat.update(self.mis)
        return flat


def _tis_quantiles(tis: list[torch.Tensor], masks: list[torch.Tensor]) -> dict[str, float]:
    pooled = torch.cat([x[m.bool()] for x, m in zip(tis, masks)]) if tis else torch.zeros(0, dtype=torch.float64)
    pooled = torch.nan_to_num(pooled, nan=0.0, posinf=0.0, neginf=0.0)
    if pooled.numel() == 0:  # no masked token: report 0 like mis.masked_min/max
        return {**{f"tis_{name}": 0.0 for name, _ in TIS_QUANTILES}, "tis_max": 0.0}
    qs = torch.quantile(pooled, torch.tensor([q for _, q in TIS_QUANTILES], dtype=torch.float64))
    out = {f"tis_{name}": float(v) for (name, _), v in zip(TIS_QUANTILES, qs)}
    out["tis_max"] = float(pooled.max())
    return out


def gap_report(
    train_logprobs: LogProbs,
    rollout_logprobs: LogProbs,
    masks: Masks = None,
    *,
    tis_clip: float = 2.0,
    tis_clip_low: float = 0.0,
    calculate_per_token_loss: bool = False,
    mis_kwargs: dict[str, Any] | None = None,
) -> GapReport:
    """All gap metrics of one batch. ``mis_kwargs`` go to ``compute_mis_weights``
    (default: the reference ``mis.yaml`` settings)."""
    train, rollout, mask = as_samples(train_logprobs, rollout_logprobs, masks)

    def reduce(vals: list[torch.Tensor]) -> float:
        return sum_of_sample_mean(vals, mask, calculate_per_token_loss=calculate_per_token_loss)

    abs_diff = [_masked_zero_nonfinite((t - r).abs(), m) for t, r, m in zip(train, rollout, mask)]
    pooled_abs = torch.cat([a[m.bool()] for a, m in zip(abs_diff, mask)]) if abs_diff else torch.zeros(0)
    _, tis_m = vanilla_tis(train, rollout, tis_clip=tis_clip, tis_clip_low=tis_clip_low)
    _, ice_m = icepop(train, rollout, tis_clip=tis_clip, tis_clip_low=tis_clip_low)
    mis = mis_metrics(train, rollout, mask, calculate_per_token_loss=calculate_per_token_loss, **(mis_kwargs or {}))
    return GapReport(
        num_samples=len(train),
        num_tokens=int(sum(float(m.sum()) for m in mask)),
        train_rollout_logprob_abs_diff=reduce(abs_diff),
        train_rollout_kl=reduce([_masked_zero_nonfinite(low_var_kl(r, t), m) for t, r, m in zip(train, rollout, mask)]),
        abs_diff_mean=float(pooled_abs.mean()) if pooled_abs.numel() else 0.0,
        abs_diff_max=float(pooled_abs.max()) if pooled_abs.numel() else 0.0,
        k3_kl=mis["mis_k3_kl"],
        tis=reduce(tis_m["tis"]),
        **_tis_quantiles(tis_m["tis"], mask),
        tis_clipfrac=reduce(tis_m["tis_clipfrac"]),
        tis_abs=reduce(tis_m["tis_abs"]),
        icepop_clipfrac=reduce(ice_m["tis_clipfrac"]),
        mis=mis,
    )


def gap_metrics(
    train_logprobs: LogProbs,
    rollout_logprobs: LogProbs,
    masks: Masks = None,
    *,
    tis_clip: float = 2.0,
    tis_clip_low: float = 0.0,
    calculate_per_token_loss: bool = False,
    mis_kwargs: dict[str, Any] | None = None,
) -> dict[str, float]:
    """``gap_report(...).as_dict()``: a flat dict of floats with stable key names."""
    return gap_report(
        train_logprobs,
        rollout_logprobs,
        masks,
        tis_clip=tis_clip,
        tis_clip_low=tis_clip_low,
        calculate_per_token_loss=calculate_per_token_loss,
        mis_kwargs=mis_kwargs,
    ).as_dict()


# --- decomposition: kernel vs staleness ----------------------------------------------

COMPONENTS = ("kernel", "staleness", "total")


@dataclass(frozen=True, kw_only=True)
class GapDecomposition:
    """Signed per-token log-prob differences of one sample (or a pooled group):
    ``kernel = engine - generating`` (numerics: same weights, different kernels),
    ``staleness = generating - current`` (policy drift since generation) and
    ``total = engine - current``; ``kernel + staleness == total`` per token up to
    float rounding. ``meta`` carries caller labels (step, age, ...) for ``aggregate_by``."""

    kernel: torch.Tensor
    staleness: torch.Tensor
    total: torch.Tensor
    categories: tuple[str, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.total.numel())

    def aggregates(self) -> dict[str, float]:
        """Per component: signed mean, mean |.|, and the mean low-variance k3 KL
        with the sampler's side first (``low_var_kl(a, b)`` for ``d = a - b``, so
        ``total_k3_kl`` is ``train_rollout_kl`` when ``current`` is the trainer)."""
        out: dict[str, float] = {"num_tokens": float(self.num_tokens)}
        for name in COMPONENTS:
            d: torch.Tensor = getattr(self, name)
            n = d.numel()
            # d = a - b; low_var_kl(a, b) uses r = b - a = -d.
            k3 = low_var_kl(d, torch.zeros_like(d))
            out[f"{name}_mean"] = float(d.mean()) if n else 0.0
            out[f"{name}_abs_mean"] = float(d.abs().mean()) if n else 0.0
            out[f"{name}_k3_kl"] = float(k3.mean()) if n else 0.0
        return out

    def aggregates_by_category(self) -> dict[str, dict[str, float]]:
        """``aggregates`` restricted to the tokens of each category (sorted keys)."""
        if self.categories is None:
            return {}
        out: dict[str, dict[str, float]] = {}
        for cat in sorted(set(self.categories)):
            idx = torch.tensor([c == cat for c in self.categories], dtype=torch.bool)
            sub = GapDecomposition(kernel=self.kernel[idx], staleness=self.staleness[idx], total=self.total[idx])
            out[cat] = sub.aggregates()
        return out

    @staticmethod
    def concat(parts: Sequence[GapDecomposition]) -> GapDecomposition:
        """Pool the tokens of several decompositions (categories kept if all have them)."""
        cats: tuple[str, ...] | None = None
        if parts and all(p.categories is not None for p in parts):
            cats = tuple(c for p in parts for c in p.categories or ())

        def cat(name: str) -> torch.Tensor:
            return torch.cat([getattr(p, name) for p in parts]) if parts else torch.zeros(0, dtype=torch.float64)

        return GapDecomposition(kernel=cat("kernel"), staleness=cat("staleness"), total=cat("total"), categories=cats)


def decompose_gap(
    engine_lp: torch.Tensor | Sequence[float],
    lp_generating_weights: torch.Tensor | Sequence[float],
    lp_current_weights: torch.Tensor | Sequence[float],
    token_categories: Sequence[str] | None = None,
    *,
    mask: torch.Tensor | Sequence[float] | None = None,
    meta: dict[str, Any] | None = None,
) -> GapDecomposition:
    """Split one sample's engine-vs-trainer gap into kernel and staleness parts.

    ``engine_lp``: the engine's log-probs at sampling time; ``lp_generating_weights``:
    the trainer's recomputation with the weights that generated each token;
    ``lp_current_weights``: the trainer's recomputation with the weights it trains
    on now. ``mask`` (1 = keep) drops tokens before anything is computed."""
    engine = _vec(engine_lp, name="engine_lp", i=0)
    gen = _vec(lp_generating_weights, name="lp_generating_weights", i=0)
    cur = _vec(lp_current_weights, name="lp_current_weights", i=0)
    if not engine.shape == gen.shape == cur.shape:
        raise ConfigError(
            f"engine_lp has {engine.numel()} tokens, lp_generating_weights {gen.numel()}, "
            f"lp_current_weights {cur.numel()}; pass one value per token of the same sample to each."
        )
    cats = tuple(token_categories) if token_categories is not None else None
    if cats is not None and len(cats) != engine.numel():
        raise ConfigError(
            f"token_categories has {len(cats)} entries for {engine.numel()} tokens; give one category per token."
        )
    if mask is not None:
        keep = _vec(mask, name="mask", i=0)
        if keep.shape != engine.shape:
            raise ConfigError(f"mask has {keep.numel()} entries for {engine.numel()} tokens; give one per token.")
        sel = keep.bool()
        engine, gen, cur = engine[sel], gen[sel], cur[sel]
        cats = tuple(c for c, k in zip(cats, sel.tolist()) if k) if cats is not None else None
    return GapDecomposition(
        kernel=engine - gen, staleness=gen - cur, total=engine - cur, categories=cats, meta=dict(meta or {})
    )


def aggregate_by(
    decompositions: Iterable[GapDecomposition], key_fn: Callable[[GapDecomposition], Hashable]
) -> dict[Hashable, dict[str, Any]]:
    """Group decompositions by ``key_fn`` (e.g. ``lambda d: d.meta["step"]`` or the
    sample age) and pool each group's tokens. Each value holds the pooled
    ``aggregates``, ``num_samples`` and, when categories are known, ``by_category``."""
    groups: dict[Hashable, list[GapDecomposition]] = {}
    for d in decompositions:
        groups.setdefault(key_fn(d), []).append(d)
    out: dict[Hashable, dict[str, Any]] = {}
    for key, parts in groups.items():
        pooled = GapDecomposition.concat(parts)
        entry: dict[str, Any] = {**pooled.aggregates(), "num_samples": len(parts)}
        if pooled.categories is not None:
            entry["by_category"] = pooled.aggregates_by_category()
        out[key] = entry
    return out
