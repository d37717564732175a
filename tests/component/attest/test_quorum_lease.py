"""The controller lease granted by a majority of three real `narwhal-attest serve` sidecars
(each beside its own emulator engine started by `narwhal-engine`), held by real `narwhal-serve`
routers over mini engines on loopback: a second router anywhere is refused with the holder
named; a standby takes over through the quorum only; a router cut off from the majority stops
placing requests within the lease period and is fenced; the old primary never serves again on
its old epoch; and the sidecar's lease routes refuse hostile requests without work."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from narwhal.core import result_line
from tests.component.attest.sidecars import (
    DEPLOYMENT,
    EngineWithSidecar,
    Sidecar,
    emulator_engines,
    start_sidecar,
    write_key,
)
from tests.component.serve.conftest import Spawner
from tests.component.serve.harness import MODEL, SERVE, Router, call, free_port

pytestmark = pytest.mark.timeout(240)
KEY = "controller-key-0123456789abcdef"
TTL = 1.0
POLL = 0.1
BODY = {"model": MODEL, "prompt": "hello there", "max_tokens": 2}


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EngineWithSidecar]]:
    """Three engines for the whole module; each test starts its own sidecars on them."""
    with emulator_engines(tmp_path_factory.mktemp("engines"), 3) as started:
        yield started


@dataclass
class Quorum:
    sidecars: list[Sidecar]
    key_file: Path
    root: Path

    @property
    def urls(self) -> list[str]:
        return [s.lease_url for s in self.sidecars]

    def controller(self, key_file: Path | None = None) -> dict[str, Any]:
        return {"lease_ttl_s": TTL, "handoff_poll_s": POLL, "quorum": {
            "deployment": DEPLOYMENT, "lease_urls": self.urls,
            "key_file": str(key_file or self.key_file)}}

    def states(self) -> list[dict[str, Any]]:
        return [_request(s.port, "GET", "/v1/lease")[1] for s in self.sidecars]


@pytest.fixture
def quorum(engines: list[EngineWithSidecar], tmp_path: Path) -> Iterator[Quorum]:
    key_file = write_key(tmp_path / "controller.key", KEY)
    sidecars: list[Sidecar] = []
    try:
        for e in engines:
            (e.run_dir / "controller-lease.json").unlink(missing_ok=True)  # a fresh fleet
            sidecars.append(start_sidecar(e.run_dir, lease_key_file=key_file))
        yield Quorum(sidecars, key_file, tmp_path)
    finally:
        for s in sidecars:
            s.stop()
    for s in sidecars:  # nothing a client sent made a handler fail
        assert "Traceback" not in s.stderr and "Exception" not in s.stderr, s.stderr
        assert KEY not in s.stderr


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    s = Spawner(tmp_path)
    try:
        yield s
    finally:
        s.close()


def _request(port: int, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        conn.close()


def _post(port: int, verb: str, body: dict[str, Any], key: str = KEY) -> tuple[int, dict[str, Any]]:
    return _request(port, "POST", f"/v1/lease/{verb}", json.dumps(body).encode(),
                    {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})


def _raw(port: int, data: bytes) -> bytes:
    """Send bytes as they are; everything the sidecar answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        return got


def _until(what: str, check: Callable[[], bool], timeout: float) -> float:
    """Seconds until check() held; fails naming `what` after `timeout`."""
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)
    return time.monotonic() - t0


def _not_leader(router: Router) -> bool:
    reply = call(router.port, "POST", "/v1/completions", BODY, timeout=5)
    return reply.status == 503 and reply.json()["error"]["code"] == "not_leader"


def _serves(router: Router) -> bool:
    return call(router.port, "POST", "/v1/completions", BODY, timeout=5).status == 200


def _controller(router: Router) -> dict[str, Any]:
    return dict(call(router.port, "GET", "/narwhal/state").json()["controller"])


