"""Every figure in README's "Measured here" table matches the committed file it cites."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.results.figures import Figure, check_figure, table_rows

ROOT = Path(__file__).resolve().parents[2]
ROWS = table_rows((ROOT / "README.md").read_text())


def test_the_table_has_rows_and_each_cites_a_file_and_keys():
    assert len(ROWS) >= 4
    for row in ROWS:
        assert row.source and row.keys, row


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.what)
def test_each_readme_figure_matches_its_cited_file(row):
    assert check_figure(row, ROOT) == []


def test_an_edited_figure_fails(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"a": {"b": 0.9612}, "runs": [0.83, 0.95, 0.89], "share": 0.631}))
    good = Figure("x", "0.96 (runs 0.83-0.95), both busy 63.1%", "r.json", ("a.b", "runs", "share"))
    assert check_figure(good, tmp_path) == []
    for edited in ("0.97 (runs 0.83-0.95), both busy 63.1%", "0.96 (runs 0.80-0.95), both busy 63.1%",
                   "0.96 (runs 0.83-0.95), both busy 64%"):
        assert check_figure(Figure("x", edited, "r.json", good.keys), tmp_path) != [], edited
    (tmp_path / "k.json").write_text(json.dumps({"kl": 0.0017543, "n": 31277}))
    assert check_figure(Figure("x", "k3 KL 1.75e-03, 31,277 per s", "k.json", ("kl", "n")), tmp_path) == []
    assert check_figure(Figure("x", "k3 KL 1.76e-03, 31,277 per s", "k.json", ("kl", "n")), tmp_path) != []
    assert check_figure(Figure("x", "1", "missing.json", ("a",)), tmp_path) != []
    assert check_figure(Figure("x", "1", "r.json", ("nope",)), tmp_path) != []


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
