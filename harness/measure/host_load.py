"""What share of the machine a real-time run had, and whether its figures are comparable.

A real-time figure (seconds per step, a speedup, tokens per second) depends on the cores
the run could use. ``Meter`` reads, at both edges of a timed window:

* the CPU seconds of this process tree: this process, every live descendant (``/proc``:
  the split layout's engine process, a local Ray cluster and its workers) and the
  children already reaped (``os.times``);
* the busy CPU seconds of the cores this process may run on (the ``cpuN`` lines of
  ``/proc/stat`` for ``os.sched_getaffinity``; ``steal``, time a hypervisor gave to
  another machine, counts as busy);
* the 1-minute load average.

``figures`` turns the two readings into the window's figures: ``cores`` (the cores the
run may use: its CPU affinity, capped by a cgroup CPU quota), ``own_cores`` (the tree's
CPU seconds over wall seconds), ``share`` (``own_cores / cores``: the share of the
machine the run had), ``others_cores`` (busy cores that were not the run's: what the
rest of the host took; None where ``/proc/stat`` is unreadable), ``load1_before`` and
``load1_after`` (the after figure includes the run's own runnable threads).

``verdict`` (pure, on those numbers) says whether the window's figures are comparable
with a clean run's. Not comparable when:

* others kept more than ``OTHERS_SHARE_MAX`` (0.2) of the cores busy on average. The
  main job's overlapped modes keep 1.7-1.9 of a 2-core host busy (the committed
  ``results/cpu/ray-2`` run); others taking 0.4 of 2 cores leave them at most 1.6, a
  tenth or more below what they use, which is more than the 2-6 % spread of the
  overlapped speedups between the two committed clean runs (``results/cpu/run-a``,
  ``run-b``). Below it, the loss is within that spread.
* only where ``others_cores`` is unreadable (no ``/proc/stat``): the 1-minute load before
  the window above ``LOAD_PER_CORE_MAX`` (1.0) per core: more runnable tasks than cores
  before the run began, so each task of the run waits for a core part of the time. The
  load average is a one-minute decaying mean that counts the run's own threads once it
  runs, so it is the fallback, never the rule where the direct figure exists.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OTHERS_SHARE_MAX = 0.2
LOAD_PER_CORE_MAX = 1.0
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (idle 3 and iowait 4 are not busy)


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (every CPU where affinity is not available)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cores_available(cpus: list[int], cgroup_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> float:
    """``len(cpus)``, capped by a cgroup v2 CPU quota (``cpu.max``: ``QUOTA PERIOD``)."""
    try:
        quota, period = cgroup_max.read_text().split()[:2]
        if quota != "max":
            return min(float(len(cpus)), int(quota) / int(period))
    except (OSError, ValueError):
        pass
    return float(len(cpus))


def host_busy_s(cpus: list[int], stat: Path = Path("/proc/stat")) -> float | None:
    """Busy CPU seconds so far of ``cpus``, every process's (None: unreadable)."""
    want = {f"cpu{c}" for c in cpus}
    try:
        ticks = 0
        found = 0
        for line in stat.read_text().splitlines():
            name, _, rest = line.partition(" ")
            if name in want:
                values = [int(v) for v in rest.split()]
                ticks += sum(values[i] for i in _BUSY_FIELDS if i < len(values))
                found += 1
        return ticks / os.sysconf("SC_CLK_TCK") if found == len(want) else None
    except (OSError, ValueError):
        return None


def tree_cpu_s() -> float:
    """CPU seconds so far of this process, its live descendants and its reaped children."""
    own = os.times()
    total = own.user + own.system + own.children_user + own.children_system
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[tuple[int, float]]] = {}
    try:
        entries = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return total
    for entry in entries:
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended while read
        ppid, cpu = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick  # ppid, utime + stime
        children.setdefault(ppid, []).append((int(entry), cpu))
    todo = [os.getpid()]
    while todo:
        for pid, cpu in children.get(todo.pop(), []):
            total += cpu
            todo.append(pid)
    return total


def load1() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


@dataclass(frozen=True)
class Reading:
    """One edge of a window: wall clock, the tree's and the cores' CPU seconds, the load."""

    t: float
    tree_cpu_s: float
    host_busy_s: float | None
    load1: float | None


class Meter:
    """``start()`` at the window's start, ``stop()`` at its end: the window's ``figures``."""

    def __init__(self) -> None:
        self.cpus = allowed_cpus()
        self.cores = cores_available(self.cpus)
        self.before: Reading | None = None

    def read(self) -> Reading:
        return Reading(time.monotonic(), tree_cpu_s(), host_busy_s(self.cpus), load1())

    def start(self) -> Meter:
        self.before = self.read()
        return self

    def stop(self) -> dict[str, Any]:
        assert self.before is not None, "Meter.stop() before start()"
        return figures(self.before, self.read(), self.cores)


