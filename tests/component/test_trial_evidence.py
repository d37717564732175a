"""A trial's network evidence over a real SSH session on loopback: the tunnel log of forwards
opened and cancelled through the host's master connection (with ssh's own words when a local
port is taken), and the router host's network snapshot taken through the host. Each is kept
as an attempt artifact, listed in attempt.json with its sha256, private."""

from __future__ import annotations

import hashlib
import http.server
import json
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.errors import HostError
from narwhal.deploy.gates import trial
from narwhal.deploy.hosts import forward_http
from narwhal.deploy.hosts.ssh import SshHost
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.trial.tunnel_log import TunnelLog
from tests.component.sshd import Sshd
from tests.component.test_ssh_host import key_host

pytestmark = pytest.mark.timeout(120)


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"router here")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def router_port() -> Iterator[int]:
    """A stand-in for the router, listening on the host's loopback."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def host(sshd: Sshd, tmp_path: Path) -> Iterator[SshHost]:
    h = key_host(sshd, tmp_path, alias="router")
    try:
        yield h
    finally:
        h.close()


def _get(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as reply:
        return bytes(reply.read())


def _kept(tmp_path: Path, name: str, data: bytes) -> bytes:
    """`data` kept as artifact `name` of a load-trial attempt; checked as listed, 0600."""
    ledger = Ledger(tmp_path / "runs", "demo").ensure()
    with ledger.attempt("load-trial", fingerprint={}, hosts={"router": ["router"]}) as attempt:
        attempt.add_artifact(name, data)
    kept = (attempt.folder / name).read_bytes()
    listed = json.loads((attempt.folder / "attempt.json").read_text())["artifacts"]
    assert listed[name] == hashlib.sha256(kept).hexdigest()
    assert (attempt.folder / name).stat().st_mode & 0o777 == 0o600
    return kept


def test_the_tunnel_log_shows_each_forward_opened_used_and_cancelled(
        host: SshHost, router_port: int, tmp_path: Path) -> None:
    host.run(["true"], check=True)  # the master is up, as it is by the time of a trial
    tunnels = TunnelLog(host.alias, host.transport, host.session_log())
    with forward_http.forwarded(host, [("127.0.0.1", router_port)], tunnels) as [local]:
        assert _get(local) == b"router here"  # the log names a tunnel that worked
    rows = [json.loads(x) for x in _kept(tmp_path, "tunnel.jsonl", tunnels.jsonl()).splitlines()]
    assert [(r["event"], r["ok"]) for r in rows] == [("open", True), ("cancel", True)]
    for r in rows:
        assert r["local"] == f"127.0.0.1:{local}" and r["remote"] == f"127.0.0.1:{router_port}"
        assert r["host"] == "router" and r["transport"] == "ssh" and r["at"].endswith("Z")
    with pytest.raises(OSError):  # cancelled: nothing listens there any more
        socket.create_connection(("127.0.0.1", local), timeout=2).close()


def test_a_taken_local_port_is_named_in_the_tunnel_log_with_sshs_own_words(
        host: SshHost, router_port: int, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    host.run(["true"], check=True)
    tunnels = TunnelLog(host.alias, host.transport, host.session_log())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        monkeypatch.setattr(forward_http, "_free_port", lambda: port)  # free a moment ago; not now
        with pytest.raises(HostError), forward_http.forwarded(
                host, [("127.0.0.1", router_port)], tunnels):
            pass
    rows = [json.loads(x) for x in _kept(tmp_path, "tunnel.jsonl", tunnels.jsonl()).splitlines()]
    assert rows[0]["event"] == "open" and not rows[0]["ok"]
    assert rows[0]["local"] == f"127.0.0.1:{port}" and "forward" in rows[0]["error"]
    said = [r["line"] for r in rows if r["event"] == "ssh-stderr"]
    assert any(f"{port}: Address already in use" in line for line in said), said


def test_the_network_snapshot_of_the_router_host_is_taken_through_the_host(
        host: SshHost, sshd: Sshd, tmp_path: Path) -> None:
    doc = json.loads(_kept(tmp_path, "network-2.json", trial.network_snapshot(host, 2.0)))
    assert doc["host"] == "router" and doc["rate"] == 2.0
    lo = next(i for i in doc["addresses"]["json"] if i["ifname"] == "lo")
    assert "127.0.0.1" in [a["local"] for a in lo["addr_info"]]
    assert isinstance(doc["routes"]["json"], list) and doc["routes"]["exit_status"] == 0
    summary = doc["sockets"]["summary"]
    assert f"127.0.0.1:{sshd.port}" in [x["local"] for x in summary["listening"]]
    assert summary["states"].get("ESTAB", 0) >= 2  # at least this session's own connection
    assert doc["sockets"]["argv"][-2:] == ["ss", "-tanp"]  # run through the host, bounded
