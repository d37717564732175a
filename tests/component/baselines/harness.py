"""Plain tools for the baseline-router tests: processes we own, HTTP on loopback, SSE, metrics.

Everything here talks to real processes over real sockets; nothing stands in for a router or
an engine. Processes start in their own session so that stopping one by its PID also stops
the children it spawned (vllm-router's launcher runs the Rust core in-process, narwhal-serve
is one uvicorn process, but a wrapper script may still fork).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.component.sshd import free_port

__all__ = [
    "HttpReply",
    "OwnedProcess",
    "free_port",
    "get",
    "metric_sum",
    "post_json",
    "sse_objects",
]


@dataclass
class OwnedProcess:
    """A process this test started: its log file, and a stop that only signals its own group."""

    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> OwnedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                list(self.argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(self.env) if self.env is not None else None,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "process was never started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM our process group, then SIGKILL it if it outlives `grace_s`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)


@dataclass(frozen=True)
class HttpReply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _send(request: urllib.request.Request, timeout_s: float) -> HttpReply:
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - loopback
            return HttpReply(
                response.status, {k.lower(): v for k, v in response.headers.items()},
                response.read(),
            )
    except urllib.error.HTTPError as exc:
        return HttpReply(exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read())


def _request(
    url: str, method: str, data: bytes | None = None, headers: Mapping[str, str] | None = None
) -> urllib.request.Request:
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError(f"tests only talk to loopback over http: {url}")
    return urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))  # noqa: S310


def get(url: str, timeout_s: float = 10.0) -> HttpReply:
    return _send(_request(url, "GET"), timeout_s)


def post_json(
    url: str, body: Any, headers: Mapping[str, str] | None = None, timeout_s: float = 60.0
) -> HttpReply:
    data = json.dumps(body).encode()
    request = _request(
        url, "POST", data, {"content-type": "application/json", **(headers or {})}
    )
    return _send(request, timeout_s)


def wait_ready(url: str, owner: OwnedProcess, timeout_s: float) -> float:
    """Poll `url` until it answers 200; return seconds waited, or fail with the log tail."""
    started = time.monotonic()
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        if not owner.alive():
            raise AssertionError(
                f"{owner.argv[0]} exited ({owner.proc.returncode if owner.proc else '?'}) "
                f"before {url} answered:\n{owner.log_tail()}"
            )
        with contextlib.suppress(OSError):
            if get(url, timeout_s=2.0).status == 200:
                return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"{url} not ready within {timeout_s:g}s:\n{owner.log_tail()}")


def sse_objects(body: bytes) -> tuple[list[dict[str, Any]], bool]:
    """The JSON objects of an SSE body and whether it ended with `data: [DONE]`."""
    objects: list[dict[str, Any]] = []
    done = False
    for line in body.decode().splitlines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        assert not done, f"data after [DONE]: {payload[:200]}"
        obj = json.loads(payload)
        assert isinstance(obj, dict), f"SSE data is not an object: {payload[:200]}"
        objects.append(obj)
    return objects, done


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)", re.MULTILINE)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of every sample of `name` whose labels include `labels` (0.0 when none match)."""
    total = 0.0
    for match in _SAMPLE.finditer(text):
        if match.group(1) != name:
            continue
        have = dict(_LABEL.findall(match.group(3) or ""))
        if all(have.get(key) == value for key, value in labels.items()):
            total += float(match.group(4))
    return total
