"""``UvicornThread``: one ASGI app served by uvicorn on a background thread.

Used for the served engine (``server.RunningServer``) and for upstream's ``MilesRouter``
in the end-to-end runs (``upstream_e2e``). ``start`` returns once uvicorn says it is
serving (its own ``started`` flag, a bounded wait), with ``port`` the one the system
chose when ``port=0``; ``stop`` asks uvicorn to exit and joins the thread.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from miles_async_core.errors import ConfigError


class UvicornThread:
    def __init__(
        self, app: Any, *, bind: str = "127.0.0.1", port: int = 0, name: str = "serve-http", log_level: str = "warning"
    ) -> None:
        import uvicorn

        self.bind = bind
        self.name = name
        self.config = uvicorn.Config(
            app, host=bind, port=port, log_level=log_level, lifespan="on", access_log=False, timeout_graceful_shutdown=5
        )
        self.server = uvicorn.Server(self.config)
        self.thread: threading.Thread | None = None
        self.port: int | None = None
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://{self.bind}:{self.port}"

    @property
    def started(self) -> bool:
        return self.thread is not None and self.server.started

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(self, timeout_s: float = 30.0) -> "UvicornThread":
        t0 = time.perf_counter()
        self.thread = threading.Thread(target=self.server.run, name=self.name, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:  # bounded wait for uvicorn's own readiness flag
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ConfigError(
                    f"{self.name} did not start within {timeout_s} s on {self.bind}:{self.config.port} "
                    "(port taken? see the log above). Fix: pass another --port or 0 for a free one."
                )
            self.thread.join(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.startup_s = time.perf_counter() - t0
        return self

    def stop(self) -> None:
        if self.thread is None:
            return
        self.server.should_exit = True
        self.thread.join(30)
        self.thread = None
