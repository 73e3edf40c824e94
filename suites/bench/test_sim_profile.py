"""The simulator's deterministic profile: Python bytecodes per simulated sample
(``harness.sim.bytecodes``) on the simulation-speed bench's scenario (fully-async, B = 64,
n = 8), steps 4 to 12.

CPU seconds on a shared host move with nothing changed; this count does not depend on
the host's load (0.2% between checkouts here, from garbage-collector callbacks), so it is
what tells whether a change of the simulator's Python made it cheaper, and
where its work goes. The test checks the committed ``results/bench/sim_profile.json``
against a fresh count: a change that moves the simulator's bytecodes per sample by more
than 1% needs the file made again (``python -m harness.results.regenerate --only
sim_profile``), as a change of the event order needs the golden traces made again.

With ``MILES_HARNESS_WRITE_RESULTS=1`` the profile (plus the git commit, a dirty flag and
the machine) is written to that file instead.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from harness.results.schema import git_info, machine_info, utc_now
from harness.sim.bytecodes import bytecode_profile
from harness.sim.scenario import Scenario
from harness.sim.simulate import simulate
from harness.sim.trainer import SimTrainerConfig
from miles_async_core.config import AsyncConfig

B, N, SHORT, LONG = 64, 8, 4, 12
RESULT_PATH = Path(__file__).resolve().parents[2] / "results/bench/sim_profile.json"
TOLERANCE = 0.01


def _run(steps: int) -> None:
    scenario = Scenario(config=AsyncConfig(rollout_batch_size=B, n_samples_per_prompt=N, fully_async=True,
                                           num_rollout=steps), trainer=SimTrainerConfig(step_base_s=5.0))
    result = simulate(scenario, trace=False)
    assert result.error is None and len(result.history) == steps


@pytest.mark.bench
def test_bytecodes_per_simulated_sample_match_the_committed_profile():
    profile = bytecode_profile(_run, SHORT, LONG, B * N)
    print(f"\n{profile['bytecodes_per_sample']:.1f} bytecodes and {profile['python_calls_per_sample']:.2f} Python "
          f"calls per simulated sample (steps {SHORT} to {LONG}, B = {B}, n = {N}, Python {profile['python']})")
    for f in profile["functions"][:12]:
        print(f"{f['bytecodes_per_sample']:>9.1f} {f['calls_per_sample']:>7.3f}  {f['function']}")
    assert profile["bytecodes_per_sample"] > 0 and profile["functions"]
    if os.environ.get("MILES_HARNESS_WRITE_RESULTS") == "1":
        git = git_info()
        profile.update(bench="sim_profile", created_utc=utc_now(), git_commit=git["commit"] if git else None,
                       git_dirty=git["dirty"] if git else None, machine=machine_info())
        RESULT_PATH.parent.mkdir(parents=True, exist_ok=True)
        RESULT_PATH.write_text(json.dumps(profile, indent=1, sort_keys=True) + "\n")
        return
    committed = json.loads(RESULT_PATH.read_text())
    if committed["python"].rsplit(".", 1)[0] != sys.version.split()[0].rsplit(".", 1)[0]:
        pytest.skip(f"the committed profile is of Python {committed['python']}, this is {sys.version.split()[0]}: "
                    "another minor version compiles other bytecode")
    change = profile["bytecodes_per_sample"] / committed["bytecodes_per_sample"] - 1
    assert abs(change) <= TOLERANCE, (
        f"the simulator executes {profile['bytecodes_per_sample']:.1f} bytecodes per sample, "
        f"{change:+.1%} against the committed {committed['bytecodes_per_sample']:.1f} "
        f"({RESULT_PATH.name}, commit {committed.get('git_commit')}); fix: if the change is meant, make the file "
        "again: python -m harness.results.regenerate --only sim_profile")
