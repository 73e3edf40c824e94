"""Errors a user can cause. Their messages name the flag or field, the value given,
what is allowed, and the fix; the CLI prints them without a traceback (exit 2)."""


class ConfigError(ValueError):
    """A bad flag value or combination, or a malformed scenario/config field."""


class WorkerDiedError(RuntimeError):
    """The fully-async rollout worker exited; raised by every later drain."""
