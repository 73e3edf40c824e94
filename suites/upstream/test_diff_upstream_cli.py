"""`miles-harness diff-upstream`: runs named matrix cases, prints identical or the first
divergence, exits 1 on an unexpected result and 2 without a Miles tree."""

from __future__ import annotations

from harness import cli
from harness.upstream import diff

# a deliberate harness extension switched on: it parts from upstream by design
EXT = "fa-group-staleness0-retry+max-retries0"


def test_prints_identical_and_known_divergence(miles_src, capsys):
    rc = cli.main(["diff-upstream", "--miles-src", str(miles_src), "--scenario", "sync",
                   "--scenario", EXT])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "sync: identical" in out
    assert f"{EXT}: first divergence in 'recycles' at item 0 (known: EXT async_max_retries" in out
    assert "2 cases" in out and "0 unexpected" in out


def test_an_unexpected_divergence_fails(miles_src, capsys, monkeypatch):
    case = diff.case_named(EXT)
    monkeypatch.setattr(diff, "case_named", lambda name: diff.DiffCase(**{**case.__dict__, "known": None}))
    rc = cli.main(["diff-upstream", "--scenario", EXT])
    assert rc == 1
    assert "UNEXPECTED: a divergence no known id explains" in capsys.readouterr().out


def test_unknown_case_and_missing_tree_are_usage_errors(miles_src, tmp_path, capsys):
    assert cli.main(["diff-upstream", "--scenario", "no-such-case"]) == 2
    assert "no case 'no-such-case'" in capsys.readouterr().err
    assert cli.main(["diff-upstream", "--miles-src", str(tmp_path)]) == 2
