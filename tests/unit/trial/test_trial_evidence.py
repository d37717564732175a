"""A trial's own network evidence, as pure records: the router host's snapshot read from real
`ip -j` and `ss -tanp` output, and the tunnel log with each forward's open and cancel and
what ssh said meanwhile. Also the command builder that bounds a snapshot at the source."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from narwhal.core.errors import HostError
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.base import RunResult
from narwhal.deploy.hosts.forward_http import forwarded
from narwhal.deploy.hosts.local import LocalHost
from narwhal.deploy.trial import network
from narwhal.deploy.trial.tunnel_log import STDERR_BYTES, TunnelLog

CAPTURES = Path(__file__).parent / "captures"


def _ran(argv: list[str], out: bytes, status: int = 0, err: bytes = b"") -> RunResult:
    return RunResult("router", tuple(argv), status, out, err, 1_000_000.0, 1_000_000.5)


def _capture(name: str) -> bytes:
    return (CAPTURES / name).read_bytes()


def test_the_socket_summary_counts_states_listeners_and_connections() -> None:
    got = network.ss_summary(_capture("ss-tanp.out").decode())
    assert got["sockets"] == 9 and got["unread_count"] == 0
    assert got["states"] == {"ESTAB": 6, "LISTEN": 2, "TIME-WAIT": 1}
    assert [x["local"] for x in got["listening"]] == ["127.0.0.1:8000", "[::1]:8010"]
    assert got["listening"][0]["process"].startswith('users:(("python3",pid=')
    assert got["established_by_local_port"]["8000"] == 2  # the two accepted, still open
    assert got["established_by_peer"] == {"127.0.0.1": 4, "[::1]": 2}


def test_a_line_that_is_no_socket_row_is_kept_and_counted_never_guessed() -> None:
    got = network.ss_summary("State Recv-Q Send-Q Local Peer\nss: netlink error\n")
    assert got["sockets"] == 0 and got["unread_lines"] == ["ss: netlink error"]


def test_the_snapshot_holds_every_command_as_json_with_its_status() -> None:
    data = network.snapshot(
        "router", 2.0,
        _ran(cl.ip_addresses(), _capture("ip-j-address.out")),
        _ran(cl.ip_routes(4), _capture("ip-j-4-route.out")),
        _ran(cl.ip_routes(6), _capture("ip-j-6-route.out")),
        _ran(cl.tcp_sockets(), _capture("ss-tanp.out")))
    doc = json.loads(data)
    assert doc["schema"] == network.SCHEMA and doc["host"] == "router" and doc["rate"] == 2.0
    names = [i["ifname"] for i in doc["addresses"]["json"]]
    assert names == ["lo", "fab1", "fab0"]
    assert doc["routes"]["json"][0] == {"dst": "default", "gateway": "10.99.0.1",
                                        "dev": "fab0", "flags": []}
    assert doc["routes6"]["argv"] == ["ip", "-j", "-6", "route", "show"]
    assert doc["sockets"]["lines_total"] == 10 and doc["sockets"]["summary"]["sockets"] == 9
    assert all(doc[k]["exit_status"] == 0 and not doc[k]["truncated"]
               for k in ("addresses", "routes", "routes6", "sockets"))


def test_a_failed_or_unreadable_command_is_kept_not_fatal() -> None:
    missing = network.json_output(_ran(["ip", "-j", "address", "show"], b"", 127,
                                       b"sh: 1: ip: not found\n"))
    assert missing["json"] is None and missing["exit_status"] == 127
    assert missing["stderr"] == "sh: 1: ip: not found"
    text = network.json_output(_ran(["ip", "-j", "route", "show"], b"default via 10.0.0.1\n"))
    assert text["error"].startswith("not JSON") and text["text"] == "default via 10.0.0.1\n"


def test_bounded_output_cuts_at_the_bound_and_keeps_the_commands_exit_status() -> None:
    host = LocalHost()
    long = host.run(cl.bounded_output(10, ["sh", "-c", "printf '%s' 0123456789abcdef; exit 3"]))
    assert long.stdout == b"0123456789" and long.exit_status == 3
    short = host.run(cl.bounded_output(100, ["printf", "a b\\n"]), check=True)
    assert short.stdout == b"a b\n"


def test_the_tunnel_log_reads_only_what_ssh_logged_since_it_began(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    log.write_bytes(b"an earlier trial's line\n")
    tunnels = TunnelLog("router", "ssh", log)
    tunnels.add("open", 1_000_000.0, 40001, ("127.0.0.1", 8080))
    tunnels.add("open", 1_000_000.0, 40002, ("127.0.0.1", 9090), "port forward failed")
    with log.open("ab") as f:
        f.write(b"bind [127.0.0.1]:40002: Address already in use\n")
    rows = [json.loads(x) for x in tunnels.jsonl().splitlines()]
    assert [(r["event"], r.get("ok")) for r in rows] == [
        ("open", True), ("open", False), ("ssh-stderr", None)]
    assert rows[0]["local"] == "127.0.0.1:40001" and rows[0]["remote"] == "127.0.0.1:8080"
    assert rows[0]["at"] == "1970-01-12T13:46:40.000Z" and rows[1]["error"]
    assert rows[2]["line"] == "bind [127.0.0.1]:40002: Address already in use"


def test_a_log_started_afresh_is_read_whole_and_a_long_one_only_its_end(
        tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    log.write_bytes(b"x" * 1000 + b"\n")
    tunnels = TunnelLog("router", "ssh", log)
    log.write_bytes(b"a new master's line\n")  # shorter: the master was started again
    assert tunnels.session_lines() == ["a new master's line"]
    log.write_bytes(b"".join(f"{i:08d}\n".encode() for i in range(20_000)))
    lines = tunnels.session_lines()
    assert lines[-1] == "00019999" and sum(len(x) + 1 for x in lines) <= STDERR_BYTES
    assert TunnelLog("workstation", "local", None).session_lines() == []


class _Refusing(LocalHost):
    """A host whose forwards to port 9090 fail, as ssh's do when the local port is taken."""

    def __init__(self) -> None:
        super().__init__("router")
        self.cancelled: list[int] = []

    def _exec(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float | None,
              env: Mapping[str, str] | None) -> tuple[int, bytes, bytes]:
        raise AssertionError("no command is run for a forward")

    def forward(self, local_port: int, remote_host: str, remote_port: int) -> int:
        if remote_port == 9090:
            raise HostError(self.alias, "port forward forward failed: Port forwarding failed")
        return local_port

    def cancel_forward(self, local_port: int, remote_host: str, remote_port: int) -> None:
        self.cancelled.append(remote_port)


def test_a_failed_forward_is_logged_and_the_ones_already_open_are_cancelled() -> None:
    host = _Refusing()
    tunnels = TunnelLog(host.alias, "ssh", None)
    with pytest.raises(HostError), \
            forwarded(host, [("127.0.0.1", 8080), ("127.0.0.1", 9090)], tunnels):
        pass
    assert host.cancelled == [8080]
    got = [(r["event"], r["remote"], r["ok"]) for r in tunnels.rows]
    assert got == [("open", "127.0.0.1:8080", True), ("open", "127.0.0.1:9090", False),
                   ("cancel", "127.0.0.1:8080", True)]
    assert "Port forwarding failed" in tunnels.rows[1]["error"]
