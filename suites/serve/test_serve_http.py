"""The SGLang-compatible server, through HTTP (``harness.serve``).

Every test drives a real uvicorn server on 127.0.0.1 with httpx. Pauses land at an exact
token count through the ``/harness/step`` hook (the engine runs exactly n decode steps,
then holds), so nothing depends on timing. References are computed in this process
from the same weights: an ``EngineCore`` run alone (same per-request seed) and full
forward passes (``model.logits``) under the old and the new weights.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from harness.backends.torch_engine import EngineCore
from harness.backends.torch_models import build_tiny_lm
from harness.serve.order import check_update_order
from harness.serve.server import TINY_CONTEXT_LENGTH, tiny_model_config
from harness.serve.weights import encode_named_tensors, save_weights_dir

pytestmark = [pytest.mark.http, pytest.mark.model]

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [1, 5, 9, 4, 7]
OLD_SEED, NEW_SEED = 0, 1  # the server's tiny model is seeded with OLD_SEED

pytestmark = pytest.mark.slow  # real HTTP servers


def tiny(seed: int):
    return build_tiny_lm(tiny_model_config(seed))


def fresh_logprobs(model, prompt: list[int], output: list[int], temperature: float = 1.0) -> list[float]:
    """Log-prob of each output token under one full forward pass over prompt + output."""
    seq = torch.tensor([prompt + output])
    with torch.no_grad():
        logp = torch.log_softmax(model.logits(seq)[0].float() / temperature, dim=-1)
    return [logp[len(prompt) + j - 1, tok].item() for j, tok in enumerate(output)]


def gen_body(max_new: int, seed: int, prompt: list[int] = PROMPT, **extra) -> dict:
    return {
        "input_ids": prompt,
        "return_logprob": True,
        "sampling_params": {
            "max_new_tokens": max_new,
            "temperature": 1.0,
            "sampling_seed": seed,
            "top_p": 1.0,
            "top_k": -1,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        },
        **extra,
    }


def events(served, kind: str) -> list:
    return [e for e in served.trace.events if e.kind == kind]


async def wait_for(predicate, what: str, timeout_s: float = 10.0) -> None:
    """Bounded wait for the server to reach a state (yields to the event loop only)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def logprobs(out: dict) -> list[float]:
    return [e[0] for e in out["meta_info"]["output_token_logprobs"]]


# --- generation matches the in-process engine -----------------------------------------------------
def test_served_generate_matches_in_process_engine(served_engine):
    seeds = [11, 12, 13]
    prompts = [PROMPT, [1, 3, 4], [1, 20, 21, 22, 23, 24, 25]]

    async def go():
        async with httpx.AsyncClient(base_url=served_engine.url, timeout=60) as c:
            rs = await asyncio.gather(*[c.post("/generate", json=gen_body(24, s, p)) for s, p in zip(seeds, prompts)])
            return [r.json() for r in rs]

    outs = asyncio.run(go())
    core = EngineCore(tiny(OLD_SEED), max_running=1, eos_token_id=None)  # one at a time: no batching at all
    for seed, prompt, out in zip(seeds, prompts, outs):
        core.add_request("ref", prompt, 24, 1.0, seed)
        done = []
        while core.has_work():
            done += core.step()
        ref = done[0]
        assert out["output_ids"] == ref.output_tokens
        assert logprobs(out) == pytest.approx(ref.log_probs, abs=1e-4)
        meta = out["meta_info"]
        assert [e[1] for e in meta["output_token_logprobs"]] == out["output_ids"]
        assert meta["finish_reason"] == {"type": "length", "length": 24}
        assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (len(prompt), 24, 0)
        assert meta["weight_version"] == "default"
        assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 24}]
    assert len(events(served_engine, "finished")) == 3
    assert served_engine.check()["violations"] == []


