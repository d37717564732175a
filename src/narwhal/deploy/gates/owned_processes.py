"""The long-lived processes a gate's earlier attempts started (sidecars, the router,
Prometheus), found by their owner records, and retired exactly: each only while it is still
that process (pid and kernel start time), so a reused pid is never ended."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from narwhal.core.errors import HostError
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.ledger import Ledger

Progress = Callable[[str, str], None]


def earlier_processes(ledger: Ledger, gate: str, this_attempt: str,
                      argv0_suffix: str) -> list[dict[str, Any]]:
    """The owned.jsonl process rows of the gate's other attempts whose argv[0] ends so."""
    entry = ledger.load().get("gates", {}).get(gate, {}) if ledger.exists() else {}
    rows = []
    for attempt_id in entry.get("attempts") or []:
        if attempt_id == this_attempt:
            continue
        owned = ledger.attempt_folder(gate, attempt_id) / "owned.jsonl"
        if not owned.exists():
            continue
        for line in owned.read_text().splitlines():
            row = json.loads(line)
            if row.get("kind") == "process" and str(row.get("argv0", "")).endswith(argv0_suffix):
                rows.append({**row, "attempt": attempt_id})
    return rows


def owned_containers(ledger: Ledger, gate: str) -> dict[str, list[str]]:
    """Every container the gate's attempts started, by host, as `ID:CREATED` (what a start
    may replace when it finds one holding its engine's name: the record owns it)."""
    entry = ledger.load().get("gates", {}).get(gate, {}) if ledger.exists() else {}
    out: dict[str, list[str]] = {}
    for attempt_id in entry.get("attempts") or []:
        owned = ledger.attempt_folder(gate, attempt_id) / "owned.jsonl"
        if not owned.exists():
            continue
        for line in owned.read_text().splitlines():
            row = json.loads(line)
            if row.get("kind") == "container" and row.get("id") and row.get("created"):
                out.setdefault(str(row["host"]), []).append(f"{row['id']}:{row['created']}")
    return out


def alive(host: Host, row: dict[str, Any]) -> bool:
    return host.process_start(int(row["pid"])) == int(row["start_ticks"])


def retire(host: Host, rows: list[dict[str, Any]], progress: Progress, role: str) -> None:
    """Stop these processes of earlier attempts while each is still that process (pid and
    start time), so the new one binds the port and nothing stale answers."""
    for row in rows:
        pid, ticks = int(row["pid"]), int(row["start_ticks"])
        if host.process_start(pid) != ticks:
            continue  # gone, or the pid is another process now: not ours to end
        progress(role, f"replacing the process an earlier attempt started (pid {pid})")
        host.signal(pid)
        deadline = time.monotonic() + 10.0
        while host.process_start(pid) == ticks and time.monotonic() < deadline:
            time.sleep(0.1)
        if host.process_start(pid) == ticks:
            raise HostError(host.alias, f"the earlier {role} process (pid {pid}) did not stop")
