"""The plugin's guard against CPython 3.11's spurious SystemError in ast.parse during
hypothesis' function digest (see ``harness.pytest_plugin._guard_hypothesis_digest``)."""

from __future__ import annotations

import inspect
import sys

import pytest


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the guard is installed on CPython 3.11 only")
def test_a_systemerror_from_getsource_falls_back_to_a_stable_name_digest(monkeypatch):
    import hypothesis.stateful
    from hypothesis.internal import reflection

    def f() -> None:
        return None

    good = hypothesis.stateful.function_digest(f)

    def broken(obj):
        raise SystemError("AST constructor recursion depth mismatch (before=135, after=188)")

    monkeypatch.setattr(inspect, "getsource", broken)
    first = hypothesis.stateful.function_digest(f)
    assert first == hypothesis.stateful.function_digest(f) and first != good
    assert reflection.function_digest is hypothesis.stateful.function_digest