def figures(before: Reading, after: Reading, cores: float) -> dict[str, Any]:
    """The window's figures (module docstring) with its ``verdict`` (``busy``, ``why``)."""
    wall = after.t - before.t
    own = (after.tree_cpu_s - before.tree_cpu_s) / wall if wall > 0 else None
    others = None
    if own is not None and before.host_busy_s is not None and after.host_busy_s is not None:
        others = max(0.0, (after.host_busy_s - before.host_busy_s) / wall - own)
    out: dict[str, Any] = {
        "wall_s": wall,
        "cores": cores,
        "own_cores": own,
        "share": None if own is None else own / cores,
        "others_cores": others,
        "load1_before": before.load1,
        "load1_after": after.load1,
    }
    busy, why = verdict(out)
    return {**out, "busy": busy, "why": why}


def verdict(f: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether a window's figures are not comparable with a clean run's, and why (the
    thresholds and their reasons are in the module docstring)."""
    cores, others, load = f["cores"], f.get("others_cores"), f.get("load1_before")
    if others is not None:
        if others > OTHERS_SHARE_MAX * cores:
            return True, (
                f"other processes kept {others:.2f} of the {cores:g} cores busy (more than "
                f"{OTHERS_SHARE_MAX:g} of them): the run had {f['own_cores']:.2f} cores "
                f"({100 * f['share']:.0f} % of the host)"
            )
        return False, None
    if load is not None and load > LOAD_PER_CORE_MAX * cores:
        return True, (
            f"the 1-minute load was {load:.2f} on {cores:g} cores before the run (more than "
            f"{LOAD_PER_CORE_MAX:g} per core; the cores others used are not readable here)"
        )
    return False, None


def summary(windows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A results file's ``host`` record: every window's figures, the thresholds, and
    ``busy`` when any window was (``why`` names the first such window)."""
    busy = {name: w for name, w in windows.items() if w.get("busy")}
    first = next(iter(busy.items()), None)
    cores = next((w["cores"] for w in windows.values()), None)
    return {
        "cores": cores,
        "others_share_max": OTHERS_SHARE_MAX,
        "load_per_core_max": LOAD_PER_CORE_MAX,
        "windows": windows,
        "busy": bool(busy),
        "why": None if first is None else f"{first[0]}: {first[1]['why']}",
        "busy_windows": list(busy),
    }


def describe(host: dict[str, Any] | None) -> str:
    """One line for a report: the host's figures and whether they are comparable."""
    if not host or not host.get("windows"):
        return "host share: not recorded"
    ws = list(host["windows"].values())
    shares = [w["share"] for w in ws if w.get("share") is not None]
    others = [w["others_cores"] for w in ws if w.get("others_cores") is not None]
    loads = [w[k] for w in ws for k in ("load1_before", "load1_after") if w.get(k) is not None]
    parts = [f"{len(ws)} timed window(s) on {host['cores']:g} cores"]
    if shares:
        spread = f"{min(shares):.2f}" if len(shares) == 1 else f"{min(shares):.2f}-{max(shares):.2f}"
        parts.append(f"the run had {spread} of the host")
    if others:
        parts.append(f"others kept up to {max(others):.2f} cores busy")
    if loads:
        parts.append(f"1-minute load {min(loads):.2f}-{max(loads):.2f}")
    line = "host share: " + ", ".join(parts)
    if host.get("busy"):
        return (
            line + f"\nNOT COMPARABLE: busy host in {len(host['busy_windows'])} window(s) ({host['why']}); "
            "real-time figures of this run are not comparable with a clean run's. Fix: rerun on an idle host"
        )
    return line + f" (clean: others at most {host['others_share_max']:g} of the cores)"


def comparison_note(
    base: dict[str, Any] | None, new: dict[str, Any] | None, base_label: str, new_label: str
) -> str | None:
    """What ``compare`` says about the two files' hosts: a line when either ran on a busy
    host, naming the clean side or the side that did not record its host (None: neither
    was busy)."""
    sides = ((base_label, base), (new_label, new))
    busy = [(lbl, h) for lbl, h in sides if h and h.get("busy")]
    if not busy:
        return None
    clean = [lbl for lbl, h in sides if h and not h.get("busy")]
    unknown = [lbl for lbl, h in sides if h is None]
    whose = "; ".join(f"{lbl}: {h['why']}" for lbl, h in busy)
    line = f"host: NOT COMPARABLE: {' and '.join(lbl for lbl, _ in busy)} ran on a busy host ({whose})"
    if clean:
        line += f", against a clean run ({', '.join(clean)})"
    if unknown:
        line += f", against {', '.join(unknown)}, which did not record its host (written before schema_version 3)"
    return line + "; the real-time figures differ by the cores each run had, not only by the code"
