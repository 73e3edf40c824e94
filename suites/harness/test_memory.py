"""``harness.measure.memory``: per-phase peak resident memory from the kernel's high-water mark."""

from __future__ import annotations

import sys

import pytest

from harness.measure.memory import PeakRss, read_peak_rss_bytes, reset_peak_rss

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="VmHWM and clear_refs are Linux /proc features; elsewhere figures are None")
MIB = 2**20


def _touch(n_bytes: int) -> bytearray:
    buf = bytearray(n_bytes)
    for i in range(0, n_bytes, 4096):  # make every page resident
        buf[i] = 1
    return buf


def test_each_phase_gets_its_own_peak_after_a_reset():
    peaks = PeakRss()
    peaks.start("big")
    buf = _touch(96 * MIB)
    del buf
    peaks.start("small")
    small = _touch(8 * MIB)
    del small
    got = peaks.stop()
    assert got["big"] - got["small"] > 64 * MIB  # the big phase's 96 MiB is not in the small phase's peak


def test_a_reset_starts_from_the_current_resident_set_and_a_missing_process_reads_none():
    assert reset_peak_rss() is True
    assert read_peak_rss_bytes() > 0
    assert read_peak_rss_bytes(2**22 + 12345) is None  # above Linux's pid_max limit: no such process
    assert reset_peak_rss(2**22 + 12345) is False
