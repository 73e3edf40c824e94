"""The simulator's machine instructions per simulated sample under valgrind's cachegrind
(``harness.results.sim_instructions``): the measurement works on this tree.

The bytecode profile (``test_sim_profile.py``) does not see the C work behind a bytecode,
and on CPython 3.11 that is where a few lines can cost several percent: a class attribute
read through the enum metaclass' ``__getattr__`` hook, a negative ``isinstance`` that
looks up ``__class__``, ``int()`` of a string. The count itself, at a base commit and at
HEAD side by side, is a ``make results`` step (``python -m harness.results.regenerate
--only sim_instructions``, minutes under valgrind) that writes
``results/bench/sim_instructions.json``; nothing holds the simulator to it. This test runs
the same count on a few steps of the same scenario and checks that it gives a positive,
plausible figure per sample, and prints it next to the committed one.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.results.sim_ab import ROOT
from harness.results.sim_instructions import count_at, per_sample

pytestmark = [pytest.mark.bench, pytest.mark.valgrind]

RESULT_PATH = Path(__file__).resolve().parents[2] / "results/bench/sim_instructions.json"
SHORT, LONG = 2, 6  # steps: the difference is 4 steps of B * n samples, seconds under valgrind
# one simulated sample is about a hundred thousand instructions: a figure off by a factor of
# 30 either way means the difference of the two runs measured something else
PLAUSIBLE = (3_000.0, 3_000_000.0)


def test_instructions_per_simulated_sample_are_measured():
    if shutil.which("valgrind") is None:
        pytest.skip(
            "valgrind is not on PATH (the count runs the simulation under cachegrind); fix: apt install valgrind"
        )
    with ThreadPoolExecutor(max_workers=2) as pool:
        short, long = pool.map(lambda steps: count_at(ROOT, steps), (SHORT, LONG))
    assert long["instructions"] > short["instructions"] > 0 and long["ll_misses"] >= short["ll_misses"] >= 0
    got = per_sample(short, long, LONG - SHORT)
    committed = json.loads(RESULT_PATH.read_text())["per_sample"]["head"] if RESULT_PATH.exists() else None
    against = (
        f"the committed count (steps 8 to 40) is {committed['instructions']:,.1f}"
        if committed
        else "no committed count"
    )
    print(
        f"\n{got['instructions']:,.1f} instructions and {got['ll_misses']:,.1f} last-level misses per simulated "
        f"sample (steps {SHORT} to {LONG}); {against}"
    )
    assert PLAUSIBLE[0] < got["instructions"] < PLAUSIBLE[1], got
