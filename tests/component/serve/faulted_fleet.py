"""A P/D fleet of emulator processes behind a router, for tests that break its engines: one
prefill engine, three decode engines, each restarted on its port after a test killed it.

A greedy request's answer is a function of its tokens on every emulator (generator.py), so
the answer a request gets on an unfaulted fleet is the reference a faulted one must give.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from narwhal.lab.engine.testing import RunningEngine, free_port, start_engine, write_tiny_llama
from tests.component.serve.harness import Router, call, journal_rows

KV_BOTH = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}'
STEP_S = 0.03  # a decode step: 40 tokens stream for about 1.2 s
ENGINE_ARGS = ["--served-model-name", "tiny", "--kv-transfer-config", KV_BOTH,
               "--emu-platform", "cpu", "--dtype", "float32", "--enforce-eager",
               "--block-size", "32", "--kv-cache-memory-bytes", "64M",
               "--emu-eos-probability", "0", "--emu-decode-base", str(STEP_S),
               "--emu-decode-per-token", "0", "--emu-decode-per-request", "0"]
ROLES = {"p0": "prefill", "d0": "decode", "d1": "decode", "d2": "decode"}
STALL_FLOOR_S = 0.6
PROMPT = "the world of people and the state of things"


class Fleet:
    """Emulators and a router in front; engines are restarted on their ports after a test
    killed or stopped one, so each test starts from a whole fleet."""

    def __init__(self, root: Path, serving: dict[str, Any] | None = None) -> None:
        self.root = root
        self.serving = {"stall_steps": 5, "stall_floor_s": STALL_FLOOR_S, **(serving or {})}
        self.model = write_tiny_llama(root / "tiny")
        self.engines: dict[str, RunningEngine] = {}
        self.router: Router | None = None
        self.journal = root / "j.jsonl"

    def start(self) -> Fleet:
        for name in ROLES:
            self.engines[name] = self._engine(name)
        doc = {"schema": "narwhal.fleet", "schema_version": 1, "model": "tiny",
               "engines": [{"id": n, "url": e.url, "role": ROLES[n]}
                           for n, e in self.engines.items()],
               "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "journal": {"path": str(self.journal)},
               "health": {"eject_after_failures": 1, "probe_interval_s": 0.2,
                          "probe_timeout_s": 0.5},
               "serving": self.serving}
        (self.root / "fleet.json").write_text(json.dumps(doc))
        self.router = Router(self.root / "fleet.json", free_port()).start()
        return self

    def _engine(self, name: str, port: int | None = None) -> RunningEngine:
        return start_engine(self.model, log_path=self.root / f"{name}.log", port=port,
                            extra_args=ENGINE_ARGS,
                            env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"})

    def heal(self) -> None:
        """Every engine running and admitted again (a stopped one continued, a dead one
        restarted on its port)."""
        for name, engine in self.engines.items():
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine.pid, signal.SIGCONT)
            if not engine.alive():
                engine.process.wait()
                self.engines[name] = self._engine(name, engine.port)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            state = call(self.port, "GET", "/narwhal/state").json()
            if all(e["admitted"] for e in state["engines"]):
                return
            time.sleep(0.1)
        raise AssertionError(f"engines not readmitted: {state['engines']}")

    @property
    def port(self) -> int:
        assert self.router is not None
        return self.router.port

    def stop(self) -> None:
        if self.router is not None and self.router.proc is not None \
                and self.router.proc.poll() is None:
            self.router.stop()
        for engine in self.engines.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine.pid, signal.SIGCONT)
            engine.stop()

    def gauge(self, name: str, series: str, label: str = "") -> float:
        """The value of `series` (a metric's name, with `label` among its labels) on engine
        `name`, read from its own /metrics; 0 when it is not there."""
        text = call(self.engines[name].port, "GET", "/metrics", timeout=0.5).body.decode()
        for line in text.splitlines():
            if line.startswith(series) and label in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def fault(self, name: str, fault: str, **fields: Any) -> None:
        """Set (or clear) a fault on engine `name` (lab/engine/faults.py)."""
        reply = call(self.engines[name].port, "POST", "/emu/fault", {"fault": fault, **fields})
        assert reply.status == 200, reply.body

    def running(self, series: str = "vllm:num_requests_running{", label: str = "") -> str | None:
        """The decode engine with a request running now (or in the state `series` and `label`
        name), from its own metrics."""
        for name in ("d0", "d1", "d2"):
            if not self.engines[name].alive():
                continue
            with contextlib.suppress(OSError):
                if self.gauge(name, series, label) > 0:
                    return name
        return None


@contextlib.contextmanager
def running(root: Path, serving: dict[str, Any] | None = None) -> Iterator[Fleet]:
    """A started fleet (for a module's tests to share), stopped whatever happens."""
    fleet = Fleet(root, serving)
    try:
        yield fleet.start()
    finally:
        fleet.stop()


class Stream:
    """A streamed request read event by event, with the time each event arrived."""

    def __init__(self, port: int, path: str, body: dict[str, Any], request_id: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.conn.request("POST", path, json.dumps(body),
                          {"content-type": "application/json", "x-request-id": request_id})
        self.response = self.conn.getresponse()
        assert self.response.status == 200
        self.events: list[Any] = []
        self.times: list[float] = []

    def read(self, n: int | None = None) -> None:
        """Read `n` more events (all of them when None)."""
        want = None if n is None else len(self.events) + n
        while want is None or len(self.events) < want:
            line = self.response.readline()
            if not line:
                return
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            self.events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
            self.times.append(time.monotonic())
            if data == b"[DONE]":
                return

    def close(self) -> None:
        self.conn.close()


def journal_row(fleet: Fleet, request_id: str) -> dict[str, Any]:
    """The journal row of `request_id` (the writer is waited for, bounded)."""
    deadline = time.monotonic() + 5
    while True:
        rows = [r for r in journal_rows(fleet.journal) if r["request_id"] == request_id]
        if rows or time.monotonic() > deadline:
            assert rows, f"no journal row for {request_id}"
            return rows[-1]
        time.sleep(0.05)


def answer_text(events: list[Any], chat: bool) -> str:
    out = ""
    for e in events:
        if isinstance(e, dict) and e.get("choices"):
            choice = e["choices"][0]
            part = choice.get("delta", {}).get("content") if chat else choice.get("text")
            out += part or ""
    return out
