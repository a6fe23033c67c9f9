"""Errors raised while turning a client's graph into work; each closes only that connection."""


class ComputeError(Exception):
    """A graph that cannot be executed (malformed references, unsupported op, bad shapes)."""


class UnsupportedOp(ComputeError):
    """No kernel for this (op, types) combination."""
