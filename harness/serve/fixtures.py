"""pytest fixtures for the served engine (registered by the harness pytest plugin).

* ``serve_factory``: ``start(model="tiny", **build_engine_kwargs) -> RunningServer`` on a
  free 127.0.0.1 port; every server it started is stopped at teardown.
* ``served_engine``: one tiny-model server (``eos_token_id=None``: requests run to
  their ``max_new_tokens``), for a test that needs just one. Parametrize it indirectly
  with a dict of ``build_engine`` keyword arguments to change that.

Importing this module costs nothing: the web stack and torch load when a fixture runs.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest


@pytest.fixture
def serve_factory() -> Iterator[Callable[..., Any]]:
    from harness.serve.server import serve_in_thread

    started: list[Any] = []

    def start(model: str = "tiny", **kwargs: Any) -> Any:
        served = serve_in_thread(model, **kwargs)
        started.append(served)
        return served

    try:
        yield start
    finally:
        for served in reversed(started):
            served.stop()


@pytest.fixture
def served_engine(request: pytest.FixtureRequest, serve_factory: Callable[..., Any]) -> Any:
    kwargs = dict(getattr(request, "param", None) or {"eos_token_id": None})
    return serve_factory(kwargs.pop("model", "tiny"), **kwargs)
