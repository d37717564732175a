"""No client without a key can stop the router: heads, sockets and slow senders are bounded.

Each test is an attack an outside client made with raw sockets (issue 13), run against a real
router process on loopback, with a normal client measured beside it where the attack aimed at
everyone else's service.
"""

from __future__ import annotations

import contextlib
import resource
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.component.serve.conftest import Spawner
from tests.component.serve.harness import MODEL, Router, call, free_port

pytestmark = pytest.mark.timeout(120)

PROMPT = {"model": MODEL, "prompt": "the quick brown fox", "max_tokens": 3}


def _state(r: Router) -> dict[str, Any]:
    return dict(call(r.port, "GET", "/narwhal/state").json())


def _read_reply(s: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the router sends until it closes the connection (or `timeout`)."""
    s.settimeout(timeout)
    data = b""
    with contextlib.suppress(ConnectionResetError, TimeoutError, socket.timeout):
        while chunk := s.recv(65536):
            data += chunk
    return data


class NormalClient:
    """A client sending ordinary completions in a loop, recording each latency and status."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.latencies: list[float] = []
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                status = call(self.port, "POST", "/v1/completions", PROMPT, timeout=10).status
            except OSError:
                status = 0
            self.latencies.append(time.monotonic() - t0)
            self.statuses.append(status)
            time.sleep(0.02)

    def __enter__(self) -> NormalClient:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


@contextlib.contextmanager
def _sockets(port: int, n: int) -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.settimeout(5)
            with contextlib.suppress(OSError):
                s.connect(("127.0.0.1", port))
                held.append(s)
                continue
            s.close()
        yield held
    finally:
        for s in held:
            s.close()


def _limited_router(spawn: Spawner, *, nofile: int = 0, **serving: Any) -> Router:
    p = spawn.engine("p0")
    d = spawn.engine("d0")
    fleet = spawn.fleet([("p0", p.url, "prefill"), ("d0", d.url, "decode")],
                        serving=serving)
    r = Router(fleet, free_port(), {}, (), nofile=nofile)
    spawn.routers.append(r)
    return r.start()


# -- 1. heads ------------------------------------------------------------------------------

def test_a_64_mib_header_is_refused_with_431_before_it_is_held(spawn: Spawner) -> None:
    """Sent in 64 KiB reads; the router answers 431 after its 32 KiB limit, keeps serving the
    normal client at its usual pace, and never holds the header (RSS stays flat)."""
    _, _, r = spawn.pd()
    assert r.proc is not None
    rss_before = _rss_kib(r.proc.pid)
    sent = 0
    with NormalClient(r.port) as normal, socket.create_connection(("127.0.0.1", r.port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nhost: r\r\nx-big: ")
        piece = b"a" * 65536
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            while sent < 64 * 1_048_576:
                s.sendall(piece)
                sent += len(piece)
        reply = _read_reply(s)
        time.sleep(0.5)
    assert reply.startswith(b"HTTP/1.1 431 "), reply[:200]
    assert b"serving.max_header_bytes" in reply
    assert sent < 64 * 1_048_576  # the router closed the connection long before the end
    assert set(normal.statuses) == {200} and max(normal.latencies) < 1.0
    assert _rss_kib(r.proc.pid) - rss_before < 32_768


def test_a_request_line_beyond_the_limit_gets_414(spawn: Spawner) -> None:
    r = _limited_router(spawn, max_request_line_bytes=1024, max_header_bytes=4096)
    with socket.create_connection(("127.0.0.1", r.port)) as s:
        s.sendall(b"GET /" + b"x" * 3000 + b" HTTP/1.1\r\nhost: r\r\n\r\n")
        reply = _read_reply(s)
    assert reply.startswith(b"HTTP/1.1 414 "), reply[:200]
    assert b"request_line_too_long" in reply


def test_more_headers_than_the_limit_get_431(spawn: Spawner) -> None:
    r = _limited_router(spawn, max_header_count=20)
    head = b"GET /health HTTP/1.1\r\nhost: r\r\n" + b"".join(
        b"x-h%d: v\r\n" % k for k in range(40)) + b"\r\n"
    with socket.create_connection(("127.0.0.1", r.port)) as s:
        s.sendall(head)
        reply = _read_reply(s)
    assert reply.startswith(b"HTTP/1.1 431 "), reply[:200]
    assert b"too_many_headers" in reply


def test_a_head_split_across_reads_at_the_blank_line_is_still_parsed(spawn: Spawner) -> None:
    """Pipelined: the second head's CRLF CR arrives with the first request, its LF alone."""
    _, _, r = spawn.pd()
    with socket.create_connection(("127.0.0.1", r.port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nhost: r\r\n\r\nGET /health HTTP/1.1\r\nhost: r\r\n\r")
        time.sleep(0.3)
        s.sendall(b"\n")
        s.settimeout(5)
        data = b""
        while data.count(b"HTTP/1.1 200") < 2:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk


# -- 2. sockets and slow senders -----------------------------------------------------------

def test_idle_sockets_beyond_the_descriptor_limit_do_not_cost_the_lease(spawn: Spawner) -> None:
    """RLIMIT_NOFILE 1024 and 1100 idle sockets: the router keeps renewing its 1 s lease for
    3 s, serves the normal client, ejects no engine and makes room by closing idle sockets."""
    r = _limited_router(spawn, nofile=1024)
    renewals = _state(r)["controller"]["renewals"]
    with _sockets(r.port, 1100) as held, NormalClient(r.port) as normal:
        assert len(held) == 1100
        time.sleep(3.0)
    state = _state(r)
    assert r.proc is not None and r.proc.poll() is None
    assert state["controller"]["role"] == "primary"
    assert state["controller"]["renewals"] >= renewals + 8  # four per second
    assert all(e["admitted"] and e["ejections"] == 0 for e in state["engines"])
    assert state["connections"]["max_connections"] < 1024
    assert state["connections"]["evicted"] >= 1100 - state["connections"]["max_connections"]
    assert normal.statuses and set(normal.statuses) == {200}


def test_a_descriptor_limit_lowered_while_serving_sheds_clients_not_the_lease(
        spawn: Spawner) -> None:
    """400 idle sockets under RLIMIT_NOFILE 1024, then the running router's soft limit is
    lowered to 300 (prlimit): the router closes client connections down to the new cap and
    keeps renewing its 1 s lease (it was fenced within about 2 s, every renewal failing on
    'Too many open files')."""
    r = _limited_router(spawn, nofile=1024, client_connection_share=1.0)
    assert r.proc is not None
    with _sockets(r.port, 400) as held:
        assert len(held) == 400
        time.sleep(0.5)
        before = _state(r)
        assert before["connections"]["open"] >= 390
        resource.prlimit(r.proc.pid, resource.RLIMIT_NOFILE, (300, 1024))
        time.sleep(1.0)
        with NormalClient(r.port) as normal:
            time.sleep(2.0)
        state = _state(r)
    assert r.proc.poll() is None
    assert state["controller"]["role"] == "primary"
    assert state["controller"]["renewals"] >= before["controller"]["renewals"] + 8
    cap = state["connections"]["max_connections"]
    assert 0 < cap < 300 - 64 and state["connections"]["shed"] >= 390 - cap
    assert normal.statuses and set(normal.statuses) == {200}
    assert all(e["admitted"] and e["ejections"] == 0 for e in state["engines"])


def test_a_slowloris_head_gets_408_at_the_header_timeout(spawn: Spawner) -> None:
    r = _limited_router(spawn, header_timeout_s=1.0)
    with socket.create_connection(("127.0.0.1", r.port)) as s:
        t0 = time.monotonic()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\n")
        answered = False
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            # a byte every 0.1 s for up to 4 s; stop at the router's first reply byte
            for _ in range(40):
                s.sendall(b"x")
                answered = bool(select.select([s], [], [], 0.1)[0])
                if answered:
                    break
        waited = time.monotonic() - t0
        reply = _read_reply(s)
    assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
    # the timer runs from the head's first byte, not from each trickled byte
    assert 0.9 < waited < 3.0, waited


def test_a_slow_body_gets_408_at_the_body_timeout_after_its_head(spawn: Spawner) -> None:
    """The body's clock starts when its head ends: a whole head, then one byte of 100, is cut
    1 s later (it was cut at the header plus body timeouts, 3 s here)."""
    r = _limited_router(spawn, header_timeout_s=2.0, body_timeout_s=1.0)
    with socket.create_connection(("127.0.0.1", r.port)) as s:
        t0 = time.monotonic()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-length: 100\r\n\r\n{")
        reply = _read_reply(s)
        waited = time.monotonic() - t0
    assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
    assert b"within 1 s of its head (serving.body_timeout_s)" in reply
    assert 0.9 < waited < 2.0, waited


def test_silent_and_idle_keep_alive_connections_are_closed(spawn: Spawner) -> None:
    r = _limited_router(spawn, header_timeout_s=0.5, idle_timeout_s=1.0)
    with socket.create_connection(("127.0.0.1", r.port)) as silent, \
            socket.create_connection(("127.0.0.1", r.port)) as used:
        used.sendall(b"GET /health HTTP/1.1\r\nhost: r\r\n\r\n")
        used.settimeout(5)
        assert used.recv(65536).startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        assert _read_reply(silent) == b""  # closed without a reply: it never asked anything
        silent_s = time.monotonic() - t0
        assert _read_reply(used) == b""
        used_s = time.monotonic() - t0
    assert silent_s < 1.5 and 0.3 < used_s < 2.5


def test_a_peer_over_its_share_loses_its_own_idlest_connection(spawn: Spawner) -> None:
    r = _limited_router(spawn, max_connections=16, client_connection_share=0.5)
    with _sockets(r.port, 8) as held:
        time.sleep(0.2)
        assert call(r.port, "GET", "/health").status == 200  # the 9th: the oldest idle goes
        held[0].settimeout(5)
        assert held[0].recv(10) == b""
    assert _state(r)["connections"]["evicted"] >= 1


def _full_router(spawn: Spawner) -> Router:
    """16 connection slots, one peer may hold them all, and a decode engine that streams a
    token every 0.3 s: 16 streamed requests keep every slot answering for 3 s."""
    p = spawn.engine("p0")
    d = spawn.engine("d0", "--token-gap-ms", "300")
    fleet = spawn.fleet([("p0", p.url, "prefill"), ("d0", d.url, "decode")],
                        serving={"max_connections": 16, "client_connection_share": 1.0})
    r = Router(fleet, free_port(), {})
    spawn.routers.append(r)
    return r.start()


def _post(body: bytes) -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%b" % (len(body), body))


_STREAM = b'{"model":"%b","prompt":"a","max_tokens":10,"stream":true}' % MODEL.encode()


def test_when_every_connection_is_answering_a_new_one_gets_503(spawn: Spawner) -> None:
    r = _full_router(spawn)
    with _sockets(r.port, 16) as busy:
        for s in busy:
            s.sendall(_post(_STREAM))
        time.sleep(0.5)
        with socket.create_connection(("127.0.0.1", r.port)) as extra:
            reply = _read_reply(extra)
    assert reply.startswith(b"HTTP/1.1 503 "), reply[:200]
    assert b"too_many_connections" in reply and b"retry-after: 1" in reply


def test_at_the_connection_cap_every_refused_client_reads_its_503(spawn: Spawner) -> None:
    """16 slots busy streaming; 40 more clients each connect and send a request at once. The
    router refuses every one, and each reads the 503 (closing on unread input reset about
    40 % of them before their client read it)."""
    r = _full_router(spawn)
    plain = (b'{"model":"%b","prompt":"a","max_tokens":2}' % MODEL.encode())
    with _sockets(r.port, 16) as busy:
        for s in busy:
            s.sendall(_post(_STREAM))
        time.sleep(0.5)
        extra: list[socket.socket] = []
        try:
            for _ in range(40):
                s = socket.create_connection(("127.0.0.1", r.port))
                extra.append(s)
                with contextlib.suppress(OSError):
                    s.sendall(_post(plain))
            replies = [_read_reply(s) for s in extra]
        finally:
            for s in extra:
                s.close()
    refused = [x for x in replies if x.startswith(b"HTTP/1.1 503 ")]
    assert len(refused) == 40, [x[:40] for x in replies if not x.startswith(b"HTTP/1.1 503 ")]
    assert all(b"too_many_connections" in x for x in refused)
    assert _state(r)["connections"]["refused"] == 40


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")
