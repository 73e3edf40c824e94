"""CPU use per process over a timed window (``harness.measure.cpu_use``)."""

from __future__ import annotations

import os
import sys

import pytest

from harness.measure import cpu_use


def test_cores_are_cpu_seconds_over_wall_seconds_per_process_and_in_total():
    before = {"main": 10.0, "engines": [1.0, 2.0]}
    after = {"main": 12.0, "engines": [2.0, 4.5]}
    c = cpu_use.cores(before, after, 4.0)
    assert c["cpu_cores_main"] == pytest.approx(0.5)
    assert c["cpu_cores_per_engine"] == pytest.approx([0.25, 0.625])
    assert c["cpu_cores_engines"] == pytest.approx(0.875)
    assert c["cpu_cores_total"] == pytest.approx(1.375)
    assert c["host_cpu_count"] == os.cpu_count()


def test_an_unreadable_engine_makes_the_sums_unknown_not_smaller():
    c = cpu_use.cores({"main": 1.0, "engines": [1.0, None]}, {"main": 2.0, "engines": [2.0, None]}, 1.0)
    assert c["cpu_cores_per_engine"] == [1.0, None]
    assert c["cpu_cores_engines"] is None and c["cpu_cores_total"] is None
    assert c["cpu_cores_main"] == pytest.approx(1.0)


def test_no_engine_process_counts_this_process_alone():
    c = cpu_use.cores({"main": 1.0, "engines": []}, {"main": 1.5, "engines": []}, 1.0)
    assert c["cpu_cores_engines"] == 0 and c["cpu_cores_total"] == pytest.approx(0.5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/stat (Linux only)")
def test_snapshot_reads_this_process_by_pid_and_none_for_a_missing_one():
    snap = cpu_use.snapshot([os.getpid(), 2**22 + 12345])
    assert snap["main"] >= 0 and snap["engines"][0] is not None and snap["engines"][0] >= 0
    assert snap["engines"][1] is None


def test_run_prints_the_cores_per_mode_with_the_hosts_count_as_a_whole_number(capsys):
    from harness.main_job.report import print_cpu_use as _print_cpu_use
    from harness.main_job.rows import aggregate_repeats
    from harness.results.mode_rows import ModeRow

    reps = [
        ModeRow(mode="one-step", cpu_cores_main=m, cpu_cores_engines=0.8, cpu_cores_total=m + 0.8, host_cpu_count=2)
        for m in (0.8, 0.9)
    ]
    _print_cpu_use([aggregate_repeats(reps)])
    out = capsys.readouterr().out
    assert "cores of this host's 2 (" in out
    assert "one-step     main 0.85  engines 0.80  total 1.65" in out
    _print_cpu_use([ModeRow(mode="sync")])  # runs without the figures print nothing
    assert capsys.readouterr().out == ""
