"""A tiny HTTP client for the component tests: real bytes over loopback, nothing mocked."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any

from narwhal.lab.engine.testing import RunningEngine


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """SSE `data:` payloads; `[DONE]` is returned as the string."""
        out: list[Any] = []
        for block in self.body.decode().split("\n\n"):
            if not block.strip():
                continue
            assert block.startswith("data: "), block
            payload = block[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
        return out


def call(engine: RunningEngine, method: str, path: str, body: Any = None, *,
         raw: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = 30.0) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=timeout)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=all_headers)
        reply = conn.getresponse()
        return Reply(reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read())
    finally:
        conn.close()


def post(engine: RunningEngine, path: str, body: Any, **kwargs: Any) -> Reply:
    return call(engine, "POST", path, body, **kwargs)


def get(engine: RunningEngine, path: str, **kwargs: Any) -> Reply:
    return call(engine, "GET", path, **kwargs)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample; every given label must match."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name}{labels}")
