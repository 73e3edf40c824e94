"""The gate's diff coverage on small files built here: the changed hunks of a file, the
statement each changed or executed line belongs to, the report per file and hunk, and
the probe that measures a module per case (in this process: no Miles tree, no worker)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from harness.upstream.diff_coverage import IMPORT, Probe, report
from harness.upstream.diff_lines import changed_files, hunks, is_async, statements

BASE = '''"""A module."""

X = 1


def used(a):
    return a + 1
'''

HEAD = '''"""A module."""

X = 2


def used(a):
    b = a + 1
    return b


@staticmethod
def unused(
    a,
    b=3,
):
    """Nobody calls this."""
    return a + b
'''


def test_hunks_are_heads_added_or_replaced_line_ranges():
    assert hunks(HEAD, BASE) == [(3, 3), (7, 17)]
    assert hunks(BASE, BASE) == []
    assert hunks("a\n", "a\nb\n") == []  # lines removed only: nothing of HEAD's to run


def test_a_changed_header_line_is_run_when_the_body_is_and_a_docstring_is_no_statement():
    stm = statements(HEAD)
    assert stm.changed[11] == stm.changed[14] == 17  # decorator and signature: the body's first statement
    assert 11 not in stm.ran and 12 not in stm.ran  # the header's own line events: the definition only
    assert 16 not in stm.changed and 16 not in stm.ran  # the docstring
    assert stm.changed[3] == stm.ran[3] == 3
    assert 9 not in stm.changed  # a blank line


def test_a_changed_line_inside_a_multi_line_statement_belongs_to_its_first_line():
    stm = statements("call(\n    1,\n    2,\n)\ntry:\n    x = 1\nexcept E:\n    pass\n")
    assert stm.changed[3] == stm.ran[2] == 1
    assert stm.changed[5] == 6  # `try:` has run when its block has
    assert stm.changed[7] == 7


def test_the_async_code_is_the_drivers_and_the_rollout_ray_and_utils_packages():
    assert is_async("miles/rollout/data_source.py") and is_async("train_async.py")
    assert not is_async("miles/backends/megatron_utils/actor.py")


def _trees(tmp_path: Path, head: str = HEAD, base: str = BASE, rel: str = "miles/rollout/m.py") -> tuple[Path, Path]:
    for side, text in (("head", head), ("base", base)):
        (tmp_path / side / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / side / rel).write_text(text)
        (tmp_path / side / "train.py").write_text("")
    return tmp_path / "head", tmp_path / "base"


def test_each_hunk_says_in_how_many_cases_it_ran_or_that_it_never_ran(tmp_path):
    head, base = _trees(tmp_path)
    assert changed_files(head, base) == ["miles/rollout/m.py"]
    measured = {
        "miles/rollout/m.py": {
            "3": [[IMPORT, IMPORT]],
            "7": [[0, 0], [2, 2]],
            "8": [[0, 0], [2, 2]],
            "11": [[IMPORT, IMPORT]],
        }
    }
    rep = report(head, base, ["miles/rollout/m.py"], measured, cases=3)
    texts = [h.text() for h in rep.hunks]
    assert texts == ["L3 ran at import only", "L7-L8 ran in 2 cases", "L11-L17 never ran"]
    assert [h.file for h in rep.unchecked] == ["miles/rollout/m.py"] and rep.unchecked[0].start == 11
    lines = rep.lines()
    assert lines[0] == "diff coverage: HEAD's changed statements in its 3 cases"
    assert "miles/rollout/m.py: L3 ran at import only; L7-L8 ran in 2 cases; L11-L17 never ran" in lines[1]
    assert lines[-1].startswith("  UNCHECKED: 1 changed hunk(s) of the async code in 1 file(s) never ran")


def test_a_hunk_that_partly_ran_names_the_statements_that_did_not(tmp_path):
    head, base = _trees(tmp_path, head=BASE.replace("return a + 1", "if a:\n        a = 0\n    return a + 1"))
    rep = report(head, base, ["miles/rollout/m.py"], {"miles/rollout/m.py": {"7": [[1, 1]], "9": [[1, 1]]}}, cases=2)
    assert [h.text() for h in rep.hunks] == ["L7-L8 ran in 1 case (1 of 2 statements never ran: L8)"]
    assert not rep.unchecked


def test_a_change_outside_the_async_code_that_never_ran_is_reported_but_not_unchecked(tmp_path):
    head, base = _trees(tmp_path, rel="miles/backends/m.py")
    rep = report(head, base, ["miles/backends/m.py"], {}, cases=1)
    assert not rep.unchecked and "(not async code: the harness stands in for it)" in rep.lines()[1]
    assert rep.lines()[-1] == "  every changed hunk of the async code ran"


def test_no_changed_file_and_comments_only_are_said_so(tmp_path):
    head, base = _trees(tmp_path, head=BASE + "# a comment\n")
    assert report(head, base, [], {}, cases=1).lines() == [
        "diff coverage: no Python file under miles/ or the drivers changed: no changed line to run"
    ]
    rep = report(head, base, ["miles/rollout/m.py"], {}, cases=1)
    assert rep.inert == 1 and not rep.unchecked
    assert "no changed statement" in rep.lines()[0]


@pytest.mark.skipif(sys.gettrace() is not None, reason="another tracer (a debugger, coverage) is active here")
def test_the_probe_records_each_line_with_the_cases_it_ran_in(tmp_path):
    head, _base = _trees(tmp_path)
    rel = "miles/rollout/m.py"
    probe = Probe(head, [rel])
    probe.start()
    try:
        spec = importlib.util.spec_from_file_location("gate_coverage_probe_module", head / rel)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        probe.case("first")
        module.used(1)
        probe.case("second")
    finally:
        measured = probe.finish(["first", "second"])
    lines = measured[rel]
    assert lines["3"] == [[IMPORT, IMPORT]] and lines["7"] == [[0, 0]] and "17" not in lines
    rep = report(head, tmp_path / "base", [rel], measured, cases=2)
    assert [h.text() for h in rep.hunks] == ["L3 ran at import only", "L7-L8 ran in 1 case", "L11-L17 never ran"]
