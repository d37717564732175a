"""The container runtime's refusals, importable without the runtime module (narwhal-engine
loads each subcommand's modules only when that subcommand runs)."""

from __future__ import annotations


class RuntimeError_(Exception):
    """The runtime refused or failed; the message is the runtime's own words."""
