"""vLLM general plugin that sets NIXL's progress-thread delay.

nixl 1.5.1 creates every agent with ``pthrDelay = 0``: its UCX progress thread polls with a
zero timeout and keeps a core busy for the engine's lifetime. On a two-core test machine two
engines starve each other and the first handoff takes tens of seconds. vLLM loads general
plugins in every process it starts (API server, engine core, worker), so wrapping the agent
constructor here reaches the worker that owns the NIXL agent. Disabling the thread instead
hangs concurrent transfers, so the thread stays and only its poll delay changes.

``NARWHAL_NIXL_PTHR_DELAY_US`` sets the delay in microseconds (default 1000; 0 leaves NIXL as is).
"""

from __future__ import annotations

import os
import types
from typing import Any

_ENV = "NARWHAL_NIXL_PTHR_DELAY_US"


def register() -> None:
    """Wrap ``nixl._api.nixlBind.nixlAgent`` once so each new agent gets the delay."""
    delay_us = int(os.environ.get(_ENV, "1000"))
    if delay_us <= 0:
        return
    try:
        import nixl._api as nixl_api
    except Exception:  # nixl absent or broken: leave vLLM to report it
        return
    bindings = nixl_api.nixlBind
    if getattr(bindings, "narwhal_pthr_delay_us", None) is not None:
        return
    make_agent = bindings.nixlAgent

    def agent_with_delay(name: str, config: Any, *args: Any, **kwargs: Any) -> Any:
        config.pthrDelay = delay_us
        return make_agent(name, config, *args, **kwargs)

    # The bindings module is a C extension whose attributes are read-only, so a plain
    # module with the same contents and one replaced constructor takes its place.
    patched = types.ModuleType(bindings.__name__)
    patched.__dict__.update(bindings.__dict__)
    patched.nixlAgent = agent_with_delay
    patched.narwhal_pthr_delay_us = delay_us
    nixl_api.nixlBind = patched
