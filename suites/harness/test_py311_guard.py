"""``harness.checking.py311_guard``: the CPython 3.11 ``ast.parse`` re-entrancy failure seen in
CI, reproduced deterministically, and shown to be prevented by the guard."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.checking import py311_guard

ROOT = Path(__file__).resolve().parents[2]

# A failed task that only the collector can reach, then a parse during which the
# collector runs (threshold 200 lands it inside the AST constructor), 20 frames deep so
# the finalizer's nested parse starts at another depth.
REPRO = textwrap.dedent("""
    import ast, asyncio, gc, logging, sys
    logging.basicConfig(stream=sys.stdout)
    if sys.argv[1] == "guard":
        from harness.checking import py311_guard
        py311_guard.install()

    def helper():
        raise RuntimeError("boom")

    async def leak():
        value = [helper()] + [1]  # a sub-expression, so the traceback has caret anchors
        return value

    def make_garbage():
        loop = asyncio.new_event_loop()
        task = loop.create_task(leak())
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
        cycle = {"task": task}
        cycle["self"] = cycle

    def deep(n):
        if n:
            return deep(n - 1)
        source = open(ast.__file__).read()
        gc.collect()
        make_garbage()
        gc.set_threshold(200)
        try:
            ast.parse(source)
        finally:
            gc.set_threshold(700)

    try:
        deep(20)
        print("PARSED")
    except SystemError as exc:
        print("SYSTEMERROR", exc)
""")


def _repro(mode: str, tmp_path: Path) -> str:
    script = tmp_path / "repro.py"  # a file, so tracebacks have source lines (and carets)
    script.write_text(REPRO)
    out = subprocess.run(
        [sys.executable, str(script), mode],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.process
@pytest.mark.skipif(
    sys.version_info[:3] > (3, 11, 7) or sys.version_info[:2] != (3, 11),
    reason="the bug is only confirmed on CPython 3.11.0-3.11.7 (CI's 3.11.7); 3.12 keeps "
    "the recursion counter per call",
)
def test_the_cpython_bug_reproduces_without_the_guard(tmp_path):
    out = _repro("plain", tmp_path)
    assert "SYSTEMERROR AST constructor recursion depth mismatch" in out
    assert "Task exception was never retrieved" in out


@pytest.mark.skipif(sys.version_info[:2] == (3, 11), reason="on 3.11 the guard is installed (the test above)")
def test_from_3_12_on_the_parse_finishes_without_the_guard_and_none_is_installed(tmp_path):
    """3.12 and 3.13 keep the AST constructor's recursion counter per call: the same
    reproduction parses, so ``install()`` leaves the log records as they are."""
    out = _repro("plain", tmp_path)
    assert "PARSED" in out and "SYSTEMERROR" not in out
    assert "Task exception was never retrieved" in out
    assert py311_guard.install("a-logger-of-this-test") is False
    assert not logging.getLogger("a-logger-of-this-test").filters


@pytest.mark.process
@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the guard is installed on CPython 3.11 only")
def test_the_guard_lets_the_parse_finish_and_still_logs_the_whole_traceback(tmp_path):
    out = _repro("guard", tmp_path)
    assert "PARSED" in out and "SYSTEMERROR" not in out
    assert "Task exception was never retrieved" in out
    assert "in helper" in out and 'raise RuntimeError("boom")' in out and "RuntimeError: boom" in out
    assert "^^^" not in out  # no caret anchors, so no nested ast.parse


def test_plain_text_keeps_the_exception_chain_in_order():
    def inner():
        raise KeyError("k")

    try:
        try:
            inner()
        except KeyError as exc:
            raise ValueError("outer") from exc
    except ValueError as exc:
        text = py311_guard.plain_exc_text(exc)
    assert text.index("KeyError: 'k'") < text.index("direct cause") < text.index("ValueError: outer")
    assert "in inner" in text


def test_the_filter_renders_records_once_and_passes_them_on():
    record = logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "msg", None, None)
    try:
        raise RuntimeError("x")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    assert py311_guard.PlainTracebacks().filter(record) is True
    assert record.exc_text.endswith("RuntimeError: x")
    assert logging.Formatter().format(record).endswith("RuntimeError: x")