# --- pause modes -------------------------------------------------------------------------------------
async def _update_across(
    c: httpx.AsyncClient, served, mode: str, *, k: int, max_new: int, seed: int, flush_first: bool
) -> dict:
    """Generate; after exactly k tokens pause(mode), update to NEW_SEED weights as version 1
    in Miles' order, continue; return the response."""
    await c.post("/harness/step", json={"n": 0})  # hold the engine
    task = asyncio.create_task(c.post("/generate", json=gen_body(max_new, seed)))
    await wait_for(lambda: events(served, "submitted"), "the request to reach the engine")
    assert (await c.post("/harness/step", json={"n": k})).status_code == 200  # admit + k tokens
    assert (await c.post("/pause_generation", json={"mode": mode})).json()["status"] == "ok"
    if flush_first:
        assert (await c.get("/flush_cache")).status_code == 200
    assert (await c.post("/begin_weight_update", json={"selector": "all"})).json()["success"]
    r = await c.post(
        "/update_weights_from_tensor",
        json={
            "serialized_named_tensors": [encode_named_tensors(tiny(NEW_SEED).state_dict())],
            "load_format": None,
            "flush_cache": False,
            "selector": "all",
            "weight_version": "1",
        },
    )
    assert r.status_code == 200 and r.json()["success"], r.text
    assert (await c.post("/update_weight_version", json={"new_version": "1", "abort_all_requests": False})).json()[
        "new_version"
    ] == "1"
    assert (await c.post("/end_weight_update", json={})).json()["success"]
    assert (await c.post("/continue_generation", json={})).json()["status"] == "ok"
    await c.post("/harness/step", json={"n": None})  # run freely
    return (await task).json()


def test_pause_abort_returns_old_version_tokens_only(served_engine):
    async def go():
        async with httpx.AsyncClient(base_url=served_engine.url, timeout=60) as c:
            await c.post("/harness/step", json={"n": 0})
            task = asyncio.create_task(c.post("/generate", json=gen_body(40, 5)))
            await wait_for(lambda: events(served_engine, "submitted"), "the request to reach the engine")
            await c.post("/harness/step", json={"n": 6})
            assert (await c.post("/pause_generation", json={"mode": "abort"})).status_code == 200
            out = (await task).json()
            r = await c.post(
                "/update_weights_from_tensor",
                json={
                    "serialized_named_tensors": [encode_named_tensors(tiny(NEW_SEED).state_dict())],
                    "weight_version": "1",
                },
            )
            assert r.json()["success"]
            await c.post("/continue_generation", json={})
            await c.post("/harness/step", json={"n": None})
            after = (await c.post("/generate", json=gen_body(4, 6))).json()
            return out, after

    out, after = asyncio.run(go())
    meta = out["meta_info"]
    assert meta["finish_reason"]["type"] == "abort"
    assert len(out["output_ids"]) == 6
    assert meta["weight_version"] == "default"
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 6}]
    assert meta["token_versions"] == [[0, 0, 6]]
    assert logprobs(out) == pytest.approx(fresh_logprobs(tiny(OLD_SEED), PROMPT, out["output_ids"]), abs=1e-4)
    assert after["meta_info"]["weight_versions"] == [{"version": "1", "start": 0, "end": 4}]
    assert [e["status"] for e in (e.fields for e in events(served_engine, "finished"))] == ["aborted", "truncated"]
    assert served_engine.check(pause_generation_mode="abort")["violations"] == []


@pytest.mark.parametrize("served_engine", [{"eos_token_id": None, "max_running": 1}], indirect=True)
def test_abort_request_abort_all_ends_every_request_with_its_partial_output(served_engine):
    """What Miles posts after every one-step rollout: one request running with k tokens
    and one waiting both come back ``abort`` with their partial output, inside one abort
    pause; with nothing in flight the same post records nothing."""
    k = 3

    async def go():
        async with httpx.AsyncClient(base_url=served_engine.url, timeout=60) as c:
            before = len(served_engine.trace.events)
            assert (await c.post("/abort_request", json={"abort_all": True})).status_code == 200
            idle_events = len(served_engine.trace.events) - before
            await c.post("/harness/step", json={"n": 0})
            tasks = [asyncio.create_task(c.post("/generate", json=gen_body(20, seed))) for seed in (1, 2)]
            await wait_for(lambda: len(events(served_engine, "submitted")) == 2, "both requests to reach the engine")
            await c.post("/harness/step", json={"n": k})  # max_running=1: one runs k steps, one waits
            assert (await c.post("/abort_request", json={"abort_all": True})).status_code == 200
            outs = [(await t).json() for t in tasks]
            await c.post("/harness/step", json={"n": None})
            after = (await c.post("/generate", json=gen_body(4, 3))).json()  # not left paused
            return idle_events, outs, after

    idle_events, outs, after = asyncio.run(go())
    assert idle_events == 0
    assert [o["meta_info"]["finish_reason"]["type"] for o in outs] == ["abort", "abort"]
    assert sorted(len(o["output_ids"]) for o in outs) == [0, k]
    running = next(o for o in outs if o["output_ids"])
    assert running["meta_info"]["weight_versions"] == [{"version": "default", "start": 0, "end": k}]
    assert logprobs(running) == pytest.approx(fresh_logprobs(tiny(OLD_SEED), PROMPT, running["output_ids"]), abs=1e-4)
    assert after["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    kinds = [
        e.kind for e in served_engine.trace.events if e.kind in ("engine_pause", "aborted", "finished", "engine_resume")
    ]
    assert kinds == ["engine_pause", "aborted", "aborted", "finished", "finished", "engine_resume", "finished"]
    assert [(e["mode"], e["in_flight"]) for e in events(served_engine, "engine_pause")] == [("abort", 2)]
    assert served_engine.check()["violations"] == []


