"""A network snapshot of the router host, one per trial rate (network-<rate>.json).

The runbook's correction path for a capacity trial starts with "local port conflicts, remote
listeners, ... client saturation": before a miss is put down to serving capacity, the record
should show what the router host's network looked like under that rate. Four commands, each
run through the host and bounded at the source: its interfaces and addresses (`ip -j
address`), its IPv4 and IPv6 routes (`ip -j route`), and its TCP sockets (`ss -tanp`), kept as
lines and summarised (sockets per state, every listener with its owner where the login may
see it, established connections per local port and per peer address). A command that failed or
printed what cannot be read is kept with its exit status and stderr: the snapshot is
evidence, never a reason for the trial to stop.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from narwhal.core.documents import stamp
from narwhal.deploy.hosts.base import RunResult
from narwhal.deploy.ledger.attempt import iso

SCHEMA = "narwhal.network-snapshot"
VERSION = 1
OUTPUT_LIMIT = 512 << 10  # per command, cut at the source (commandline.bounded_output)
SOCKET_LINES = 2000  # socket lines kept verbatim; the summary counts every line received
TOP_PEERS = 50
STDERR_CHARS = 2000


def _run_record(ran: RunResult) -> dict[str, Any]:
    stderr = ran.stderr.decode("utf-8", "replace").strip()
    return {"argv": list(ran.argv), "exit_status": ran.exit_status,
            "at": iso(ran.started), "stderr": stderr[-STDERR_CHARS:],
            "truncated": len(ran.stdout) >= OUTPUT_LIMIT}


def json_output(ran: RunResult) -> dict[str, Any]:
    """An `ip -j` command's output as JSON, or its text and why it could not be read (cut at
    the bound, or not JSON: an `ip` without -j support prints text)."""
    out = _run_record(ran)
    try:
        out["json"] = json.loads(ran.stdout) if ran.stdout.strip() else None
    except ValueError as exc:
        out["error"] = f"not JSON ({exc})"
        out["text"] = ran.text[:OUTPUT_LIMIT]
    return out


def _port(address: str) -> str:
    return address.rsplit(":", 1)[-1]


def ss_summary(text: str) -> dict[str, Any]:
    """`ss -tanp` read into counts: sockets per state, every listener (local address and
    owner), established connections per local port and per peer address (the busiest
    TOP_PEERS).
    Lines that are not socket rows are counted and kept, never guessed at."""
    states: Counter[str] = Counter()
    by_port: Counter[str] = Counter()
    by_peer: Counter[str] = Counter()
    listening, unread = [], []
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0] == "State":
            continue
        if len(fields) < 5 or not fields[1].isdigit() or not fields[2].isdigit():
            unread.append(line[:300])
            continue
        state, local, peer = fields[0], fields[3], fields[4]
        states[state] += 1
        if state == "LISTEN":
            listening.append({"local": local, "process": " ".join(fields[5:])})
        elif state == "ESTAB":
            by_port[_port(local)] += 1
            by_peer[peer.rsplit(":", 1)[0]] += 1
    return {"sockets": sum(states.values()), "states": dict(sorted(states.items())),
            "listening": sorted(listening, key=lambda x: x["local"]),
            "established_by_local_port": dict(sorted(by_port.items())),
            "established_by_peer": dict(by_peer.most_common(TOP_PEERS)),
            "unread_lines": unread[:20], "unread_count": len(unread)}


def sockets_output(ran: RunResult) -> dict[str, Any]:
    lines = ran.text.splitlines()
    return {**_run_record(ran), "summary": ss_summary(ran.text),
            "lines": lines[:SOCKET_LINES], "lines_total": len(lines)}


def snapshot(alias: str, rate: float, addresses: RunResult, routes: RunResult,
             routes6: RunResult, sockets: RunResult) -> bytes:
    """The stamped network-<rate>.json document of one rate."""
    doc = stamp(SCHEMA, VERSION, {
        "host": alias, "rate": rate, "taken": iso(addresses.started),
        "addresses": json_output(addresses), "routes": json_output(routes),
        "routes6": json_output(routes6), "sockets": sockets_output(sockets)})
    return (json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()
