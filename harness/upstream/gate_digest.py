"""A gate run kept as a small result file: ``miles-harness gate`` on two Miles trees, and
from its ``gate.json`` what a reader of ``docs/upstream.md`` needs: the verdict counts, the
aspects that differ (cases per aspect), the wall and CPU time with the host's load before
and after, and the cases that are neither unchanged nor changed, grouped by what HEAD
newly breaks (or why it did not start), each group with its case names.

    python -m harness.upstream.gate_digest --miles-src HEAD_TREE --base BASE_TREE --out PREFIX

writes ``PREFIX.json`` and ``PREFIX.md``; the gate's own output (``summary.md``, the logs,
megabytes) goes to a temporary directory that is removed. Exit 0 once the files are
written (the gate's exit code is in them), else the gate's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.results.schema import git_info, machine_info, portable, utc_now

# the verdicts that are a case's headline (a finding, or a case the gate could not compare)
LISTED = ("new_violation", "not_started", "harness_error", "no_base", "violation_fixed", "not_run")


def digest(gate: dict[str, Any]) -> dict[str, Any]:
    """The counts, aspects, times and grouped headline cases of a ``gate.json``."""
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for case in gate["cases"]:
        if case["verdict"] not in LISTED:
            continue
        what = ", ".join(sorted(case["new"])) if case["verdict"] == "new_violation" else case["message"][:160]
        groups[(case["verdict"], what)].append(case["name"])
    return {
        "exit": gate["exit"],
        "counts": gate["counts"],
        "aspects": gate["aspects"],
        "wall_s": gate["wall_s"],
        "cpu_s": gate["cpu_s"],
        "trees": gate["trees"],
        "groups": [
            {"verdict": verdict, "what": what, "cases": len(names), "names": names}
            for (verdict, what), names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        ],
    }


def format_md(doc: dict[str, Any]) -> str:
    d = doc["digest"]
    lines = [
        f"# Gate: {doc['head']} against {doc['base']}",
        "",
        f"`{doc['command']}`",
        "",
        f"Exit {d['exit']}; {sum(d['counts'].values())} cases: "
        + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(d["counts"].items())),
        f"Wall {d['wall_s']:.1f} s, CPU {d['cpu_s']:.1f} s on {doc['machine']['cpu_count']} cores; "
        f"load average before {doc['load_before']}, after {doc['load_after']}.",
        "What differs, by aspect (cases): " + ", ".join(f"{k} {v}" for k, v in d["aspects"].items()),
        "",
        "| verdict | what | cases | first cases |",
        "|---|---|---:|---|",
    ]
    for g in d["groups"]:
        what = g["what"].replace("|", "\\|")
        lines.append(f"| {g['verdict'].replace('_', ' ')} | {what} | {g['cases']} | {', '.join(g['names'][:6])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.upstream.gate_digest", description=__doc__.split("\n\n")[0])
    p.add_argument("--miles-src", required=True, help="HEAD: the pull request's Miles tree")
    p.add_argument("--base", required=True, help="BASE: a Miles tree or a git ref (as for miles-harness gate)")
    p.add_argument("--out", required=True, type=Path, help="write OUT.json and OUT.md")
    a = p.parse_args(argv)
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="miles-harness-gate-") as tmp:
        cmd = [sys.executable, "-m", "harness.cli", "gate", "--miles-src", a.miles_src, "--base", a.base, "--out", tmp]
        rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False).returncode
        gate_json = Path(tmp) / "gate.json"
        if not gate_json.is_file():
            print(f"the gate exited {rc} and wrote no gate.json", file=sys.stderr)
            return rc or 2
        gate = json.loads(gate_json.read_text())
    doc = {
        "command": "python -m harness.upstream.gate_digest " + " ".join(argv if argv is not None else sys.argv[1:]),
        "created_utc": utc_now(),
        "git": git_info(),
        "machine": machine_info(),
        "head": Path(a.miles_src).name,
        "base": Path(a.base).name,
        "load_before": load_before,
        "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "digest": digest(gate),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(portable(json.dumps(doc, indent=1)) + "\n")
    a.out.with_suffix(".md").write_text(portable(format_md(doc)))
    print(format_md(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