# -- one controller -------------------------------------------------------------------------
def test_a_second_router_anywhere_is_refused_naming_the_holder(
        quorum: Quorum, spawn: Spawner, tmp_path: Path) -> None:
    _, _, primary = spawn.pd(controller=quorum.controller())
    assert primary.proc is not None
    controller = _controller(primary)
    assert controller["backend"] == "quorum of 3 sidecars" and controller["lease_path"] is None
    assert controller["holder"]["url"] == primary.url and controller["epoch"] == 1
    assert all(s["holder"]["url"] == primary.url and s["holder"]["epoch"] == 1
               for s in quorum.states())
    # Another document in another folder, so no lease file could be shared: only the quorum.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fleet = elsewhere / "fleet.json"
    doc = json.loads(primary.fleet.read_text())
    fleet.write_text(json.dumps(doc))
    rival = subprocess.run([str(SERVE), "--fleet", str(fleet), "--port", str(free_port())],
                           capture_output=True, text=True, timeout=30)
    assert rival.returncode == 1, rival.stderr
    err = rival.stderr
    assert primary.url in err and f"pid {primary.proc.pid}" in err
    assert f"on host {socket.gethostname()}" in err and "epoch 1" in err
    assert "quorum of 3 sidecars" in err and quorum.urls[0] in err and "--standby-of" in err
    result = result_line.parse(rival.stdout, "narwhal-serve")
    assert not result.ok and primary.url in result.error
    assert KEY not in err + rival.stdout
    assert _serves(primary)  # unharmed


