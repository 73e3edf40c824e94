"""The simulator's deterministic profile: Python bytecodes per simulated sample
(``harness.sim.bytecodes``) on the simulation-speed bench's scenario (fully-async, B = 64,
n = 8), steps 4 to 12.

CPU seconds on a shared host move with nothing changed; this count does not depend on
the host's load, so it is what tells whether a change of the simulator's Python made it
cheaper, and where its work goes. The bench reports the count, its top functions and how
far it moved from the committed ``results/bench/sim_profile.json``; it does not hold the
simulator to that figure (an honest edit changes it). What it checks is that the
measurement works: the two runs' difference is a positive count of plausible size, spent
in the simulator's and the core's own functions.

With ``MILES_HARNESS_WRITE_RESULTS=1`` the profile (plus the git commit, a dirty flag and
the machine) is written to that file (``python -m harness.results.regenerate --only
sim_profile``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.results.schema import git_info, machine_info, utc_now
from harness.sim.bytecodes import bytecode_profile
from harness.sim.scenario import Scenario
from harness.sim.run_scenario import simulate
from harness.sim.trainer import SimTrainerConfig
from miles_async_core.config import AsyncConfig

B, N, SHORT, LONG = 64, 8, 4, 12
RESULT_PATH = Path(__file__).resolve().parents[2] / "results/bench/sim_profile.json"
# one simulated sample is a few thousand bytecodes: a figure off by a factor of 30 either way
# means the difference of the two runs measured something else (set-up, or nothing)
PLAUSIBLE = (50.0, 50_000.0)


def _run(steps: int) -> None:
    scenario = Scenario(
        config=AsyncConfig(rollout_batch_size=B, n_samples_per_prompt=N, fully_async=True, num_rollout=steps),
        trainer=SimTrainerConfig(step_base_s=5.0),
    )
    result = simulate(scenario, trace=False)
    assert result.error is None and len(result.history) == steps


def _against_committed(profile: dict) -> str:
    """How the fresh count compares with the committed file's (a report, not a check)."""
    if not RESULT_PATH.exists():
        return f"no committed {RESULT_PATH.name} to compare with"
    committed = json.loads(RESULT_PATH.read_text())
    change = profile["bytecodes_per_sample"] / committed["bytecodes_per_sample"] - 1
    return (
        f"{change:+.1%} against the committed {committed['bytecodes_per_sample']:.1f} (Python "
        f"{committed['python']}, commit {str(committed.get('git_commit'))[:7]})"
    )


@pytest.mark.bench
def test_the_bytecode_profile_of_a_simulated_sample_is_measured():
    profile = bytecode_profile(_run, SHORT, LONG, B * N)
    per_sample = profile["bytecodes_per_sample"]
    print(
        f"\n{per_sample:.1f} bytecodes and {profile['python_calls_per_sample']:.2f} Python calls per "
        f"simulated sample (steps {SHORT} to {LONG}, B = {B}, n = {N}, Python {profile['python']}); "
        f"{_against_committed(profile)}"
    )
    for f in profile["functions"][:12]:
        print(f"{f['bytecodes_per_sample']:>9.1f} {f['calls_per_sample']:>7.3f}  {f['function']}")
    assert PLAUSIBLE[0] < per_sample < PLAUSIBLE[1], per_sample
    assert profile["python_calls_per_sample"] > 0
    top = profile["functions"]
    assert top and sum(f["bytecodes_per_sample"] for f in top) <= per_sample + 0.01 * len(top)
    own = [f for f in top if f["function"].startswith(("harness/", "miles_async_core/"))]
    assert own, f"none of the top functions is the simulator's or the core's: {[f['function'] for f in top]}"
    if os.environ.get("MILES_HARNESS_WRITE_RESULTS") == "1":
        git = git_info()
        profile.update(
            bench="sim_profile",
            created_utc=utc_now(),
            git_commit=git["commit"] if git else None,
            git_dirty=git["dirty"] if git else None,
            machine=machine_info(),
        )
        RESULT_PATH.parent.mkdir(parents=True, exist_ok=True)
        RESULT_PATH.write_text(json.dumps(profile, indent=1, sort_keys=True) + "\n")
