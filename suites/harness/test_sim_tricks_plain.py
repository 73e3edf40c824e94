"""Each kept speed trick's plain version (``harness/results/tricks/<name>.diff``) still applies
to the code and gives the pinned traces: the golden scenario's and every cross-Python
run's, byte for byte. ``harness.results.sim_tricks_ab`` measures HEAD against these plain
versions, so a patch that no longer applies, or whose plain code behaves otherwise, would
measure something else."""

from __future__ import annotations

import pytest

from harness.results.sim_tricks_ab import apply_plain, export, stored_digests, trace_digests, tricks


@pytest.fixture(scope="module")
def stored() -> dict[str, str]:
    return stored_digests()


@pytest.mark.parametrize("name", tricks())
def test_the_plain_version_applies_and_gives_the_pinned_traces(name, stored, tmp_path):
    tree = apply_plain(export(tmp_path / "tree"), name)
    got = trace_digests(tree, steps=0)
    assert set(got) == set(stored)
    differ = sorted(run for run in stored if got[run] != stored[run])
    assert not differ, f"the plain version {name!r} changes the traces of {differ}"


def test_the_trace_check_sees_a_changed_draw(stored, tmp_path):
    """A seeded bug: splitmix64's second multiplier changed, so every seeded draw differs."""
    tree = export(tmp_path / "tree")
    draws = tree / "harness/sim/draws.py"
    text = draws.read_text()
    assert text.count("0x94D049BB133111EB") >= 1
    draws.write_text(text.replace("0x94D049BB133111EB", "0x94D049BB133111ED"))
    got = trace_digests(tree, steps=0)
    assert got["golden"] != stored["golden"]


def test_a_patch_that_no_longer_applies_names_itself_and_the_fix(tmp_path):
    tree = export(tmp_path / "tree")
    diffs = tmp_path / "tricks"
    diffs.mkdir()
    (diffs / "stale.diff").write_text(
        "--- a/harness/sim/draws.py\n+++ b/harness/sim/draws.py\n@@ -1,1 +1,1 @@\n-no such line\n+plain\n"
    )
    with pytest.raises(SystemExit, match=r"(?s)stale\.diff: does not apply .*fix: remake it"):
        apply_plain(tree, "stale", diffs)
