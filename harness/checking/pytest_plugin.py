"""pytest plugin ``miles_async_harness``: hypothesis profiles and the buffer conformance hook.

Installed as a ``pytest11`` entry point, so any pytest run in an environment with this
package gets:

* hypothesis profiles ``miles-harness-dev``, ``miles-harness-ci`` and
  ``miles-harness-nightly`` (``harness.checking.hypothesis_profiles``), registered under
  names of their own and never loaded here: a user's ``$HYPOTHESIS_PROFILE`` and the
  profiles their conftest registers work as without this plugin. This project's root
  ``conftest.py`` loads one for its own suites.
* ``--data-buffer=package.module:factory``: the ``DataBuffer`` factory the buffer suite
  (``suites/properties/test_buffer_machine.py``) checks, called as
  ``factory(DataBufferConstructorInput(args, unused_handler_fn))`` like Miles'
  ``--custom-async-data-buffer-path``. The module is imported from the current
  directory or ``sys.path``; a bad value is a usage error naming the option, the value
  and the expected form, raised before any test runs.
* the fixture ``data_buffer_factory``: that factory, or ``DefaultDataBuffer``.
* the fixtures ``serve_factory`` and ``served_engine`` (``harness.serve.fixtures``): the
  SGLang-compatible CPU server on a free port, stopped at teardown (``docs/serve.md``).
* ``--miles-src=PATH`` (or ``$MILES_SRC``): the upstream Miles tree the upstream tier
  (``suites/upstream``) runs; the fixture ``miles_src`` activates it or skips with the
  reason (``harness.upstream.source``; default: the pinned tree beside the repository).
  A tree its seams refuse (``harness.upstream.seams``: no driver can run faithfully)
  fails every test that needs it, naming the seam and the file: a user's tree is never
  silently skipped.
* ``--py311-guard`` (opt-in; this project's root ``conftest.py`` turns it on for its own
  suites): on CPython 3.11, plain (caret-free) tracebacks in ``asyncio`` log records
  (``harness.checking.py311_guard``). Off by default, so a pytest run that merely has this
  package installed keeps its logging untouched.
* ``st.from_type(Sample)`` and ``st.from_type(DataBufferInput)``: the strategies
  ``harness.checking.buffer_machine`` registers, available to every test.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Callable

import pytest

from harness.checking import hypothesis_profiles, py311_guard
from harness.serve.fixtures import serve_factory, served_engine  # noqa: F401  (fixtures for any suite)

OPTION = "--data-buffer"
EXPECTED = "package.module:factory"
GUARD_OPTION = "--py311-guard"

hypothesis_profiles.register()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("miles-async-harness")
    group.addoption(
        OPTION,
        action="store",
        default=None,
        metavar=EXPECTED,
        help="DataBuffer factory the buffer conformance suite checks: a callable taking "
        "DataBufferConstructorInput(args, unused_handler_fn) and returning a DataBuffer "
        "(default: miles_async_core.buffer.DefaultDataBuffer)",
    )
    group.addoption(
        "--miles-src",
        action="store",
        default=None,
        metavar="PATH",
        help="upstream Miles checkout for the upstream tier (default: $MILES_SRC, else the pinned "
        "Miles tree in ../shared/third_party/ when present; none: the tier skips)",
    )
    group.addoption(
        GUARD_OPTION,
        action="store_true",
        default=False,
        help="on CPython 3.11, render asyncio log tracebacks without caret anchors, so a leaked "
        "task's traceback cannot corrupt ast.parse in another test (see "
        "harness.checking.py311_guard)",
    )


def _usage(value: str, problem: str, fix: str) -> pytest.UsageError:
    return pytest.UsageError(
        f"{OPTION}={value!r}: {problem}. Expected {OPTION}={EXPECTED} (a callable "
        f"taking DataBufferConstructorInput and returning a DataBuffer, importable from "
        f"the current directory or sys.path). Fix: {fix}."
    )


def resolve_factory(value: str) -> Callable[..., object]:
    """Import ``package.module:factory`` (the attribute may be dotted: ``mod:Class.make``)."""
    module_name, sep, attr = value.partition(":")
    if (
        not sep
        or not module_name
        or not attr
        or not all(p.isidentifier() for p in attr.split("."))
        or not all(p.isidentifier() for p in module_name.split("."))
    ):
        raise _usage(
            value,
            "not of the form package.module:factory",
            "name a module and a callable in it, separated by one colon",
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise _usage(
            value,
            f"module {module_name!r} cannot be imported ({e})",
            "run pytest from the directory holding it or add that directory to PYTHONPATH",
        ) from e
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise _usage(value, f"{module_name} has no attribute {attr!r}", "check the factory's name")
        obj = getattr(obj, part)
    if not callable(obj):
        raise _usage(
            value, f"{module_name}:{attr} is a {type(obj).__name__}, not callable", "point at a class or function"
        )
    return obj


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # Registers the Sample / DataBufferInput strategies; imported here, not at plugin
    # import, because building strategies before hypothesis' own plugin has loaded
    # triggers its HypothesisSideeffectWarning.
    importlib.import_module("harness.checking.buffer_machine")
    if config.getoption(GUARD_OPTION, default=False):
        py311_guard.install()
    value = config.getoption(OPTION, default=None)
    config._miles_data_buffer_factory = resolve_factory(value) if value else None  # type: ignore[attr-defined]


def pytest_report_header(config: pytest.Config) -> str:
    value = config.getoption(OPTION, default=None)
    return f"miles-async-harness: data buffer under test: {value or 'miles_async_core.buffer:DefaultDataBuffer'}"


@pytest.fixture
def data_buffer_factory(pytestconfig: pytest.Config) -> Callable[..., object]:
    """The ``DataBuffer`` factory named by ``--data-buffer``, else ``DefaultDataBuffer``."""
    factory = getattr(pytestconfig, "_miles_data_buffer_factory", None)
    if factory is None:
        from miles_async_core.buffer import DefaultDataBuffer

        return DefaultDataBuffer
    return factory


@pytest.fixture(scope="session")
def miles_src(pytestconfig: pytest.Config) -> Path:
    """The upstream Miles tree, activated (on ``sys.path``, import fakes applied); skips the
    test with the reason when there is none or it does not import here."""
    from harness.upstream import source

    path, how = source.find_miles_src(pytestconfig.getoption("--miles-src", default=None))
    if path is None:
        pytest.skip(how)
    try:
        return source.activate(path)
    except source.SeamMissing as exc:
        pytest.fail(f"upstream Miles ({how}) refused: {exc}", pytrace=False)
    except source.UpstreamUnavailable as exc:
        pytest.skip(f"upstream Miles ({how}) unavailable: {exc}")
