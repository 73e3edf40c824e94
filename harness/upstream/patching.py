"""Seeded bugs in upstream Miles as small source patches, applied in memory at test time.

An ``UpstreamMutant`` is a name, what it breaks, and ``Patch(path, old, new)`` edits:
``path`` relative to the Miles tree, ``old`` an exact snippet that must occur exactly once
in that file, ``new`` its replacement. The project holds only these snippets, never a
copy of an upstream file: ``applied(mutant)`` reads the active tree's file, replaces the
snippet, compiles the result under the file's own name and

* for a module of the ``miles`` package (already imported): executes it in a fresh
  namespace under the same module name, then moves the new code into the live objects:
  every function and method defined in that module gets the patched ``__code__`` (and
  defaults), every changed module-level constant its new value. References held
  elsewhere (``from ... import``, the runner's wrappers, bound methods) therefore run the
  patched code; leaving the context puts every original back.
* for ``train.py`` / ``train_async.py``: hands the patched text to the runner
  (``harness.upstream.host.DRIVER_SOURCES``), from which each host loads its driver per run.

A snippet that is not in the file, or is there more than once (upstream changed), raises
``PatchDoesNotApply`` naming the mutant, the file and the snippet; a patch that changes no
code (e.g. only a comment) raises too.
"""

from __future__ import annotations

import builtins
import importlib
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from harness.upstream import host, source

DRIVERS = ("train.py", "train_async.py")
REAL_TIME_LIMIT_S = 20.0  # per mutant run: a mutant may livelock
_SIMPLE = (int, float, str, bool, bytes, tuple, frozenset, type(None))


class PatchDoesNotApply(RuntimeError):
    """A mutant's snippet is not (exactly once) in the upstream file it names."""


@dataclass(frozen=True)
class Patch:
    path: str  # relative to the Miles tree, e.g. "miles/rollout/fully_async_data_buffer.py"
    old: str
    new: str


@dataclass(frozen=True)
class UpstreamMutant:
    name: str
    area: str  # buffer | fully_async | scheduler | data_source | driver
    doc: str
    patches: tuple[Patch, ...]
    expected: frozenset[str]  # invariant names and/or "differential"
    # the drivers whose runs can show it (``harness.upstream.seams.DRIVERS``); on a tree that
    # refuses all of them the mutant is not tried there, and the suite says why
    observable_in: frozenset[str] = frozenset({"sync", "one-step", "fully-async"})


def patched_text(mutant: UpstreamMutant, patch: Patch, tree: Path) -> str:
    file = tree / patch.path
    if not file.is_file():
        raise PatchDoesNotApply(f"mutant {mutant.name!r}: {patch.path} is not in the Miles tree at {tree}")
    text = file.read_text()
    n = text.count(patch.old)
    if n != 1:
        raise PatchDoesNotApply(
            f"mutant {mutant.name!r}: {patch.path}: the snippet to replace occurs {n} times (expected exactly once; "
            f"upstream changed?). Snippet:\n{patch.old}"
        )
    return text.replace(patch.old, patch.new)


def _module_name(rel: str) -> str:
    return rel[:-3].replace("/", ".")


def _unwrap(obj: Any) -> list[types.FunctionType]:
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        return [f for f in (obj.fget, obj.fset, obj.fdel) if isinstance(f, types.FunctionType)]
    return [obj] if isinstance(obj, types.FunctionType) else []


def _swap(old: types.FunctionType, new: types.FunctionType, undo: list, where: str) -> bool:
    if old.__code__ == new.__code__:
        return False
    if old.__code__.co_freevars != new.__code__.co_freevars:
        raise PatchDoesNotApply(
            f"{where}: the patch changes the closure of {old.__qualname__} "
            f"({old.__code__.co_freevars} -> {new.__code__.co_freevars}); patch its body only"
        )
    changed = (
        old.__code__.co_code != new.__code__.co_code
        or old.__code__.co_consts != new.__code__.co_consts
        or old.__code__.co_names != new.__code__.co_names
    )
    undo.append((old, old.__code__, old.__defaults__, old.__kwdefaults__))
    old.__code__, old.__defaults__, old.__kwdefaults__ = new.__code__, new.__defaults__, new.__kwdefaults__
    return changed


