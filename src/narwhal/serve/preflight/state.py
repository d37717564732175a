"""What the gates share while one check runs: the fleet, its clients, and who already failed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from narwhal.core.calibration import Calibration
from narwhal.core.fleet import EngineEntry, FleetDocument
from narwhal.core.profiles import Generation, ProfileStore
from narwhal.core.secret import Secret
from narwhal.serve.engine_client import EngineClient
from narwhal.serve.preflight.captures import EngineCapture
from narwhal.serve.preflight.events_feed import EventIndex
from narwhal.serve.preflight.options import CheckOptions

# Which earlier gates an engine must have passed for a later gate to measure it.
NEEDS: dict[str, tuple[str, ...]] = {
    "model": ("reach",),
    "profile": ("reach",),
    "pace": ("reach", "model", "profile"),
    "tokenize": ("reach", "model"),
    "events": ("reach", "model"),
    "kv": ("reach", "model", "tokenize"),
    "contract": ("reach",),
    "slo": ("profile",),
}


@dataclass
class CheckState:
    """Mutable on purpose: each gate records the engines it failed for the gates after it."""

    fleet: FleetDocument
    fleet_path: Path
    options: CheckOptions
    clients: dict[str, EngineClient]
    calibration: Calibration | None = None
    calibration_path: Path | None = None
    store: ProfileStore | None = None
    generations: dict[str, Generation] = field(default_factory=dict)
    captures: dict[str, EngineCapture] | None = None  # --captures: Gate C's evidence
    failed: dict[str, set[str]] = field(default_factory=dict)
    engine_key: Secret | None = None  # the engines' API key (fleet: engine_auth)
    # a fresh router index for one engine's KV events (check_cli wires in the router's own)
    event_index: Callable[[], EventIndex] | None = None

    @property
    def engines(self) -> tuple[EngineEntry, ...]:
        return self.fleet.engines

    def fail(self, gate: str, engine_id: str) -> None:
        self.failed.setdefault(gate, set()).add(engine_id)

    def blocker(self, gate: str, engine_id: str) -> str | None:
        """Why `gate` cannot measure `engine_id` (the first failed gate it needs), or None."""
        for need in NEEDS.get(gate, ()):
            if engine_id in self.failed.get(need, set()):
                return f"{engine_id} failed the {need} gate"
        return None
