"""Is a flag on a Miles command line a flag of Miles at all?

Contract: ``unknown_flags(argv)`` returns, in order, each ``--flag`` of ``argv`` that is
neither a flag the harness models (``miles_async_core.config``), nor listed in
``known_flags.txt`` (Miles' and Megatron-LM's flag names, written by
``harness.flags.extract``), nor under a prefix Miles adds at run time (SGLang's server
flags as ``--sglang-*`` and ``--eval-sglang-*``). ``nearest(flag)`` is the closest known
name by ``difflib`` (``None`` when nothing is close). A command turns an unknown flag into
an error unless the user passes ``--allow-unknown-miles-flags`` (a flag of a newer Miles
tree than the list was made from): a misspelled flag would otherwise be ignored and the
run would use the default the user meant to change.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path

from miles_async_core.config import flag_of
from miles_async_core.config import AsyncConfig

# SGLang's ServerArgs become Miles flags under these prefixes (miles/backends/sglang_utils/arguments.py).
RUNTIME_PREFIXES = ("--sglang-", "--eval-sglang-")
OPT_OUT = "--allow-unknown-miles-flags"


@lru_cache(maxsize=1)
def modelled() -> frozenset[str]:
    import dataclasses

    return frozenset(flag_of(f.name) for f in dataclasses.fields(AsyncConfig) if f.name != "driver")


@lru_cache(maxsize=1)
def listed() -> frozenset[str]:
    text = Path(__file__).with_name("known_flags.txt").read_text()
    return frozenset(line.strip() for line in text.splitlines() if line.startswith("--"))


def is_known(flag: str) -> bool:
    return flag in modelled() or flag in listed() or flag.startswith(RUNTIME_PREFIXES)


def nearest(flag: str) -> str | None:
    """The modelled flag closest to ``flag`` if one is close (a misspelled async flag is the
    costly case), else the closest listed one."""
    for pool in (sorted(modelled()), sorted(listed())):
        match = difflib.get_close_matches(flag, pool, n=1, cutoff=0.75)
        if match:
            return match[0]
    return None


def unknown_flags(argv: list[str]) -> list[str]:
    return [t.partition("=")[0] for t in argv if t.startswith("--") and t != "--" and not is_known(t.partition("=")[0])]
