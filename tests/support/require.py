"""Real components a test needs (reference env, gguf, pyverbs, the fuzz corpus).

A developer's checkout may lack them: the tests that need them skip. CI sets
``RPCNET_REQUIRE_REFENV=1`` (``.ci/run``): then a missing component FAILS the test, so a broken
setup can never turn into a green run of skipped tests.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

from support import refenv as _refenv

SWITCH = "RPCNET_REQUIRE_REFENV"


def strict() -> bool:
    """True when missing components must fail (CI)."""
    return os.environ.get(SWITCH) == "1"


def missing(message: str) -> NoReturn:
    """Skip the current test, or fail it when the switch is set."""
    if strict():
        pytest.fail(f"{message} ({SWITCH}=1: required)", pytrace=False)
    pytest.skip(message)


def reference_env(version: str | None = None) -> None:
    """The llama.cpp reference environment built by tools/refenv.sh (one version or all)."""
    if not _refenv.available(version):
        missing(f"reference env missing in {_refenv.refenv_dir()}: run tools/refenv.sh")


def module(name: str) -> ModuleType:
    """Import an optional test dependency (gguf, ...)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"{name} is not installed ({exc}): pip install '.[test]'")
