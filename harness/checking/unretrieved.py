"""asyncio's "Task exception was never retrieved" records, made something a test asserts.

A task that ends with an exception nobody retrieves is logged by asyncio when the task is
garbage-collected, which may be long after the run that left it (after the test session,
as stray tracebacks under a green run). ``collect`` runs the collector now, so the records
land in the test that caused them, and returns them from ``records`` (a live list such as
pytest's ``caplog.records``, read after the collection). ``from_worker_crash`` says
whether a record is the known upstream one: under an injected worker crash, upstream's
fully-async worker dies on the first failed group (``task.result()`` in ``_worker_loop``,
``miles/rollout/fully_async_rollout.py:L127-L135``) and the other failed groups' tasks
stay unretrieved.
"""

from __future__ import annotations

import gc
import logging


def collect(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    """The unretrieved-task records in ``records`` once every unreachable task is collected."""
    gc.collect()
    return [r for r in records if r.name == "asyncio" and "never retrieved" in r.getMessage()]


def from_worker_crash(record: logging.LogRecord) -> bool:
    """A failed group task of upstream's fully-async worker, failed by the injected crash."""
    from harness.sim.fault_schedule import WorkerCrash

    exc = record.exc_info[1] if record.exc_info else None
    return "coro=<FullyAsyncRolloutFn._generate_group()" in record.getMessage() and isinstance(exc, WorkerCrash)
