"""What goes into a rollout engine and what comes out of it, defined once for every
engine (torch, process, SGLang adapter; the simulated engine uses the outcome and
event parts).

In: ``request_for(sample, sampling)`` is the prefix and token budget of a request (a
partially generated sample resumes after its response so far), and ``check_request``
is the one set of checks a request must pass; every engine runs it in the caller, so a
bad request raises ``ConfigError`` there and never reaches an engine thread or process.
``add_request_args`` is both, plus the request's sampling seed (``request_seed``): the
checked arguments of ``EngineCore.add_request`` that the torch engines (thread, child
process, Ray actor) send for a ``generate``; ``emit_submitted`` is the SUBMITTED event
every engine records as the request is handed over.

Events: ``sample_fields`` turns an engine-side event about request ids into one about
sample indices, the ids the trace and its checkers use.

Out: ``merge_result`` writes an engine result into the ``Sample`` (appending to any
partial response: tokens, log-probs, per-token ``VersionRuns``, one new
``weight_versions`` entry, the status), and ``emit_finished`` is the FINISHED event
every engine emits for it.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from miles_async_core import events as ev
from miles_async_core.errors import ConfigError
from miles_async_core.types import Sample, SamplingParams, Status, VersionRuns


def request_for(sample: Sample, sampling: SamplingParams) -> tuple[list[int], int]:
    """``(prefix, max_new_tokens)`` for generating ``sample``: the prompt plus the tokens
    already generated, and what is left of ``sampling.max_new_tokens``."""
    prefix = list(sample.prompt_tokens) + list(sample.response_tokens)
    return prefix, sampling.max_new_tokens - len(sample.response_tokens)


def check_request(
    prefix: Sequence[int],
    max_new_tokens: int,
    temperature: float,
    *,
    max_seq_len: int | None = None,
    generated: int = 0,
) -> None:
    """Raise ``ConfigError`` unless the request can run: a non-empty prompt, at least one
    new token, ``prefix + max_new_tokens <= max_seq_len`` where the engine knows its
    length, and ``temperature >= 0``. ``generated`` is how many tokens of ``prefix``
    are an earlier partial response (the prompt is the rest)."""
    if len(prefix) - generated < 1:
        raise ConfigError(
            "prompt_tokens is empty; a request needs at least one prompt token. "
            "Fix: tokenize the prompt into sample.prompt_tokens first."
        )
    total = len(prefix) + max_new_tokens
    if max_new_tokens < 1 or (max_seq_len is not None and total > max_seq_len):
        allowed = "max_new_tokens >= 1" + (
            f" and prefix + max_new_tokens <= max_seq_len={max_seq_len}" if max_seq_len is not None else ""
        )
        fix = (
            "raise --rollout-max-response-len or drop finished samples before resubmitting"
            if max_new_tokens < 1
            else "lower --rollout-max-response-len or build the model with a larger max_seq_len"
        )
        raise ConfigError(
            f"max_new_tokens={max_new_tokens + generated} leaves {max_new_tokens} new tokens after a "
            f"{len(prefix)}-token prefix ({generated} already generated); allowed is {allowed}. Fix: {fix}."
        )
    if temperature < 0:
        raise ConfigError(f"temperature={temperature} must be >= 0 (0 = greedy). Fix: pass --rollout-temperature >= 0.")


def request_seed(base_seed: int, sample: Sample) -> int:
    """Per-request sampling seed: stable across runs, distinct per sample and retry."""
    return (base_seed * 1_000_003 + sample.index * 7_919 + sample.retry_count * 104_729) % (2**63)


def add_request_args(
    sample: Sample, sampling: SamplingParams, *, seed: int, max_seq_len: int | None
) -> tuple[list[int], int, float, int]:
    """``(prefix, max_new_tokens, temperature, seed)`` for ``EngineCore.add_request`` to
    generate ``sample``, checked here (``ConfigError`` in the caller); ``seed`` is the
    engine's base seed, ``max_seq_len`` the model's (``None``: checked where it is known)."""
    prefix, budget = request_for(sample, sampling)
    check_request(prefix, budget, sampling.temperature, max_seq_len=max_seq_len, generated=len(sample.response_tokens))
    return prefix, budget, sampling.temperature, request_seed(seed, sample)


def emit_submitted(sink: Any, sample: Sample, version: Any, **extra: Any) -> None:
    """The SUBMITTED event of one generate call: ``version`` is the weight version the
    caller's side has seen loaded; ``extra`` adds fields (the Ray layout's ``engine``)."""
    if sink.enabled:
        sink.emit(ev.SUBMITTED, index=sample.index, group_index=sample.group_index, version=version, **extra)


def record_outcome(sample: Sample, weight_version: Any, status: Status) -> None:
    """The end of one generate call: one ``weight_versions`` entry (the engine version
    when the output is emitted, as a string, as SGLang reports it) and the status."""
    sample.weight_versions.append(str(weight_version))
    sample.status = status


def merge_result(
    sample: Sample,
    *,
    tokens: Iterable[int],
    log_probs: Iterable[float],
    token_runs: Iterable[Sequence[int]],
    weight_version: Any,
    status: Status,
) -> Sample:
    """Append one engine result to ``sample`` and return it. ``token_runs`` are the
    result's ``(version, kv_version, count)`` runs; a run continuing the sample's last
    one is merged into it. New lists are assigned, never extended in place."""
    runs = VersionRuns(sample.token_versions.runs)
    for version, kv_version, count in token_runs:
        runs.append(version, kv_version, count)
    sample.response_tokens = sample.response_tokens + list(tokens)
    sample.rollout_log_probs = sample.rollout_log_probs + [float(lp) for lp in log_probs]
    sample.token_versions = runs
    record_outcome(sample, weight_version, status)
    return sample


def emit_finished(sink: Any, sample: Sample, **extra: Any) -> None:
    """The FINISHED event of one generate call (nothing when the sink records nothing);
    ``extra`` adds fields (the served engine's ``tokens_digest``)."""
    if sink.enabled:
        sink.emit(
            ev.FINISHED,
            index=sample.index,
            group_index=sample.group_index,
            status=sample.status.value,
            response_length=sample.response_length,
            token_versions=sample.token_versions.to_json(),
            weight_versions=list(sample.weight_versions),
            **extra,
        )


def sample_fields(fields: dict[str, Any], requests: Any) -> dict[str, Any] | None:
    """``fields`` of an engine event with request ids (``index``, ``indices``) replaced by
    the indices of their samples; ``requests`` maps a request id to ``(future, sample)``.
    A request cancelled meanwhile is left out, and an event about it alone is dropped
    (``None``)."""
    if "index" in fields:
        entry = requests.get(fields["index"])
        if entry is None:
            return None
        fields["index"] = entry[1].index
    if "indices" in fields:
        fields["indices"] = [e[1].index for e in map(requests.get, fields["indices"]) if e is not None]
    return fields
