"""Peak resident memory of a phase of a run, from the kernel's high-water mark.

Linux keeps each process's peak resident set (``VmHWM`` in ``/proc/<pid>/status``) and
lets the process reset it (``5`` written to ``/proc/<pid>/clear_refs``). ``PeakRss``
resets it where a phase starts and reads it where the phase ends, so each phase (the
timed run, what runs after it) gets its own peak, and an engine process's peak is read
from its own ``/proc`` entry while it is alive. ``getrusage``'s ``ru_maxrss`` cannot do
either: it never resets, and a child started by fork + exec (multiprocessing's spawn)
inherits its parent's peak at the fork. Elsewhere (macOS, no ``/proc``) every figure is
None and the run says so.
"""

from __future__ import annotations

from pathlib import Path


def read_peak_rss_bytes(pid: int | str = "self") -> int | None:
    """``VmHWM`` of a live process in bytes (None: not readable here)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # the kernel writes kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak_rss(pid: int | str = "self") -> bool:
    """Start a new high-water mark at the current resident set; False where it cannot."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class PeakRss:
    """Peaks of consecutive phases of this process: ``start(name)`` ends the previous phase."""

    def __init__(self) -> None:
        self.peaks: dict[str, int | None] = {}
        self._phase: str | None = None
        self._resettable = True

    def start(self, phase: str) -> None:
        self._close()
        self._resettable = reset_peak_rss()
        self._phase = phase

    def stop(self) -> dict[str, int | None]:
        self._close()
        return dict(self.peaks)

    def _close(self) -> None:
        if self._phase is not None:
            self.peaks[self._phase] = read_peak_rss_bytes() if self._resettable else None
            self._phase = None


__all__ = ["PeakRss", "read_peak_rss_bytes", "reset_peak_rss"]
