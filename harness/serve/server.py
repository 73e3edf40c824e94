"""Start and stop the server: ``build_host`` (the model behind it), ``ServedEngine``
(uvicorn on a background thread, on a free port by default) and ``serve_in_thread``.

    from harness.serve.server import serve_in_thread

    with serve_in_thread(model="tiny") as served:
        requests.post(f"{served.url}/generate", json={"input_ids": [1, 5, 6], ...})
        assert not served.check()["violations"]

``served.trace`` / ``served.request_log`` are the live trace and HTTP log; the pytest
fixture ``served_engine`` (``harness.serve.fixtures``) wraps the same.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from miles_async_core.errors import ConfigError

from .engine import EngineHost

_DEFAULT = object()


def build_host(model: str = "tiny", *, seed: int = 0, max_running: int = 16, eos_token_id: Any = _DEFAULT,
               weight_version: str = "default", device: str = "cpu", tiny_config: Any = None) -> EngineHost:
    """An ``EngineHost`` over ``model``: ``tiny`` (``TinyLM`` sized for the harness's char
    tokenizer, seeded by ``seed``), ``smollm2`` (the packaged GGUF) or a local HF directory.
    ``eos_token_id`` defaults to the tokenizer's; pass ``None`` to never stop early."""
    from harness.backends.torch_engine import EngineCore
    from harness.backends import torch_models as tm

    if model == "tiny":
        from harness.backends.tasks import TINY_TOKENIZER

        cfg = tiny_config or tm.TinyLMConfig(vocab_size=TINY_TOKENIZER.vocab_size, seed=seed)
        engine_model, tokenizer = tm.build_tiny_lm(cfg, device=device), TINY_TOKENIZER
    elif model == "smollm2":
        engine_model, tokenizer = tm.load_smollm2(device=device), tm.load_smollm2_tokenizer()
    else:
        engine_model = tm.load_hf_dir(model, device=device)
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model)
        except Exception:  # a weights-only directory: input_ids still work, text does not
            tokenizer = None
    eos = getattr(tokenizer, "eos_token_id", None) if eos_token_id is _DEFAULT else eos_token_id
    initial = int(weight_version) if str(weight_version).isdigit() else 0
    core = EngineCore(engine_model, max_running=max_running, eos_token_id=eos, version=initial)
    return EngineHost(core, tokenizer=tokenizer, model_path=model, weight_version=weight_version, seed=seed)


def check_served(host: EngineHost, *, pause_generation_mode: str = "retract", fully_async: bool = False,
                 complete: bool = False) -> dict[str, Any]:
    """Every applicable trace invariant on the served run so far, and the update order."""
    from miles_async_core.config import AsyncConfig
    from harness.checking.invariants import check_all

    from .order import check_update_order

    config = AsyncConfig(pause_generation_mode=pause_generation_mode, fully_async=fully_async)
    with host.sink.lock:
        events = list(host.trace.events)
    violations = check_all(events, config, complete=complete)
    return {"violations": [{"invariant": v.invariant, "message": v.message} for v in violations],
            "update_order": check_update_order(list(host.request_log)), "events": len(events)}


class ServedEngine:
    """uvicorn serving ``create_app(host)`` on a background thread."""

    def __init__(self, host: EngineHost, *, bind: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        import uvicorn

        from .app import create_app

        self.host = host
        self.bind = bind
        self.config = uvicorn.Config(create_app(host), host=bind, port=port, log_level=log_level, lifespan="on",
                                     access_log=False, timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(self.config)
        self.thread: threading.Thread | None = None
        self.port: int | None = None
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://{self.bind}:{self.port}"

    @property
    def trace(self):
        return self.host.trace

    @property
    def request_log(self) -> list[dict[str, Any]]:
        return self.host.request_log

    def check(self, **kwargs: Any) -> dict[str, Any]:
        return check_served(self.host, **kwargs)

    def start(self, timeout_s: float = 30.0) -> "ServedEngine":
        t0 = time.perf_counter()
        self.thread = threading.Thread(target=self.server.run, name="serve-http", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:  # bounded wait for uvicorn's own readiness flag
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ConfigError(f"the server did not start within {timeout_s} s on {self.bind}:{self.config.port} "
                                  "(port taken? see the log above). Fix: pass another --port or 0 for a free one.")
            self.thread.join(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.startup_s = time.perf_counter() - t0
        return self

    def stop(self) -> None:
        if self.thread is None:
            return
        loop = self.host._loop
        if self.server.started and loop is not None and self.host.alive:
            try:  # end every request so no HTTP call hangs the shutdown
                asyncio.run_coroutine_threadsafe(self.host.abort_everything(), loop).result(10)
            except Exception:
                pass
        self.server.should_exit = True
        self.thread.join(30)
        self.thread = None

    def __enter__(self) -> "ServedEngine":
        return self.start() if self.thread is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_in_thread(model: str = "tiny", *, bind: str = "127.0.0.1", port: int = 0, **host_kwargs: Any) -> ServedEngine:
    """A started ``ServedEngine`` (use it as a context manager to stop it)."""
    return ServedEngine(build_host(model, **host_kwargs), bind=bind, port=port).start()
