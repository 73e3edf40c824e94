"""The exit codes of the commands that face an upstream Miles tree (``gate``,
``diff-upstream``, ``doctor``), one meaning each across the three.

``FINDING`` is about upstream (an invariant broken, a divergence no known name explains,
a pull request that does not import); ``HARNESS_ERROR`` is about the harness (it could not
run a case faithfully, it crashed, or it was given bad input: ``miles-harness`` exits 2 on
a usage error too); ``REFUSED``: no driver of the tree can run faithfully, or what the
tree imports is not installed, decided before any case runs; ``UNCHECKED``: the pull
request's changed asynchronous lines never ran in any case (``gate``, unless accepted).
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    FINDING = 1
    HARNESS_ERROR = 2
    USAGE = 2  # an alias: a usage error is the harness being asked what it cannot do
    REFUSED = 3
    UNCHECKED = 4


__all__ = ["Exit"]