def test_pause_retract_reprefills_under_new_weights(served_engine):
    k, max_new = 5, 30

    async def go():
        async with httpx.AsyncClient(base_url=served_engine.url, timeout=60) as c:
            return await _update_across(c, served_engine, "retract", k=k, max_new=max_new, seed=7, flush_first=True)

    out = asyncio.run(go())
    meta, tokens = out["meta_info"], out["output_ids"]
    assert meta["finish_reason"] == {"type": "length", "length": max_new}
    assert meta["weight_version"] == "1"
    assert meta["weight_versions"] == [
        {"version": "default", "start": 0, "end": k},
        {"version": "1", "start": k, "end": max_new},
    ]
    assert meta["token_versions"] == [[0, 0, k], [1, 1, max_new - k]]
    assert meta["num_retractions"] == 1
    lps = logprobs(out)
    assert lps[:k] == pytest.approx(fresh_logprobs(tiny(OLD_SEED), PROMPT, tokens)[:k], abs=1e-4)
    assert lps[k:] == pytest.approx(fresh_logprobs(tiny(NEW_SEED), PROMPT, tokens)[k:], abs=1e-4)
    admitted = [e.fields for e in events(served_engine, "admitted")]
    assert [(a["version"], a["prefix_tokens"]) for a in admitted] == [(0, len(PROMPT)), (1, len(PROMPT) + k)]
    assert len(events(served_engine, "retracted")) == 1
    assert served_engine.check(pause_generation_mode="retract") == {
        "violations": [],
        "update_order": [],
        "events": len(served_engine.trace.events),
    }


def test_pause_in_place_keeps_old_kv(served_engine):
    k, max_new = 5, 30

    async def go():
        async with httpx.AsyncClient(base_url=served_engine.url, timeout=60) as c:
            return await _update_across(c, served_engine, "in_place", k=k, max_new=max_new, seed=8, flush_first=False)

    out = asyncio.run(go())
    meta, tokens, lps = out["meta_info"], out["output_ids"], logprobs(out)
    assert meta["weight_versions"] == [
        {"version": "default", "start": 0, "end": k},
        {"version": "1", "start": k, "end": max_new},
    ]
    assert meta["token_versions"] == [[0, 0, k], [1, 0, max_new - k]]  # new weights on version-0 KV
    assert meta["num_retractions"] == 0
    # measured: not what a fresh forward under the new weights gives ...
    fresh_new = fresh_logprobs(tiny(NEW_SEED), PROMPT, tokens)[k:]
    assert max(abs(a - b) for a, b in zip(lps[k:], fresh_new)) > 1e-3
    # ... but exactly what the engine gives decoding the new weights on top of the old KV
    core = EngineCore(tiny(OLD_SEED), max_running=1, eos_token_id=None)
    core.add_request("ref", PROMPT, max_new, 1.0, 8)
    for _ in range(k):
        core.step()
    core.pause("in_place")
    core.update_weights(1, tiny(NEW_SEED).state_dict())
    core.resume()
    done = []
    while core.has_work():
        done += core.step()
    assert tokens == done[0].output_tokens
    assert lps == pytest.approx(done[0].log_probs, abs=1e-4)
    # the trace says so: frozen in place, admitted once, and kv_versions flags it under a retract config
    assert [e["mode"] for e in events(served_engine, "paused_req")] == ["in_place"]
    assert len(events(served_engine, "admitted")) == 1
    assert served_engine.check(pause_generation_mode="in_place")["violations"] == []
    assert served_engine.check(pause_generation_mode="in_place")["update_order"] == []
    flagged = served_engine.check(pause_generation_mode="retract")["violations"]
    assert [v["invariant"] for v in flagged] == ["kv_versions"]


