"""The determinism claim, tested: the same scenario and seed give a byte-identical trace
on every supported Python minor (3.11, 3.12, 3.13), not only within one.

Each run below is a fixed scenario (every driver, every pause mode, both submission
granularities, staleness with retry and drop, each kind of fault); its trace's SHA-256
(the JSONL text ``write_jsonl`` writes) is stored in ``fixtures/golden/cross_python_traces.json``,
made on one Python and checked on each of them (``.ci/other_pythons.sh`` runs this file on 3.12
and 3.13). A difference means the trace order depends on the Python version, which the
project rules out (``miles_async_core.collect`` is the case that did).

To regenerate after an intended behaviour change:
    UPDATE_GOLDEN=1 python -m pytest suites/harness/test_cross_python_traces.py
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from fixtures.golden_runs import CROSS_PYTHON_RUNS as RUNS
from fixtures.golden_runs import cross_python_scenario
from harness.sim.faults import run_with_faults
from harness.trace import write_jsonl

ROOT = Path(__file__).resolve().parents[2]
DIGESTS = ROOT / "fixtures/golden/cross_python_traces.json"


def _trace_digest(name: str, tmp_path: Path) -> tuple[str, int]:
    scenario, faults = cross_python_scenario(name)
    out = run_with_faults(scenario, faults)
    path = tmp_path / f"{name}.jsonl"
    write_jsonl(out.events, path)
    return hashlib.sha256(path.read_bytes()).hexdigest(), len(out.events)


def test_every_run_gives_the_stored_trace_on_this_python(tmp_path):
    got = {name: _trace_digest(name, tmp_path) for name in RUNS}
    if os.environ.get("UPDATE_GOLDEN"):
        DIGESTS.write_text(
            json.dumps({n: {"sha256": d, "events": k} for n, (d, k) in got.items()}, indent=1, sort_keys=True) + "\n"
        )
    stored = json.loads(DIGESTS.read_text())
    assert set(stored) == set(RUNS), "regenerate the digests: UPDATE_GOLDEN=1 (see the module docstring)"
    differ = [
        f"{n}: {k} events, sha256 {d[:12]} (stored {stored[n]['events']} events, {stored[n]['sha256'][:12]})"
        for n, (d, k) in got.items()
        if d != stored[n]["sha256"]
    ]
    assert not differ, "traces differ from the stored ones on this Python:\n" + "\n".join(differ)


def test_the_runs_cover_what_they_claim(tmp_path):
    """Each fault kind happens in its run, so a trace digest covers its handling."""
    kinds = {}
    for name in ("fa-injected-abort", "fa-abort-storm", "fa-worker-crash", "one-step-cancel"):
        sc, faults = cross_python_scenario(name)
        kinds[name] = {e.get("what") for e in run_with_faults(sc, faults).events if e.kind == "fault"}
    assert "injected_abort" in kinds["fa-injected-abort"] and "abort_storm" in kinds["fa-abort-storm"]
    assert "worker_crash" in kinds["fa-worker-crash"] and "cancel" in kinds["one-step-cancel"]
