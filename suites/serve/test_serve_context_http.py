"""``--context-length`` and pacing through a real server: SGLang's status and error shape
for a request over the context (plain and streaming), ``/v1/loads`` and ``/model_info``
consistent with the setting, the widening KV pool giving the same tokens as a pool as
wide as the context from the start, and the paced rate measured against its setting."""

from __future__ import annotations

import json
import sys
import time

import httpx
import pytest

from harness.backends.torch_engine import EngineCore
from harness.backends.torch_models import build_tiny_lm
from harness.serve.pacing import Pacing
from harness.serve.served_core import KV_CHUNK, ServedCore
from harness.serve.server import SWITCH_INTERVAL_S, TINY_CONTEXT_LENGTH, tiny_model_config

pytestmark = [pytest.mark.http, pytest.mark.model]


def test_a_request_over_the_context_gets_sglangs_error_plain_and_streaming(serve_factory):
    served = serve_factory("tiny", context_length=64)
    with httpx.Client(base_url=served.url, timeout=60) as c:
        body = {"input_ids": list(range(3, 13)), "sampling_params": {"max_new_tokens": 54}}
        r = c.post("/generate", json=body)
        assert r.status_code == 400
        assert r.json() == {"error": {"message": r.json()["error"]["message"]}}
        assert r.json()["error"]["message"].startswith(
            "Requested token count exceeds the model's maximum context length of 64 tokens. You requested a total "
            "of 64 tokens: 10 tokens from the input messages and 54 tokens for the completion."
        )
        r = c.post("/generate", json=dict(body, stream=True))
        assert r.status_code == 200  # SGLang checks inside the stream: one error event, then [DONE]
        lines = [line for line in r.text.splitlines() if line]
        assert lines[-1] == "data: [DONE]" and len(lines) == 2
        err = json.loads(lines[0][len("data: ") :])["error"]
        assert err["code"] == 400 and err["message"].startswith("Requested token count exceeds")
        r = c.post("/generate", json={"input_ids": [5] * 64, "sampling_params": {"max_new_tokens": 1}})
        assert r.status_code == 400 and "The input (64 tokens) is longer" in r.json()["error"]["message"]
        ok = c.post("/generate", json=dict(body, sampling_params={"max_new_tokens": 53, "ignore_eos": True}))
        assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 53
        assert c.get("/model_info").json()["max_seq_len"] == 64
        assert c.get("/v1/loads").json()["loads"][0]["max_total_num_tokens"] == 16 * 64
        assert c.get("/server_info").json()["context_length"] == 64
        assert c.get("/v1/models").json()["data"][0]["max_model_len"] == 64


def test_the_default_tiny_context_fits_sglangs_long_requests(serve_factory):
    before = sys.getswitchinterval()
    served = serve_factory("tiny", eos_token_id=None)
    assert sys.getswitchinterval() == SWITCH_INTERVAL_S  # while it serves (restored by stop, below)
    with httpx.Client(base_url=served.url, timeout=120) as c:
        assert c.get("/model_info").json()["max_seq_len"] == TINY_CONTEXT_LENGTH >= 4096
        out = c.post(
            "/generate", json={"text": "Tell a long story.", "sampling_params": {"max_new_tokens": 1500, "n": 3}}
        ).json()
        assert [o["meta_info"]["completion_tokens"] for o in out] == [1500] * 3
    assert served.engine.core.model.cache_len() == 3 * KV_CHUNK  # widened in steps to the ~1,520 positions used
    served.stop()
    assert sys.getswitchinterval() == before


def test_a_widening_kv_pool_gives_the_tokens_of_a_full_width_one():
    cfg = tiny_model_config(3, context_length=2048)
    narrow, wide = ServedCore(build_tiny_lm(cfg), max_running=4), EngineCore(build_tiny_lm(cfg), max_running=4)
    assert narrow.model.cache_len() == KV_CHUNK and wide.model.cache_len() == 2048
    prompts = [[1, 5, 9], [2] * (KV_CHUNK + 20), [7, 7], [4] * 40]
    results = []
    for core in (narrow, wide):
        for i, p in enumerate(prompts):
            core.add_request(i, p, 700, 1.0, seed=i)
        done = []
        while core.has_work():
            done += core.step()
        results.append({d.req_id: (d.output_tokens, d.log_probs) for d in done})
    assert results[0] == results[1]
    assert narrow.model.cache_len() == 3 * KV_CHUNK  # 532 + 700 positions at most, in 512-steps


@pytest.mark.parametrize("rate", [10.0, 25.0])
def test_paced_decoding_holds_each_request_to_the_set_rate(serve_factory, rate):
    """Three concurrent streams of ``4 * rate`` tokens (4 s each); each one's rate from
    its first to its last chunk is never above the setting and at most 10 % below it.
    The rates are ones the tiny model beats many times over even on a 2-core machine
    at a load average of 10 (pacing only slows: a step that computes past its budget is
    not made up, so a CPU that falls behind shows as a lower rate)."""
    served = serve_factory("tiny", eos_token_id=None, pacing=Pacing(decode_tokens_per_s=rate))
    n_tokens = int(4 * rate)

    def one(i: int) -> float:
        times = []
        with httpx.Client(base_url=served.url, timeout=120) as c:
            with c.stream(
                "POST",
                "/generate",
                json={
                    "input_ids": [5, 6, 7],
                    "stream": True,
                    "sampling_params": {"max_new_tokens": n_tokens, "ignore_eos": True, "sampling_seed": i},
                },
            ) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        times.append((time.perf_counter(), json.loads(line[6:])["meta_info"]["completion_tokens"]))
        (t0, k0), (t1, k1) = times[0], times[-1]
        return (k1 - k0) / (t1 - t0)

    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(3) as pool:
        rates = list(pool.map(one, range(3)))
    print(f"\npaced at {rate} tokens/s per request: achieved {[round(r, 1) for r in rates]}")
    assert all(rate * 0.90 <= r <= rate * 1.02 for r in rates), rates