def test_flush_refused_while_in_place_requests_are_frozen(served_engine):
    async def go():
        async with httpx.AsyncClient(base_url=served_engine.url, timeout=60) as c:
            await c.post("/harness/step", json={"n": 0})
            task = asyncio.create_task(c.post("/generate", json=gen_body(20, 3)))
            await wait_for(lambda: events(served_engine, "submitted"), "the request to reach the engine")
            await c.post("/harness/step", json={"n": 2})
            await c.post("/pause_generation", json={"mode": "in_place"})
            refused = await c.get("/flush_cache")
            await c.post("/continue_generation", json={})
            await c.post("/harness/step", json={"n": None})
            await task
            return refused, await c.get("/flush_cache")

    refused, idle = asyncio.run(go())
    assert refused.status_code == 400 and "running or waiting requests" in refused.text
    assert idle.status_code == 200


def test_request_during_pause_waits_for_continue(served_engine):
    async def go():
        async with httpx.AsyncClient(base_url=served_engine.url, timeout=60) as c:
            await c.post("/pause_generation", json={"mode": "retract"})
            task = asyncio.create_task(c.post("/generate", json=gen_body(3, 1)))
            await wait_for(
                lambda: any(e["path"] == "/generate" for e in served_engine.request_log), "the generate call to arrive"
            )
            for _ in range(3):  # the server answers other calls meanwhile
                assert (await c.get("/get_weight_version")).json() == {"weight_version": "default"}
            waiting = not task.done() and not events(served_engine, "submitted")
            await c.post("/continue_generation", json={})
            return waiting, (await task).json()

    waiting, out = asyncio.run(go())
    assert waiting
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    kinds = [e.kind for e in served_engine.trace.events]
    assert kinds.index("engine_resume") < kinds.index("submitted")


def test_update_weights_from_disk_and_version_endpoints(served_engine, tmp_path):
    save_weights_dir(tiny(NEW_SEED).state_dict(), tmp_path / "ckpt")

    async def go():
        async with httpx.AsyncClient(base_url=served_engine.url, timeout=60) as c:
            await c.post("/pause_generation", json={"mode": "retract"})
            assert (await c.get("/flush_cache")).status_code == 200
            r = await c.post(
                "/update_weights_from_disk", json={"model_path": str(tmp_path / "ckpt"), "weight_version": "1"}
            )
            assert r.status_code == 200 and r.json()["success"] and r.json()["num_paused_requests"] == 0
            await c.post("/continue_generation", json={})
            out = (await c.post("/generate", json=gen_body(6, 2))).json()
            info = (await c.get("/model_info")).json()
            return out, info, (await c.get("/get_weight_version")).json(), await c.get("/health_generate")

    out, info, version, health = asyncio.run(go())
    assert version == {"weight_version": "1"} and info["weight_version"] == "1"
    assert info["is_generation"] is True and info["max_seq_len"] == TINY_CONTEXT_LENGTH
    assert health.status_code == 200
    assert logprobs(out) == pytest.approx(fresh_logprobs(tiny(NEW_SEED), PROMPT, out["output_ids"]), abs=1e-4)
    assert check_update_order(served_engine.request_log) == []
    assert served_engine.check()["violations"] == []


