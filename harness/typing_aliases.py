"""Type aliases shared across the harness's public surfaces.

JSON. ``JSONValue`` is what ``json.loads`` returns and ``json.dumps`` accepts without a
``default=``: ``None``, ``bool``, ``int``, ``float``, ``str``, and lists and string-keyed
objects of those, nested to any depth. ``JSONDict`` is one JSON object. Code that builds a
document and hands it to ``json.dumps`` takes ``JSONDict``; code that reads a parsed
document narrows each value with ``isinstance`` before it uses it.

``dict`` is invariant in its value type, so a ``dict[str, int]`` is not a ``JSONDict``:
a function that only reads or passes a JSON-like mapping on takes ``JSONMapping``
(read-only, so covariant), and a value that is only passed through is typed ``object``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TypeAlias

JSONScalar: TypeAlias = "str | int | float | bool | None"
JSONValue: TypeAlias = "JSONScalar | list[JSONValue] | dict[str, JSONValue]"
JSONDict: TypeAlias = "dict[str, JSONValue]"
JSONList: TypeAlias = "list[JSONValue]"
# Read-only views: a dict[str, int] or a list[dict[str, float]] is one of these.
JSONMapping: TypeAlias = "Mapping[str, JSONReadable]"
JSONReadable: TypeAlias = "JSONScalar | Sequence[JSONReadable] | Mapping[str, JSONReadable]"


def to_json(value: object) -> JSONValue:
    """``value`` as a JSON document holds it (tuples become lists); raises ``TypeError``
    on a value JSON cannot hold, as writing it would."""
    parsed: JSONValue = json.loads(json.dumps(value))
    return parsed
