"""``POST /generate``: SGLang's native generation route over a ``ServedEngine``.

As sglang 0.5.23 answers it (``srt/entrypoints/http_server.py``, ``srt/managers/
tokenizer_manager.py``, ``srt/managers/io_struct.py``):

* one prompt (``text`` or ``input_ids``) and ``sampling_params.n == 1``: one output
  ``{"text", "output_ids", "meta_info"}``;
* a batch (a list of texts or of id lists; ``sampling_params`` one dict or one per
  prompt) or ``n > 1``: a JSON list, prompt-major (prompt i, sample j at ``i * n + j``);
  a batch's ``rid`` is a list of one per prompt, or a string ``x`` giving ``x_0``,
  ``x_1``, ...; with ``n > 1`` every sample gets a fresh ``uuid4().hex`` rid (SGLang
  makes each a child request of its own);
* ``"stream": true``: ``text/event-stream`` of ``data: <json>\\n\\n`` events, each the
  output so far (cumulative ``text``, ``output_ids`` and ``meta_info``, SGLang's default
  without ``--incremental-streaming-output``; ``finish_reason`` null until the last),
  one event per decode step at most (``sampling_params.stream_interval`` tokens apart),
  then ``data: [DONE]``. A batch or ``n > 1`` interleaves its outputs in one stream,
  each chunk with its ``index``. An abort ends a stream with a last chunk whose
  ``finish_reason.type`` is ``"abort"``; a ``retract`` / ``in_place`` pause leaves it
  open and silent until ``/continue_generation``. A client that goes away aborts its
  requests;
* ``top_logprobs_num`` adds ``output_top_logprobs``; unknown top-level keys are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid
from typing import Any, AsyncIterator, cast

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict

from .sampling import SamplingOptions, parse_sampling
from .served_engine import GenerateParams, ServedEngine
from .served_errors import ContextLengthError, ServeError

_FEATURES = {
    "return_routed_experts": "routed experts (MoE)",
    "return_indexer_topk": "indexer top-k",
    "lora_path": "LoRA",
    "image_data": "multimodal input",
    "return_hidden_states": "hidden states",
    "input_embeds": "input embeddings",
    "audio_data": "audio input",
    "video_data": "video input",
}

router = APIRouter()


class GenerateReq(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool | None = False
    top_logprobs_num: int | None = 0
    rid: str | list[str] | None = None
    stream: bool = False
    return_routed_experts: bool = False
    return_indexer_topk: bool = False
    return_hidden_states: bool = False
    lora_path: Any = None
    image_data: Any = None
    input_embeds: Any = None
    audio_data: Any = None
    video_data: Any = None


def tokenize(engine: ServedEngine, text: str) -> list[int]:
    if engine.tokenizer is None:
        raise ServeError("text input needs a tokenizer, and this server has none; send input_ids.")
    try:
        return list(engine.tokenizer.encode(text))
    except ValueError as exc:
        raise ServeError(f"text cannot be tokenized: {exc}") from None


def check_ids(engine: ServedEngine, ids: list[int]) -> list[int]:
    bad = [t for t in ids if not 0 <= t < engine.vocab_size]
    if bad:
        raise ServeError(f"input_ids {bad[:5]} are outside the vocabulary [0, {engine.vocab_size}).")
    if not ids:
        raise ServeError("the prompt is empty; send at least one token (input_ids) or character (text).")
    return ids


def options_for(engine: ServedEngine, params: dict[str, Any] | None, prompt_len: int) -> SamplingOptions:
    """``parse_sampling``, with SGLang's scheduler clamp: a request that names no
    ``max_new_tokens`` gets at most what fits the context after its prompt."""
    opts = parse_sampling(params, eos_token_id=engine.core.eos_token_id, vocab_size=engine.vocab_size)
    if "max_new_tokens" not in (params or {}) or (params or {}).get("max_new_tokens") is None:
        opts = dataclasses.replace(
            opts, max_new_tokens=max(0, min(opts.max_new_tokens, engine.context_length - prompt_len - 1))
        )
    return opts


def expand(engine: ServedEngine, req: GenerateReq) -> tuple[list[GenerateParams], bool]:
    """Every output's ``GenerateParams`` (prompt-major) and whether the answer is a list."""
    for name, what in _FEATURES.items():
        if getattr(req, name):
            raise ServeError(f"{name} is set: {what} is not modelled by this server (see docs/serve.md).")
    if req.input_ids is None and req.text is None:
        raise ServeError("Either text or input_ids should be provided.")
    ids, text = req.input_ids, req.text
    if ids is not None:
        # the model validated ids as all ints or all lists, so the first item tells which
        batch = bool(ids) and isinstance(ids[0], list)
        prompts = [list(p) for p in cast(list[list[int]], ids)] if batch else [list(cast(list[int], ids))]
    elif isinstance(text, list):
        batch, prompts = True, [tokenize(engine, t) for t in text]
    else:
        assert text is not None, "refused above: neither text nor input_ids"
        batch, prompts = False, [tokenize(engine, text)]
    prompts = [check_ids(engine, p) for p in prompts]
    sp = req.sampling_params
    if isinstance(sp, list) and len(sp) != len(prompts):
        raise ServeError(
            f"sampling_params is a list of {len(sp)} for {len(prompts)} prompts; allowed: one dict, or one per prompt."
        )
    per_prompt = sp if isinstance(sp, list) else [sp] * len(prompts)
    options = [options_for(engine, p, len(ids)) for p, ids in zip(per_prompt, prompts)]
    n = options[0].n
    if any(o.n != n for o in options):
        raise ServeError("sampling_params.n differs between prompts; SGLang needs the same n for every prompt.")
    rids = _rids(req.rid, len(prompts), batch)
    top = max(0, int(req.top_logprobs_num or 0))
    listed = batch or n > 1
    out: list[GenerateParams] = []
    for i, (ids, opts) in enumerate(zip(prompts, options)):
        opts = dataclasses.replace(opts, top_logprobs_num=top if req.return_logprob else 0)
        for j in range(n):
            rid = uuid.uuid4().hex if n > 1 else rids[i]
            seed = engine.next_seed() if opts.seed is None else int(opts.seed) % (2**63)
            out.append(
                GenerateParams(
                    input_ids=ids,
                    options=opts,
                    seed=seed,
                    rid=rid,
                    return_logprob=bool(req.return_logprob),
                    index=i * n + j if listed else None,
                )
            )
    if len({p.rid for p in out}) != len(out):
        raise ServeError(f"rid repeats within the request ({[p.rid for p in out]}); allowed: distinct rids.")
    for p in out:
        engine.validate(p)
    return out, listed


