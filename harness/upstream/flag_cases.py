"""Cases for the flags a pull request adds, or whose default it changes.

``changes(head_source, base_source)`` reads the ``add_argument`` calls of both trees'
``miles/utils/arguments.py`` with ``ast`` (nothing is imported) and returns each flag HEAD
adds or gives another default, with the value its cases set it to (``value_for``): a
boolean flag set (``store_true``: True, ``store_false``: False), a flag with choices the
first choice that is not the default, a number the default plus one (an int) or twice the
default (a float; 1.0 for 0), anything else no case, with the reason.

``specs(changes, drivers)``: one case per flag and driver, on the first matrix case of
that driver (``diff.matrix``) with the flag set. Both trees run it: where BASE lacks the
flag it runs the matrix case as it is (the flag did not exist, so BASE behaves as its
default), and the gate compares the two as any case (``gate.classify``). ``flag_set``
sets the flag on the args upstream runs with (``runner.upstream_args``): after Miles'
parser and the runner's wiring, before Miles' own validation.
"""

from __future__ import annotations

import ast
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

ARGUMENTS = "miles/utils/arguments.py"
_NOT_LITERAL = object()


@dataclass(frozen=True)
class Flag:
    option: str  # the long option, e.g. "--partial-rollout"
    dest: str
    action: str | None
    default: Any  # a literal, or _NOT_LITERAL
    default_text: str  # as written (or implied by the action)
    choices: tuple | None
    type: str | None  # the `type=` name, e.g. "int"
    nargs: str | None


def _literal(node: ast.expr | None) -> Any:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return _NOT_LITERAL


def flags(source: str) -> dict[str, Flag]:
    """Every ``add_argument`` call's flag in ``source``, by long option (empty when it
    does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    out: dict[str, Flag] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "add_argument":
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        longs = [n for n in names if n.startswith("--")]
        if not longs:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        action = _literal(kw.get("action")) if "action" in kw else None
        action = action if isinstance(action, str) else None
        if "default" in kw:
            default, text = _literal(kw["default"]), ast.unparse(kw["default"])
        else:
            default = {"store_true": False, "store_false": True}.get(action or "")
            text = repr(default)
        choices = _literal(kw.get("choices")) if "choices" in kw else None
        dest = _literal(kw.get("dest")) if "dest" in kw else longs[0][2:].replace("-", "_")
        nargs = ast.unparse(kw["nargs"]) if "nargs" in kw else None
        typ = kw.get("type")
        out[longs[0]] = Flag(
            option=longs[0],
            dest=dest if isinstance(dest, str) else longs[0][2:].replace("-", "_"),
            action=action,
            default=default,
            default_text=text,
            choices=tuple(choices) if isinstance(choices, (list, tuple)) else None,
            type=typ.id if isinstance(typ, ast.Name) else (ast.unparse(typ) if typ is not None else None),
            nargs=nargs,
        )
    return out


def value_for(flag: Flag) -> tuple[Any, str | None]:
    """(the value a case sets ``flag`` to, None) or (None, why no case sets it)."""
    if flag.action == "store_true":
        return True, None
    if flag.action == "store_false":
        return False, None
    if flag.nargs is not None:
        return None, f"takes a list (nargs={flag.nargs}): no value to set it to"
    if flag.choices:
        other = [c for c in flag.choices if c != flag.default]
        if other and _jsonable(other[0]):
            return other[0], None
        return None, f"no choice other than its default {flag.default_text}"
    number = flag.type in ("int", "float") or (
        isinstance(flag.default, (int, float)) and not isinstance(flag.default, bool)
    )
    if number and flag.default is not _NOT_LITERAL:
        if flag.type == "int" or isinstance(flag.default, int):
            return (flag.default or 0) + 1, None
        return (flag.default * 2 if flag.default else 1.0), None
    return None, f"not a boolean, a choice or a number (default {flag.default_text}): no value to set it to"


def _jsonable(value: Any) -> bool:
    try:
        return json.loads(json.dumps(value)) == value
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class FlagChange:
    flag: Flag
    base: Flag | None  # None: BASE lacks the flag
    value: Any
    skip: str | None  # why no case sets it

    def text(self) -> str:
        what = "new" if self.base is None else f"default {self.base.default_text} -> {self.flag.default_text}"
        if self.skip:
            return f"{self.flag.option} ({what}): no case: {self.skip}"
        where = "on HEAD; BASE, which lacks it, runs each case without it" if self.base is None else "on both trees"
        return f"{self.flag.option} ({what}): set to {json.dumps(self.value)} {where}"


def changes(head_source: str, base_source: str) -> list[FlagChange]:
    """Each flag HEAD adds, or whose default (as written) differs from BASE's."""
    head, base = flags(head_source), flags(base_source)
    out = []
    for option, flag in head.items():
        old = base.get(option)
        if old is not None and old.default_text == flag.default_text:
            continue
        value, skip = value_for(flag)
        out.append(FlagChange(flag, old, value, skip))
    return out


def specs(found: list[FlagChange], bases: list[str]) -> list[dict[str, Any]]:
    """The cases (for ``gate_run --flag-case``): each flag with a value, on each of
    ``bases`` (matrix case names); ``set``: per tree (``head`` / ``base``)."""
    out = []
    for ch in found:
        if ch.skip:
            continue
        for scenario in bases:
            out.append(
                {
                    "name": f"flag{ch.flag.option}={json.dumps(ch.value)}@{scenario}",
                    "scenario": scenario,
                    "dest": ch.flag.dest,
                    "value": ch.value,
                    "set": {"head": True, "base": ch.base is not None},
                }
            )
    return out


def first_case_per_driver(drivers: list[str] | None = None) -> list[str]:
    """The first matrix case of each driver (``seams.DRIVERS`` order; only ``drivers``
    when given)."""
    from harness.upstream import seams
    from harness.upstream.diff import matrix

    first: dict[str, str] = {}
    for case in matrix():
        first.setdefault(seams.driver_of(case.scenario().config), case.name)
    return [first[d] for d in seams.DRIVERS if d in first and (drivers is None or d in drivers)]


@contextlib.contextmanager
def flag_set(dest: str, value: Any) -> Iterator[None]:
    """Upstream's args carry ``dest = value`` while this lasts (``runner.upstream_args``
    returns them; Miles' validation runs on them after)."""
    from harness.upstream import runner

    original = runner.upstream_args

    def with_flag(*a: Any, **k: Any) -> Any:
        args = original(*a, **k)
        setattr(args, dest, value)
        return args

    runner.upstream_args = with_flag
    try:
        yield
    finally:
        runner.upstream_args = original


__all__ = ["ARGUMENTS", "Flag", "FlagChange", "changes", "first_case_per_driver", "flag_set", "flags", "specs"]