# --- bad requests -----------------------------------------------------------------------------------
BAD = [
    ("missing input", "POST", "/generate", {"sampling_params": {"max_new_tokens": 2}}, 400, "error"),
    ("input_ids of the wrong type", "POST", "/generate", {"input_ids": "abc"}, 400, "object"),
    (
        "max_new_tokens of the wrong type",
        "POST",
        "/generate",
        {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "x"}},
        400,
        "schema",
    ),
    ("token outside the vocabulary", "POST", "/generate", {"input_ids": [1, 999]}, 400, "error"),
    (
        "prompt longer than the context",
        "POST",
        "/generate",
        {"input_ids": [1] * (TINY_CONTEXT_LENGTH - 10), "sampling_params": {"max_new_tokens": 20}},
        400,
        "error",
    ),
    ("top_p out of range", "POST", "/generate", {"input_ids": [1, 2], "sampling_params": {"top_p": 1.5}}, 400, "error"),
    (
        "unmodelled json_schema",
        "POST",
        "/generate",
        {"input_ids": [1, 2], "sampling_params": {"json_schema": "{}"}},
        400,
        "error",
    ),
    (
        "unknown sampling key",
        "POST",
        "/generate",
        {"input_ids": [1, 2], "sampling_params": {"top_q": 1}},
        400,
        "schema",
    ),
    ("routed experts asked", "POST", "/generate", {"input_ids": [1, 2], "return_routed_experts": True}, 400, "error"),
    ("unknown endpoint", "POST", "/no_such_endpoint", {}, 404, "detail"),
    ("wrong method", "GET", "/generate", None, 405, "detail"),
    ("unknown pause mode", "POST", "/pause_generation", {"mode": "sideways"}, 400, "error"),
    ("end without begin", "POST", "/end_weight_update", {}, 400, "error"),
    ("version missing", "POST", "/update_weight_version", {"abort_all_requests": False}, 400, "object"),
    (
        "tensor payload not base64",
        "POST",
        "/update_weights_from_tensor",
        {"serialized_named_tensors": ["%%%"]},
        400,
        "success",
    ),
    (
        "flattened bucket",
        "POST",
        "/update_weights_from_tensor",
        {"serialized_named_tensors": ["AA=="], "load_format": "flattened_bucket"},
        400,
        "success",
    ),
    ("disk path missing", "POST", "/update_weights_from_disk", {"model_path": "/nonexistent/x"}, 400, "success"),
]


def _message(body: dict, key: str) -> str:
    return {
        "error": lambda: body["error"]["message"],
        "object": lambda: body["message"],
        "schema": lambda: body["error"] if isinstance(body["error"], str) else "",
        "detail": lambda: body["detail"],
        "success": lambda: body["message"],
    }[key]()


def test_bad_requests_get_errors_and_the_server_keeps_serving(served_engine):
    state = tiny(OLD_SEED).state_dict()
    name = next(iter(state))
    wrong_shape = {name: torch.zeros(*[d + 1 for d in state[name].shape])}
    unknown_name = {"not.a.param": torch.zeros(2)}
    with httpx.Client(base_url=served_engine.url, timeout=60) as c:
        cases = list(BAD)
        for what, payload in (
            ("update with a wrong shape", wrong_shape),
            ("update with an unknown name", unknown_name),
        ):
            cases.append(
                (
                    what,
                    "POST",
                    "/update_weights_from_tensor",
                    {"serialized_named_tensors": [encode_named_tensors(payload)]},
                    400,
                    "success",
                )
            )
        for what, method, path, body, status, key in cases:
            r = c.request(method, path, json=body) if body is not None else c.request(method, path)
            assert r.status_code == status, (what, r.status_code, r.text)
            assert _message(r.json(), key), (what, r.text)
            assert c.post("/generate", json=gen_body(2, 1)).status_code == 200, what  # still serving
        raw = c.post("/generate", content=b"{not json", headers={"content-type": "application/json"})
        assert raw.status_code == 400 and raw.json()["object"] == "error"
        assert c.post("/pause_generation", json={"mode": "retract"}).status_code == 200
        again = c.post("/pause_generation", json={"mode": "in_place"})
        assert again.status_code == 400 and "already paused" in again.json()["error"]["message"]
        assert c.post("/begin_weight_update", json={}).status_code == 200
        nested = c.post("/begin_weight_update", json={})
        assert nested.status_code == 400 and "already open" in nested.json()["error"]["message"]
        c.post("/end_weight_update", json={})
        assert c.post("/continue_generation", json={}).status_code == 200
        assert c.get("/health").status_code == 200
        assert c.post("/generate", json=gen_body(3, 2)).json()["meta_info"]["weight_version"] == "default"
    # the refused wrong-shape update changed nothing
    out = httpx.post(f"{served_engine.url}/generate", json=gen_body(4, 9), timeout=60).json()
    assert logprobs(out) == pytest.approx(fresh_logprobs(tiny(OLD_SEED), PROMPT, out["output_ids"]), abs=1e-4)
    assert served_engine.check()["violations"] == []