def test_a_router_with_the_wrong_key_refuses_to_start_saying_so(
        quorum: Quorum, spawn: Spawner) -> None:
    wrong = write_key(quorum.root / "wrong.key", "another-key-0123456789abcdef")
    fleet = spawn.fleet([("p0", "http://127.0.0.1:1", "both")],
                        controller=quorum.controller(wrong))
    done = subprocess.run([str(SERVE), "--fleet", str(fleet), "--port", str(free_port())],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "cannot acquire the controller lease" in done.stderr
    assert "refused the router's controller key (401)" in done.stderr
    assert all(s["holder"] is None for s in quorum.states())


def test_a_standby_takes_over_through_the_quorum_after_the_primary_is_killed(
        quorum: Quorum, spawn: Spawner) -> None:
    _, _, primary = spawn.pd(controller=quorum.controller())
    standby = spawn.router_on(primary.fleet, "--standby-of", primary.url, wait_ready=False)
    for _ in range(20):  # a second of overlap: the standby never places a request
        assert _not_leader(standby) and _serves(primary)
    state = _controller(standby)
    assert state["role"] == "standby" and state["holder"]["url"] == primary.url
    assert primary.proc is not None
    os.kill(primary.proc.pid, signal.SIGKILL)
    took = _until("the standby to serve", lambda: _serves(standby), timeout=TTL + POLL + 1.0)
    print(f"standby took over {took:.2f} s after the primary was killed")
    state = _controller(standby)
    assert state["role"] == "primary" and state["epoch"] == 2
    assert all(s["holder"]["url"] == standby.url and s["highest_epoch"] == 2
               for s in quorum.states())


def test_a_primary_that_stops_releases_its_grants_for_the_standby_at_once(
        quorum: Quorum, spawn: Spawner) -> None:
    _, _, primary = spawn.pd(controller=quorum.controller())
    standby = spawn.router_on(primary.fleet, "--standby-of", primary.url, wait_ready=False)
    assert primary.stop() == 0 and primary.result()["data"]["lease"]["epoch"] == 1
    took = _until("the standby to serve", lambda: _serves(standby), timeout=TTL)
    print(f"standby took over {took:.2f} s after the primary stopped")  # released: not expired


def test_one_sidecar_of_three_lost_does_not_disturb_the_primary(
        quorum: Quorum, spawn: Spawner) -> None:
    _, _, primary = spawn.pd(controller=quorum.controller())
    quorum.sidecars[2].pause()
    renewals = _controller(primary)["renewals"]
    deadline = time.monotonic() + 3 * TTL
    while time.monotonic() < deadline:
        assert _serves(primary)
        time.sleep(0.05)
    state = _controller(primary)
    assert state["role"] == "primary" and state["epoch"] == 1
    assert state["renewals"] >= renewals + 8  # still four a second: the hung one delays none


# -- cut off from the majority --------------------------------------------------------------
def test_a_primary_cut_off_from_the_majority_stops_within_the_lease_period_and_is_fenced(
        quorum: Quorum, spawn: Spawner) -> None:
    _, _, primary = spawn.pd(controller=quorum.controller())
    assert primary.proc is not None
    quorum.sidecars[1].pause()
    quorum.sidecars[2].pause()
    stopped = _until("the primary to stop placing requests", lambda: _not_leader(primary),
                     timeout=TTL + 0.5)
    print(f"primary stopped placing requests {stopped:.2f} s after losing the majority")
    # Its validity ran from the start of its last renewal, before the pause, less the drift
    # margin: within one lease period, give or take this loop's own polling.
    assert stopped < TTL + 0.1
    assert primary.proc.wait(timeout=20) == 1
    primary.stop()
    assert "lost the controller lease" in primary.stderr and "fenced" in primary.stderr
    assert "2 needed" in primary.stderr  # it says why: too few sidecars answered


def test_a_minority_cannot_be_taken_by_a_standby_either(quorum: Quorum, spawn: Spawner) -> None:
    _, _, primary = spawn.pd(controller=quorum.controller())
    standby = spawn.router_on(primary.fleet, "--standby-of", primary.url, wait_ready=False)
    assert primary.proc is not None
    quorum.sidecars[1].pause()
    quorum.sidecars[2].pause()
    os.kill(primary.proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 3 * TTL
    while time.monotonic() < deadline:
        assert _not_leader(standby)
        time.sleep(0.05)
    quorum.sidecars[1].resume()  # a majority again: now the standby may take the lease
    _until("the standby to serve", lambda: _serves(standby), timeout=TTL + POLL + 1.0)
    assert _controller(standby)["epoch"] == 2


def test_the_old_primary_reconnected_does_not_serve_without_a_new_epoch(
        quorum: Quorum, spawn: Spawner) -> None:
    _, _, primary = spawn.pd(controller=quorum.controller())
    standby = spawn.router_on(primary.fleet, "--standby-of", primary.url, wait_ready=False)
    assert primary.proc is not None
    old_id = _controller(primary)["holder_id"]
    os.kill(primary.proc.pid, signal.SIGSTOP)  # cut off: not a packet leaves it
    try:
        _until("the standby to serve", lambda: _serves(standby), timeout=TTL + POLL + 1.0)
    finally:
        os.kill(primary.proc.pid, signal.SIGCONT)
    # Resumed, it finds its lease gone and stops: it answers not_leader until its listener
    # closes, and a loaded machine may run that renewal before this request arrives
    # (`make test` once saw the connection refused). Either way it serves nothing.
    with contextlib.suppress(ConnectionRefusedError):
        assert _not_leader(primary)
    assert primary.proc.wait(timeout=20) == 1
    primary.stop()
    assert "lost the controller lease" in primary.stderr and standby.url in primary.stderr
    for s in quorum.sidecars:  # nor would the sidecars renew its old epoch for it
        status, reply = _post(s.port, "renew", {"deployment": DEPLOYMENT, "holder_id": old_id,
                                                "epoch": 1, "ttl_s": 1.0})
        assert status == 409 and reply["reason"] == "held"
        assert reply["holder"]["url"] == standby.url
        assert reply["highest_epoch"] == 2
    assert _serves(standby)


def test_a_primary_paused_past_its_lease_with_no_rival_serves_again_only_at_a_new_epoch(
        quorum: Quorum, spawn: Spawner) -> None:
    _, _, primary = spawn.pd(controller=quorum.controller())
    assert primary.proc is not None
    os.kill(primary.proc.pid, signal.SIGSTOP)
    time.sleep(TTL + 0.5)
    os.kill(primary.proc.pid, signal.SIGCONT)
    _until("the primary to serve again", lambda: _serves(primary), timeout=3.0)
    assert _controller(primary)["epoch"] == 2
    assert all(s["holder"]["epoch"] == 2 for s in quorum.states())


# -- the sidecar's lease routes -------------------------------------------------------------
CLAIM = {"deployment": DEPLOYMENT, "holder_id": "h1", "url": "http://127.0.0.1:1", "pid": 1,
         "host": "x", "epoch": 1, "ttl_s": 30.0}


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer wrong-key-0123456789abcdef"}, {"Authorization": f"Basic {KEY}"},
    {"Authorization": f"Bearer {KEY}x"}, {"Authorization": "Bearer "},
])
def test_a_lease_verb_without_the_key_is_refused_and_changes_nothing(
        quorum: Quorum, headers: dict[str, str]) -> None:
    port = quorum.sidecars[0].port
    for verb in ("acquire", "renew", "release"):
        status, reply = _request(port, "POST", f"/v1/lease/{verb}",
                                 json.dumps(CLAIM).encode(), headers)
        assert status == 401 and "controller key" in reply["error"]
        assert KEY not in json.dumps(reply)
    assert quorum.states()[0]["holder"] is None and quorum.states()[0]["highest_epoch"] == 0


