"""Errors a user can cause. Their messages name the flag or field, the value given,
what is allowed, and the fix; the CLI prints them without a traceback (exit 2)."""


class ConfigError(ValueError):
    """A bad flag value or combination, or a malformed scenario/config field."""


class WorkerDiedError(RuntimeError):
    """Not raised by the core any more: a drain after the fully-async worker died raises
    the worker's own exception, and ``asyncio.CancelledError`` for a cancelled worker, as
    upstream (``fully_async_rollout.py:L152``). Kept for callers that still catch it."""


class EngineDeadError(RuntimeError):
    """The rollout engine itself is gone (its process or thread died): no request can
    succeed any more, so drivers stop instead of skipping the failed group and retrying
    forever, which is what upstream does for a single failed request."""
