"""Decode engines killed and started again on a schedule, for bench/goodput.py --kill-every.

Every `period_s` the next decode engine (in turn) gets SIGKILL (by the PID this bench started)
and is started again at once on the same ports with the same flags, as a supervisor (systemd,
a container's restart policy) would. A restarted engine is a new generation: for the routers
that bind placement to one (Narwhal's profile store), `restarted` is told, and rewrites the
store's row as `narwhal deploy` would after re-profiling that engine (Gate F for it alone);
the others see the engine come back at its URL.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from _procs import Owned, start, wait_status


@dataclass
class Killer:
    """Kills and restarts decode engines in turn while a router is measured."""

    engines: list[Owned]
    decode: list[int]  # indexes of the decode engines, killed in turn
    period_s: float
    restarted: Callable[[int], None] = lambda i: None
    events: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def begin(self, t_zero: float) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(t_zero,), daemon=True)
        self._thread.start()

    def end(self) -> list[dict[str, Any]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)
        return self.events

    def _run(self, t_zero: float) -> None:
        turn = 0
        while not self._stop.wait(max(0.0, t_zero + self.period_s * (turn + 1) - time.monotonic())):
            i = self.decode[turn % len(self.decode)]
            turn += 1
            self.events.append(self._kill_and_restart(i, t_zero))

    def _kill_and_restart(self, i: int, t_zero: float) -> dict[str, Any]:
        old = self.engines[i]
        killed = time.monotonic()
        os.kill(old.pid, signal.SIGKILL)
        old.proc.wait(10)
        argv, env, cpu = old.extra["argv"], old.extra["env"], old.extra["cpu"]
        new = start(old.name, argv, cpu=str(cpu), log=old.log, port=old.port,  # type: ignore[arg-type]
                    env=env)  # type: ignore[arg-type]
        new.extra.update(old.extra)
        self.engines[i] = new
        wait_status(new.port, "/health", 90, new.proc)
        healthy = time.monotonic()
        self.restarted(i)
        return {"engine": f"e{i}", "killed_at_s": round(killed - t_zero, 3),
                "healthy_after_s": round(healthy - killed, 3)}
