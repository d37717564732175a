"""Fuzz tier: generated HTTP requests against a real router process (hypothesis).

Every example is sent as raw bytes on its own connection. A well-formed request must be served
(200); one carrying a known-malformed part (a head no HTTP/1.1 parser may accept, or a body the
router's own rules refuse) must get a 4xx and must never reach an engine, which the engines'
own records show: every example carries a nonce, and no malformed example's nonce may appear
in them. Throughout, the router must never answer 5xx, log a traceback or stop.
At least 2,000 requests are generated per run (counted below).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.component.serve.harness import MODEL, MiniEngine, Router, call, fleet_doc, free_port

pytestmark = pytest.mark.timeout(600)

MAX_BODY = 16_384
WELL_FORMED = 700
MALFORMED = 1400
SEEN: dict[str, int] = {"well_formed": 0, "malformed": 0}
_ROUTER_KEYS = {"model", "prompt", "messages", "stream", "stream_options", "max_tokens",
                "max_completion_tokens", "min_tokens", "n", "kv_transfer_params", "ignore_eos",
                "stop", "stop_token_ids"}


@dataclass
class Fleet:
    router: Router
    engines: list[MiniEngine]
    malformed_nonces: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fuzz")
    engines = [MiniEngine(name, free_port(), root / f"{name}.calls.jsonl") for name in ("p0", "d0")]
    router: Router | None = None
    try:
        for engine in engines:
            engine.start()
        doc = fleet_doc([("p0", engines[0].url, "prefill"), ("d0", engines[1].url, "decode")],
                        root / "journal.jsonl",
                        serving={"max_request_bytes": MAX_BODY, "max_header_bytes": 4096,
                                 "max_request_line_bytes": 1024, "max_header_count": 32,
                                 "max_concurrent": 64})
        (root / "fleet.json").write_text(json.dumps(doc))
        router = Router(root / "fleet.json", free_port(), {}, ("--log-level", "info")).start()
        yield Fleet(router, engines)
    finally:
        if router is not None and router.proc is not None and router.proc.poll() is None:
            router.stop()
        for engine in engines:
            engine.stop()


# -- building requests ---------------------------------------------------------------------

@dataclass
class Parts:
    method: bytes
    path: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def encode(self) -> bytes:
        head = b"%b %b HTTP/1.1\r\n" % (self.method, self.path)
        head += b"".join(b"%b: %b\r\n" % h for h in self.headers)
        return head + b"\r\n" + self.body


def _with_length(parts: Parts) -> Parts:
    parts.headers.append((b"content-length", b"%d" % len(parts.body)))
    return parts


_text = st.text(st.characters(codec="utf-8"), max_size=60)
_extra_value = st.one_of(st.integers(-(2**63), 2**63 - 1), st.booleans(), st.none(), _text,
                         st.floats(-1e15, 1e15, allow_nan=False, allow_infinity=False))
_extra_key = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12).filter(
    lambda k: k not in _ROUTER_KEYS)


@st.composite
def valid_body(draw: st.DrawFn, nonce: str) -> tuple[bytes, dict[str, Any]]:
    chat = draw(st.booleans())
    body: dict[str, Any] = {"model": MODEL, "max_tokens": draw(st.integers(1, 4)),
                            "stream": draw(st.booleans())}
    text = f"{nonce} {draw(_text)}"
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    body.update(draw(st.dictionaries(_extra_key, _extra_value, max_size=4)))
    path = b"/v1/chat/completions" if chat else b"/v1/completions"
    return path, body


def _request(path: bytes, body: dict[str, Any]) -> Parts:
    raw = json.dumps(body).encode()
    return _with_length(Parts(b"POST", path, [(b"host", b"router"),
                                              (b"content-type", b"application/json"),
                                              (b"connection", b"close")], raw))


Mutation = Callable[[Parts, Any], Parts]


def _header_value(parts: Parts, junk: bytes) -> Parts:
    parts.headers.insert(1, (b"x-fuzz", b"v" + junk + b"v"))
    return parts


def _header_name(parts: Parts, junk: bytes) -> Parts:
    parts.headers.insert(1, (b"x" + junk + b"y", b"1"))
    return parts


def _body(new: bytes) -> Mutation:
    def apply(parts: Parts, _: Any) -> Parts:
        parts.headers = [h for h in parts.headers if h[0] != b"content-length"]
        nonce = re.search(rb"nw-fuzz-m?[0-9]+", parts.body)
        assert nonce is not None
        parts.body = new.replace(b"NONCE", nonce.group(0))
        return _with_length(parts)
    return apply


def _json_field(key: str, value: Any) -> Mutation:
    def apply(parts: Parts, _: Any) -> Parts:
        doc = json.loads(parts.body)
        doc[key] = value
        parts.headers = [h for h in parts.headers if h[0] != b"content-length"]
        parts.body = json.dumps(doc).encode()
        return _with_length(parts)
    return apply


def _raw_field(key: bytes, literal: bytes) -> Mutation:
    def apply(parts: Parts, _: Any) -> Parts:
        parts.headers = [h for h in parts.headers if h[0] != b"content-length"]
        parts.body = parts.body[:-1] + b',"%b":%b}' % (key, literal)
        return _with_length(parts)
    return apply


_CTL = st.sampled_from([bytes([c]) for c in [*range(0, 9), *range(10, 32), 127]])
MUTATIONS: dict[str, tuple[Mutation, st.SearchStrategy[Any]]] = {
    "control in header value": (_header_value, _CTL),
    "bad char in header name": (_header_name, st.sampled_from(
        [b" ", b"(", b")", b"\x00", b"\x7f", b"\xff", b"@", b"[", b"\t"])),
    "bad method": (lambda p, junk: Parts(b"PO" + junk + b"ST", p.path, p.headers, p.body),
                   st.sampled_from([b"\x01", b" ", b"(", b"\xff", b"\r"])),
    "bad path char": (lambda p, junk: Parts(p.method, p.path + junk, p.headers, p.body),
                      st.sampled_from([b"\x00", b"\x7f", b"\xff", b"\x1b", b" x"])),
    "two content-lengths": (lambda p, _: Parts(p.method, p.path, [*p.headers,
                            (b"content-length", b"%d" % (len(p.body) + 1))], p.body), st.none()),
    "content-length and chunked": (lambda p, _: Parts(p.method, p.path, [*p.headers,
                                   (b"transfer-encoding", b"chunked")], p.body), st.none()),
    "signed content-length": (lambda p, _: Parts(p.method, p.path, [
        (k, b"-%b" % v if k == b"content-length" else v) for k, v in p.headers], p.body),
        st.none()),
    "folded header": (lambda p, _: Parts(p.method, p.path, [*p.headers[:1], (b" folded", b"x"),
                                                            *p.headers[1:]], p.body), st.none()),
    "too many headers": (lambda p, n: Parts(p.method, p.path, p.headers + [
        (b"x-h%d" % k, b"v") for k in range(n)], p.body), st.integers(40, 200)),
    "header block too large": (lambda p, n: Parts(p.method, p.path, [
        *p.headers, (b"x-big", b"a" * n)], p.body), st.integers(4100, 200_000)),
    "request line too long": (lambda p, n: Parts(p.method, p.path + b"?" + b"q" * n, p.headers,
                                                 p.body), st.integers(1100, 3000)),
    "body too large": (_body(b'{"model":"mini-model","prompt":"NONCE' + b"z" * MAX_BODY + b'"}'),
                       st.none()),
    "not json": (_body(b"NONCE{not json"), st.none()),
    "truncated json": (_body(b'{"model":"mini-model","prompt":"NONCE'), st.none()),
    "invalid utf-8": (_body(b'{"model":"mini-model","prompt":"NONCE\xff\xfe"}'), st.none()),
    "lone surrogate": (_body(b'{"model":"mini-model","prompt":"NONCE\\udc00"}'), st.none()),
    "nested too deep": (_body(b'{"model":"mini-model","prompt":"NONCE","x":' + b"[" * 1100
                              + b"]" * 1100 + b"}"), st.none()),
    "trailing garbage": (_body(b'{"model":"mini-model","prompt":"NONCE"} x'), st.none()),
    "not an object": (_body(b'["NONCE"]'), st.none()),
    "integer beyond 64 bits": (lambda p, lit: _raw_field(b"seed", lit)(p, None), st.sampled_from(
        [b"18446744073709551616", b"-9223372036854775809", b"9" * 40, b"1e400"])),
    "max_tokens not a count": (lambda p, v: _json_field("max_tokens", v)(p, None),
                               st.one_of(st.integers(-5, 0), st.floats(0.5, 9.5), _text,
                                         st.booleans(), st.lists(st.integers(), max_size=2))),
    "stream not a bool": (lambda p, v: _json_field("stream", v)(p, None),
                          st.one_of(st.integers(), _text, st.none())),
    "n other than 1": (lambda p, v: _json_field("n", v)(p, None), st.integers(2, 10)),
    "router-owned field": (lambda p, v: _json_field("kv_transfer_params", v)(p, None),
                           st.dictionaries(_extra_key, _extra_value, max_size=2)),
    "another model": (lambda p, v: _json_field("model", v)(p, None),
                      _text.filter(lambda t: t != MODEL)),
}


# -- sending -------------------------------------------------------------------------------

def _exchange(port: int, data: bytes) -> int:
    """Send raw bytes on a new connection; the status of the reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(data)  # refused mid-send (431/413): the reply is still in the socket
        resp = http.client.HTTPResponse(s)
        resp.begin()
        resp.read()
        return resp.status


