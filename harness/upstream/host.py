"""One host for upstream Miles' code: the rebinds a run puts on upstream's modules, the
lifecycle sink, and the patched drivers, for every way the harness runs upstream.

Two hosts run upstream's own drivers: ``harness.upstream.runner`` (virtual time, on
``SimEngine``; the differential, the fault sweep, the gate and the resume lives all run
through ``UpstreamRunner.run``) and ``harness.serve.upstream_e2e`` (real time, over the
served CPU engine). Each names what it rebinds as ``Rebind``\\ s, one per seam of
``harness.upstream.seams.SEAMS``: the seam, the object and attribute it replaces, its
probe (whether the active tree has it, ``source.report()``), how the replacement is made
from what is there, and how it is put back. ``installed(run, rebinds)`` installs them for
one run and restores them in reverse order on leaving, even on error; outside a run no
upstream name is rebound, so no run depends on which ran before it.

One run at a time: ``installed`` holds the process' single host slot, and a second run
entering while one holds it raises ``HostBusy`` naming both. ``current()`` is the run that
holds it, for the few targets upstream loads by dotted path from ``args``
(``--custom-async-data-buffer-path``, ``--dynamic-sampling-filter-path``) and cannot be
handed the run.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.upstream import source
from harness.upstream.harness_errors import HarnessError
from harness.upstream.seams import BY_NAME, TreeReport
from harness.upstream.leaf_fakes import LeafCalled

# ``train.py`` / ``train_async.py`` source to run instead of the file's: set only while an
# upstream mutant is applied (``harness.upstream.patching.applied``); each host reads it when
# it loads its driver (``load_driver``)
DRIVER_SOURCES: dict[str, str] = {}

_MISSING = object()


class HostBusy(HarnessError):
    """A hosted run was started while another one holds the host: two runs would share
    upstream's rebound module names."""


@dataclass(frozen=True)
class Rebind:
    """``owner().attr`` replaced by ``make(what is there)`` for one run.

    ``seam``: its name in ``harness.upstream.seams.SEAMS``. ``owner``: returns the object
    (an upstream module, the ``TrajectoryLifecycle`` singleton), imported when the rebind
    is installed. ``probe``: whether to install it on the active tree (default: the tree
    has the seam); a rebind whose probe says no leaves the name as upstream has it."""

    seam: str
    owner: Callable[[], Any]
    attr: str
    make: Callable[[Any], Any]
    probe: Callable[[TreeReport], bool] | None = None

    def __post_init__(self) -> None:
        if self.seam not in BY_NAME:
            raise ValueError(
                f"Rebind seam={self.seam!r} is not a seam of harness.upstream.seams.SEAMS; "
                f"allowed: {sorted(BY_NAME)}. Fix: register the seam there first."
            )

    def applies(self, report: TreeReport) -> bool:
        return self.probe(report) if self.probe is not None else report.found(self.seam)

    def install(self) -> Callable[[], None]:
        """Replace the attribute; returns what puts back exactly what was there."""
        obj = self.owner()
        before = obj.__dict__.get(self.attr, _MISSING) if hasattr(obj, "__dict__") else _MISSING
        setattr(obj, self.attr, self.make(getattr(obj, self.attr, None)))

        def restore() -> None:
            if before is _MISSING:
                delattr(obj, self.attr)
            else:
                setattr(obj, self.attr, before)

        return restore


def module(name: str) -> Callable[[], types.ModuleType]:
    """``Rebind.owner`` for an upstream module, imported when the rebind is installed."""
    return lambda: importlib.import_module(name)


def trajectory_lifecycle() -> Any:
    """``Rebind.owner`` for upstream's ``TrajectoryLifecycle`` singleton (its ``sink``)."""
    from miles.utils.lifecycle import TrajectoryLifecycle

    return TrajectoryLifecycle()


