"""Regenerate ``known_flags.txt``: the flag names a Miles command line may carry.

    python -m harness.flags.extract --miles-src MILES_TREE --megatron-src MEGATRON_TREE

Reads, without importing either tree: every ``--flag`` string literal passed to an
``add_argument`` call in the Miles tree (Miles' own flags, its router and plugin flags)
and in Megatron-LM's ``megatron/training`` (Megatron's argparse, which Miles' parser
extends), and the field names of the dataclasses Megatron turns into flags with
``ArgumentGroupFactory`` (``--field-name``, with ``--no-`` / ``--disable-`` for booleans).
SGLang's server flags come in under the ``--sglang-`` prefix at run time and are matched
by prefix (``harness.flags.known``), not listed. Writes one flag per line, sorted, under
a header naming both trees.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from pathlib import Path

OUT = Path(__file__).with_name("known_flags.txt")


def add_argument_flags(source: str) -> set[str]:
    flags: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                    flags.add(arg.value)
    return flags


def dataclass_flags(source: str) -> set[str]:
    """``--name`` for each annotated field of each class (and ``--no-name`` /
    ``--disable-name`` for a bool field), as Megatron's ArgumentGroupFactory names them."""
    flags: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                name = item.target.id.replace("_", "-")
                if name.startswith("-"):
                    continue
                flags.add(f"--{name}")
                if isinstance(item.annotation, ast.Name) and item.annotation.id == "bool":
                    flags |= {f"--no-{name}", f"--disable-{name}"}
    return flags


def _commit(tree: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()[:12]
    except (OSError, subprocess.CalledProcessError):
        return tree.name


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--miles-src", type=Path, required=True)
    p.add_argument("--megatron-src", type=Path, required=True)
    args = p.parse_args()
    flags: set[str] = set()
    for path in sorted(args.miles_src.rglob("*.py")):
        flags |= add_argument_flags(path.read_text(errors="replace"))
    meg = args.megatron_src / "megatron"
    for path in sorted((meg / "training").rglob("*.py")):
        flags |= add_argument_flags(path.read_text(errors="replace"))
    for rel in (
        "core/model_parallel_config.py",
        "core/transformer/transformer_config.py",
        "core/optimizer/optimizer_config.py",
        "core/distributed/distributed_data_parallel_config.py",
    ):
        if (meg / rel).exists():
            flags |= dataclass_flags((meg / rel).read_text(errors="replace"))
    for path in sorted((meg / "training" / "config").rglob("*.py")):
        flags |= dataclass_flags(path.read_text(errors="replace"))
    header = (
        "# Flag names a Miles command line may carry: Miles' own (add_argument literals in the Miles\n"
        f"# tree {_commit(args.miles_src)}) and Megatron-LM's (add_argument literals in megatron/training\n"
        f"# and the config dataclasses' fields, Megatron-LM tree {_commit(args.megatron_src)}).\n"
        "# Names only. Regenerate: python -m harness.flags.extract --miles-src M --megatron-src MEG\n"
    )
    OUT.write_text(header + "".join(f"{f}\n" for f in sorted(flags)))
    print(f"{OUT}: {len(flags)} flags")


if __name__ == "__main__":
    main()