def _actor_class(obj: Any) -> type | None:
    """The class a vray ``ActorClass`` (upstream's ``@ray.remote`` class) hosts, else ``None``."""
    from harness.upstream.vray import ActorClass

    return obj._cls if isinstance(obj, ActorClass) else None


def _transplant(mod: types.ModuleType, ns: dict, undo: list, consts: list, where: str) -> int:
    """Move the patched code into ``mod``'s live objects; returns how many bodies changed."""
    changed = 0
    for name, new in ns.items():
        old = mod.__dict__.get(name)
        if (
            isinstance(new, types.FunctionType)
            and isinstance(old, types.FunctionType)
            and new.__module__ == mod.__name__
        ):
            changed += _swap(old, new, undo, where)
        elif _actor_class(new) is not None and _actor_class(old) is not None:
            # a @ray.remote class (harness.upstream.vray.ActorClass): patch the class it hosts
            new, old = _actor_class(new), _actor_class(old)
            for attr, value in new.__dict__.items():
                for f_new, f_old in zip(_unwrap(value), _unwrap(old.__dict__.get(attr))):
                    changed += _swap(f_old, f_new, undo, where)
        elif isinstance(new, type) and isinstance(old, type) and new.__module__ == mod.__name__:
            for attr, value in new.__dict__.items():
                for f_new, f_old in zip(_unwrap(value), _unwrap(old.__dict__.get(attr))):
                    changed += _swap(f_old, f_new, undo, where)
        elif isinstance(new, _SIMPLE) and not name.startswith("__") and name in mod.__dict__ and old != new:
            consts.append((mod, name, old))
            setattr(mod, name, new)
            changed += 1
    return changed


@contextmanager
def applied(mutant: UpstreamMutant, tree: Path | None = None) -> Iterator[None]:
    """``mutant`` in effect on the active (imported) upstream tree; undone on exit."""
    tree = source.active() if tree is None else tree
    undo: list = []
    consts: list = []
    drivers: dict[str, str] = {}
    try:
        for patch in mutant.patches:
            text = patched_text(mutant, patch, tree)
            where = f"mutant {mutant.name!r}: {patch.path}"
            code = compile(text, str(tree / patch.path), "exec", dont_inherit=True)  # not our __future__
            if patch.path in DRIVERS:
                drivers[patch.path] = text
                continue
            name = _module_name(patch.path)
            mod = sys.modules.get(name)
            if mod is None and tree == source.active():
                # a module upstream imports only when a run needs it (the actor group): import it now,
                # as a run would (under the in-process Ray), so the patch reaches what the run will use
                from harness.upstream import vray

                with vray.installed():
                    try:
                        mod = importlib.import_module(name)
                    except ImportError as exc:
                        raise PatchDoesNotApply(f"{where}: module {name} does not import: {exc}") from None
            if mod is None:
                raise PatchDoesNotApply(f"{where}: module {name} is not imported (activate the tree first)")
            ns: dict[str, Any] = {
                "__name__": name,
                "__file__": str(tree / patch.path),
                "__package__": name.rpartition(".")[0],
                "__builtins__": builtins,
            }
            from harness.upstream import vray

            with vray.installed():  # as the module was imported (harness.upstream.source.activate)
                exec(code, ns)
            if not _transplant(mod, ns, undo, consts, where):
                raise PatchDoesNotApply(f"{where}: the patch changes no code")
        host.DRIVER_SOURCES.update(drivers)
        yield
    finally:
        for path in drivers:
            host.DRIVER_SOURCES.pop(path, None)
        for fn, code, defaults, kwdefaults in reversed(undo):
            fn.__code__, fn.__defaults__, fn.__kwdefaults__ = code, defaults, kwdefaults
        for mod, name, value in reversed(consts):
            setattr(mod, name, value)


# --------------------------------------------------------------------------- the search


