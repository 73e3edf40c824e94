"""The routes: SGLang's HTTP API (the part RL frameworks use) over an ``EngineHost``.

Web stack: FastAPI on uvicorn, the stack SGLang's own ``http_server.py`` uses, so the
framework-level answers a client sees (routing, a 404 for an unknown path, a 405 for a
wrong method, the JSON body parsing) are the ones it gets from SGLang, and the same
exception handlers give the same error shapes. Import cost is ~1 s on 2 cores, well
inside the 10 s start-up budget (torch dominates). aiohttp would start a little faster
but answers framework errors differently from SGLang.

Error shapes, as SGLang 0.5.x's ``http_server.py`` answers them:

* body that does not parse or has a wrong type (FastAPI's ``RequestValidationError``):
  HTTP 400, ``{"object": "error", "message": ..., "type": "Bad Request", "param": null,
  "code": 400}`` (SGLang overrides FastAPI's 422 with this ``ErrorResponse``);
* a ``/generate`` SGLang's tokenizer manager rejects (a ``ValueError``, e.g. no
  ``input_ids`` and no ``text``, a prompt longer than the context):
  HTTP 400, ``{"error": {"message": ...}}`` (``_create_error_response``);
* weight updates: ``{"success": false, "message": ...}`` with HTTP 400;
  ``/flush_cache``: a plain-text body with HTTP 400 while requests are pending;
* an unknown path: Starlette's HTTP 404 ``{"detail": "Not Found"}``.

Control calls this server refuses where SGLang would not (pause during a pause, a
nested or unmatched begin/end weight update) answer HTTP 400 ``{"error": {"message":
...}}``. An unexpected exception in a route answers HTTP 500 ``{"error": {"message":
...}}``; the server keeps serving.

Harness routes (not SGLang's), under ``/harness/``: ``trace`` (the JSON events),
``request_log``, ``check`` (``check_all`` on the trace and the update-order check on
the log), ``step`` (a test hook that runs the engine a given number of decode steps).
"""

from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from .engine import EngineHost, GenerateParams, ServeError

# sampling parameters: accepted (only affect the text or are Miles' defaults) vs refused values
_TEXT_ONLY = {"skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens"}
_NEUTRAL = {"top_p": (1.0,), "top_k": (-1, 0, None), "min_p": (0.0, 0, None), "frequency_penalty": (0.0, 0, None),
            "presence_penalty": (0.0, 0, None), "repetition_penalty": (1.0, 1, None), "n": (1, None),
            "min_new_tokens": (0, None), "stop": (None, "", []), "json_schema": (None,), "regex": (None,),
            "ebnf": (None,), "logit_bias": (None, {}), "custom_params": (None,)}
_FEATURES = {"return_routed_experts": "routed experts (MoE)", "return_indexer_topk": "indexer top-k",
             "lora_path": "LoRA", "image_data": "multimodal input", "stream": "streaming",
             "return_hidden_states": "hidden states", "input_embeds": "input embeddings"}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class GenerateReq(_Body):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool | None = False
    rid: str | None = None
    stream: bool = False
    return_routed_experts: bool = False
    return_indexer_topk: bool = False
    return_hidden_states: bool = False
    lora_path: Any = None
    image_data: Any = None
    input_embeds: Any = None


class PauseReq(_Body):
    mode: str = "abort"  # SGLang's PauseGenerationReqInput default; Miles always sends one


class AbortReq(_Body):
    rid: str | None = ""
    abort_all: bool = False


class VersionReq(_Body):
    new_version: str
    abort_all_requests: bool = False


class TensorReq(_Body):
    serialized_named_tensors: list[str | bytes]
    load_format: str | None = None
    flush_cache: bool = True
    weight_version: str | None = None
    selector: str | None = None


class DiskReq(_Body):
    model_path: str
    load_format: str | None = None
    weight_version: str | None = None


class StepReq(_Body):
    n: int | None = None


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _summarise(body: Any) -> Any:
    if isinstance(body, dict) and "serialized_named_tensors" in body:
        tensors = body["serialized_named_tensors"]
        body = dict(body, serialized_named_tensors=f"<{len(tensors) if isinstance(tensors, list) else '?'} ranks>")
    return body


