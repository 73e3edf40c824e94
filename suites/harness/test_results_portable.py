"""Committed result files name no path of the machine that made them: a reader's checkout
is elsewhere (``harness.results.schema.portable`` writes them relative to the checkout)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from harness.results.schema import _REPO_DIR, portable

ROOT = Path(__file__).resolve().parents[2]
# absolute paths under the usual roots of a machine's own folders
MACHINE_PATH = re.compile(r"(?<![\w.$])/(?:work|tmp|home|root|Users|mnt)/")


def test_portable_writes_the_checkout_the_folder_beside_it_and_the_temp_dir_as_a_reader_follows_them():
    text = f"{_REPO_DIR.parent}/shared/tree, {_REPO_DIR}/results/x.json, {tempfile.gettempdir()}/log"
    assert portable(text) == "../shared/tree, results/x.json, $TMPDIR/log"


def test_no_committed_result_file_names_a_path_of_the_machine_that_made_it():
    named = []
    for path in sorted((ROOT / "results").rglob("*")):
        if path.is_file() and path.suffix in {".json", ".txt", ".md", ".jsonl"}:
            text = path.read_text(errors="replace")
            named += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in MACHINE_PATH.finditer(text)][:1]
    assert named == []
