"""``ServeError``: a request the server refuses, with its HTTP status.

``schema=True`` marks what SGLang's request schema rejects before any handler runs (an
unknown ``sampling_params`` key, a wrong type): SGLang answers those ``{"error":
"<message>"}``; every other refusal answers ``{"error": {"message": ...}}``.

``ContextLengthError`` is the tokenizer manager's length check (``_validate_one_request``
in sglang's ``srt/managers/tokenizer_manager.py``): a ``ValueError`` there, so SGLang
answers it HTTP 400 ``{"error": {"message"}}``, and inside a stream (where the check
runs after the response began) HTTP 200 with a ``data: {"error": {...}}`` event, then
``data: [DONE]``.
"""

from __future__ import annotations


class ServeError(Exception):
    def __init__(self, message: str, status: int = 400, *, schema: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.schema = schema


class ContextLengthError(ServeError):
    """A prompt, or a prompt plus ``max_new_tokens``, that does not fit the context."""
