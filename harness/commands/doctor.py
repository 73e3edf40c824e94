"""`miles-harness doctor`: can the harness run this Miles checkout faithfully?

    miles-harness doctor [--miles-src PATH]

Probes every seam where the harness touches upstream beyond its public flags
(``harness.upstream.seams``: the lifecycle sink, the submission scheduler factory, the
weight-version source, each function it wraps or rebinds, each private attribute it
reads) by reading the tree's source, and prints the table: seam, found or missing,
where it looked, what the harness does without it; then the verdict per driver; then
the leaves the harness fakes (everything between them is upstream's own code, its
orchestration included), each with its boundary and why. Nothing of the tree is imported, so a tree that does not import is still
described.

Exit 0: the harness runs the tree (``runs``, or ``runs partly``: the drivers it cannot
run are named with the seams they lack, and the differential and the suites skip or
refuse them); 3: refused, no driver can run faithfully; 2: no Miles tree at the path.
"""

from __future__ import annotations

import argparse

from harness.upstream.exit_codes import Exit
from miles_async_core.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--miles-src",
        help="upstream Miles checkout (default: $MILES_SRC, else the pinned tree "
        "beside the repository, ../shared/third_party/miles-<pinned commit>)",
    )


def main(args: argparse.Namespace) -> int:
    from harness.upstream import seams, source

    path, how = source.find_miles_src(args.miles_src)
    if path is None:
        raise ConfigError(how)
    why = source.not_miles("--miles-src", str(args.miles_src or path), path)
    if why:
        raise ConfigError(why)
    report = seams.probe(path)
    print(f"({how})")
    print(report.format())
    print(_leaves(report.shape))
    if report.verdict == "refused":
        print(f"\nrefused: {report.refusal()}")
        return Exit.REFUSED
    return Exit.OK


def _leaves(shape: str | None = None) -> str:
    """What the harness fakes on ``shape``: each a leaf, with its boundary; on the controller-executor shape also the leaves not faked yet, with where a
    run stops without them (``harness.upstream.leaves_refactor.UNHOSTED``)."""
    from harness.upstream import leaves, leaves_refactor
    from harness.upstream.seams import CONTROLLER_EXECUTOR

    refactor = shape == CONTROLLER_EXECUTOR
    table = leaves_refactor.LEAVES if refactor else leaves.LEAVES
    lines = [
        "",
        f"faked on the {shape or 'rollout-manager'} shape (the leaves; everything between them runs as "
        "upstream wrote it):",
    ]
    for leaf in table:
        lines.append(f"  {leaf.name:<20} {leaf.boundary}")
        lines.append(f"  {'':<20} why: {leaf.why}")
    if not refactor:
        from harness.serve.served_leaves import SERVED_LEAVES

        lines += [
            "",
            "faked in the served run (harness.serve.upstream_e2e: real time, real HTTP to CPU servers; "
            "the same orchestration runs as upstream wrote it):",
        ]
        for leaf in SERVED_LEAVES:
            lines.append(f"  {leaf.name:<20} {leaf.boundary}")
            lines.append(f"  {'':<20} why: {leaf.why}")
    if refactor and leaves_refactor.UNHOSTED:
        lines += ["", "not faked yet on the controller-executor shape (the shape is refused until they are):"]
        for name, needs, stops in leaves_refactor.UNHOSTED:
            lines.append(f"  {name:<20} needs: {needs}")
            lines.append(f"  {'':<20} without it: {stops}")
    return "\n".join(lines)
