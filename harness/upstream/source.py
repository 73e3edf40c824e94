"""Where the upstream Miles tree is, and making it importable.

One setting names it: ``pytest --miles-src=PATH`` or the ``MILES_SRC`` environment
variable (the option wins). With neither, the pinned tree that CI has beside the
repository, ``../shared/third_party/miles-<PINNED_MILES_COMMIT>``, is used when it is there. The
project never copies upstream code: the tree is only put on ``sys.path`` at run time.

``find_miles_src()`` returns ``(path or None, how it was found or why there is none)``;
``activate(path)`` probes the tree's seams (``harness.upstream.seams``: refused with
``SeamMissing``, naming the seam and the file, when no driver can run faithfully),
applies the import fakes and imports the upstream modules the runner runs, raising
``UpstreamUnavailable`` with the reason. ``report()`` is the active tree's seam table;
the runner refuses a driver it lacks a seam for (``TreeReport.require``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from miles_async_core.rules import PINNED_MILES_COMMIT
from harness.upstream.seams import SeamMissing, TreeReport, probe

ENV = "MILES_SRC"
OPTION = "--miles-src"
REPO_ROOT = Path(__file__).resolve().parents[2]
PINNED_TREE_NAME = f"miles-{PINNED_MILES_COMMIT}"
DEFAULT_TREE = REPO_ROOT.parent / "shared" / "third_party" / PINNED_TREE_NAME
# A Miles tree: the ``miles`` package and at least one root driver. Which drivers it can
# run is the seam probe's answer (``harness.upstream.seams``): a tree from before the
# fully-async rollout moved out of ``examples/`` into ``miles/rollout/`` runs sync and
# one-step, and its fully-async cases are not run, naming the missing module.
MARKER = Path("miles") / "__init__.py"
DRIVER_FILES = ("train.py", "train_async.py")
FULLY_ASYNC_MODULE = Path("miles") / "rollout" / "fully_async_rollout.py"


def is_miles_tree(path: Path) -> bool:
    return (path / MARKER).is_file() and any((path / d).is_file() for d in DRIVER_FILES)


def not_miles(flag: str, value: str, path: Path) -> str | None:
    """Why ``path`` is not a Miles tree (the message for ``flag value``), else ``None``."""
    if is_miles_tree(path):
        return None
    return (
        f"{flag} {value}: not a Miles tree ({path} has no {MARKER}, or neither of {', '.join(DRIVER_FILES)}).\n"
        "Fix: point it at the root of a Miles checkout (the folder holding miles/ and the drivers)"
    )


class UpstreamUnavailable(RuntimeError):
    """No usable Miles tree, or its modules cannot be imported here."""


def find_miles_src(explicit: str | None = None) -> tuple[Path | None, str]:
    if explicit or os.environ.get(ENV):
        given, how = (explicit, f"{OPTION}={explicit}") if explicit else (os.environ[ENV], f"{ENV}={os.environ[ENV]}")
        path = Path(given).resolve()
        if not path.exists():
            return None, (
                f"{how}: {path} does not exist. Fix: pass {OPTION}=PATH (or set {ENV}=PATH) to the root of "
                "a Miles checkout (the folder holding miles/ and train_async.py)"
            )
        return path, how
    if is_miles_tree(DEFAULT_TREE):
        return DEFAULT_TREE, f"the pinned tree beside the repository ({DEFAULT_TREE})"
    return None, (
        f"no upstream Miles tree: pass {OPTION}=PATH or set {ENV}=PATH to a Miles checkout "
        f"(the pinned one is expected at {DEFAULT_TREE})"
    )


_active: Path | None = None
_report: TreeReport | None = None


def activate(path: Path) -> Path:
    """Probe ``path``'s seams, put it on ``sys.path`` (first), apply the import fakes, import
    the runner's modules. A tree no driver can run on faithfully raises ``SeamMissing``."""
    global _active, _report
    path = Path(path).resolve()
    why = not_miles("the tree", str(path), path)
    if why:
        raise UpstreamUnavailable(why)
    tree_report = probe(path)
    if tree_report.verdict == "refused":
        raise tree_report.refusal()
    if _active is not None:
        if _active != path:
            raise UpstreamUnavailable(
                f"upstream Miles is already imported from {_active} in this process; cannot switch to {path}"
            )
        return path
    loaded = sys.modules.get("miles")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(str(path)):
        raise UpstreamUnavailable(f"a different 'miles' package is already imported ({loaded.__file__})")
    sys.path.insert(0, str(path))
    from harness.upstream import leaf_fakes

    leaf_fakes.install()
    # Ray is a leaf: upstream's modules bind the in-process Ray (harness.upstream.vray) at
    # import, so their @ray.remote classes are hosted on the run's loop; the real `ray` is
    # back in sys.modules afterwards for the rest of the process
    from harness.upstream import vray

    try:
        with vray.installed():
            if (path / FULLY_ASYNC_MODULE).is_file():  # an older tree has none: its fully-async cases are not run
                import miles.rollout.fully_async_rollout  # noqa: F401
            import miles.rollout.inference_rollout.inference_rollout_train  # noqa: F401
            import miles.rollout.data_source  # noqa: F401

            _import_orchestration()
    except ImportError as exc:
        sys.path.remove(str(path))
        raise UpstreamUnavailable(
            f"upstream Miles at {path} does not import here: {exc!r}. Fix: "
            "pip install -e '.[upstream]' (or `make test`, which installs it)"
        ) from exc
    _active, _report = path, tree_report
    return path