# --- the update-order check ----------------------------------------------------------------------------
def _log(*calls) -> list[dict]:
    out = []
    for call in calls:
        path, _, mode = call.partition(":")
        out.append({"path": path, "status": 200, "body": {"mode": mode} if mode else {}})
    return out


MILES = [
    "/begin_weight_update",
    "/update_weights_from_tensor",
    "/update_weights_from_tensor",
    "/update_weight_version",
    "/end_weight_update",
    "/continue_generation",
]


def test_update_order_check():
    assert check_update_order(_log("/pause_generation:retract", "/flush_cache", *MILES)) == []
    assert check_update_order(_log("/pause_generation:in_place", *MILES)) == []
    assert (
        check_update_order(
            _log("/pause_generation:retract", "/flush_cache", "/update_weights_from_disk", "/continue_generation")
        )
        == []
    )
    assert check_update_order(_log("/pause_generation:retract", "/flush_cache", "/continue_generation")) == []
    assert check_update_order(_log("/pause_generation:retract", *MILES))  # no flush
    assert check_update_order(_log("/pause_generation:in_place", "/flush_cache", *MILES))
    swapped = [
        "/begin_weight_update",
        "/update_weight_version",
        "/update_weights_from_tensor",
        "/end_weight_update",
        "/continue_generation",
    ]
    assert check_update_order(_log("/pause_generation:abort", "/flush_cache", *swapped))
    assert check_update_order(_log("/update_weights_from_tensor"))  # outside a pause
    assert check_update_order(_log("/pause_generation:retract", "/flush_cache", *MILES[:-1]))  # never continued
    refused_flush = _log("/pause_generation:retract", "/flush_cache", "/flush_cache", *MILES)
    refused_flush[1]["status"] = 400  # a retried flush: the refused try does not count
    assert check_update_order(refused_flush) == []


