"""Dynamic sampling filters for the differential, in each return form upstream accepts
(``miles/rollout/filter_hub/base_types.py:L11-L21``). The same function serves the core
(``args.dynamic_sampling_filter``) and upstream (``--dynamic-sampling-filter-path``).
Each rejects every third prompt group, keyed by ``group_index`` only."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class _Output:
    keep: bool
    reason: str | None = None


def _output_cls() -> type:
    mod = sys.modules.get("miles.rollout.filter_hub.base_types")
    return getattr(mod, "DynamicFilterOutput", _Output) if mod is not None else _Output


def _first(group: Any) -> Any:
    return group[0][0] if isinstance(group[0], list) else group[0]


def _reject(group: Any) -> bool:
    return _first(group).group_index % 3 == 2


def with_reason(args: Any, group: Any) -> Any:
    """``DynamicFilterOutput(keep, reason)``: rejects counted as ``drop_third``."""
    return _output_cls()(keep=not _reject(group), reason="third" if _reject(group) else None)


def bare_bool(args: Any, group: Any) -> bool:
    """A bare bool (legacy form): no reason, so no drop metric."""
    return not _reject(group)


def none_rejects(args: Any, group: Any) -> bool | None:
    """``None`` for a reject, ``True`` otherwise: upstream wraps ``None`` as ``keep=None``
    and drops the group, with no drop metric (divergence `filter-none-drops`, closed: the core does the same)."""
    return None if _reject(group) else True


FORMS = {"with_reason": with_reason, "bare_bool": bare_bool, "none_rejects": none_rejects}
