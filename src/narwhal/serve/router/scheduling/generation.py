"""Generation binding: an engine is priced only by a profile row measured on the same process.

At startup and on every sweep the router reads each engine's live generation (`GET /version`
for the engine version, `process_start_time_seconds` from `GET /metrics`) and compares it with
the engine's row in the profile store:
- equal: the engine may be placed and is priced by that row (`engine.profile`);
- different: held out of placement with reason `reprofile` until someone re-profiles it;
- no row: held out with reason `no_profile`.
An engine whose generation cannot be read keeps its last binding; health decides whether it
is reachable at all.

The store is re-read when its file changes (checked every sweep by mtime, size and inode) and
at once on SIGHUP. A store that no longer validates is not used: the previous one stays, and
the error shows in /narwhal/state and the log. Nothing here runs on the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from narwhal.core.errors import InputError
from narwhal.core.profiles import Generation, ProfileStore, load_profiles
from narwhal.serve.router.control.attestation import HELD as ATTESTATION_HELD
from narwhal.serve.router.jsonio import loads
from narwhal.serve.router.request.deadlines import Deadlines
from narwhal.serve.router.request.legs import LegFailed, LegTimedOut, exchange, request_bytes
from narwhal.serve.router.request.upstream import EngineUnreachable
from narwhal.serve.router.scheduling.bookings import profile_rebound
from narwhal.serve.router.scheduling.engines import Engine

_log = logging.getLogger("narwhal.serve.router.scheduling.generation")
_START = re.compile(rb"^process_start_time_seconds ([0-9.eE+-]+)[ \t]*$", re.MULTILINE)
REPROFILE = "reprofile"
NO_PROFILE = "no_profile"


class GenerationUnreadable(Exception):
    """The engine did not tell its version or process start time."""


def parse_version(payload: bytes) -> str:
    """The `version` string of a `GET /version` body."""
    try:
        version = loads(payload).get("version")
    except (ValueError, AttributeError):
        raise GenerationUnreadable("/version is not a JSON object") from None
    if not isinstance(version, str) or not version:
        raise GenerationUnreadable("/version has no version string")
    return version


def parse_start_time(metrics_text: bytes) -> float:
    """`process_start_time_seconds` from a Prometheus text page."""
    found = _START.search(metrics_text)
    if found is None:
        raise GenerationUnreadable("/metrics has no process_start_time_seconds")
    try:
        value = float(found.group(1))
    except ValueError:
        raise GenerationUnreadable("process_start_time_seconds is not a number") from None
    if not value > 0:
        raise GenerationUnreadable("process_start_time_seconds is not positive")
    return value


async def read_generation(engine: Engine, timeout_s: float, deadlines: Deadlines) -> Generation:
    """The engine's live generation; raises GenerationUnreadable."""
    host = engine.spec.host_header
    try:
        status, version = await exchange(engine.pool, request_bytes(b"GET", b"/version", host, b"",
                                                                    None), timeout_s, deadlines)
        if status != 200:
            raise GenerationUnreadable(f"/version answered {status}")
        status, metrics = await exchange(engine.pool, request_bytes(b"GET", b"/metrics", host, b"",
                                                                    None), timeout_s, deadlines)
        if status != 200:
            raise GenerationUnreadable(f"/metrics answered {status}")
    except (EngineUnreachable, LegFailed, LegTimedOut) as exc:
        raise GenerationUnreadable(str(exc) or type(exc).__name__) from None
    return Generation(engine_version=parse_version(version),
                      process_start_time_seconds=parse_start_time(metrics))


class ProfileBook:
    """The profile store as this router holds it, reloaded when its file changes."""

    def __init__(self, path: Path, model: str, engine_ids: tuple[str, ...]) -> None:
        self.path = path
        self.model = model
        self.engine_ids = engine_ids
        self.store: ProfileStore | None = None
        self.loads = 0
        self.last_error = ""
        self._signature: tuple[int, int, int] | None = None

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def load(self) -> ProfileStore:
        """Read and validate the store now (startup: an InputError stops the router)."""
        signature = self._stat()
        store = load_profiles(self.path, model=self.model, engine_ids=self.engine_ids)
        self.store, self._signature = store, signature
        self.loads += 1
        self.last_error = ""
        return store

    def reload_if_changed(self, force: bool = False) -> bool:
        """Blocking (run it in a thread): True when a new store was taken."""
        if not force and self._stat() == self._signature:
            return False
        try:
            self.load()
        except InputError as exc:
            self._signature = self._stat()  # do not re-parse the same bad file every sweep
            self.last_error = str(exc)
            _log.error("profile store not reloaded, keeping the previous one: %s", exc)
            return False
        _log.warning("profile store %s reloaded", self.path)
        return True

    def state(self) -> dict[str, Any]:
        return {"path": str(self.path), "loads": self.loads, "last_error": self.last_error or None}


class Binder:
    """Reads live generations and binds each engine to its row, or holds it out."""

    def __init__(self, engines: Sequence[Engine], book: ProfileBook, deadlines: Deadlines,
                 timeout_s: float, interval_s: float,
                 attested: Mapping[str, str] | None = None) -> None:
        self.engines = tuple(engines)
        # engine id -> the attestation digest of Gate E's contract: such an engine is placed
        # only while its sidecar vouches for exactly that digest (attestation.py), so it is
        # part of the live generation a profile row must name
        self.attested = dict(attested or {})
        self.book = book
        self.deadlines = deadlines
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self.holds = 0
        self._wake = asyncio.Event()

    def bind(self, engine: Engine) -> None:
        """Decide from the engine's last live generation and the current store."""
        live = engine.live_generation
        store = self.book.store
        if live is None or store is None or engine.held == ATTESTATION_HELD:
            return  # an engine its sidecar does not vouch for stays out (attestation.py)
        row = store.row(engine.id)
        if row is None:
            held, detail, profile = NO_PROFILE, f"the profile store has no row for {engine.id}", None
        elif row.generation != live:
            held, profile = REPROFILE, None
            detail = (f"live generation ({live.describe()}) differs from the profiled one "
                      f"({row.generation.describe()}); run narwhal-profile --only {engine.id}")
        else:
            held, detail, profile = "", "", row
        if held and held != engine.held:
            self.holds += 1
            _log.warning("engine %s held out (%s): %s", engine.id, held, detail)
        elif engine.held and not held:
            _log.warning("engine %s bound to its profile again", engine.id)
        if profile is not engine.profile:
            profile_rebound(engine)  # the biases measured were the old row's
        engine.held, engine.held_detail, engine.profile = held, detail, profile

    async def _read(self, engine: Engine) -> None:
        try:
            live = await read_generation(engine, self.timeout_s, self.deadlines)
        except GenerationUnreadable as exc:
            _log.debug("engine %s generation unreadable: %s", engine.id, exc)
            return
        if engine.id in self.attested:
            live = live.model_copy(update={"attestation_digest": self.attested[engine.id]})
        engine.live_generation = live
        self.bind(engine)

    async def sweep(self, force_reload: bool = False) -> None:
        if await asyncio.to_thread(self.book.reload_if_changed, force_reload):
            for engine in self.engines:
                self.bind(engine)
        await asyncio.gather(*(self._read(e) for e in self.engines))

    def reload_now(self) -> None:
        """SIGHUP: re-read the store and every generation now."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            forced = self._wake.is_set()
            self._wake.clear()
            await self.sweep(force_reload=forced)
