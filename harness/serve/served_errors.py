"""``ServeError``: a request the server refuses, with its HTTP status.

``schema=True`` marks what SGLang's request schema rejects before any handler runs (an
unknown ``sampling_params`` key, a wrong type): SGLang answers those ``{"error":
"<message>"}``; every other refusal answers ``{"error": {"message": ...}}``.
"""

from __future__ import annotations


class ServeError(Exception):
    def __init__(self, message: str, status: int = 400, *, schema: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.schema = schema