@pytest.mark.parametrize(("body", "status", "words"), [
    (b"{not json", 400, "not JSON"),
    (b"[" * 2000 + b"]" * 2000, 400, "readable depth"),
    (b'{"deployment": "\xff"}', 400, "not UTF-8"),
    (b"[1, 2]", 400, "not a JSON object"),
    (json.dumps({**CLAIM, "ttl": 5}).encode(), 400, "ttl: unknown key"),
    (json.dumps({**CLAIM, "epoch": "1"}).encode(), 400, "epoch"),
    (json.dumps({**CLAIM, "epoch": True}).encode(), 400, "epoch"),
    (json.dumps({**CLAIM, "epoch": 0}).encode(), 400, "epoch"),
    (json.dumps({**CLAIM, "ttl_s": 3600}).encode(), 400, "ttl_s"),
    (json.dumps({**CLAIM, "ttl_s": float("nan")}).encode(), 400, "ttl_s"),
    (json.dumps({k: v for k, v in CLAIM.items() if k != "host"}).encode(), 400, "host"),
    (json.dumps({**CLAIM, "deployment": "other"}).encode(), 409, "sidecar of another deployment"),
])
def test_a_malformed_or_foreign_claim_is_refused_naming_what_is_wrong(
        quorum: Quorum, body: bytes, status: int, words: str) -> None:
    sidecar = quorum.sidecars[0]
    got, reply = _request(sidecar.port, "POST", "/v1/lease/acquire", body,
                          {"Authorization": f"Bearer {KEY}"})
    assert got == status and words in reply["error"], reply
    assert quorum.states()[0]["holder"] is None
    assert sidecar.proc.poll() is None


