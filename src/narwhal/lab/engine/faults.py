"""Faults on command: what a broken engine looks like to its clients.

`EngineFaults` holds the live state; the HTTP layer and the step loop read it on every request
or step (plain attribute reads), the NIXL side reads its four flags at the moment it acts:

    refuse_handshakes          answer no side-channel handshake
    drop_lease_early           free held KV blocks before their lease runs out
    recompute_instead_of_pull  a consumer recomputes instead of pulling
    stale_peer                 behave as a restarted producer: consumers that handshook before
                               fail until they handshake again

corrupt_pulls (with an optional `peer`: the producer's "host:port" side channel, its port, or
its engine id; none: every producer) makes a consumer decode KV it pulled from that producer as
if it held another request's blocks (the last prompt it pulled, as vllm#52234; the first pull,
its prompt with the last token repeated): the transfer itself succeeds and every counter says
so, only the answer is wrong (HTTP 200 with wrong tokens).

cut_pulls (the same optional `peer`) is a cut fabric edge from that producer to this consumer:
a pull from it starts (the request counts as fetching) and then waits, moving nothing, until
the fault is cleared, when it goes on as a link that came back would; only the client leaving
or the engine's death ends it sooner.

Engine-level faults: crash (exit at once, like a dead engine core), hang (no HTTP answer,
/health included, and no scheduler progress; the /emu routes still answer so a test can clear
it), slow (every step costs `factor` times more), wrong_model (serve another model name).
`POST /emu/fault {"fault": NAME, ...}` sets one; `clear` resets all; SIGUSR1 toggles hang.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FLAG_FAULTS = ("refuse_handshakes", "drop_lease_early", "recompute_instead_of_pull", "stale_peer")
FaultName = Literal["crash", "hang", "slow", "wrong_model", "refuse_handshakes",
                    "drop_lease_early", "recompute_instead_of_pull", "stale_peer",
                    "corrupt_pulls", "cut_pulls", "clear"]


class FaultCommand(BaseModel):
    """Body of POST /emu/fault."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    fault: FaultName
    enabled: bool = True  # hang and the four flags: set (true) or clear (false)
    factor: float = Field(default=10.0, gt=0)  # slow
    model: str | None = Field(default=None, min_length=1)  # wrong_model: the name to serve
    exit_code: int = Field(default=1, ge=0, le=255)  # crash
    # corrupt_pulls, cut_pulls
    peer: str | None = Field(default=None, min_length=1, max_length=256)


class _Clearing:
    """What waits for a fault to clear: one future shared by every waiter, made when the first
    one asks and completed when the fault is cleared."""

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None

    def wait(self) -> asyncio.Future[None]:
        if self._future is None or self._future.done():
            self._future = asyncio.get_running_loop().create_future()
        return self._future

    def cleared(self) -> None:
        if self._future is not None and not self._future.done():
            self._future.set_result(None)


@dataclass
class EngineFaults:
    """Live fault state (mutable on purpose: faults change while the engine runs)."""

    refuse_handshakes: bool = False
    drop_lease_early: bool = False
    recompute_instead_of_pull: bool = False
    stale_peer: bool = False
    hung: bool = False
    slow_factor: float = 1.0
    wrong_model: str | None = None
    corrupt_pulls_from: str | None = None  # "*": every producer
    cut_pulls_from: str | None = None  # "*": every producer

    def __post_init__(self) -> None:
        self._unhung = _Clearing()
        self._mended = _Clearing()

    def hang_gate(self) -> asyncio.Future[None] | None:
        """While hung: a future that completes when the hang is cleared; else None."""
        return self._unhung.wait() if self.hung else None

    def set_hung(self, hung: bool) -> None:
        self.hung = hung
        if not hung:
            self._unhung.cleared()

    def cut_gate(self, params: dict[str, object]) -> asyncio.Future[None] | None:
        """While the edge from this request's producer is cut: a future that completes when
        the cut is cleared; else None."""
        return self._mended.wait() if _matches(self.cut_pulls_from, params) else None

    def _set_cut(self, peer: str | None) -> None:
        self.cut_pulls_from = peer
        if peer is None:
            self._mended.cleared()

    def apply(self, command: FaultCommand) -> None:
        """Apply one command (crash is handled by the caller: it ends the process)."""
        name = command.fault
        if name == "clear":
            for flag in FLAG_FAULTS:
                setattr(self, flag, False)
            self.slow_factor = 1.0
            self.wrong_model = None
            self.corrupt_pulls_from = None
            self._set_cut(None)
            self.set_hung(False)
        elif name == "hang":
            self.set_hung(command.enabled)
        elif name == "slow":
            self.slow_factor = command.factor if command.enabled else 1.0
        elif name == "corrupt_pulls":
            self.corrupt_pulls_from = (command.peer or "*") if command.enabled else None
        elif name == "cut_pulls":
            self._set_cut((command.peer or "*") if command.enabled else None)
        elif name == "wrong_model":
            self.wrong_model = (command.model or "wrong-model") if command.enabled else None
        elif name in FLAG_FAULTS:
            setattr(self, name, command.enabled)

    def snapshot(self) -> dict[str, object]:
        return {
            "refuse_handshakes": self.refuse_handshakes,
            "drop_lease_early": self.drop_lease_early,
            "recompute_instead_of_pull": self.recompute_instead_of_pull,
            "stale_peer": self.stale_peer,
            "hung": self.hung,
            "slow_factor": self.slow_factor,
            "wrong_model": self.wrong_model,
            "corrupt_pulls_from": self.corrupt_pulls_from,
            "cut_pulls_from": self.cut_pulls_from,
        }

    def corrupts(self, params: dict[str, object]) -> bool:
        """Whether KV pulled with these kv_transfer_params is to be decoded as corrupt."""
        return _matches(self.corrupt_pulls_from, params)


def _matches(peer: str | None, params: dict[str, object]) -> bool:
    """Whether a fault naming `peer` (None: off; "*": every producer) concerns a pull with
    these kv_transfer_params (its producer's "host:port" side channel, port or engine id)."""
    if peer is None:
        return False
    host, port = params.get("remote_host"), params.get("remote_port")
    return peer in ("*", f"{host}:{port}", str(port), str(params.get("remote_engine_id")))
