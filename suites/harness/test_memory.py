"""``harness.measure.memory``: per-phase peak resident memory from the kernel's high-water mark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.measure.memory import read_peak_rss_bytes, reset_peak_rss

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="VmHWM and clear_refs are Linux /proc features; elsewhere figures are None",
)
MIB = 2**20


_PHASES = """
import json
from harness.measure.memory import PeakRss

def touch(n):
    buf = bytearray(n)
    for i in range(0, n, 4096):  # make every page resident
        buf[i] = 1
    return buf

peaks = PeakRss()
peaks.start("big")
buf = touch(96 * 2**20)
del buf
peaks.start("small")
small = touch(8 * 2**20)
del small
print(json.dumps(peaks.stop()))
"""


@pytest.mark.process
def test_each_phase_gets_its_own_peak_after_a_reset():
    # a fresh single-threaded interpreter: in a long test process, threads' cached RSS counters and
    # the allocator's retained memory make the figures depend on what ran before
    out = subprocess.run(
        [sys.executable, "-c", _PHASES],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout
    got = json.loads(out)
    assert got["big"] - got["small"] > 64 * MIB  # the big phase's 96 MiB is not in the small phase's peak


def test_a_reset_starts_from_the_current_resident_set_and_a_missing_process_reads_none():
    assert reset_peak_rss() is True
    assert read_peak_rss_bytes() > 0
    assert read_peak_rss_bytes(2**22 + 12345) is None  # above Linux's pid_max limit: no such process
    assert reset_peak_rss(2**22 + 12345) is False
