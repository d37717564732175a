"""Fixtures for router component tests: start mini engines and routers, stop them all by PID."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.component.serve.harness import MiniEngine, Router, fleet_doc, free_port, journal_rows


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "serve_load: the full 256-concurrency x 30 s journal test "
        "(runs in make test; about 35 s)")


class Spawner:
    """Starts processes for one test and remembers them so the fixture can stop them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.engines: list[MiniEngine] = []
        self.routers: list[Router] = []

    def engine(self, name: str, *args: str, port: int | None = None) -> MiniEngine:
        eng = MiniEngine(name, port or free_port(), self.root / f"{name}.calls.jsonl", args)
        self.engines.append(eng)
        return eng.start()

    def fleet(self, engines: list[tuple[str, str, str]], **sections: Any) -> Path:
        path = self.root / f"fleet-{len(self.routers)}.json"
        path.write_text(json.dumps(fleet_doc(engines, self.journal, **sections)))
        return path

    @property
    def journal(self) -> Path:
        return self.root / "journal.jsonl"

    def router(self, engines: list[tuple[str, str, str]], *, env: dict[str, str] | None = None,
               wait_ready: bool = True, **sections: Any) -> Router:
        r = Router(self.fleet(engines, **sections), free_port(), env or {})
        self.routers.append(r)
        return r.start(wait_ready=wait_ready)

    def router_on(self, fleet: Path, *args: str, wait_ready: bool = True) -> Router:
        """Another router process on an existing fleet document (a rival or a standby)."""
        r = Router(fleet, free_port(), {}, args)
        self.routers.append(r)
        return r.start(wait_ready=wait_ready)

    def pd(self, **sections: Any) -> tuple[MiniEngine, MiniEngine, Router]:
        """One prefill engine, one decode engine and a router over them."""
        p = self.engine("p0")
        d = self.engine("d0")
        r = self.router([("p0", p.url, "prefill"), ("d0", d.url, "decode")], **sections)
        return p, d, r

    def close(self) -> None:
        for r in self.routers:
            if r.proc is not None and r.proc.poll() is None:
                r.stop()
        for e in self.engines:
            e.stop()
        journal_rows(self.journal)  # every request the routers settled, held to the table


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    s = Spawner(tmp_path)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spawner]:
    """One prefill engine, one decode engine and a router for a whole module of tests that
    do not change them (reach them as shared.engines and shared.routers[0])."""
    s = Spawner(tmp_path_factory.mktemp("shared"))
    try:
        s.pd()
        yield s
    finally:
        s.close()
