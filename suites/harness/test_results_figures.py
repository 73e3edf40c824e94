"""Every figure in ``results/README.md`` matches the committed file and named key it cites,
and the check fails when a figure or a cited value is edited."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from harness.results.figures import Figure, KeyPathError, segments, check_figure, lookup, table_rows

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "results" / "README.md").read_text()
ROWS = table_rows(TEXT)


def test_the_table_has_rows_and_each_cites_a_file_and_named_keys():
    assert len(ROWS) >= 4
    for row in ROWS:
        assert row.source and row.keys, row
        for key in row.keys:  # a name or a selector at every step, never a list position
            assert not any(name.isdigit() for name, _ in segments(key)), (row.what, key)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.what[:60])
def test_each_figure_matches_its_cited_file(row):
    assert check_figure(row, ROOT) == []


def _bump(printed: str) -> str:
    """The printed number moved by one unit of its last digit."""
    mantissa, _, exponent = printed.partition("e")
    digits = len(mantissa.split(".")[1]) if "." in mantissa else 0
    moved = f"{float(mantissa) + 10**-digits:.{digits}f}"
    return moved + ("e" + exponent if exponent else "")


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.what[:60])
def test_editing_any_number_of_a_figure_fails(row):
    from harness.results.figures import NUMBER

    for m in NUMBER.finditer(row.figure):
        number = m.group(1).replace(",", "")
        edited = row.figure[: m.start(1)] + _bump(number) + row.figure[m.end(1) :]
        assert check_figure(Figure(row.what, edited, row.source, row.keys), ROOT) != [], (row.what, edited)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.what[:60])
def test_editing_a_cited_value_in_its_file_fails(row, tmp_path):
    path = tmp_path / row.source
    path.parent.mkdir(parents=True)
    shutil.copy(ROOT / row.source, path)
    doc = json.loads(path.read_text())
    key = row.keys[0]
    parent_key, _, last = key.rpartition(".")
    parent = lookup(doc, parent_key) if parent_key else doc
    value = parent[last]
    parent[last] = [v * 1.5 + 1 for v in value] if isinstance(value, list) else value * 1.5 + 1
    path.write_text(json.dumps(doc))
    assert check_figure(row, tmp_path) != []


def test_the_figures_cite_no_commit_hash_and_no_issue_number():
    assert not re.search(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", TEXT)
    assert not re.search(r"\bissue \d+|#\d+|\u00a7", TEXT)


def test_an_edited_figure_fails(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"a": {"b": 0.9612}, "runs": [0.83, 0.95, 0.89], "share": 0.631}))
    good = Figure("x", "0.96 (runs 0.83-0.95), both busy 63.1%", "r.json", ("a.b", "runs", "share"))
    assert check_figure(good, tmp_path) == []
    for edited in (
        "0.97 (runs 0.83-0.95), both busy 63.1%",
        "0.96 (runs 0.80-0.95), both busy 63.1%",
        "0.96 (runs 0.83-0.95), both busy 64%",
    ):
        assert check_figure(Figure("x", edited, "r.json", good.keys), tmp_path) != [], edited
    (tmp_path / "k.json").write_text(json.dumps({"kl": 0.0017543, "n": 31277}))
    assert check_figure(Figure("x", "k3 KL 1.75e-03, 31,277 per s", "k.json", ("kl", "n")), tmp_path) == []
    assert check_figure(Figure("x", "k3 KL 1.76e-03, 31,277 per s", "k.json", ("kl", "n")), tmp_path) != []
    assert check_figure(Figure("x", "1", "missing.json", ("a",)), tmp_path) != []
    assert check_figure(Figure("x", "1", "r.json", ("nope",)), tmp_path) != []


def test_a_number_no_key_accounts_for_fails(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"a": 0.5}))
    assert check_figure(Figure("x", "0.5", "r.json", ("a",)), tmp_path) == []
    assert check_figure(Figure("x", "0.5 of 40 steps", "r.json", ("a",)), tmp_path) != []


def test_records_are_cited_by_field_values_never_by_position(tmp_path):
    doc = {
        "rows": [
            {"mode": "sync", "B": 8, "e": 0.1},
            {"mode": "one-step", "B": 8, "e": -0.093},
            {"mode": "one-step", "B": 16, "e": 0.02, "cfg": {"name": "x.y"}},
        ]
    }
    (tmp_path / "v.json").write_text(json.dumps(doc))
    assert lookup(doc, "rows[B=8,mode=one-step].e") == -0.093
    assert lookup(doc, "rows[cfg.name=x.y].B") == 16
    assert check_figure(Figure("x", "-9.3%", "v.json", ("rows[B=8,mode=one-step].e",)), tmp_path) == []
    for bad in ("rows.1.e", "rows[mode=one-step].e", "rows[mode=fully-async].e", "rows[mode].e"):
        with pytest.raises(KeyPathError):
            lookup(doc, bad)
        assert check_figure(Figure("x", "-9.3%", "v.json", (bad,)), tmp_path) != [], bad


def test_a_figure_in_gib_is_compared_with_bytes(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps({"peak": 5_207_000_000}))
    assert check_figure(Figure("x", "peak 4.85 GiB", "m.json", ("peak",)), tmp_path) == []
    assert check_figure(Figure("x", "peak 4.86 GiB", "m.json", ("peak",)), tmp_path) != []
    assert check_figure(Figure("x", "peak 5207000000", "m.json", ("peak",)), tmp_path) == []  # no unit: as stored


def test_a_signed_figure_keeps_its_sign_and_a_range_dash_is_not_a_minus(tmp_path):
    (tmp_path / "e.json").write_text(json.dumps({"err": -0.0928, "up": 0.091, "lo": 0.83, "hi": 0.95}))
    keys = ("err", "up", "lo", "hi")
    assert check_figure(Figure("x", "-9.3% and +9.1% (0.83-0.95)", "e.json", keys), tmp_path) == []
    assert check_figure(Figure("x", "9.3% and +9.1% (0.83-0.95)", "e.json", keys), tmp_path) != []
    assert check_figure(Figure("x", "-9.3% and -9.1% (0.83-0.95)", "e.json", keys), tmp_path) != []
