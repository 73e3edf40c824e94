"""The harness could not run upstream's code faithfully: never an upstream finding.

Commands and suites that face upstream tell two failures apart: upstream differs or
breaks an invariant (a finding, exit 1), and the harness itself could not run the case
as upstream would run (``HarnessError``, exit 2). Each ``HarnessError`` names the seam
(``harness.upstream.seams``) or the piece of the harness that failed.
"""

from __future__ import annotations


class HarnessError(RuntimeError):
    """The harness could not run this faithfully. ``seams``: the seams involved."""

    def __init__(self, message: str, seams: list[str] | tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.seams = list(seams)


class RunnerSeamError(HarnessError):
    """A leaf fake or seam of the harness raised inside upstream's code during a run
    (``LeafCalled``): upstream may have caught and logged it as its own task error,
    but the failure is the harness'. Raised after the run with what the run left
    (``result``), so no finding is made of it."""

    def __init__(self, raised: list, result: object) -> None:
        seams = sorted({getattr(e, "seam", "leaf") for e in raised})
        first = "; ".join(f"[{getattr(e, 'seam', 'leaf')}] {e}" for e in raised[:3])
        super().__init__(
            f"harness_error: seam {', '.join(seams)} failed inside upstream's code ({len(raised)} time(s)): {first}",
            seams,
        )
        self.raised = raised
        self.result = result


__all__ = ["HarnessError", "RunnerSeamError"]