# --- the command --------------------------------------------------------------------------------------
def test_cli_serve_starts_under_ten_seconds(tmp_path):
    trace = tmp_path / "served.jsonl"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "serve", "--port", "0", "--trace", str(trace)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        line = proc.stdout.readline()  # the command prints it once the server answers
        assert line.startswith("serving http://127.0.0.1:"), line
        url = line.split()[1]
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        startup_s = time.perf_counter() - t0
        out = httpx.post(
            f"{url}/generate", json={"text": "ab", "sampling_params": {"max_new_tokens": 3}}, timeout=30
        ).json()
        assert out["meta_info"]["prompt_tokens"] == 2 and isinstance(out["text"], str)
    finally:
        proc.terminate()
        rest, _ = proc.communicate(timeout=30)
    print(f"miles-harness serve: answered /health {startup_s:.2f} s after launch")
    assert startup_s < 10.0
    assert proc.returncode == 0, rest
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert [x["kind"] for x in lines if x["kind"] in ("submitted", "finished")] == ["submitted", "finished"]
    stored = trace.with_name("served.config.json")
    assert f"its config: {stored}" in rest
    checked = subprocess.run(
        [sys.executable, "-m", "harness.cli", "check-trace", str(trace)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr  # the trace carries its config
    assert f"config: {stored}; checked as a prefix" in checked.stdout


# --- scheduler state, abort by rid, streaming (exact token counts through /harness/step) ------------
def _load(c_sync) -> dict:
    return c_sync.get("/v1/loads").json()["loads"][0]


@pytest.mark.parametrize("mode, running", [("retract", 0), ("in_place", 1)])
def test_loads_show_retract_empties_the_batch_and_in_place_keeps_it(served_engine, mode, running):
    async def go():
        async with httpx.AsyncClient(base_url=served_engine.url, timeout=60) as c:
            await c.post("/harness/step", json={"n": 0})
            task = asyncio.create_task(c.post("/generate", json=gen_body(30, 4, rid="job-a")))
            await wait_for(lambda: events(served_engine, "submitted"), "the request to reach the engine")
            await c.post("/harness/step", json={"n": 3})
            before = (await c.get("/v1/loads")).json()["loads"][0]
            await c.post("/pause_generation", json={"mode": mode})
            during = (await c.get("/v1/loads")).json()["loads"][0]
            await c.post("/continue_generation", json={})
            await c.post("/harness/step", json={"n": None})
            await task
            return before, during

    before, during = asyncio.run(go())
    assert (before["num_running_reqs"], before["harness"]["running_rids"], before["harness"]["paused"]) == (
        1,
        ["job-a"],
        False,
    )
    assert before["num_used_tokens"] == len(PROMPT) + 3 - 1  # the KV holds prompt + output[:-1]
    assert during["num_running_reqs"] == running and during["harness"]["paused"]
    assert during["harness"]["pause_mode"] == mode
    if mode == "retract":
        assert during["harness"]["waiting_rids"] == ["job-a"] and during["queues"]["retracted"] == 1
        assert during["num_used_tokens"] == 0
    assert during["harness"]["free_kv_tokens"] == during["max_total_num_tokens"] - during["num_used_tokens"]


def test_abort_by_rid_returns_exactly_the_tokens_so_far_and_the_trace_checks(served_engine):
    k = 5

    async def go():
        async with httpx.AsyncClient(base_url=served_engine.url, timeout=60) as c:
            await c.post("/harness/step", json={"n": 0})
            tasks = [
                asyncio.create_task(c.post("/generate", json=gen_body(30, s, rid=rid)))
                for s, rid in ((1, "job-1"), (2, "job-10"), (3, "job-1_0"))
            ]
            await wait_for(lambda: len(events(served_engine, "submitted")) == 3, "the requests to reach the engine")
            await c.post("/harness/step", json={"n": k})
            assert (await c.post("/abort_request", json={"rid": "job-1"})).status_code == 200
            assert (await c.post("/abort_request", json={"rid": "job-1"})).status_code == 200  # gone: a no-op
            first = (await tasks[0]).json()
            await c.post("/harness/step", json={"n": None})
            return first, [(await t).json() for t in tasks[1:]]

    first, others = asyncio.run(go())
    meta = first["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["finish_reason"]["message"] == "Aborted"
    assert meta["completion_tokens"] == len(first["output_ids"]) == k
    assert logprobs(first) == pytest.approx(fresh_logprobs(tiny(OLD_SEED), PROMPT, first["output_ids"]), abs=1e-4)
    assert [o["meta_info"]["finish_reason"]["type"] for o in others] == ["length", "length"]
    assert [e["what"] for e in events(served_engine, "fault")] == ["abort_request"]
    assert served_engine.check()["violations"] == []


def test_stream_gets_one_chunk_per_step_and_an_abort_pause_ends_it(served_engine):
    async def go():
        async with httpx.AsyncClient(base_url=served_engine.url, timeout=60) as c:
            await c.post("/harness/step", json={"n": 0})
            chunks: list[dict] = []

            async def read():
                async with c.stream("POST", "/generate", json=gen_body(30, 8, stream=True)) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            chunks.append(line[6:])

            reader = asyncio.create_task(read())
            await wait_for(lambda: events(served_engine, "submitted"), "the request to reach the engine")
            for n in range(1, 4):  # one step at a time: each step's chunk arrives before the next step
                await c.post("/harness/step", json={"n": 1})
                await wait_for(lambda n=n: len(chunks) == n, f"chunk {n}")
            await c.post("/pause_generation", json={"mode": "abort"})
            await reader
            await c.post("/continue_generation", json={})
            await c.post("/harness/step", json={"n": None})
            return chunks

    chunks = asyncio.run(go())
    assert chunks[-1] == "[DONE]"
    outs = [json.loads(c) for c in chunks[:-1]]
    assert [len(o["output_ids"]) for o in outs] == [1, 2, 3, 3]
    assert [o["meta_info"]["finish_reason"] for o in outs[:3]] == [None, None, None]
    assert outs[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert outs[-1]["output_ids"][:2] == outs[1]["output_ids"]
    assert served_engine.check(pause_generation_mode="abort")["violations"] == []