class RequestLog:
    """ASGI middleware: one entry per HTTP call, appended on arrival, completed on reply."""

    def __init__(self, app: Any, host: EngineHost) -> None:
        self.app, self.host = app, host

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        entry: dict[str, Any] = {"seq": len(self.host.request_log), "t": time.monotonic(),
                                 "method": scope["method"], "path": scope["path"], "body": None, "status": None}
        self.host.request_log.append(entry)
        chunks: list[bytes] = []

        async def logged_receive() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    raw = b"".join(chunks)
                    try:
                        entry["body"] = _summarise(json.loads(raw)) if raw else None
                    except ValueError:
                        entry["body"] = raw[:200].decode("utf-8", "replace")
            return message

        async def logged_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                entry["status"] = message["status"]
                entry["t_end"] = time.monotonic()
            await send(message)

        await self.app(scope, logged_receive, logged_send)


def _sampling(host: EngineHost, params: dict[str, Any] | None) -> tuple[int, float, int]:
    params = dict(params or {})
    unknown = sorted(set(params) - _TEXT_ONLY - set(_NEUTRAL) - {"temperature", "max_new_tokens", "sampling_seed",
                                                                  "stop_token_ids", "ignore_eos"})
    if unknown:
        raise ServeError(f"sampling_params has unknown or unsupported keys {unknown}; allowed: temperature, "
                         f"max_new_tokens, sampling_seed, stop_token_ids, ignore_eos, {sorted(_TEXT_ONLY)}, and "
                         f"{sorted(_NEUTRAL)} at their neutral values.")
    for key, allowed in _NEUTRAL.items():
        if key in params and params[key] not in allowed:
            raise ServeError(f"sampling_params.{key}={params[key]!r} is not modelled by this server (it samples the "
                             f"full distribution); allowed: {[a for a in allowed if a is not None] or 'null'}.")
    temperature = params.get("temperature", 1.0)
    max_new = params.get("max_new_tokens", 128)
    seed = params.get("sampling_seed")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise ServeError(f"sampling_params.temperature={temperature!r}: must be a number >= 0 (0 = greedy).")
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
        raise ServeError(f"sampling_params.max_new_tokens={max_new!r}: must be an integer >= 1.")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ServeError(f"sampling_params.sampling_seed={seed!r}: must be an integer.")
    eos = host.core.eos_token_id
    stop_ids = params.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or any(t != eos for t in stop_ids):
        raise ServeError(f"sampling_params.stop_token_ids={stop_ids!r}: this server stops on the model's EOS "
                         f"({eos}) only; allowed: null, [] or [{eos}].")
    if params.get("ignore_eos") and eos is not None:
        raise ServeError(f"sampling_params.ignore_eos=true: this server always stops on EOS ({eos}); start it "
                         "with eos_token_id=None to never stop early.")
    return max_new, float(temperature), host.next_seed() if seed is None else int(seed) % (2**63)


