"""Log levels of `rpcnet serve`: INFO by default, `-v` DEBUG, `-vv` TRACE (every command)."""

from __future__ import annotations

import logging

TRACE = 5  # below DEBUG: every command with its size and latency
logging.addLevelName(TRACE, "TRACE")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def level_for(verbose: int) -> int:
    return (logging.INFO, logging.DEBUG, TRACE)[max(0, min(verbose, 2))]


def configure(verbose: int) -> int:
    """Set the root level from the count of `-v` flags; returns the level chosen."""
    level = level_for(verbose)
    logging.basicConfig(level=level, format=FORMAT)
    logging.getLogger().setLevel(level)
    return level