class LifecycleSink:
    """``TrajectoryLifecycle().sink`` while a run is hosted: which sample each task is
    generating. ``generate_and_rm`` announces its prompt sample (``attempt_start``,
    ``gen_start``, ``inference_rollout_common.py:L78-L93``); a generate function that adds
    samples to the trajectory announces each before its request (``gen_start``), handed to
    ``on_trajectory_sample(sample, root)`` (nested groups, ``harness.upstream.generate_fns``).
    Keyed by asyncio task: each sample's attempt runs in a task of its own."""

    def __init__(self, on_trajectory_sample: Callable[[Any, Any], None] | None = None) -> None:
        self.on_trajectory_sample = on_trajectory_sample
        self.task_sample: dict[asyncio.Task, Any] = {}
        self.task_root: dict[asyncio.Task, Any] = {}  # generate_and_rm's task -> its prompt sample

    def attempt_start(self, sample: Any) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.task_root[task] = sample

    def gen_start(self, sample: Any) -> None:
        task = asyncio.current_task()
        if task is None:
            return
        root = self.task_root.get(task)
        if root is not None and sample is not root and self.on_trajectory_sample is not None:
            self.on_trajectory_sample(sample, root)
        self.task_sample[task] = sample

    def attempt_end(self, sample: Any) -> None:
        task = asyncio.current_task()
        self.task_sample.pop(task, None)  # type: ignore[arg-type]
        self.task_root.pop(task, None)  # type: ignore[arg-type]

    def sample_of(self, task: asyncio.Task | None) -> Any:
        return self.task_sample.get(task) if task is not None else None

    def root_of(self, task: asyncio.Task | None) -> Any:
        return self.task_root.get(task) if task is not None else None


def sink_rebind(sink: LifecycleSink) -> Rebind:
    """Upstream's lifecycle seam pointed at ``sink``."""
    return Rebind("trajectory_lifecycle", trajectory_lifecycle, "sink", lambda _: sink)


# --------------------------------------------------------------------------- the host slot

_HOST: Any = None  # the run that holds the host, or None
_LOCK = threading.Lock()


def _name(run: Any) -> str:
    return f"{type(run).__name__} {getattr(run, 'name', '?')!r}"


def current(seam: str = "http_post(single_turn)") -> Any:
    """The run that holds the host; ``LeafCalled`` (naming ``seam``) outside any run."""
    run = _HOST
    if run is None:
        raise LeafCalled(f"upstream reached the {seam} seam outside a hosted run", seam=seam)
    return run


def holder() -> Any:
    """The run that holds the host, or ``None``."""
    return _HOST


@contextmanager
def installed(run: Any, rebinds: Sequence[Rebind], report: TreeReport | None = None) -> Iterator[None]:
    """``rebinds`` installed for ``run`` (in order, those whose probe passes on ``report``,
    default the active tree's), ``run`` holding the host; leaving restores them in reverse
    order and frees the host, also when the run or an install raises. ``HostBusy`` when
    another run holds it."""
    global _HOST
    with _LOCK:
        if _HOST is not None:
            raise HostBusy(
                f"cannot host {_name(run)}: {_name(_HOST)} holds the upstream host (one hosted run at a time: "
                "both would share upstream's rebound module names). Fix: run them one after the other.",
                ["host"],
            )
        _HOST = run
    restores: list[Callable[[], None]] = []
    try:
        report = source.report() if report is None else report
        for rebind in rebinds:
            if rebind.applies(report):
                restores.append(rebind.install())
        yield
    finally:
        try:
            for restore in reversed(restores):
                restore()
        finally:
            with _LOCK:
                _HOST = None


def load_driver(file: str, module_name: str) -> types.ModuleType:
    """The active tree's ``file`` (``train.py`` / ``train_async.py``) as a fresh module named
    ``module_name``, or the patched text a seeded driver bug put in ``DRIVER_SOURCES``
    (compiled under the file's own name, so tracebacks name upstream's lines)."""
    path: Path = source.active() / file
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not importable as a module")
    mod = importlib.util.module_from_spec(spec)
    text = DRIVER_SOURCES.get(file)
    from harness.upstream import vray

    with vray.installed():  # what the driver imports binds the in-process Ray, wherever it is loaded
        if text is None:
            spec.loader.exec_module(mod)
        else:
            exec(compile(text, str(path), "exec", dont_inherit=True), mod.__dict__)
    return mod


__all__ = [
    "DRIVER_SOURCES",
    "HostBusy",
    "LifecycleSink",
    "Rebind",
    "current",
    "holder",
    "installed",
    "load_driver",
    "module",
    "sink_rebind",
    "trajectory_lifecycle",
]