def test_an_oversized_body_is_refused_before_it_is_read(quorum: Quorum) -> None:
    port = quorum.sidecars[0].port
    answer = _raw(port, f"POST /v1/lease/acquire HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                  f"{KEY}\r\nContent-Length: 1000000000\r\n\r\n".encode())
    # answered and closed at once: the sidecar waits for none of the body
    assert answer.startswith(b"HTTP/1.0 413") and b"larger than 4096" in answer
    body = json.dumps({**CLAIM, "host": "x" * 4096}).encode()
    status, _ = _request(port, "POST", "/v1/lease/acquire", body,
                         {"Authorization": f"Bearer {KEY}"})
    assert len(body) > 4096 and status == 413
    assert quorum.states()[0]["holder"] is None


@pytest.mark.parametrize(("extra", "status"), [
    (b"Transfer-Encoding: chunked\r\n", 411), (b"", 411), (b"Content-Length: -5\r\n", 400),
    (b"Content-Length: \xb2\r\n", 400), (b"Content-Length: 1e3\r\n", 400)])
def test_a_body_without_a_plain_length_is_refused(quorum: Quorum, extra: bytes,
                                                  status: int) -> None:
    sidecar = quorum.sidecars[0]
    answer = _raw(sidecar.port, f"POST /v1/lease/acquire HTTP/1.1\r\nHost: x\r\nAuthorization: "
                  f"Bearer {KEY}\r\n".encode() + extra + b"\r\n")
    assert answer.startswith(f"HTTP/1.0 {status}".encode())
    assert sidecar.proc.poll() is None


def test_a_slow_sender_is_cut_off_while_renewals_are_served(quorum: Quorum) -> None:
    sidecar = quorum.sidecars[0]
    status, _ = _post(sidecar.port, "acquire", CLAIM)
    assert status == 200
    body = json.dumps({k: CLAIM[k] for k in ("deployment", "holder_id", "epoch", "ttl_s")})
    slow = socket.create_connection(("127.0.0.1", sidecar.port), timeout=15)
    try:
        slow.sendall(f"POST /v1/lease/renew HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}"
                     f"\r\nContent-Length: {len(body)}\r\n\r\n{body[:10]}".encode())
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.0:  # a byte now and then, never the whole body
            slow.sendall(body[10:11].encode())
            assert _post(sidecar.port, "renew", json.loads(body))[0] == 200  # not held up
            time.sleep(0.5)
        assert slow.recv(1024) == b""  # closed by the sidecar: one deadline for the body
        assert 4.0 <= time.monotonic() - t0 < 8.0
    finally:
        slow.close()


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/v1/lease/acquire", 405), ("PUT", "/v1/lease/acquire", 405),
    ("DELETE", "/v1/lease/renew", 405), ("PATCH", "/v1/lease", 405), ("POST", "/v1/lease", 405),
    ("POST", "/v1/lease/steal", 404), ("POST", "/v1/lease/acquire/../../x", 404),
    ("POST", "/v1/attestation", 405),
])
def test_only_a_post_of_the_three_verbs_reaches_the_keeper(
        quorum: Quorum, method: str, path: str, status: int) -> None:
    got, _ = _request(quorum.sidecars[0].port, method, path, json.dumps(CLAIM).encode(),
                      {"Authorization": f"Bearer {KEY}"})
    assert got == status
    assert quorum.states()[0]["holder"] is None


def test_the_lease_state_is_open_and_names_the_holder_but_never_the_key(quorum: Quorum) -> None:
    sidecar = quorum.sidecars[0]
    assert _post(sidecar.port, "acquire", CLAIM)[0] == 200
    status, state = _request(sidecar.port, "GET", "/v1/lease")
    assert status == 200 and state["schema"] == "narwhal.sidecar-lease"
    assert state["holder"]["url"] == CLAIM["url"] and state["highest_epoch"] == 1
    assert 29 < state["holder"]["seconds_left"] <= 30
    assert KEY not in json.dumps(state)
    status, refused = _post(sidecar.port, "acquire", {**CLAIM, "holder_id": "h2", "epoch": 2})
    assert status == 409 and refused["reason"] == "held"
    assert refused["holder"]["holder_id"] == "h1" and refused["highest_epoch"] == 1
    assert sidecar.started["lease_url"] == sidecar.lease_url


def test_a_sidecar_without_a_key_file_keeps_no_lease(engines: list[EngineWithSidecar]) -> None:
    sidecar = start_sidecar(engines[0].run_dir)
    try:
        for method, path in (("GET", "/v1/lease"), ("POST", "/v1/lease/acquire")):
            status, reply = _request(sidecar.port, method, path, json.dumps(CLAIM).encode(),
                                     {"Authorization": f"Bearer {KEY}"})
            assert status == 404 and "holds no controller lease" in reply["error"]
        assert sidecar.started["lease_url"] is None
    finally:
        sidecar.stop()


@pytest.mark.parametrize(("text", "mode", "words"), [
    (KEY, 0o644, "has mode 0644"), (KEY, 0o604, "chmod 600"), ("", 0o600, "is empty")])
def test_a_sidecar_with_an_open_or_empty_key_file_refuses_to_start(
        engines: list[EngineWithSidecar], tmp_path: Path, text: str, mode: int,
        words: str) -> None:
    key_file = tmp_path / "controller.key"
    key_file.write_text(text)
    key_file.chmod(mode)
    with pytest.raises(AssertionError) as caught:
        start_sidecar(engines[0].run_dir, lease_key_file=key_file)
    assert str(key_file) in str(caught.value) and words in str(caught.value)
    assert KEY not in str(caught.value)
