"""What ``/generate`` answers, as SGLang builds it: ``{"text", "output_ids", "meta_info"}``.

``meta_info`` (sglang 0.5.23 ``tokenizer_manager.py``, the fields of each output):
``id`` (the rid), ``finish_reason`` (``null`` until the request ends, then
``{"type": "stop", "matched": <token id or string>}``, ``{"type": "length", "length":
<max_new_tokens>}`` or ``{"type": "abort", "message", "status_code", "err_type"}``),
``prompt_tokens``, ``completion_tokens`` (so far), ``cached_tokens`` (always 0: no prefix
cache here), ``weight_version`` (the version now; at the end, the last span's),
``num_retractions``, ``output_token_logprobs`` ``[logprob, token_id, null]`` when asked
(and ``output_top_logprobs``, a list of those per token, with ``top_logprobs_num``);
the final output adds ``e2e_latency`` and ``weight_versions`` (per-token spans
``{"version", "start", "end"}``). Harness addition: ``token_versions``, the
``[version, kv_version, count]`` runs (the KV version has no SGLang field).

``text`` is the decoded output; a stop string is cut from it with what follows (kept
with ``no_stop_trim``), and a stop token's text is cut too (SGLang's detokenizer);
``output_ids`` keep every token, the matched stop token included.
"""

from __future__ import annotations

from typing import Any, Callable

from miles_async_core.types import Status

from .sampling import SamplingOptions


def finish_reason(
    status: Status | None, *, matched: Any = None, length: int = 0, message: str = "Aborted"
) -> dict[str, Any] | None:
    if status is None:
        return None
    if status is Status.COMPLETED:
        return {"type": "stop", "matched": matched}
    if status is Status.TRUNCATED:
        return {"type": "length", "length": length}
    return {"type": "abort", "message": message, "status_code": None, "err_type": None}


def output_text(
    decode: Callable[..., str] | None, tokens: list[int], options: SamplingOptions, matched: Any = None
) -> str:
    if decode is None:
        return ""
    if isinstance(matched, int) and not isinstance(matched, bool) and not options.no_stop_trim and tokens:
        tokens = tokens[:-1]
    text = decode(tokens, skip_special_tokens=options.skip_special_tokens)
    if isinstance(matched, str) and matched in text:
        text = text[: text.index(matched) + (len(matched) if options.no_stop_trim else 0)]
    return text


def version_spans(runs: list[list[int]], label: Callable[[int], str]) -> list[dict[str, Any]]:
    """Per-token ``[version, kv_version, count]`` runs as SGLang's ``weight_versions`` spans."""
    spans: list[dict[str, Any]] = []
    start = 0
    for version, _kv, count in runs:
        name = label(version)
        if spans and spans[-1]["version"] == name:
            spans[-1]["end"] += count
        else:
            spans.append({"version": name, "start": start, "end": start + count})
        start += count
    return spans


def generate_output(
    *,
    rid: str,
    prompt_tokens: int,
    tokens: list[int],
    log_probs: list[float],
    runs: list[list[int]] | None,
    finish: dict[str, Any] | None,
    weight_version: str,
    num_retractions: int,
    text: str,
    return_logprob: bool,
    label: Callable[[int], str],
    e2e_latency: float | None = None,
    index: int | None = None,
    top_logprobs: list[list[tuple[float, int]]] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(tokens),
        "cached_tokens": 0,
        "weight_version": weight_version,
        "num_retractions": num_retractions,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [[float(lp), int(t), None] for lp, t in zip(log_probs, tokens)]
        if top_logprobs is not None:
            meta["output_top_logprobs"] = [[[float(lp), int(t), None] for lp, t in step] for step in top_logprobs]
    if finish is not None:
        spans = version_spans(runs or [], label)
        meta["weight_versions"] = spans
        if spans:
            meta["weight_version"] = spans[-1]["version"]
        meta["e2e_latency"] = e2e_latency
        meta["token_versions"] = [list(r) for r in runs or []]
    out: dict[str, Any] = {"text": text, "output_ids": list(tokens), "meta_info": meta}
    if index is not None:
        out["index"] = index
    return out


def stop_prefix_pending(text: str, stops: tuple[str, ...]) -> bool:
    """Whether ``text`` ends with the start of a stop string: SGLang holds a stream chunk
    back then, so a stop string is never streamed in part."""
    return any(text.endswith(s[:k]) for s in stops for k in range(1, len(s)))


class IncrementalText:
    """The text of a growing token list, decoding only the tokens since the last clean
    boundary (vLLM's and SGLang's detokenizer keep the same two offsets): a stream's
    chunk costs the new tokens, not the whole output again. ``update(tokens)`` returns
    the text so far; it waits while the new tokens end in an incomplete UTF-8 character
    (U+FFFD) or add no text, and never takes back what it returned. The final output
    is decoded whole (``output_text``), so a stop string or stop token is cut from it
    there."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.text = ""
        self.prefix = 0  # where the decoded window starts: a clean boundary before ``read``
        self.read = 0  # tokens whose text is in ``self.text``

    def update(self, tokens: list[int]) -> str:
        before = self.decode(tokens[self.prefix : self.read])
        after = self.decode(tokens[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self.prefix, self.read = self.read, len(tokens)
        return self.text


def stop_window_text(decode: Callable[[list[int]], str], tokens: list[int], longest_stop: int) -> str:
    """Text of the output's last tokens, enough to hold any stop string that the newest
    token completes: a stop string found there is in the whole text, and one that the
    newest token completes is found there. Decoding the whole output on every step
    would cost the square of its length.

    The window starts ``4 * (longest_stop + 4)`` tokens back (a character is at most 4
    byte-fallback tokens) and doubles while its text is shorter than the longest stop
    string plus the newest 4 tokens' text plus 8 characters (tokens that decode to
    nothing, such as skipped special tokens, or a start inside a character, which
    decodes to U+FFFD that no stop string contains)."""
    width = 4 * (longest_stop + 4)
    if width >= len(tokens):
        return decode(tokens)
    need = longest_stop + len(decode(tokens[-4:])) + 8
    while True:
        text = decode(tokens[-width:])
        if len(text) >= need or width >= len(tokens):
            return text
        width *= 2
