"""The hand-written HTTP/1.1 front, byte by byte: keep-alive, pipelining, HTTP/1.0, 100-continue."""

from __future__ import annotations

import json
import socket

import pytest

from tests.component.serve.conftest import Spawner
from tests.component.serve.harness import MODEL

pytestmark = pytest.mark.timeout(120)


def _request(body: dict[str, object], *, version: str = "1.1", rid: str = "",
             extra: str = "") -> bytes:
    data = json.dumps(body).encode()
    head = f"POST /v1/completions HTTP/{version}\r\nhost: r\r\ncontent-type: application/json\r\n"
    if rid:
        head += f"x-request-id: {rid}\r\n"
    return (head + extra + f"content-length: {len(data)}\r\n\r\n").encode() + data


def _read_until_closed(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def _read_responses(s: socket.socket, n: int) -> bytes:
    """Read until n complete chunked responses (each ending in 0\\r\\n\\r\\n) arrived."""
    end = b"\r\n0\r\n\r\n"
    data = b""
    while data.count(end) < n:
        chunk = s.recv(65536)
        assert chunk, f"connection closed after {data.count(end)} responses"
        data += chunk
    return data


def test_pipelined_requests_are_answered_in_order_on_one_connection(shared: Spawner) -> None:
    r = shared.routers[0]
    body = {"model": MODEL, "prompt": "a b c", "max_tokens": 3, "stream": True}
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
        s.sendall(_request(body, rid="pipe-1") + _request(body, rid="pipe-2") +
                  _request(body, rid="pipe-3"))
        data = _read_responses(s, 3)
    first, second, third = (data.index(b"x-request-id: pipe-%d" % k) for k in (1, 2, 3))
    assert first < second < third
    assert data.count(b"data: [DONE]") == 3


def test_keep_alive_serves_many_requests_on_one_connection(shared: Spawner) -> None:
    r = shared.routers[0]
    body = {"model": MODEL, "prompt": "a", "max_tokens": 2, "stream": True}
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
        for k in range(5):
            s.sendall(_request(body, rid=f"ka-{k}"))
            assert b"data: [DONE]" in _read_responses(s, 1)


def test_an_http_1_0_client_gets_an_unframed_stream_ended_by_close(shared: Spawner) -> None:
    r = shared.routers[0]
    body = {"model": MODEL, "prompt": "a b", "max_tokens": 3, "stream": True}
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
        s.sendall(_request(body, version="1.0"))
        data = _read_until_closed(s)
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"transfer-encoding" not in head.lower()
    assert payload.startswith(b"data: {") and payload.endswith(b"data: [DONE]\n\n")


def test_expect_100_continue_is_honoured(shared: Spawner) -> None:
    r = shared.routers[0]
    data = json.dumps({"model": MODEL, "prompt": "a", "max_tokens": 1}).encode()
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: r\r\nexpect: 100-continue\r\n"
                  b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(data))
        assert s.recv(1024).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(data)
        reply = s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200 ")


def test_garbage_is_a_400_and_the_connection_closes(shared: Spawner) -> None:
    r = shared.routers[0]
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        data = _read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 400 ")
    assert b'"error"' in data