def _import_orchestration() -> None:
    """Upstream's orchestration modules, imported now (under vray, by ``activate``) so that
    nothing imports them later under the real ``ray``; a tree that lacks one is described
    by its seams (``doctor``), not refused here."""
    for name in ("miles.ray.placement_group", "miles.ray.rollout.rollout_manager", "miles.utils.arguments"):
        try:
            importlib.import_module(name)
        except ImportError:
            continue


def refused_reason(config: object) -> str | None:
    """Why the active tree cannot run ``config``'s driver faithfully (the missing seams,
    with their files), or ``None`` when it can: the suites skip such a case, saying so."""
    from harness.upstream.seams import driver_of

    driver = driver_of(config)
    miss = report().missing_for(driver)
    return str(report().refusal(driver)) if miss else None


ORCHESTRATION_FLAG = "--orchestration"


def _orchestration(value: str) -> str:
    if value != "upstream":
        raise argparse.ArgumentTypeError(
            f"{value!r}: the harness' stand-ins were removed; upstream's own orchestration (over the "
            "harness' leaves, `miles-harness doctor` lists them) is what runs. Fix: drop the flag"
        )
    return value


def add_orchestration_flag(parser: argparse.ArgumentParser) -> None:
    """``--orchestration``, kept so that ``--orchestration upstream`` (what always runs)
    still parses; any other value exits 2 naming the flag, the value and the fix."""
    parser.add_argument(ORCHESTRATION_FLAG, type=_orchestration, default="upstream", help=argparse.SUPPRESS)


def refused_files() -> dict[str, str]:
    """Files of the active tree behind a missing, needed seam: ``{file: seam}``."""
    return {p.seam.file: p.seam.name for p in report().probes if p.needed}


def report() -> TreeReport:
    """The seam table of the active tree."""
    if _report is None:
        active()
    return _report  # type: ignore[return-value]


def active() -> Path:
    """The tree ``activate`` put on ``sys.path``."""
    if _active is None:
        raise UpstreamUnavailable("no upstream Miles tree is active: call harness.upstream.source.activate(path)")
    return _active


__all__ = [
    "DEFAULT_TREE",
    "DRIVER_FILES",
    "FULLY_ASYNC_MODULE",
    "MARKER",
    "ENV",
    "OPTION",
    "PINNED_MILES_COMMIT",
    "PINNED_TREE_NAME",
    "SeamMissing",
    "UpstreamUnavailable",
    "activate",
    "add_orchestration_flag",
    "active",
    "find_miles_src",
    "is_miles_tree",
    "not_miles",
    "refused_files",
    "refused_reason",
    "report",
]