def _rids(rid: str | list[str] | None, count: int, batch: bool) -> list[str]:
    if isinstance(rid, list):
        if len(rid) != count:
            raise ServeError(f"rid is a list of {len(rid)} for {count} prompts; allowed: one rid per prompt.")
        return list(rid)
    if rid is None:
        return [uuid.uuid4().hex for _ in range(count)]
    return [f"{rid}_{i}" for i in range(count)] if batch else [rid]


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def _error_chunk(exc: Exception) -> dict[str, Any]:
    """SGLang's mid-stream error event for a refusal; any other failure (e.g. the engine
    thread died) as an internal error, so the stream still ends with ``[DONE]``."""
    if isinstance(exc, ServeError):
        return {
            "error": {"message": exc.message, "type": "invalid_request_error", "code": exc.status, "retryable": False}
        }
    return {
        "error": {
            "message": f"internal error: {type(exc).__name__}: {exc}",
            "type": "internal_error",
            "code": 500,
            "retryable": False,
        }
    }


async def interleaved(engine: ServedEngine, params: list[GenerateParams]) -> AsyncIterator[dict[str, Any]]:
    """Every output's stream chunks as they come, in one stream; a refusal after the
    stream began comes as ``{"error": {...}}`` (SGLang's mid-stream error). Leaving
    early (the client went away) aborts every request still running."""
    if len(params) == 1:  # one output: its chunks as they come, no queue between
        try:
            async with contextlib.aclosing(engine.stream(params[0])) as chunks:  # closed (aborting) if we are
                async for chunk in chunks:
                    yield chunk
        except Exception as exc:
            yield _error_chunk(exc)
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(p: GenerateParams) -> None:
        try:
            async for chunk in engine.stream(p):
                await queue.put(chunk)
        except Exception as exc:
            await queue.put(_error_chunk(exc))
        finally:
            await queue.put(None)

    tasks = [asyncio.ensure_future(pump(p)) for p in params]
    try:
        remaining = len(tasks)
        while remaining:
            chunk = await queue.get()
            if chunk is None:
                remaining -= 1
            else:
                yield chunk
    finally:
        for task in tasks:
            task.cancel()


async def sse(engine: ServedEngine, params: list[GenerateParams]) -> AsyncIterator[bytes]:
    async for chunk in interleaved(engine, params):
        yield _sse(chunk)
    yield b"data: [DONE]\n\n"


async def _refused_stream(exc: ServeError) -> AsyncIterator[bytes]:
    """SGLang's answer to a stream its tokenizer manager refuses: HTTP 200, one error
    event, then ``[DONE]``."""
    yield _sse({"error": {"message": exc.message, "type": "invalid_request_error", "code": exc.status}})
    yield b"data: [DONE]\n\n"


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate(req: GenerateReq, request: Request) -> Any:
    engine: ServedEngine = request.app.state.engine
    try:
        params, listed = expand(engine, req)
    except ContextLengthError as exc:
        if not req.stream:
            raise
        return StreamingResponse(_refused_stream(exc), media_type="text/event-stream")
    if req.stream:
        return StreamingResponse(sse(engine, params), media_type="text/event-stream")
    outputs = await asyncio.gather(*[engine.generate(p) for p in params])
    if not listed:
        return outputs[0]
    for out in outputs:  # a non-streaming list carries no index (the list position is it)
        out.pop("index", None)
    return list(outputs)
