"""Golden trace: a fixed scenario's trace is committed under fixtures/golden and must
be reproduced exactly (as torchtitan's golden loss files pin numerics).

To regenerate after an intended behaviour change:
    UPDATE_GOLDEN=1 python -m pytest suites/harness/test_golden_trace.py
and explain the change in the commit message.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.sim.scenario import load_scenario
from harness.sim.run_scenario import simulate
from harness.trace import write_jsonl

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "fixtures/scenarios/golden_fully_async.toml"
GOLDEN = ROOT / "fixtures/golden/fully_async_trace.jsonl"


def test_golden_trace_is_reproduced_event_for_event(tmp_path):
    result = simulate(load_scenario(SCENARIO))
    assert result.error is None
    out = tmp_path / "trace.jsonl"
    write_jsonl(result.events, out)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(out.read_text())
    expected = GOLDEN.read_text().splitlines()
    actual = out.read_text().splitlines()
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a == e, f"first difference at trace line {i + 1}:\n  expected {e}\n  actual   {a}"
    assert len(actual) == len(expected)


def test_golden_scenario_exercises_what_it_claims():
    kinds = {json.loads(line)["kind"] for line in GOLDEN.read_text().splitlines()}
    assert {"retracted", "stale_rejected", "recycled", "put_blocked", "trained", "run_end"} <= kinds


def test_same_seed_same_trace_and_another_seed_differs():
    scenario = load_scenario(SCENARIO)
    a = [e.to_json() for e in simulate(scenario).events]
    b = [e.to_json() for e in simulate(scenario).events]
    assert a == b
    import dataclasses

    other = dataclasses.replace(scenario, engine=dataclasses.replace(scenario.engine, seed=12))
    assert [e.to_json() for e in simulate(other).events] != a
