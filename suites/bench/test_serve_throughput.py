"""Throughput of the served CPU engine over HTTP: 16 concurrent ``/generate`` requests,
streaming and not, side by side in one run, next to the same requests on the engine
core called directly (no HTTP, no engine thread).

Each round: 16 requests from 16 concurrent clients (httpx, one event loop), prompt of
8 tokens, 64 new tokens each (``ignore_eos``), temperature 1, seeded per request; the
three ways alternate within each round after one warm-up round each. Tokens/s is the
round's generated tokens over its wall time; medians over ``ROUNDS`` rounds and the
ratios (streaming / non-streaming, HTTP / direct) come from this one run. Two more ways
send long outputs with a stop string (4 requests of 400 tokens, ``stop: ["QQ"]``, which
the model does not produce), plain and streaming: what the stop-string check and the
stream's text cost per token as an output grows. Each figure is also given per CPU
second of this process (``time.process_time``: the server, its engine thread and the
client together), which other work on a shared machine disturbs far less than wall
time. Prints a table,
then one JSON document on the last line; with ``MILES_HARNESS_WRITE_RESULTS=1`` the
document is also written to ``results/bench/serve_throughput.json``. Asserts only token
accounting (every request got its 64 tokens, every stream ended with ``[DONE]``).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import httpx
import pytest

from harness.results.schema import git_info, machine_info, utc_now
from harness.serve.sampling import SamplingOptions
from harness.serve.served_core import ServedCore
from harness.serve.server import serve_in_thread

pytestmark = [pytest.mark.bench, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CONCURRENT = 16
NEW_TOKENS = 64
ROUNDS = 5
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


LONG_CONCURRENT, LONG_TOKENS = 4, 400


def body(i: int, stream: bool, new_tokens: int = NEW_TOKENS, stop: bool = False) -> dict:
    params = {"max_new_tokens": new_tokens, "ignore_eos": True, "sampling_seed": i}
    if stop:
        params["stop"] = ["QQ"]
    return {"input_ids": PROMPT, "stream": stream, "sampling_params": params}


async def http_round(
    url: str, stream: bool, concurrent: int = CONCURRENT, new_tokens: int = NEW_TOKENS, stop: bool = False
) -> int:
    async def one(c: httpx.AsyncClient, i: int) -> int:
        if not stream:
            r = await c.post("/generate", json=body(i, False, new_tokens, stop))
            assert r.status_code == 200, r.text
            return r.json()["meta_info"]["completion_tokens"]
        last, done = None, False
        async with c.stream("POST", "/generate", json=body(i, True, new_tokens, stop)) as r:
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    last = line
        assert done and last is not None
        return json.loads(last[len("data: ") :])["meta_info"]["completion_tokens"]

    limits = httpx.Limits(max_connections=concurrent)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as c:
        return sum(await asyncio.gather(*[one(c, i) for i in range(concurrent)]))


def direct_round(core: ServedCore) -> int:
    opts = SamplingOptions(max_new_tokens=NEW_TOKENS)
    for i in range(CONCURRENT):
        core.add_request(i, PROMPT, NEW_TOKENS, 1.0, i, options=opts)
    tokens = 0
    while core.has_work():
        tokens += sum(len(d.output_tokens) for d in core.step())
    return tokens


def test_serve_throughput_streaming_and_not(one_torch_thread):
    from harness.backends.torch_models import build_tiny_lm
    from harness.serve.server import tiny_model_config

    core = ServedCore(build_tiny_lm(tiny_model_config(0)), max_running=CONCURRENT, eos_token_id=None)
    samples: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    short, long = CONCURRENT * NEW_TOKENS, LONG_CONCURRENT * LONG_TOKENS
    with serve_in_thread("tiny", eos_token_id=None, max_running=CONCURRENT) as served:
        ways = {
            "direct": (lambda: direct_round(core), short),
            "http": (lambda: asyncio.run(http_round(served.url, False)), short),
            "http_stream": (lambda: asyncio.run(http_round(served.url, True)), short),
            "long_http_stop": (
                lambda: asyncio.run(http_round(served.url, False, LONG_CONCURRENT, LONG_TOKENS, True)),
                long,
            ),
            "long_http_stream_stop": (
                lambda: asyncio.run(http_round(served.url, True, LONG_CONCURRENT, LONG_TOKENS, True)),
                long,
            ),
        }
        for fn, expected in ways.values():  # warm-up
            assert fn() == expected
        for _ in range(ROUNDS):
            for name, (fn, expected) in ways.items():
                t0, c0 = time.perf_counter(), time.process_time()
                tokens = fn()
                samples.setdefault(name, []).append(tokens / (time.perf_counter() - t0))
                cpu.setdefault(name, []).append(tokens / (time.process_time() - c0))
                assert tokens == expected
    med = {k: statistics.median(v) for k, v in samples.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    ratios = {
        "http_stream_over_http": med["http_stream"] / med["http"],
        "http_over_direct": med["http"] / med["direct"],
        "http_stream_over_direct": med["http_stream"] / med["direct"],
        "cpu_http_stream_over_http": med_cpu["http_stream"] / med_cpu["http"],
        "cpu_http_over_direct": med_cpu["http"] / med_cpu["direct"],
    }
    print(
        f"\n{CONCURRENT} x {NEW_TOKENS} tokens ({LONG_CONCURRENT} x {LONG_TOKENS} for long_*), {ROUNDS} rounds, "
        "median tokens/s (wall) and tokens per CPU second"
    )
    for name, value in med.items():
        print(
            f"  {name:<22} {value:8.0f} tok/s {med_cpu[name]:8.0f} tok/cpu-s   "
            f"(rounds: {', '.join(f'{s:.0f}' for s in samples[name])})"
        )
    for name, value in ratios.items():
        print(f"  {name:<26} {value:6.3f}")
    doc = {
        "name": "serve_throughput",
        "when": utc_now(),
        "git": git_info(),
        "machine": machine_info(),
        "concurrent": CONCURRENT,
        "new_tokens": NEW_TOKENS,
        "long_concurrent": LONG_CONCURRENT,
        "long_tokens": LONG_TOKENS,
        "rounds": ROUNDS,
        "tokens_per_s": samples,
        "tokens_per_cpu_s": cpu,
        "median_tokens_per_s": med,
        "median_tokens_per_cpu_s": med_cpu,
        "ratios": ratios,
    }
    if os.environ.get("MILES_HARNESS_WRITE_RESULTS") == "1":
        out = ROOT / "results" / "bench" / "serve_throughput.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc))
