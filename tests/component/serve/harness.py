"""Processes and clients for router component tests: mini engines, the router, HTTP calls.

Every process is started by PID and stopped by PID in the fixtures' finally blocks.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from narwhal.lab.ports import free_port as free_port  # one picker for every harness
from narwhal.serve.router.request.decisions import every_decision

REPO = Path(__file__).resolve().parents[3]
SERVE = Path(sys.executable).parent / "narwhal-serve"
MODEL = "mini-model"


def wait_http(port: int, path: str, want: int = 200, timeout: float = 20.0,
              proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {path} answered")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", path)
            status = conn.getresponse().status
            conn.close()
            if status == want:
                return
            last = str(status)
        except OSError as exc:
            last = str(exc)
        time.sleep(0.05)
    raise TimeoutError(f"127.0.0.1:{port}{path} did not answer {want} in {timeout}s (last: {last})")


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 10) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)


@dataclass
class MiniEngine:
    """One tests.component.serve.mini_engine process."""

    id: str
    port: int
    record: Path
    args: Sequence[str] = ()
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MiniEngine:
        log = self.record.with_suffix(".log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.component.serve.mini_engine", "--port", str(self.port),
             "--id", self.id, "--record", str(self.record), "--model", MODEL, *self.args],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_http(self.port, "/health", proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)

    def kill(self) -> None:
        if self.proc is not None:
            _stop(self.proc, signal.SIGKILL)

    def calls(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line]


def fleet_doc(engines: Sequence[tuple[str, str, str]], journal: Path, **sections: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": "narwhal.fleet", "schema_version": 1, "model": MODEL,
        "engines": [{"id": i, "url": u, "role": r} for i, u, r in engines],
        "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        "journal": {"path": str(journal)},
    }
    doc.update(sections)
    return doc


@dataclass
class Router:
    """A narwhal-serve process."""

    fleet: Path
    port: int
    env: Mapping[str, str] = field(default_factory=dict)
    args: Sequence[str] = ()
    proc: subprocess.Popen[bytes] | None = None
    stdout: str = ""
    stderr: str = ""
    nofile: int = 0  # RLIMIT_NOFILE (soft and hard) for the router process; 0 keeps ours

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait_ready: bool = True) -> Router:
        env = {**os.environ, **self.env}
        limit = self.nofile

        def limits() -> None:
            if limit:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        self.proc = subprocess.Popen(
            [str(SERVE), "--fleet", str(self.fleet), "--port", str(self.port), *self.args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
            preexec_fn=limits if limit else None)
        try:
            wait_http(self.port, "/ready" if wait_ready else "/health", proc=self.proc)
        except RuntimeError as exc:  # it exited: say why, from its own words
            if self.proc.poll() is None:
                raise
            out, err = self.proc.communicate(timeout=10)
            self.stdout, self.stderr = out.decode(), err.decode()
            raise RuntimeError(f"{exc}; its stderr ends: {self.stderr[-2000:]}") from None
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            out, err = self.proc.communicate(timeout=10)
        self.stdout, self.stderr = out.decode(), err.decode()
        return self.proc.returncode

    def result(self) -> dict[str, Any]:
        line = [ln for ln in self.stdout.splitlines() if ln.startswith("NARWHAL_RESULT ")]
        assert len(line) == 1, self.stdout + self.stderr
        return dict(json.loads(line[0][len("NARWHAL_RESULT "):]))


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """SSE data payloads, `[DONE]` kept as the string."""
        out: list[Any] = []
        for block in self.body.decode().split("\n\n"):
            for line in block.splitlines():
                if line.startswith("data: "):
                    payload = line[6:]
                    out.append(payload if payload == "[DONE]" else json.loads(payload))
        return out


def call(port: int, method: str, path: str, body: Any = None, headers: Mapping[str, str] | None = None,
         raw: bytes | None = None, timeout: float = 20) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        hdrs = {"content-type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def journal_rows(path: Path, expect: int | None = None, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Rows of the journal, waiting (bounded) for the writer to reach `expect` rows; each row
    held to the decision table (follows_the_table)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        if expect is None or len(rows) >= expect or time.monotonic() > deadline:
            follows_the_table(rows)
            return rows
        time.sleep(0.05)


def follows_the_table(rows: list[dict[str, Any]]) -> None:
    """Each journal row names the decision table's rule that settled it, and says what that
    rule says (outcome, and status: a rule with status 0 passes on the engine's): a request
    the router settled on a path the table does not name fails the test that made it."""
    rules = every_decision()
    for row in rows:
        rule = rules.get(row.get("rule") or "")
        assert rule is not None, f"settled by no rule of serve/router/request/decisions.py: {row}"
        assert row["outcome"] == rule.outcome, (rule.name, row)
        assert row["status"] == rule.status if rule.status else 400 <= row["status"] < 600, \
            (rule.name, row)


async def _one_stream(reader: Any, writer: Any, body: bytes, rid: str) -> bool:
    """Send one streamed completion on a kept-alive connection; True if it ended in [DONE]."""
    writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: router\r\ncontent-type: application/json"
                 b"\r\nx-request-id: %b\r\ncontent-length: %d\r\n\r\n%b"
                 % (rid.encode(), len(body), body))
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" not in head.lower():
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        return False
    data = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            break
        data += chunk[:-2]
    return status == 200 and data.endswith(b"data: [DONE]\n\n") and b'"error"' not in data


async def load(port: int, concurrency: int, seconds: float, prefix: str,
               max_tokens: int = 16) -> tuple[list[str], int]:
    """`concurrency` keep-alive clients send streamed completions for `seconds`.

    Returns every x-request-id sent and how many streams completed cleanly.
    """
    import asyncio

    sent: list[str] = []
    ok = 0
    body = json.dumps({"model": MODEL, "prompt": "w " * 64, "max_tokens": max_tokens,
                       "stream": True}).encode()
    stop_at = time.monotonic() + seconds

    async def client(k: int) -> None:
        nonlocal ok
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        n = 0
        try:
            while time.monotonic() < stop_at:
                rid = f"{prefix}-{k}-{n}"
                n += 1
                sent.append(rid)
                if await asyncio.wait_for(_one_stream(reader, writer, body, rid), 30):
                    ok += 1
        finally:
            writer.close()

    await asyncio.gather(*(client(k) for k in range(concurrency)))
    return sent, ok
