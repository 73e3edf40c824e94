"""The app: SGLang's HTTP API (the part RL frameworks use) over a ``ServedEngine``.

Routes live in three modules: ``generate_routes`` (``/generate``), ``openai_routes``
(``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``) and this one (control,
weights, scheduler state, health, harness routes).

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
  ``input_ids`` and no ``text``, a prompt longer than the context, a value out of
  range): HTTP 400, ``{"error": {"message": ...}}`` (``_create_error_response``); what
  its request schema rejects (an unknown ``sampling_params`` key, a wrong type):
  HTTP 400, ``{"error": "<message>"}``;
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
from datetime import datetime, UTC
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from .check import check_served
from .generate_routes import router as generate_router
from .openai_routes import openai_error, router as openai_router
from .served_engine import ServedEngine
from .served_errors import ServeError
from .weights import decode_named_tensors, load_weights_dir


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


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


SERVER_VERSION = "miles-harness-cpu"  # /v1/loads and /server_info ``version`` (SGLang: its release)
_LOAD_SECTIONS = ("core", "memory", "spec", "lora", "disagg", "queues", "all")


def harness_state(state: dict[str, Any]) -> dict[str, Any]:
    """What SGLang has no field for: the rids, the pause, the free KV tokens."""
    return {
        "running_rids": state["running_rids"],
        "waiting_rids": state["waiting_rids"],
        "paused": state["paused"] or state["pause_mode"] is not None,
        "pause_mode": state["pause_mode"],
        "held_at_admission": state["held_at_admission"],
        "free_kv_tokens": state["kv_total"] - state["kv_used"],
    }


def load_entry(state: dict[str, Any], include: str | None) -> dict[str, Any]:
    """One ``/v1/loads`` entry with SGLang's field names (``load_snapshot.py``), for the
    one rank here; ``queues.paused`` counts requests held at admission by a pause,
    ``queues.retracted`` waiting requests with tokens already generated."""
    sections = [s.strip() for s in include.split(",")] if include else ["all"]
    unknown = [s for s in sections if s not in _LOAD_SECTIONS]
    if unknown:
        raise ServeError(f"include={include!r} has unknown sections {unknown}; allowed: {list(_LOAD_SECTIONS)}.")
    used, total = state["kv_used"], state["kv_total"]
    running, waiting = len(state["running_rids"]), len(state["waiting_rids"])
    entry: dict[str, Any] = {
        "dp_rank": 0,
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_total_reqs": running + waiting,
        "num_used_tokens": used,
        "num_total_tokens": used,
        "max_total_num_tokens": total,
        "max_running_requests": state["max_running_requests"],
        "token_usage": used / total if total else 0.0,
        "gen_throughput": state["gen_throughput"],
        "harness": harness_state(state),
    }
    if "all" in sections or "queues" in sections:
        entry["queues"] = {
            "waiting": waiting,
            "grammar": 0,
            "paused": state["held_at_admission"] if state["pause_mode"] else 0,
            "retracted": state["retracted"],
            "prealloc_ready": 0,
        }
    return entry


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _summarise(body: Any) -> Any:
    if isinstance(body, dict) and "serialized_named_tensors" in body:
        tensors = body["serialized_named_tensors"]
        body = dict(body, serialized_named_tensors=f"<{len(tensors) if isinstance(tensors, list) else '?'} ranks>")
    return body


class RequestLog:
    """ASGI middleware: one entry per HTTP call, appended on arrival, completed on reply."""

    def __init__(self, app: Any, engine: ServedEngine) -> None:
        self.app, self.engine = app, engine

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        entry: dict[str, Any] = {
            "seq": len(self.engine.request_log),
            "t": time.monotonic(),
            "method": scope["method"],
            "path": scope["path"],
            "body": None,
            "status": None,
        }
        self.engine.request_log.append(entry)
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


def create_app(engine: ServedEngine) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        try:
            yield
        finally:
            engine.close()

    app = FastAPI(lifespan=lifespan, openapi_url=None)
    app.state.engine = engine

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in exc.errors()]
        return JSONResponse(
            {
                "object": "error",
                "message": f"{len(errors)} validation error(s): {errors}",
                "type": HTTPStatus.BAD_REQUEST.phrase,
                "param": None,
                "code": 400,
            },
            status_code=400,
        )

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, exc: ServeError) -> JSONResponse:
        if request.url.path.startswith("/v1/"):
            return openai_error(exc.message, exc.status)
        if exc.schema:
            return JSONResponse({"error": exc.message}, status_code=exc.status)
        return _error(exc.message, exc.status)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        return _error(f"internal error: {type(exc).__name__}: {exc}", 500)

    app.include_router(generate_router)
    app.include_router(openai_router)

    # --- abort, health ----------------------------------------------------------------------
    @app.post("/abort_request")
    async def abort_request(req: AbortReq) -> Response:
        await engine.abort(rid=req.rid or None, abort_all=req.abort_all)
        return Response(status_code=200)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.alive else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        try:
            ok = await engine.health_generate()
        except ServeError:
            ok = False
        return Response(status_code=200 if ok else 503)

    # --- pause / continue / cache -------------------------------------------------------------
    @app.post("/pause_generation")
    async def pause_generation(req: PauseReq) -> JSONResponse:
        await engine.pause(req.mode)
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation() -> JSONResponse:
        await engine.resume()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        ok = await engine.flush_cache()
        return Response(
            content="Cache flushed.\nPlease check backend logs for more details. (When there are "
            "running or waiting requests, the operation will not be performed.)\n",
            status_code=200 if ok else 400,
        )

    # --- weights ------------------------------------------------------------------------------
    @app.post("/begin_weight_update")
    async def begin_weight_update() -> JSONResponse:
        if engine.update_session_open:
            raise ServeError(
                "begin_weight_update while a weight update is already open; allowed: begin, "
                "transfers, end. Fix: call /end_weight_update first."
            )
        engine.update_session_open = True
        return JSONResponse({"success": True, "message": "Weight update begun."})

    @app.post("/end_weight_update")
    async def end_weight_update() -> JSONResponse:
        if not engine.update_session_open:
            raise ServeError("end_weight_update without begin_weight_update. Fix: call /begin_weight_update first.")
        engine.update_session_open = False
        return JSONResponse({"success": True, "message": "Weight update ended."})

    async def _load(named_fn: Any, version: str | None, what: str) -> JSONResponse:
        try:
            named = named_fn()
            await engine.load_weights(named, version)
        except ServeError as exc:
            return JSONResponse({"success": False, "message": exc.message}, status_code=400)
        message = f"Succeeded to update model weights ({what})."
        if version is not None:
            message += f" Weight version updated to {version}."
        return JSONResponse({"success": True, "message": message})

    @app.post("/update_weights_from_tensor")
    async def update_weights_from_tensor(req: TensorReq) -> JSONResponse:
        return await _load(
            lambda: decode_named_tensors(req.serialized_named_tensors, req.load_format),
            req.weight_version,
            "from tensor",
        )

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(req: DiskReq) -> JSONResponse:
        response = await _load(lambda: load_weights_dir(req.model_path), req.weight_version, "from disk")
        body = json.loads(bytes(response.body))
        body["num_paused_requests"] = 0
        return JSONResponse(body, status_code=response.status_code)

    @app.post("/update_weight_version")
    async def update_weight_version(req: VersionReq) -> JSONResponse:
        await engine.set_weight_version(req.new_version, abort_all=req.abort_all_requests)
        return JSONResponse(
            {"success": True, "message": f"Weight version updated to {req.new_version}", "new_version": req.new_version}
        )

    @app.get("/get_weight_version")
    async def get_weight_version() -> dict:
        return {"weight_version": engine.weight_version}

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict:
        return {
            "model_path": engine.model_path,
            "tokenizer_path": engine.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": engine.weight_version,
            # harness additions
            "max_seq_len": engine.max_seq_len,
            "vocab_size": engine.vocab_size,
            "eos_token_id": engine.core.eos_token_id,
            "parameter_shapes": {k: list(v.shape) for k, v in engine.core.model.module.state_dict().items()},
        }

    # --- scheduler state ------------------------------------------------------------------------
    @app.get("/v1/loads")
    async def loads(include: str | None = None, dp_rank: int | None = None) -> dict:
        state = await engine.scheduler_state()
        return {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": SERVER_VERSION,
            "accelerator": None,
            "num_accelerators": 0,
            "loads": [] if dp_rank not in (None, 0) else [load_entry(state, include)],
        }

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict:
        state = await engine.scheduler_state()
        return {
            "model_path": engine.model_path,
            "tokenizer_path": engine.model_path,
            "version": SERVER_VERSION,
            "max_running_requests": engine.core.max_running,
            "context_length": engine.max_seq_len,
            "weight_version": engine.weight_version,
            "internal_states": [
                {
                    "last_gen_throughput": state["gen_throughput"],
                    "memory_usage": {"kv_tokens_used": state["kv_used"], "kv_tokens_total": state["kv_total"]},
                    "harness": harness_state(state),
                }
            ],
        }

    # --- harness routes -----------------------------------------------------------------------
    @app.get("/harness/trace")
    async def harness_trace() -> dict:
        with engine.sink.lock:
            return {"events": [e.to_json() for e in engine.trace.events]}

    @app.get("/harness/request_log")
    async def harness_request_log() -> dict:
        return {"requests": [dict(e) for e in engine.request_log]}

    @app.post("/harness/step")
    async def harness_step(req: StepReq) -> dict:
        if req.n is not None and req.n < 0:
            raise ServeError(f"n={req.n}: allowed null (run freely), 0 (hold) or a positive step count.")
        await engine.step(req.n)
        return {"status": "ok", "n": req.n}

    @app.get("/harness/check")
    async def harness_check(pause_generation_mode: str = "retract", fully_async: bool = False) -> dict:
        return check_served(engine, pause_generation_mode=pause_generation_mode, fully_async=fully_async)

    return RequestLog(app, engine)  # type: ignore[return-value]
