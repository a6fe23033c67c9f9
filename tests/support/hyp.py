"""Hypothesis profiles: deterministic in CI, random for developers, long and random in bench/.

Profiles (``HYPOTHESIS_PROFILE`` picks one explicitly):
* ``ci``: derandomized (the same examples every run) and no example database; the default when
  ``CI=true`` or ``RPCNET_REQUIRE_REFENV=1``.
* ``dev``: Hypothesis' own defaults (a fresh random draw each run, failures replayed from
  ``.hypothesis/``); the default elsewhere.
* ``long``: random, for ``bench/property_long.py``; ``RPCNET_HYPOTHESIS_SCALE`` multiplies every
  test's example count (:func:`examples`).

A failure found by a random draw is added to its test as an explicit ``@example`` so that the ci
profile checks it on every run.
"""

from __future__ import annotations

import os

from hypothesis import Phase, settings

SCALE_VARIABLE = "RPCNET_HYPOTHESIS_SCALE"

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev")
settings.register_profile(
    "long", derandomize=False, print_blob=True, phases=tuple(Phase), report_multiple_bugs=True
)


def default_profile() -> str:
    if os.environ.get("HYPOTHESIS_PROFILE"):
        return os.environ["HYPOTHESIS_PROFILE"]
    if os.environ.get("CI") == "true" or os.environ.get("RPCNET_REQUIRE_REFENV") == "1":
        return "ci"
    return "dev"


def load() -> str:
    """Load the profile for this run (before any test module builds its settings)."""
    name = default_profile()
    settings.load_profile(name)
    return name


def examples(count: int) -> int:
    """A test's example count, scaled for the long randomized run."""
    return count * max(1, int(os.environ.get(SCALE_VARIABLE, "1")))
