"""Staleness as Miles defines it (`fully_async_data_buffer.py:L187-L192`, `L40-L43`).

``staleness(group, current_version) = current_version - min over every sample (nested
groups flattened, all turns) of sample.oldest_weight_version``; ``None`` when the
version is unknown or no sample carries a numeric version. Pure functions only.
"""

from __future__ import annotations

from typing import Any

from miles_async_core.types import samples_of


def group_oldest_weight_version(group: Any) -> int | None:
    """The oldest ``Sample.oldest_weight_version`` over every sample of ``group``, or ``None``."""
    versions = [v for s in samples_of(group) if (v := s.oldest_weight_version) is not None]
    return min(versions) if versions else None


def group_staleness(group: Any, current_version: int | None) -> int | None:
    if current_version is None:
        return None
    oldest = group_oldest_weight_version(group)
    return None if oldest is None else current_version - oldest
