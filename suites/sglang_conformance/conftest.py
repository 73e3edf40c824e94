"""SGLang conformance: what an SGLang client may rely on, checked against any server.

    pytest suites/sglang_conformance --server-url http://HOST:PORT   # any SGLang-shaped server
    pytest suites/sglang_conformance                                  # starts the CPU server here

Written from SGLang's documented and read behaviour (docs/serve.md says which release and
files), not from SGLang's tests. The cases use only SGLang's own routes (no harness
route), text prompts and ``ignore_eos`` where a fixed length is needed, so they run
unchanged against a real SGLang server on a GPU machine. Markers (registered here):

* ``pause_routes``: needs ``/pause_generation`` and ``/continue_generation``;
* ``weight_routes``: needs ``/update_weight_version`` and ``/model_info``'s ``weight_version``.

Deselect them with ``-m "not pause_routes and not weight_routes"`` on a server without
those routes. Against a shared server, the pause cases pause it for a moment each.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterator

import httpx
import pytest

TIMEOUT_S = 120.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pause_routes: needs SGLang's /pause_generation and /continue_generation")
    config.addinivalue_line("markers", "weight_routes: needs /update_weight_version and /model_info weight_version")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--server-url",
        default=None,
        help="SGLang-compatible server to check (default: start the harness's CPU server in-process)",
    )


class Api:
    """A small SGLang client over httpx (what a framework would send)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=TIMEOUT_S)

    def post(self, path: str, body: Any = None) -> httpx.Response:
        return self.http.post(path, json=body if body is not None else {})

    def generate(self, body: dict[str, Any], status: int = 200) -> Any:
        r = self.post("/generate", body)
        assert r.status_code == status, r.text
        return r.json()

    def stream_lines(self, path: str, body: dict[str, Any]) -> Iterator[str]:
        """The ``data:`` payloads of an event stream, in order (``[DONE]`` included)."""
        with self.http.stream("POST", path, json=body) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if line:
                    assert line.startswith("data: "), line
                    yield line[len("data: ") :]

    def stream(self, path: str, body: dict[str, Any]) -> list[Any]:
        """Every chunk as JSON, checking the stream ends with exactly one ``[DONE]``."""
        payloads = list(self.stream_lines(path, body))
        assert payloads and payloads[-1] == "[DONE]" and "[DONE]" not in payloads[:-1], payloads[-3:]
        return [json.loads(p) for p in payloads[:-1]]

    def loads(self) -> dict[str, Any]:
        r = self.http.get("/v1/loads")
        assert r.status_code == 200, r.text
        return r.json()

    def wait_for(self, predicate: Any, what: str, timeout_s: float = 60.0) -> None:
        """Poll the server until ``predicate()`` holds (a bounded wait on a live server)."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
            time.sleep(0.02)

    @staticmethod
    def error_message(body: Any) -> str:
        """The message of any of SGLang's error shapes."""
        if isinstance(body, dict):
            err = body.get("error", body.get("message", body.get("detail")))
            return str(err.get("message")) if isinstance(err, dict) else str(err)
        return str(body)

    def model_name(self) -> str:
        r = self.http.get("/v1/models")
        assert r.status_code == 200, r.text
        return r.json()["data"][0]["id"]


@pytest.fixture(scope="session")
def server_url(request: pytest.FixtureRequest) -> Iterator[str]:
    url = request.config.getoption("--server-url", default=None)
    if url:
        yield url
        return
    from harness.serve.server import serve_in_thread

    with serve_in_thread("tiny") as served:
        yield served.url


@pytest.fixture(scope="session")
def api(server_url: str) -> Iterator[Api]:
    client = Api(server_url)
    yield client
    client.http.close()