def create_app(host: EngineHost) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        host.start()
        try:
            yield
        finally:
            host.close()

    app = FastAPI(lifespan=lifespan, openapi_url=None)
    app.state.host = host

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in exc.errors()]
        return JSONResponse({"object": "error", "message": f"{len(errors)} validation error(s): {errors}",
                             "type": HTTPStatus.BAD_REQUEST.phrase, "param": None, "code": 400}, status_code=400)

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, exc: ServeError) -> JSONResponse:
        return _error(exc.message, exc.status)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        return _error(f"internal error: {type(exc).__name__}: {exc}", 500)

    # --- generation -------------------------------------------------------------------------
    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(req: GenerateReq) -> Any:
        for name, what in _FEATURES.items():
            if getattr(req, name):
                raise ServeError(f"{name} is set: {what} is not modelled by this server (see docs/serve.md).")
        if req.input_ids is None and req.text is None:
            raise ServeError("Either text or input_ids should be provided.")
        if isinstance(req.text, list) or (req.input_ids and isinstance(req.input_ids[0], list)) or \
                isinstance(req.sampling_params, list):
            raise ServeError("batched /generate (a list of prompts) is not supported by this server; send one "
                             "request per prompt.")
        if req.input_ids is not None:
            ids = list(req.input_ids)
        else:
            if host.tokenizer is None:
                raise ServeError("text input needs a tokenizer, and this server has none; send input_ids.")
            try:
                ids = list(host.tokenizer.encode(req.text))
            except ValueError as exc:
                raise ServeError(f"text cannot be tokenized: {exc}") from None
        bad = [t for t in ids if not 0 <= t < host.vocab_size]
        if bad:
            raise ServeError(f"input_ids {bad[:5]} are outside the vocabulary [0, {host.vocab_size}).")
        max_new, temperature, seed = _sampling(host, req.sampling_params)
        rid = req.rid or f"req-{len(host.request_log)}"
        return await host.generate(GenerateParams(input_ids=ids, max_new_tokens=max_new, temperature=temperature,
                                                  seed=seed, rid=rid, return_logprob=bool(req.return_logprob)))

    @app.post("/abort_request")
    async def abort_request(req: AbortReq) -> Response:
        await host.abort(rid=req.rid or None, abort_all=req.abort_all)
        return Response(status_code=200)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if host.alive else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        try:
            ok = await host.health_generate()
        except ServeError:
            ok = False
        return Response(status_code=200 if ok else 503)

    # --- pause / continue / cache -------------------------------------------------------------
    @app.post("/pause_generation")
    async def pause_generation(req: PauseReq) -> JSONResponse:
        await host.pause(req.mode)
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation() -> JSONResponse:
        await host.resume()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        ok = await host.flush_cache()
        return Response(content="Cache flushed.\nPlease check backend logs for more details. (When there are "
                                "running or waiting requests, the operation will not be performed.)\n",
                        status_code=200 if ok else 400)

    # --- weights ------------------------------------------------------------------------------
    @app.post("/begin_weight_update")
    async def begin_weight_update() -> JSONResponse:
        if host.update_session_open:
            raise ServeError("begin_weight_update while a weight update is already open; allowed: begin, "
                             "transfers, end. Fix: call /end_weight_update first.")
        host.update_session_open = True
        return JSONResponse({"success": True, "message": "Weight update begun."})

    @app.post("/end_weight_update")
    async def end_weight_update() -> JSONResponse:
        if not host.update_session_open:
            raise ServeError("end_weight_update without begin_weight_update. Fix: call /begin_weight_update first.")
        host.update_session_open = False
        return JSONResponse({"success": True, "message": "Weight update ended."})

    async def _load(named_fn: Any, version: str | None, what: str) -> JSONResponse:
        try:
            named = named_fn()
            await host.load_weights(named, version)
        except ServeError as exc:
            return JSONResponse({"success": False, "message": exc.message}, status_code=400)
        message = f"Succeeded to update model weights ({what})."
        if version is not None:
            message += f" Weight version updated to {version}."
        return JSONResponse({"success": True, "message": message})

    @app.post("/update_weights_from_tensor")
    async def update_weights_from_tensor(req: TensorReq) -> JSONResponse:
        from .weights import decode_named_tensors

        return await _load(lambda: decode_named_tensors(req.serialized_named_tensors, req.load_format),
                           req.weight_version, "from tensor")

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(req: DiskReq) -> JSONResponse:
        from .weights import load_weights_dir

        response = await _load(lambda: load_weights_dir(req.model_path), req.weight_version, "from disk")
        body = json.loads(response.body)
        body["num_paused_requests"] = 0
        return JSONResponse(body, status_code=response.status_code)

    @app.post("/update_weight_version")
    async def update_weight_version(req: VersionReq) -> JSONResponse:
        await host.set_weight_version(req.new_version, abort_all=req.abort_all_requests)
        return JSONResponse({"success": True, "message": f"Weight version updated to {req.new_version}",
                             "new_version": req.new_version})

    @app.get("/get_weight_version")
    async def get_weight_version() -> dict:
        return {"weight_version": host.weight_version}

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict:
        return {"model_path": host.model_path, "tokenizer_path": host.model_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": host.weight_version,
                # harness additions
                "max_seq_len": host.max_seq_len, "vocab_size": host.vocab_size,
                "eos_token_id": host.core.eos_token_id,
                "parameter_shapes": {k: list(v.shape) for k, v in host.core.model.module.state_dict().items()}}

    # --- harness routes -----------------------------------------------------------------------
    @app.get("/harness/trace")
    async def harness_trace() -> dict:
        with host.sink.lock:
            return {"events": [e.to_json() for e in host.trace.events]}

    @app.get("/harness/request_log")
    async def harness_request_log() -> dict:
        return {"requests": [dict(e) for e in host.request_log]}

    @app.post("/harness/step")
    async def harness_step(req: StepReq) -> dict:
        if req.n is not None and req.n < 0:
            raise ServeError(f"n={req.n}: allowed null (run freely), 0 (hold) or a positive step count.")
        await host.step(req.n)
        return {"status": "ok", "n": req.n}

    @app.get("/harness/check")
    async def harness_check(pause_generation_mode: str = "retract", fully_async: bool = False) -> dict:
        from .server import check_served

        return check_served(host, pause_generation_mode=pause_generation_mode, fully_async=fully_async)

    return RequestLog(app, host)  # type: ignore[return-value]