def _nonce(k: int) -> str:
    return f"nw-fuzz-{k:08d}"


@settings(max_examples=WELL_FORMED, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_well_formed_requests_are_served(fleet: Fleet, data: st.DataObject) -> None:
    SEEN["well_formed"] += 1
    path, body = data.draw(valid_body(_nonce(SEEN["well_formed"])))
    status = _exchange(fleet.router.port, _request(path, body).encode())
    assert status == 200, (path, body)


@settings(max_examples=MALFORMED, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(sorted(MUTATIONS)))
def test_malformed_requests_are_refused_and_reach_no_engine(
        fleet: Fleet, data: st.DataObject, name: str) -> None:
    SEEN["malformed"] += 1
    nonce = f"nw-fuzz-m{SEEN['malformed']:07d}"
    fleet.malformed_nonces.append(nonce)
    path, body = data.draw(valid_body(nonce))
    mutate, arg = MUTATIONS[name]
    parts = mutate(_request(path, body), data.draw(arg))
    status = _exchange(fleet.router.port, parts.encode())
    assert 400 <= status < 500, (name, parts.encode()[:300])


def test_the_fuzzed_router_stayed_up_logged_no_bug_and_no_engine_saw_malformed_input(
        fleet: Fleet) -> None:
    assert SEEN["well_formed"] + SEEN["malformed"] >= 2000, SEEN
    assert call(fleet.router.port, "GET", "/health").status == 200
    recorded = "".join(e.record.read_text() for e in fleet.engines if e.record.exists())
    leaked = [n for n in fleet.malformed_nonces if n in recorded]
    assert not leaked, leaked[:5]
    for k in range(1, SEEN["well_formed"] + 1, 97):
        assert _nonce(k) in recorded  # the well-formed ones did reach the engines
    fleet.router.stop()
    log = fleet.router.stderr
    assert "Traceback" not in log and "this is a bug" not in log, log[-2000:]
