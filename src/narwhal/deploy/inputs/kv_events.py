"""NARWHAL_KV_EVENTS_PORT against the launch policy: what would make the events a lie.

An engine publishes KV cache events only for blocks its prefix cache holds, so an engine
launched with `--no-enable-prefix-caching` and asked to publish would send nothing the router
could place on, while the fleet says it publishes; and `--kv-events-config` written by hand in
ENGINE_ARGS would be a second, unrecorded publisher setting (the fleet would not know its
endpoint). Both are refused here, before any host is touched, naming both fields.
"""

from __future__ import annotations

from collections.abc import Sequence

PREFIX_CACHING = "--enable-prefix-caching"
NO_PREFIX_CACHING = "--no-enable-prefix-caching"
EVENTS_FLAG = "--kv-events-config"


def _flag(arg: str) -> str:
    """A flag as vLLM's parser reads it: `--a_b=1` is `--a-b` (underscores are dashes)."""
    name = arg.split("=", 1)[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def prefix_caching_on(engine_args: Sequence[str]) -> bool:
    """vLLM's default (on) unless the last of the two spellings turns it off."""
    on = True
    for arg in engine_args:
        flag = _flag(arg)
        if flag == PREFIX_CACHING:
            on = True
        elif flag == NO_PREFIX_CACHING:
            on = False
    return on


def conflicts(port: int | None, engine_args: Sequence[str], args_var: str,
              port_var: str) -> list[tuple[str, str, str]]:
    """(variable, problem, fix) for each contradiction between the events port and ENGINE_ARGS."""
    out: list[tuple[str, str, str]] = []
    if any(_flag(a) == EVENTS_FLAG for a in engine_args):
        out.append((args_var, f"sets {EVENTS_FLAG}, which Narwhal writes itself from "
                    f"{port_var} (and records in the launch record and the fleet)",
                    f"remove {EVENTS_FLAG} from {args_var} and set {port_var}=PORT"))
    if port is not None and not prefix_caching_on(engine_args):
        out.append((args_var, f"turns prefix caching off ({NO_PREFIX_CACHING}) while "
                    f"{port_var}={port} asks the engine to publish KV cache events: it would "
                    "publish none, and the router would place on a cache that is not there",
                    f"remove {NO_PREFIX_CACHING} from {args_var}, or delete {port_var}"))
    return out
