"""Remove exactly what a failed attempt created, and only while it still is what was created.

A file is removed only if its inode and sha256 still match; a directory only if its inode
matches and it is empty by then; a tree a command made (a clone, a venv) whole, only if its
inode matches; a process only if its pid still has the same kernel start
time; a container only if its id still has the same creation time. Everything else is kept
and reported. The failed attempt's evidence is never touched.

A process a later attempt adopted (Gate G adopts the primary router an earlier attempt
started, and records it as an "adopted" row of its own owned.jsonl) is kept: it is that later
attempt's service now, and undoing the earlier, failed attempt must not take it down. The
adopting attempt's own recovery keeps it too, since it did not create it (kept_because).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from narwhal.core.errors import HostError, LedgerError
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.hosts.containers import inspect_container, remove_container
from narwhal.deploy.ledger.evidence import read_rows
from narwhal.deploy.ledger.store import Ledger

STOP_WAIT_S = 5.0
ProcessKey = tuple[str, int, int]  # host alias, pid, kernel start time: one process, exactly


def target_attempt(ledger: Ledger, gate: str, attempt_id: str | None) -> str:
    """The attempt to recover: the one named, else the gate's last one, which must not have
    passed."""
    index = ledger.load()
    entry = index["gates"].get(gate) or index["activities"].get(gate)
    if not entry or not entry["attempts"]:
        raise LedgerError(f"gate {gate} has no attempts to recover")
    chosen = attempt_id or entry["attempts"][-1]
    if chosen not in entry["attempts"]:
        raise LedgerError(f"gate {gate} has no attempt {chosen!r}; known: "
                          + ", ".join(entry["attempts"]))
    done = ledger.attempt_folder(gate, chosen) / "attempt.json"
    if done.exists() and json.loads(done.read_text()).get("verdict") == "passed":
        raise LedgerError(f"attempt {chosen} of gate {gate} passed; recovery only undoes "
                          "failed or interrupted attempts")
    return chosen


def _process_key(row: Mapping[str, Any]) -> ProcessKey | None:
    try:
        return str(row["host"]), int(row["pid"]), int(row["start_ticks"])
    except (KeyError, TypeError, ValueError):
        return None


def adopted_later(owned: Mapping[str, Sequence[Mapping[str, Any]]], attempts: Sequence[str],
                  chosen: str) -> dict[ProcessKey, str]:
    """Every process an attempt after `chosen` adopted, with the last attempt that adopted
    it (`owned`: each attempt's owned.jsonl rows, `attempts` in the record's order)."""
    out: dict[ProcessKey, str] = {}
    for attempt_id in attempts[attempts.index(chosen) + 1:]:
        for row in owned.get(attempt_id, ()):
            if row.get("kind") == "adopted" and (key := _process_key(row)) is not None:
                out[key] = attempt_id
    return out


def kept_because(item: Mapping[str, Any], gate: str,
                 adopted: Mapping[ProcessKey, str]) -> str:
    """Why recovery keeps an owned item before asking its host ("" when its kind's action
    decides): a row that only records an adoption (this attempt did not create the process),
    or a process a later attempt adopted and serves with now."""
    if item.get("kind") == "adopted":
        return (f"kept: adopted from {item.get('started_by') or 'an earlier attempt'}, not "
                "created by this attempt")
    key = _process_key(item) if item.get("kind") == "process" else None
    if key is not None and key in adopted:
        return (f"kept: adopted by the later attempt {gate}/{adopted[key]}, which serves with "
                f"it (the next `narwhal {gate}` adopts or replaces it)")
    return ""


def _later_adoptions(ledger: Ledger, gate: str, chosen: str) -> dict[ProcessKey, str]:
    index = ledger.load()
    attempts = list((index["gates"].get(gate) or index["activities"].get(gate))["attempts"])
    owned = {a: read_rows(ledger.attempt_folder(gate, a) / "owned.jsonl")
             for a in attempts[attempts.index(chosen) + 1:]}
    return adopted_later(owned, attempts, chosen)


def _file(host: Host, item: dict[str, Any]) -> str:
    facts = host.stat_file(item["path"])
    if facts is None:
        return "already gone"
    if facts != (item["inode"], item["sha256"]):
        return "kept: replaced or changed after the attempt created it"
    host.run(["rm", "-f", "--", item["path"]], check=True)
    return "removed"


def _same_dir(host: Host, item: dict[str, Any]) -> str | None:
    """Why the owned directory is not to be touched, or None while it is the one created."""
    inode = host.stat_dir(item["path"])
    if inode is None:
        return "already gone"
    if inode != item["inode"]:
        return "kept: a different directory now has this path"
    return None


def _dir(host: Host, item: dict[str, Any]) -> str:
    if (kept := _same_dir(host, item)) is not None:
        return kept
    if not host.run(["rmdir", "--", item["path"]]).ok:
        return "kept: not empty (holds files the attempt did not create)"
    return "removed"


def _tree(host: Host, item: dict[str, Any]) -> str:
    if (kept := _same_dir(host, item)) is not None:
        return kept
    host.run(["rm", "-rf", "--", item["path"]], check=True)
    return "removed"


def _process(host: Host, item: dict[str, Any]) -> str:
    ticks = host.process_start(item["pid"])
    if ticks is None:
        return "already gone"
    if ticks != item["start_ticks"]:
        return "kept: the pid now belongs to another process"
    host.signal(item["pid"], "TERM")
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        if host.process_start(item["pid"]) != item["start_ticks"]:
            return "stopped"
        time.sleep(0.1)
    host.signal(item["pid"], "KILL")
    return "killed after it ignored TERM"


def _container(host: Host, item: dict[str, Any]) -> str:
    runtime, container_id = item.get("runtime", ""), str(item.get("id", ""))
    created = str(item.get("created", ""))
    if runtime not in cl.CONTAINER_RUNTIMES or not cl.CONTAINER_ID_RE.fullmatch(container_id) \
            or not created:
        return "kept: the row lacks a known runtime, a full container id or a creation time"
    now = inspect_container(host, runtime, container_id)
    if now is None:
        return "already gone"
    if (now.id, now.created) != (container_id, created):
        return (f"kept: a container with this id was created at {now.created}, not at "
                f"{created} when the attempt created its own; remove it by hand "
                f"(`{runtime} rm -f {container_id}`) if it is not wanted")
    if not remove_container(host, runtime, container_id):
        return "already gone"
    return "removed"


ACTIONS: dict[str, Callable[[Host, dict[str, Any]], str]] = {
    "file": _file, "dir": _dir, "tree": _tree, "process": _process, "container": _container}


def recover(ledger: Ledger, gate: str, host_for: Callable[[str], Host],
            attempt_id: str | None = None) -> list[dict[str, Any]]:
    """Undo one attempt; returns one row per owned item with what was done."""
    chosen = target_attempt(ledger, gate, attempt_id)
    owned = read_rows(ledger.attempt_folder(gate, chosen) / "owned.jsonl")
    adopted = _later_adoptions(ledger, gate, chosen)
    report: list[dict[str, Any]] = []
    with ledger.attempt("recover", fingerprint={}, hosts={},
                        retry_of=f"{gate}/{chosen}") as record:
        for item in reversed(owned):
            if kept := kept_because(item, gate, adopted):
                report.append({**item, "result": kept})
                continue
            action = ACTIONS.get(item.get("kind", ""))
            if action is None:
                report.append({**item, "result": "kept: unknown kind"})
                continue
            host = host_for(item["host"])
            try:
                with record.bind(host):
                    result = action(host, item)
            except HostError as exc:
                result = f"kept: {exc}"
            report.append({**item, "result": result})
        record.add_artifact("recovery.json", (json.dumps(
            {"gate": gate, "attempt": chosen, "items": report}, indent=2) + "\n").encode())
    ledger._update(gate, state="pending", cause=f"attempt {chosen} recovered")
    return report
