"""Skips for missing hardware or software that become failures on a GPU runner.

Tests that need a CUDA GPU, NVML, sglang or the test model skip elsewhere with a stated
reason. On a machine that is supposed to have all of that (the GPU CI runner sets
``MILES_HARNESS_REQUIRE_GPU=1``) such a skip would let a broken runner pass silently, so
``require_or_skip(reason)`` fails the test instead, naming what is missing.

Use it for every guard of the form "this needs X and X is absent here". Guards of the
opposite form ("this checks the no-GPU path and a GPU is present") are plain skips: on a
GPU runner they are expected.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Mapping
from typing import NoReturn

import pytest

REQUIRE_GPU_ENV = "MILES_HARNESS_REQUIRE_GPU"
_OFF = ("", "0", "false", "no", "off")


def gpu_required(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``$MILES_HARNESS_REQUIRE_GPU`` is set to anything but empty/0/false/no/off."""
    env = os.environ if environ is None else environ
    return env.get(REQUIRE_GPU_ENV, "").strip().lower() not in _OFF


def require_or_skip(reason: str) -> NoReturn:
    """Skip with ``reason``, or fail with it when ``$MILES_HARNESS_REQUIRE_GPU`` is set."""
    if gpu_required():
        pytest.fail(f"{REQUIRE_GPU_ENV} is set (this machine must run the GPU tests), but: {reason}", pytrace=False)
    pytest.skip(reason)


def cuda_missing_reason() -> str | None:
    """Why torch cannot use a CUDA device here, or None when it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def module_installed(name: str) -> bool:
    """Whether the real package ``name`` can be imported here. The upstream tier registers
    import fakes for packages that are not installed (``harness.upstream.leaf_fakes``); such
    a module in ``sys.modules`` has no spec, so the search goes to ``sys.path`` instead."""
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__miles_harness_fake__", False):
        return importlib.machinery.PathFinder.find_spec(name) is not None
    return importlib.util.find_spec(name) is not None
