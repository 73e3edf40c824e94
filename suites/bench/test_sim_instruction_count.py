"""The simulator's machine instructions per simulated sample under valgrind's cachegrind
(``harness.results.sim_instructions``: the simulation-speed scenario, steps 8 to 40),
against the count committed in ``results/bench/sim_instructions.json`` (its HEAD side).

The bytecode profile (``test_sim_profile.py``) does not see the C work behind a bytecode,
and on CPython 3.11 that is where a few lines can cost several percent: a class attribute
read through the enum metaclass' ``__getattr__`` hook, a negative ``isinstance`` that
looks up ``__class__``, ``int()`` of a string. Instructions repeat to about 0.01% between
runs of the same code, whatever the host's load, so a change that moves them by more than
2% needs the file made again (``python -m harness.results.regenerate --only
sim_instructions``), as a change of the bytecodes needs the profile made again.
"""

from __future__ import annotations

import json
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.results.sim_ab import ROOT
from harness.results.sim_instructions import _count, per_sample

RESULT_PATH = Path(__file__).resolve().parents[2] / "results/bench/sim_instructions.json"
TOLERANCE = 0.02


@pytest.mark.bench
def test_instructions_per_simulated_sample_match_the_committed_count():
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not on PATH (the count runs the simulation under cachegrind); "
                    "fix: apt install valgrind")
    committed = json.loads(RESULT_PATH.read_text())
    if committed["python"].rsplit(".", 1)[0] != sys.version.split()[0].rsplit(".", 1)[0]:
        pytest.skip(f"the committed count is of Python {committed['python']}, this is {sys.version.split()[0]}: "
                    "another minor version executes other instructions")
    short, long = committed["short_steps"], committed["long_steps"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        counts = list(pool.map(lambda steps: _count(ROOT, steps), (short, long)))
    got = per_sample(counts[0], counts[1], long - short)["instructions"]
    want = committed["per_sample"]["head"]["instructions"]
    print(f"\n{got:,.1f} instructions per simulated sample (steps {short} to {long}); committed {want:,.1f} "
          f"at {committed['head_commit'][:7]}")
    change = got / want - 1
    assert abs(change) <= TOLERANCE, (
        f"the simulator executes {got:,.1f} instructions per sample, {change:+.1%} against the committed "
        f"{want:,.1f} ({RESULT_PATH.name}, commit {committed['head_commit'][:7]}); fix: if the change is meant, "
        "make the file again: python -m harness.results.regenerate --only sim_instructions")
