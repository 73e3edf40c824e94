"""SGLang's ``sampling_params`` for the served engine: parsing (``parse_sampling``) and
what they do to one decode step's logits (``choose_tokens``).

Read from sglang 0.5.23 (``srt/sampling/sampling_params.py`` for the fields, defaults
and ranges; ``srt/sampling/penaltylib/`` for the penalties; ``srt/layers/sampler.py``
for the order): logit bias and penalties act on the logits first (repetition on prompt
and output tokens: a positive logit divided by the penalty, a negative one multiplied;
frequency and presence on output tokens: ``count * frequency + (count > 0) *
presence`` subtracted; ``min_new_tokens``: the stop tokens masked until that many tokens
exist), then the temperature; the reported log-prob is the sampled token's under that
distribution, before top-k / top-p / min-p truncation (SGLang's default); truncation then
keeps the ``top_k`` most likely tokens, the smallest set whose mass reaches ``top_p``,
and tokens at least ``min_p`` times the most likely one. Temperature 0 is greedy.

Each request draws one uniform per token from its own seeded generator and inverts the
CDF of what is left, so with neutral options a token is exactly what
``harness.backends.torch_engine.sample_tokens`` draws, and a request's tokens do not
depend on what else is in the batch.

Fields with no model here (``json_schema``, ``regex``, ``ebnf``, ``structural_tag``,
``stop_regex``, ``custom_params``) are refused when set, naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .served_errors import ServeError

MODELLED = (
    "max_new_tokens",
    "min_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "sampling_seed",
    "n",
    "logit_bias",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
)
UNMODELLED = ("json_schema", "regex", "ebnf", "structural_tag", "stop_regex", "custom_params")


@dataclass(frozen=True, kw_only=True)
class SamplingOptions:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    logit_bias: tuple[tuple[int, float], ...] = ()
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    stream_interval: int = 1
    stop_ids: frozenset[int] = field(default=frozenset())  # EOS + stop_token_ids unless ignore_eos
    top_logprobs_num: int = 0  # the request's ``top_logprobs_num`` (a top-level field, not a sampling one)

    @property
    def penalised(self) -> bool:
        return (
            bool(self.logit_bias)
            or self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.min_new_tokens > 0
        )

    @property
    def truncated(self) -> bool:
        return self.temperature > 0 and (self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0)


def _schema(key: str, value: Any, allowed: str) -> ServeError:
    return ServeError(f"sampling_params.{key}={value!r} has the wrong type; allowed: {allowed}.", schema=True)


def _number(params: dict[str, Any], key: str, default: float, *, integer: bool = False) -> Any:
    value = params.get(key)
    if value is None:
        return default
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        raise _schema(key, value, "an integer" if integer else "a number")
    return value


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ServeError(f"sampling_params.{key}={value!r} is out of range; allowed: {allowed}.")


def parse_sampling(params: dict[str, Any] | None, *, eos_token_id: int | None, vocab_size: int) -> SamplingOptions:
    """Checked ``SamplingOptions`` from a request's ``sampling_params``; ``ServeError``
    naming the field otherwise (``schema=True`` for an unknown key or a wrong type)."""
    params = dict(params or {})
    unknown = sorted(k for k in params if k not in MODELLED and k not in UNMODELLED)
    if unknown:
        raise ServeError(
            f"sampling_params has unknown keys {unknown}; allowed: {sorted(MODELLED + UNMODELLED)}.", schema=True
        )
    for key in UNMODELLED:
        if params.get(key) not in (None, "", {}, []):
            raise ServeError(
                f"sampling_params.{key} is set: constrained or custom decoding ({key}) is not modelled "
                "by this server (docs/serve.md lists what is). Fix: drop the field."
            )
    o: dict[str, Any] = {
        key: _number(params, key, default)
        for key, default in (
            ("temperature", 1.0),
            ("top_p", 1.0),
            ("min_p", 0.0),
            ("frequency_penalty", 0.0),
            ("presence_penalty", 0.0),
            ("repetition_penalty", 1.0),
        )
    }
    for key, default in (
        ("max_new_tokens", 128),
        ("min_new_tokens", 0),
        ("top_k", -1),
        ("n", 1),
        ("stream_interval", 1),
    ):
        o[key] = _number(params, key, default, integer=True)
    _check(o["temperature"] >= 0, "temperature", o["temperature"], ">= 0 (0 = greedy)")
    _check(0 < o["top_p"] <= 1, "top_p", o["top_p"], "0 < top_p <= 1")
    _check(0 <= o["min_p"] <= 1, "min_p", o["min_p"], "0 <= min_p <= 1")
    _check(o["top_k"] == -1 or o["top_k"] >= 1, "top_k", o["top_k"], "-1 (all tokens) or >= 1")
    for key in ("frequency_penalty", "presence_penalty"):
        _check(-2 <= o[key] <= 2, key, o[key], "-2 <= value <= 2")
    _check(0 < o["repetition_penalty"] <= 2, "repetition_penalty", o["repetition_penalty"], "0 < value <= 2")
    _check(o["max_new_tokens"] >= 0, "max_new_tokens", o["max_new_tokens"], ">= 0")
    _check(
        0 <= o["min_new_tokens"] <= o["max_new_tokens"],
        "min_new_tokens",
        o["min_new_tokens"],
        f"0 <= min_new_tokens <= max_new_tokens ({o['max_new_tokens']})",
    )
    _check(o["n"] >= 1, "n", o["n"], ">= 1")
    _check(o["stream_interval"] >= 1, "stream_interval", o["stream_interval"], ">= 1")
    if o["top_k"] >= vocab_size:
        o["top_k"] = -1
    stop = params.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise _schema("stop", params.get("stop"), "a string or a list of strings")
    stop_token_ids = params.get("stop_token_ids") or ()
    if not isinstance(stop_token_ids, (list, tuple)) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in stop_token_ids
    ):
        raise _schema("stop_token_ids", stop_token_ids, "a list of integers")
    bad = [t for t in stop_token_ids if not 0 <= t < vocab_size]
    _check(not bad, "stop_token_ids", list(stop_token_ids), f"token ids in [0, {vocab_size})")
    bias = params.get("logit_bias") or {}
    if not isinstance(bias, dict):
        raise _schema("logit_bias", bias, "an object of token id -> bias")
    try:
        bias_items = tuple(sorted((int(k), float(v)) for k, v in bias.items()))
    except (TypeError, ValueError):
        raise _schema("logit_bias", bias, "an object of token id -> number") from None
    _check(all(0 <= k < vocab_size for k, _ in bias_items), "logit_bias", bias, f"token ids in [0, {vocab_size})")
    seed = params.get("sampling_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _schema("sampling_seed", seed, "an integer")
    flags = {}
    for key, default in (
        ("ignore_eos", False),
        ("skip_special_tokens", True),
        ("no_stop_trim", False),
        ("spaces_between_special_tokens", True),
    ):
        value = params.get(key, default)
        if not isinstance(value, bool):
            raise _schema(key, value, "true or false")
        flags[key] = value
    stop_ids = (
        frozenset()
        if flags["ignore_eos"]
        else frozenset(list(stop_token_ids) + ([eos_token_id] if eos_token_id is not None else []))
    )
    return SamplingOptions(
        max_new_tokens=o["max_new_tokens"],
        min_new_tokens=o["min_new_tokens"],
        temperature=float(o["temperature"]),
        top_p=float(o["top_p"]),
        top_k=o["top_k"],
        min_p=float(o["min_p"]),
        frequency_penalty=float(o["frequency_penalty"]),
        presence_penalty=float(o["presence_penalty"]),
        repetition_penalty=float(o["repetition_penalty"]),
        stop=tuple(s for s in stop if s),
        stop_token_ids=tuple(stop_token_ids),
        ignore_eos=flags["ignore_eos"],
        seed=seed,
        n=o["n"],
        logit_bias=bias_items,
        skip_special_tokens=flags["skip_special_tokens"],
        no_stop_trim=flags["no_stop_trim"],
        stream_interval=o["stream_interval"],
        stop_ids=stop_ids,
    )


def _penalise(
    row: torch.Tensor, opts: SamplingOptions, prompt: list[int], output: list[int], eos_token_id: int | None
) -> None:
    """Logit bias and penalties on one row of logits, in place."""
    for tok, bias in opts.logit_bias:
        row[tok] += bias
    if opts.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt) | set(output)), dtype=torch.long, device=row.device)
        vals = row[seen]
        row[seen] = torch.where(vals > 0, vals / opts.repetition_penalty, vals * opts.repetition_penalty)
    if output and (opts.frequency_penalty or opts.presence_penalty):
        counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=row.shape[-1]).to(row)
        row -= counts * opts.frequency_penalty + (counts > 0).to(row) * opts.presence_penalty
    if len(output) < opts.min_new_tokens:
        stops = set(opts.stop_token_ids) | ({eos_token_id} if eos_token_id is not None else set())
        if stops:
            row[torch.tensor(sorted(stops), dtype=torch.long, device=row.device)] = float("-inf")


def _truncate(probs: torch.Tensor, opts: SamplingOptions) -> torch.Tensor:
    """One row of probabilities with the tokens top-k / top-p / min-p drop set to 0."""
    keep = torch.ones_like(probs, dtype=torch.bool)
    if opts.top_k > 0:
        keep &= probs >= torch.topk(probs, opts.top_k).values[-1]
    if opts.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= opts.top_p
        keep &= ~torch.zeros_like(keep).scatter(0, order, drop_sorted)
    if opts.min_p > 0.0:
        keep &= probs >= opts.min_p * probs.max()
    return torch.where(keep, probs, torch.zeros_like(probs))


def choose_tokens(
    logits: torch.Tensor, reqs: list[Any], generators: list[torch.Generator], *, eos_token_id: int | None
) -> tuple[list[int], list[float], torch.Tensor]:
    """One token per row for ``reqs`` (each with ``options``, ``prompt_tokens``,
    ``output_tokens``); returns (tokens, their log-probs, every token's log-prob) under
    the penalised, temperature-scaled distribution."""
    logits = logits.float()
    if any(req.options.penalised for req in reqs):
        logits = logits.clone()  # the model's output is left as it was
        for i, req in enumerate(reqs):
            if req.options.penalised:
                _penalise(logits[i], req.options, req.prompt_tokens, req.output_tokens, eos_token_id)
    temperatures = [r.options.temperature for r in reqs]
    temps = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=torch.float32)
    logp = torch.log_softmax(logits / temps.to(logits.device).view(-1, 1), dim=-1)
    u = torch.cat([torch.rand(1, generator=g) for g in generators]).to(logits.device)
    probs = logp.exp()
    for i, req in enumerate(reqs):
        if req.options.truncated:
            probs[i] = _truncate(probs[i], req.options)
    cdf = probs.cumsum(dim=-1)
    drawn = torch.searchsorted(cdf, (u * cdf[:, -1]).view(-1, 1)).clamp_(max=logits.shape[-1] - 1)
    greedy = torch.tensor([t <= 0 for t in temperatures], device=logits.device).view(-1, 1)
    chosen = torch.where(greedy, logp.argmax(dim=-1, keepdim=True), drawn)
    return chosen.view(-1).tolist(), logp.gather(1, chosen).view(-1).tolist(), logp
