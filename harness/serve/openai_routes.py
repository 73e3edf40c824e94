"""OpenAI-compatible routes on the same engine: ``/v1/completions``,
``/v1/chat/completions``, ``/v1/models``.

As sglang 0.5.23 answers them (``srt/entrypoints/openai/protocol.py``,
``serving_completions.py``, ``serving_chat.py``, ``serving_base.py``):

* sampling: ``max_tokens`` (chat also ``max_completion_tokens``), ``temperature``,
  ``top_p``, ``n``, ``stop``, ``seed``, ``presence_penalty``, ``frequency_penalty``,
  ``logit_bias``, and SGLang's extras at the top level (where an OpenAI client's
  ``extra_body`` lands): ``top_k``, ``min_p``, ``min_tokens``, ``repetition_penalty``,
  ``stop_token_ids``, ``ignore_eos``, ``no_stop_trim``, ``skip_special_tokens``,
  ``rid``, ``return_token_ids``; unknown keys are ignored;
* log-probs: completions ``logprobs: k`` gives ``logprobs {tokens, token_logprobs,
  top_logprobs, text_offset}`` with the k most likely per token; chat ``logprobs: true``
  with ``top_logprobs: k`` gives ``logprobs.content[{token, bytes, logprob,
  top_logprobs}]``;
* reply: ``choices`` (``index``, ``text`` or ``message``, ``logprobs``,
  ``finish_reason`` ``stop`` / ``length`` / ``abort``, ``matched_stop``, with
  ``return_token_ids`` also ``token_ids`` / ``prompt_token_ids``), ``usage``, and
  ``metadata {weight_version, weight_versions}`` (the weight version of the last token,
  and per-choice spans); ``id`` is the first choice's rid;
* streaming: ``data:`` chunks of per-choice deltas (chat: a role chunk first), a chunk
  with each choice's ``finish_reason`` and ``matched_stop``, a usage chunk only with
  ``stream_options.include_usage``, then ``data: [DONE]``;
* chat template: the model's own (a Hugging Face tokenizer's ``apply_chat_template``);
  the tiny model's is defined in ``tokenizer.py`` (``"<role>: <content>\\n"`` lines,
  then ``"assistant: "``); tools and structured ``response_format`` are refused;
* errors: HTTP 400 ``{"object": "error", "message", "type": "BadRequestError",
  "param": null, "code": 400}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from .generate_routes import check_ids, interleaved, options_for, tokenize
from .served_engine import GenerateParams, ServedEngine
from .served_errors import ServeError

router = APIRouter()

# OpenAI field -> SGLang sampling_params field
_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "n": "n",
    "stop": "stop",
    "seed": "sampling_seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "logit_bias": "logit_bias",
    "top_k": "top_k",
    "min_p": "min_p",
    "min_tokens": "min_new_tokens",
    "repetition_penalty": "repetition_penalty",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "no_stop_trim": "no_stop_trim",
    "skip_special_tokens": "skip_special_tokens",
}
_REFUSED = {
    "tools": "tool calls",
    "functions": "function calls",
    "echo": "echo",
    "suffix": "suffix",
    "best_of": "best_of",
    "lora_path": "LoRA",
}


def openai_error(message: str, status: int = 400) -> JSONResponse:
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return JSONResponse(
        {"object": "error", "message": message, "type": kind, "param": None, "code": status}, status_code=status
    )


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise ServeError("the body is not JSON; send a JSON object with Content-Type: application/json.") from None
    if not isinstance(body, dict):
        raise ServeError("the body must be a JSON object.")
    for key, what in _REFUSED.items():
        value = body.get(key)
        if value not in (None, False, []) and not (key == "best_of" and value == 1):
            raise ServeError(f"{key} is set: {what} is not modelled by this server (see docs/serve.md).")
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise ServeError(
            f'response_format={fmt!r}: structured output is not modelled; allowed: null or {{"type": "text"}}.'
        )
    return body


def _sampling(body: dict[str, Any], max_tokens: Any) -> dict[str, Any]:
    params = {sg: body[oa] for oa, sg in _SAMPLING.items() if body.get(oa) is not None}
    if max_tokens is not None:
        params["max_new_tokens"] = max_tokens
    return params


def _params(
    engine: ServedEngine, body: dict[str, Any], prompt: list[int], max_tokens: Any, top: int, logprobs: bool
) -> list[GenerateParams]:
    opts = options_for(engine, _sampling(body, max_tokens), len(prompt))
    opts = dataclasses.replace(opts, top_logprobs_num=top if logprobs else 0)
    base = body.get("rid") if isinstance(body.get("rid"), str) else None
    out = []
    for j in range(opts.n):
        rid = (base if opts.n == 1 else f"{base}_{j}") if base else uuid.uuid4().hex
        seed = engine.next_seed() if opts.seed is None else int(opts.seed) % (2**63)
        out.append(GenerateParams(input_ids=prompt, options=opts, seed=seed, rid=rid, return_logprob=logprobs, index=j))
    for p in out:
        engine.validate(p)
    return out


def _finish(out: dict[str, Any]) -> tuple[str | None, Any]:
    reason = out["meta_info"]["finish_reason"]
    if reason is None:
        return None, None
    return reason["type"], reason.get("matched")


def _token_text(engine: ServedEngine, tok: int) -> str:
    return engine.decode([tok], skip_special_tokens=False)


def _completion_logprobs(engine: ServedEngine, out: dict[str, Any], start: int = 0, offset: int = 0) -> dict:
    meta = out["meta_info"]
    entries = meta.get("output_token_logprobs", [])[start:]
    tops = meta.get("output_top_logprobs", [])[start:] or [[] for _ in entries]
    tokens = [_token_text(engine, e[1]) for e in entries]
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [e[0] for e in entries],
        "top_logprobs": [{_token_text(engine, t[1]): t[0] for t in top} for top in tops],
        "text_offset": offsets,
    }


def _chat_logprobs(engine: ServedEngine, out: dict[str, Any], start: int = 0) -> dict:
    meta = out["meta_info"]
    entries = meta.get("output_token_logprobs", [])[start:]
    tops = meta.get("output_top_logprobs", [])[start:] or [[] for _ in entries]

    def item(lp: float, tok: int) -> dict[str, Any]:
        text = _token_text(engine, tok)
        return {"token": text, "bytes": list(text.encode("utf-8")), "logprob": lp}

    return {
        "content": [
            dict(item(e[0], e[1]), top_logprobs=[item(t[0], t[1]) for t in top]) for e, top in zip(entries, tops)
        ]
    }


def _usage(outputs: list[dict[str, Any]]) -> dict[str, int]:
    prompt = outputs[0]["meta_info"]["prompt_tokens"] if outputs else 0
    completion = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _metadata(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "weight_version": outputs[-1]["meta_info"]["weight_version"],
        "weight_versions": [o["meta_info"].get("weight_versions", []) for o in outputs],
    }


def _chat_prompt(engine: ServedEngine, messages: Any) -> list[int]:
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise ServeError("messages must be a non-empty list of {role, content} objects.")
    for m in messages:
        if not isinstance(m.get("content", ""), (str, type(None))):
            raise ServeError("messages[].content must be a string: multimodal content parts are not modelled.")
    tok = engine.tokenizer
    if tok is None or not hasattr(tok, "apply_chat_template"):
        raise ServeError("this server's model has no tokenizer with a chat template; use /generate with input_ids.")
    try:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except TypeError:
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
    except Exception as exc:  # a Hugging Face tokenizer with no chat_template
        raise ServeError(f"the model's tokenizer has no usable chat template ({exc}).") from None
    return check_ids(engine, tokenize(engine, text) if isinstance(text, str) else list(text))


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


async def _stream(
    engine: ServedEngine, params: list[GenerateParams], head: dict[str, Any], *, chat: bool, include_usage: bool
) -> AsyncIterator[bytes]:
    sent_text = {p.index: 0 for p in params}
    sent_tokens = {p.index: 0 for p in params}
    finals: list[dict[str, Any]] = []
    if chat:
        for p in params:
            yield _sse(
                dict(
                    head,
                    choices=[
                        {
                            "index": p.index,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                )
            )
    async for out in interleaved(engine, params):
        if "error" in out:
            yield _sse(out)
            continue
        i = out["index"]
        text, start = out["text"], sent_tokens[i]
        delta, sent_text[i], sent_tokens[i] = text[sent_text[i] :], len(text), len(out["output_ids"])
        reason, matched = _finish(out)
        logprobs = None
        if params[0].return_logprob:
            logprobs = _chat_logprobs(engine, out, start) if chat else _completion_logprobs(engine, out, start)
        choice: dict[str, Any] = {"index": i, "logprobs": logprobs, "finish_reason": reason, "matched_stop": matched}
        choice.update({"delta": {"content": delta}} if chat else {"text": delta})
        yield _sse(dict(head, choices=[choice]))
        if reason is not None:
            finals.append(out)
    if include_usage and finals:
        yield _sse(dict(head, choices=[], usage=_usage(finals)))
    yield b"data: [DONE]\n\n"


def _head(params: list[GenerateParams], body: dict[str, Any], engine: ServedEngine, obj: str) -> dict[str, Any]:
    return {
        "id": params[0].rid,
        "object": obj,
        "created": int(time.time()),
        "model": body.get("model") or engine.model_path,
    }


async def _run(
    engine: ServedEngine,
    body: dict[str, Any],
    prompt: list[int],
    max_tokens: Any,
    *,
    chat: bool,
    top: int,
    logprobs: bool,
) -> Any:
    params = _params(engine, body, prompt, max_tokens, top, logprobs)
    kind = "chat.completion" if chat else "text_completion"
    if body.get("stream"):
        if chat and any(body.get(k) for k in ("return_token_ids", "return_prompt_token_ids", "return_meta_info")):
            raise ServeError(
                "return_token_ids / return_prompt_token_ids / return_meta_info cannot be used with stream=true."
            )
        head = _head(params, body, engine, kind + ".chunk" if chat else kind)
        include = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            _stream(engine, params, head, chat=chat, include_usage=include), media_type="text/event-stream"
        )
    outputs = await asyncio.gather(*[engine.generate(p) for p in params])
    choices = []
    for p, out in zip(params, outputs):
        reason, matched = _finish(out)
        choice: dict[str, Any] = {"index": p.index, "finish_reason": reason, "matched_stop": matched}
        if chat:
            choice["message"] = {
                "role": "assistant",
                "content": out["text"],
                "reasoning_content": None,
                "tool_calls": None,
            }
            choice["logprobs"] = _chat_logprobs(engine, out) if logprobs else None
        else:
            choice["text"] = out["text"]
            choice["logprobs"] = _completion_logprobs(engine, out) if logprobs else None
        if body.get("return_token_ids"):
            choice["token_ids" if not chat else "response_token_ids"] = out["output_ids"]
            choice["prompt_token_ids"] = list(p.input_ids)
        choices.append(choice)
    return dict(
        _head(params, body, engine, kind),
        choices=choices,
        usage=_usage(list(outputs)),
        metadata=_metadata(list(outputs)),
    )


@router.post("/v1/completions")
async def completions(request: Request) -> Any:
    engine: ServedEngine = request.app.state.engine
    body = await _body(request)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = check_ids(engine, tokenize(engine, prompt))
    elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        ids = check_ids(engine, list(prompt))
    else:
        raise ServeError("prompt must be a string or a list of token ids (one prompt per request here).")
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0):
        raise ServeError(f"logprobs={logprobs!r}: allowed null or an integer >= 0 (how many top log-probs).")
    return await _run(
        engine, body, ids, body.get("max_tokens", 16), chat=False, top=logprobs or 0, logprobs=logprobs is not None
    )


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Any:
    engine: ServedEngine = request.app.state.engine
    body = await _body(request)
    ids = (
        check_ids(engine, list(body["input_ids"]))
        if body.get("input_ids")
        else _chat_prompt(engine, body.get("messages"))
    )
    top = body.get("top_logprobs") or 0
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
        raise ServeError(f"top_logprobs={top!r}: allowed an integer 0..20.")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return await _run(engine, body, ids, max_tokens, chat=True, top=top, logprobs=bool(body.get("logprobs")))


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    engine: ServedEngine = request.app.state.engine
    return {
        "object": "list",
        "data": [
            {
                "id": engine.model_path,
                "object": "model",
                "created": 0,
                "owned_by": "miles-harness",
                "root": engine.model_path,
                "max_model_len": engine.max_seq_len,
            }
        ],
    }
