"""The hypothesis profiles of this project's own suites.

Their names are the project's own (``miles-harness-dev``, ``miles-harness-ci``,
``miles-harness-nightly``), so registering them can never replace a profile a user
registers, and the pytest plugin (``harness.checking.pytest_plugin``) registers them and
loads none: a pytest run that merely has this package installed keeps hypothesis'
defaults and the user's own ``$HYPOTHESIS_PROFILE``. This repository's root
``conftest.py`` loads one for its suites (``load_for_project``).

* ``miles-harness-dev``: random, with hypothesis' example database (the default here).
* ``miles-harness-ci``: derandomized, no deadline, ``print_blob``, 200 examples, no database.
* ``miles-harness-nightly``: 5000 examples, no deadline.
"""

from __future__ import annotations

import os
from typing import Final

from hypothesis import HealthCheck, settings
from hypothesis.errors import InvalidArgument

PROFILE_ENV: Final = "HYPOTHESIS_PROFILE"
DEV: Final = "miles-harness-dev"
CI: Final = "miles-harness-ci"
NIGHTLY: Final = "miles-harness-nightly"
NAMES: Final = (DEV, CI, NIGHTLY)


def register() -> None:
    """Register the three profiles (idempotent; loads none)."""
    settings.register_profile(DEV, deadline=None)
    settings.register_profile(
        CI,
        derandomize=True,
        deadline=None,
        print_blob=True,
        max_examples=200,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile(NIGHTLY, max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def load_for_project() -> str:
    """Load the profile ``$HYPOTHESIS_PROFILE`` names (any registered one), else ``miles-harness-dev``;
    returns its name. An unknown name raises ``ValueError`` naming the variable, the value,
    the allowed names and the fix."""
    register()
    name = os.environ.get(PROFILE_ENV) or DEV
    try:
        settings.load_profile(name)
    except InvalidArgument:
        raise ValueError(
            f"{PROFILE_ENV}={name!r} names no registered hypothesis profile. Allowed for this "
            f"project's suites: {', '.join(NAMES)}. Fix: set it to one of those (e.g. "
            f"{PROFILE_ENV}={CI}) or unset it."
        ) from None
    return name
