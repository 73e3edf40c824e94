"""The simulator's reference loop and its speed path give byte-identical traces.

``$MILES_HARNESS_SIM_SPEED`` picks the loop ``run_virtual`` makes (``harness.sim.vtime``):
``plain``, asyncio's own loop on a virtual clock, or ``fast`` (``harness.sim.vtime_fast``).
Every pinned scenario (the golden one and each cross-Python run) runs on both: the JSONL
traces must be the same bytes, and the ones stored in ``fixtures/golden``.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from fixtures.golden_runs import CROSS_PYTHON_RUNS, GOLDEN_SCENARIO, ROOT, cross_python_scenario
from harness.sim import vtime
from harness.sim.faults import run_with_faults
from harness.sim.run_scenario import simulate
from harness.sim.scenario import load_scenario
from harness.sim.vtime_fast import FastVirtualTimeLoop
from harness.trace import write_jsonl

SCENARIOS = ["golden", *CROSS_PYTHON_RUNS]
GOLDEN_TRACE = ROOT / "fixtures/golden/fully_async_trace.jsonl"
DIGESTS = ROOT / "fixtures/golden/cross_python_traces.json"


def _trace(name: str, speed: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> bytes:
    monkeypatch.setenv(vtime.SPEED_ENV, speed)
    if name == "golden":  # as test_golden_trace.py runs it
        events = simulate(load_scenario(GOLDEN_SCENARIO)).events
    else:  # as test_cross_python_traces.py runs it
        events = run_with_faults(*cross_python_scenario(name)).events
    path = tmp_path / f"{name}-{speed}.jsonl"
    write_jsonl(events, path)
    return path.read_bytes()


def _stored(name: str) -> str:
    """The SHA-256 of the stored trace of ``name``."""
    if name == "golden":
        return hashlib.sha256(GOLDEN_TRACE.read_bytes()).hexdigest()
    return str(json.loads(DIGESTS.read_text())[name]["sha256"])


@pytest.mark.parametrize("name", SCENARIOS)
def test_plain_and_fast_loops_give_the_same_trace(name, monkeypatch, tmp_path):
    plain = _trace(name, "plain", monkeypatch, tmp_path)
    fast = _trace(name, "fast", monkeypatch, tmp_path)
    assert plain.count(b"\n") > 20  # a real run, not an empty trace
    assert plain == fast
    assert hashlib.sha256(plain).hexdigest() == _stored(name)


def test_the_switch_picks_the_loop(monkeypatch):
    monkeypatch.setenv(vtime.SPEED_ENV, "plain")
    assert vtime.loop_class() is vtime.VirtualTimeLoop
    monkeypatch.delenv(vtime.SPEED_ENV)
    assert vtime.loop_class() is FastVirtualTimeLoop
    monkeypatch.setenv(vtime.SPEED_ENV, "turbo")
    with pytest.raises(ValueError, match="MILES_HARNESS_SIM_SPEED='turbo': allowed fast, plain"):
        vtime.loop_class()


def test_the_plain_loop_runs_asyncios_own_iteration():
    """The reference loop overrides none of asyncio's scheduling."""
    for name in ("_run_once", "call_soon", "call_at", "_write_to_self"):
        assert name not in vars(vtime.VirtualTimeLoop)
