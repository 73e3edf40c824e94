"""The members upstream's drivers use on the objects the harness puts in their place.

The hosts run ``train.py`` / ``train_async.py`` with their Ray names rebound
(``harness.upstream.ray_names``): the rollout manager, the actor group, the critic group
(``None``), the eval dispatcher and the object store are the harness' stand-ins. A tree
whose driver reads a member a stand-in lacks cannot run faithfully. ``uses(tree)`` finds
every such read by reading the source (``ast``; nothing is imported):

* seeds, in each driver file: the names bound from ``create_rollout_manager(...)``
  (``rollout_manager``), ``create_training_models(...)`` (``actor_model``,
  ``critic_model``), ``EvalDispatcher(...)`` (``eval_dispatcher``) and the module name
  ``object_store``;
* a use: ``x.member`` (``.remote`` calls included) or ``getattr`` / ``hasattr`` with a
  constant name on a tracked expression;
* the object followed where it goes: a local alias (``y = x``), an argument to a function
  or class of the same file or imported from the tree's ``miles`` package (the parameter
  it binds), an attribute of ``self`` it is stored in (``self._m = x``: every method of
  that class), and the result of a method of that class that returns it
  (``return self._m``). Calls to names the harness rebinds are not followed (their real
  code never runs).

A read inside the body of an ``if`` whose test is plain, an attribute of ``args`` alone
or compared with a constant (``if args.offload:``, ``if args.device == "gpu":``,
``if args.port is not None:``), carries that test as its ``guard``: the read runs only in
a case whose args make the test hold (``Guard.holds``). The innermost such ``if`` in the
reading function counts; a read in a function called from under one is not guarded.

What it cannot see (a stand-in reached through a container, a dynamic ``getattr``, a read
under a guard that is not plain) is still caught when the run reaches it: the stand-in
raises ``StandInMissing`` naming the member and the line.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from harness.upstream.ray_names import REBOUND

DRIVER_FILES = {"train.py": frozenset({"sync"}), "train_async.py": frozenset({"one-step", "fully-async"})}
_SEED_CALLS = {
    "create_rollout_manager": ("rollout_manager",),
    "create_training_models": ("actor_model", "critic_model"),
    "EvalDispatcher": ("eval_dispatcher",),
}


# the comparisons a plain guard may make with its constant
_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_UNSET = object()


@dataclass(frozen=True)
class Guard:
    """The plain test of the ``if`` a read sits under: ``args.<flag>`` alone (truthy), or
    compared (``op``, an ``ast`` comparison's name) with the constant ``value``."""

    flag: str
    text: str  # the test as written
    op: str | None = None  # None: the flag's value itself is the test
    value: Any = None  # a constant (a list or set constant as a tuple / frozenset)

    def holds(self, args: object) -> bool:
        """Whether the test may hold on ``args``: evaluated on the flag's value; an
        ``args`` without the flag, or a comparison that cannot be made, may hold."""
        got = vars(args).get(self.flag, _UNSET) if hasattr(args, "__dict__") else _UNSET
        if got is _UNSET:
            return True
        if self.op is None:
            return bool(got)
        fn = next(f for t, f in _OPS.items() if t.__name__ == self.op)
        try:
            return bool(fn(got, self.value))
        except TypeError:
            return True


def _args_flag(node: ast.AST) -> str | None:
    """``X`` of ``args.X`` or ``self.args.X``, else ``None``."""
    if not isinstance(node, ast.Attribute):
        return None
    base = node.value
    if isinstance(base, ast.Name) and base.id == "args":
        return node.attr
    if _matches(base, "self.args"):
        return node.attr
    return None


def _constant(node: ast.AST) -> tuple[bool, Any]:
    """(True, value) when ``node`` is a hashable constant (a list or set constant as a
    tuple / frozenset), else (False, None)."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None
    if isinstance(value, list):
        value = tuple(value)
    elif isinstance(value, set):
        value = frozenset(value)
    try:
        hash(value)
    except TypeError:
        return False, None
    return True, value


def _plain_guard(test: ast.AST) -> Guard | None:
    """The guard an ``if`` test is when it is plain: ``args.X``, or ``args.X OP constant``."""
    flag = _args_flag(test)
    if flag is not None:
        return Guard(flag, ast.unparse(test))
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _OPS:
        flag = _args_flag(test.left)
        ok, value = _constant(test.comparators[0])
        if flag is not None and ok:
            return Guard(flag, ast.unparse(test), type(test.ops[0]).__name__, value)
    return None


@dataclass(frozen=True)
class Use:
    """``role.member`` read at ``file:line`` (relative to the tree). ``remote``: called as
    ``.member.remote(...)``; ``probe``: through ``getattr``/``hasattr`` with a default."""

    role: str
    member: str
    file: str
    line: int
    driver_file: str
    remote: bool = False
    probe: bool = False
    guard: Guard | None = None  # the plain ``if args...`` it is read under, if any

    @property
    def where(self) -> str:
        return f"{self.file}:L{self.line}"


class _File:
    def __init__(self, root: Path, rel: str, tree: ast.Module) -> None:
        self.root, self.rel, self.tree = root, rel, tree
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.defs: dict[str, ast.AST] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs.setdefault(node.name, node)
        self.imported: dict[str, tuple[str, str]] = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    self.imported[a.asname or a.name] = (node.module, a.name)

    def guard(self, node: ast.AST) -> Guard | None:
        """The innermost plain ``if args...:`` whose body holds ``node``, within the
        function (or module) ``node`` is in."""
        child = node
        while child in self.parent:
            up = self.parent[child]
            if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                return None
            if isinstance(up, ast.If) and any(child is b for b in up.body):
                found = _plain_guard(up.test)
                if found is not None:
                    return found
            child = up
        return None

    def enclosing_class(self, node: ast.AST) -> ast.ClassDef | None:
        while node in self.parent:
            node = self.parent[node]
            if isinstance(node, ast.ClassDef):
                return node
        return None


@lru_cache(maxsize=128)
def _load(root: Path, rel: str) -> _File | None:
    path = root / rel
    if not path.is_file():
        return None
    try:
        return _File(root, rel, ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    except SyntaxError:
        return None


def _module_file(root: Path, module: str) -> str | None:
    base = Path(*module.split("."))
    for rel in (base.with_suffix(".py"), base / "__init__.py"):
        if (root / rel).is_file():
            return str(rel)
    return None


def _matches(node: ast.AST, key: str) -> bool:
    if key.startswith("self."):
        return (
            isinstance(node, ast.Attribute)
            and node.attr == key[5:]
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        )
    return isinstance(node, ast.Name) and node.id == key


def _returned(value: ast.AST | None, key: str) -> bool:
    """``return key`` or a conditional expression with ``key`` as one of its outcomes."""
    if isinstance(value, ast.IfExp):
        return _returned(value.body, key) or _returned(value.orelse, key)
    return value is not None and _matches(value, key)


def _params(fn: ast.AST, *, skip_self: bool) -> list[str]:
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    return names[1:] if skip_self and names else names


class _Walker:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.seen: set[tuple[str, int, str, str, str]] = set()
        self.todo: list[tuple[_File, ast.AST, str, str, str]] = []
        self.out: set[Use] = set()

    def add(self, f: _File, scope: ast.AST, key: str, role: str, driver: str) -> None:
        k = (f.rel, id(scope), key, role, driver)
        if k not in self.seen:
            self.seen.add(k)
            self.todo.append((f, scope, key, role, driver))

    def run(self) -> set[Use]:
        while self.todo:
            self.visit(*self.todo.pop())
        return self.out

    def visit(self, f: _File, scope: ast.AST, key: str, role: str, driver: str) -> None:
        cls = scope if isinstance(scope, ast.ClassDef) else f.enclosing_class(scope)
        for node in ast.walk(scope):
            if isinstance(node, ast.Attribute) and _matches(node.value, key):
                up = f.parent.get(node)
                remote = isinstance(up, ast.Attribute) and up.attr == "remote"
                self.out.add(Use(role, node.attr, f.rel, node.lineno, driver, remote=remote, guard=f.guard(node)))
            elif isinstance(node, ast.Call):
                self.call(f, node, key, role, driver, cls)
            elif isinstance(node, ast.Assign) and _matches(node.value, key):
                for t in node.targets:
                    self.bind(f, scope, t, role, driver)
            elif isinstance(node, ast.Return) and cls is not None and _returned(node.value, key):
                method = f.parent.get(node)
                while method is not None and not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    method = f.parent.get(method)
                if method is not None:
                    self.returns(f, cls, method.name, role, driver)

    def bind(self, f: _File, scope: ast.AST, target: ast.AST, role: str, driver: str) -> None:
        if isinstance(target, ast.Name):
            self.add(f, scope, target.id, role, driver)
        elif _matches(target, f"self.{getattr(target, 'attr', '')}"):
            cls = f.enclosing_class(target)
            if cls is not None:
                self.add(f, cls, f"self.{target.attr}", role, driver)  # type: ignore[attr-defined]

    def returns(self, f: _File, cls: ast.ClassDef, method: str, role: str, driver: str) -> None:
        """``self.method(...)`` returns the object: each name it is assigned to in the class."""
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and _matches(node.value.func, f"self.{method}")
            ):
                scope = f.parent.get(node)
                while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    scope = f.parent.get(scope)
                for t in node.targets:
                    self.bind(f, scope or cls, t, role, driver)

    def call(self, f: _File, node: ast.Call, key: str, role: str, driver: str, cls: ast.ClassDef | None) -> None:
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and _matches(node.args[0], key)
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            self.out.add(Use(role, node.args[1].value, f.rel, node.lineno, driver, probe=True, guard=f.guard(node)))
            return
        bound: list[tuple[int | None, str | None]] = [(i, None) for i, a in enumerate(node.args) if _matches(a, key)]
        bound += [(None, k.arg) for k in node.keywords if k.arg and _matches(k.value, key)]
        if not bound:
            return
        target = self.callee(f, func, cls)
        if target is None:
            return
        tf, fn, skip_self = target
        params = _params(fn, skip_self=skip_self)
        named = set(params) | {a.arg for a in getattr(getattr(fn, "args", None), "kwonlyargs", [])}
        for pos, kw in bound:
            name = kw if kw is not None else (params[pos] if pos is not None and pos < len(params) else None)
            if name is not None and name in named:
                self.add(tf, fn, name, role, driver)

    def callee(self, f: _File, func: ast.AST, cls: ast.ClassDef | None) -> tuple[_File, ast.AST, bool] | None:
        """The function a call runs (``__init__`` for a class), its file, and whether its
        first parameter is ``self``."""
        if cls is not None and isinstance(func, ast.Attribute) and _matches(func, f"self.{func.attr}"):
            m = next(
                (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == func.attr),
                None,
            )
            return (f, m, True) if m is not None else None
        if not isinstance(func, ast.Name) or (f.rel in DRIVER_FILES and func.id in REBOUND):
            return None
        tf, name = f, func.id
        if name not in f.defs:
            origin = f.imported.get(name)
            if origin is None or not origin[0].startswith("miles"):
                return None
            rel = _module_file(self.root, origin[0])
            tf = _load(self.root, rel) if rel else None  # type: ignore[assignment]
            if tf is None:
                return None
            name = origin[1]
        node = tf.defs.get(name)
        if isinstance(node, ast.ClassDef):
            init = next(
                (
                    n
                    for n in node.body
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__init__"
                ),
                None,
            )
            return (tf, init, True) if init is not None else None
        if node is None:
            return None
        return tf, node, tf.enclosing_class(node) is not None

    def seed(self, f: _File) -> None:
        driver = f.rel
        for node in ast.walk(f.tree):
            if isinstance(node, ast.Assign):
                call = node.value.value if isinstance(node.value, ast.Await) else node.value
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in _SEED_CALLS):
                    continue
                roles = _SEED_CALLS[call.func.id]
                for t in node.targets:
                    names = t.elts if isinstance(t, ast.Tuple) else [t]
                    for role, n in zip(roles, names):
                        if isinstance(n, ast.Name):
                            self.add(f, f.tree, n.id, role, driver)
        if "object_store" in f.imported or any(
            isinstance(n, ast.alias) and (n.asname or n.name) == "object_store" for n in ast.walk(f.tree)
        ):
            self.add(f, f.tree, "object_store", "object_store", driver)


def uses(tree: Path) -> list[Use]:
    """Every member the drivers of ``tree`` read on a stand-in, sorted by role, member, place."""
    root = Path(tree).resolve()
    w = _Walker(root)
    for rel in DRIVER_FILES:
        f = _load(root, rel)
        if f is not None:
            w.seed(f)
    return sorted(w.run(), key=lambda u: (u.role, u.member, u.file, u.line, u.driver_file))


__all__ = ["DRIVER_FILES", "Guard", "Use", "uses"]