@dataclass
class Catch:
    mutant: str
    runs: int  # matrix cases run on the mutant until the first catch (all of them if none)
    case: str | None  # the catching case
    caught_by: list[str]  # invariant names, and "differential:<aspect>" when the core's run differs
    detail: str = ""


def _check(
    case: Any, core_cache: dict, mutant: UpstreamMutant | None, *, differential: bool = True
) -> tuple[list[str], str]:
    """One matrix case on upstream (with ``mutant`` applied, if any): what caught it.
    A run that ends with an error where the case injects no fault and expects no refusal is
    ``run_error:TYPE``: judged as a prefix, the checkers would not see it. ``differential``:
    also compare with the core's run where the two agree unmutated."""
    from contextlib import nullcontext

    from harness.checking.invariants import check_all
    from harness.sim.engine import SimEngine
    from harness.sim.faults import fault_engine_class
    from harness.upstream.diff import core_run
    from harness.upstream.observables import first_divergence, observables
    from harness.upstream.fault_sweep import guarded_upstream_run

    sc = case.scenario()
    if case.name not in core_cache:
        core = core_run(case, sc)
        core_cache[case.name] = (observables(core.events, core.history, core.wall_s, core.error), core.wall_s)
    core_obs, core_wall = core_cache[case.name]
    engine = fault_engine_class(SimEngine, case.faults) if case.faults is not None else SimEngine
    gen = None
    if case.generate_function:  # nested groups: upstream loads the same generate function as the core runs
        from harness.upstream.generate_fns import FORMS

        gen = FORMS[case.generate_function][1]
    with applied(mutant) if mutant is not None else nullcontext():
        up, hang = guarded_upstream_run(
            sc,
            vtime_limit_s=max(60.0, 20 * core_wall),
            real_time_limit_s=REAL_TIME_LIMIT_S,
            engine_factory=engine,
            dynamic_filter_path=f"harness.upstream.filters.{case.dynamic_filter}" if case.dynamic_filter else None,
            generate_function_path=gen,
        )
    caught = ["hang"] if hang else []
    caught += sorted({v.invariant for v in check_all(up.events, sc.config, complete=up.error is None and hang is None)})
    if up.error is not None and hang is None and case.faults is None and not case.refused:
        # an error no injected fault explains, in a case that runs to its end unmutated: with
        # no differential to consult, the run judged as a prefix would hide it (the fault
        # sweep's run_error)
        caught.append(f"run_error:{type(up.error).__name__}")
    detail = hang or (f"upstream error {up.error!r}"[:200] if up.error is not None else "")
    if differential and case.known is None:  # where core and upstream agree unmutated
        first = first_divergence(core_obs, observables(up.events, up.history, up.wall_s, up.error))
        if first is not None:
            caught.append(f"differential:{first[0]}")
    return caught, detail


def first_catch(
    mutant: UpstreamMutant,
    cases: list | None = None,
    core_cache: dict | None = None,
    *,
    differential: bool = True,
) -> Catch:
    """Run the differential matrix's cases (in order) on upstream with ``mutant`` applied
    until one is caught: a hang (the watchdog: 20x the core's virtual time, or
    ``REAL_TIME_LIMIT_S``), an invariant checker failing on the upstream run, or (on cases
    where core and upstream agree unmutated, ``known is None``) the run differing from the
    core's (unless ``differential`` is off: the checkers on upstream's own run alone).
    ``core_cache`` keeps the core's runs across mutants."""
    from harness.upstream.diff import matrix

    cases = matrix() if cases is None else cases
    core_cache = {} if core_cache is None else core_cache
    for i, case in enumerate(cases, start=1):
        caught, detail = _check(case, core_cache, mutant, differential=differential)
        if caught:
            return Catch(mutant.name, i, case.name, caught, detail)
    return Catch(mutant.name, len(cases), None, [])


def clean_catch(case: Any, core_cache: dict | None = None) -> list[str]:
    """The same checks on unmutated upstream: ``[]`` for every matrix case."""
    return _check(case, {} if core_cache is None else core_cache, None)[0]
