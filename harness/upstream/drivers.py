"""The three drivers of upstream Miles the harness runs, spelled one way.

``Driver.SYNC`` is ``train.py``; ``Driver.ONE_STEP`` and ``Driver.FULLY_ASYNC`` are
``train_async.py`` without and with ``--fully-async`` (``miles/rollout/fully_async_rollout.py``).
A ``Driver`` is a ``str`` (``"sync"``, ``"one-step"``, ``"fully-async"``): the reports, the
seam table and ``miles-harness doctor`` print these values.
"""

from __future__ import annotations

from enum import StrEnum


class Driver(StrEnum):
    SYNC = "sync"
    ONE_STEP = "one-step"
    FULLY_ASYNC = "fully-async"

    @property
    def file(self) -> str:
        """The root driver file it runs."""
        return "train.py" if self is Driver.SYNC else "train_async.py"

    @classmethod
    def of(cls, config: object) -> Driver:
        """The driver a scenario config runs (its ``driver`` and ``fully_async``)."""
        if getattr(config, "driver", None) == "train":
            return cls.SYNC
        return cls.FULLY_ASYNC if getattr(config, "fully_async", False) else cls.ONE_STEP


__all__ = ["Driver"]
