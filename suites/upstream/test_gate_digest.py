"""The gate's digest (``harness.upstream.gate_digest``): what a result file keeps of a gate run."""

from __future__ import annotations

from harness.upstream import gate_digest


def _case(name: str, verdict: str, new: list[str] | None = None, message: str = "") -> dict:
    return {"name": name, "verdict": verdict, "new": new or [], "message": message}


def test_the_digest_keeps_counts_and_times_and_groups_the_headline_cases_by_what_head_newly_breaks():
    gate = {
        "exit": 1,
        "counts": {"changed": 2, "new_violation": 3, "not_started": 1},
        "aspects": {"generate": 5, "end": 6},
        "wall_s": 10.0,
        "cpu_s": 7.5,
        "trees": {"head": {"tree": "h"}, "base": {"tree": "b"}},
        "cases": [
            _case("a", "new_violation", ["one_step_overlap"]),
            _case("b", "changed"),
            _case("c", "new_violation", ["run_error:AssertionError", "one_step_overlap"]),
            _case("d", "new_violation", ["one_step_overlap", "run_error:AssertionError"]),
            _case("e", "not_started", message="HEAD's run ended before its first generate call: CancelledError"),
            _case("f", "changed"),
        ],
    }
    d = gate_digest.digest(gate)
    assert (d["exit"], d["counts"], d["aspects"], d["wall_s"], d["cpu_s"]) == (
        1,
        gate["counts"],
        gate["aspects"],
        10.0,
        7.5,
    )
    assert [(g["verdict"], g["what"], g["names"]) for g in d["groups"]] == [
        ("new_violation", "one_step_overlap, run_error:AssertionError", ["c", "d"]),
        ("new_violation", "one_step_overlap", ["a"]),
        ("not_started", "HEAD's run ended before its first generate call: CancelledError", ["e"]),
    ]
