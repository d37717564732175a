"""One attempt at one gate: its folder, its command log, what it owns, its artifacts, verdict."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from narwhal.core.documents import canonical_json, sha256_bytes, stamp
from narwhal.core.errors import GateBlocked, LedgerError, Problem
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.base import Host, ProcessRef, Recorder, RunResult
from narwhal.deploy.ledger.evidence import EvidenceWriter, private_dir

if TYPE_CHECKING:
    from narwhal.deploy.ledger.store import Ledger

ATTEMPT_SCHEMA = "narwhal.attempt"


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def blocked_cause(problems: Sequence[Problem]) -> str:
    """A blocked attempt's cause, one format for every gate: its first two problems, and how
    many more problems.json holds."""
    said = "; ".join(x.line() for x in problems[:2])
    return said + (f"; and {len(problems) - 2} more (problems.json)" if len(problems) > 2
                   else "")


class Attempt:
    """Records everything one gate attempt does; hosts bound to it record their own commands."""

    def __init__(self, ledger: Ledger, gate: str, attempt_id: str, folder: Path,
                 start_doc: dict[str, Any]) -> None:
        self.ledger = ledger
        self.gate = gate
        self.id = attempt_id
        self.folder = folder
        self.writer: EvidenceWriter = ledger.writer
        self.start_doc = start_doc
        self.artifacts: dict[str, str] = {}
        self._seq = 0
        # Hosts are driven from several threads at once (concurrent inspection, engine starts,
        # attestation): numbering, the out/ files and the commands.jsonl row of one command
        # happen under this lock, so no two commands share a number and rows stay in seq order.
        self._lock = threading.Lock()
        # id(host) -> (host, its recorder before this attempt bound it, how many binds hold it)
        self._bound: dict[int, tuple[Host, Recorder | None, int]] = {}
        private_dir(folder / "out")

    # Recording ---------------------------------------------------------------

    def record_command(self, result: RunResult, transport: str) -> None:
        """Number the command, keep its output under out/ and append its row (thread-safe)."""
        with self._lock:
            self._seq += 1
            seq = self._seq
            row: dict[str, Any] = {
                "seq": seq, "host": result.alias, "transport": transport,
                "argv": list(result.argv), "start": iso(result.started), "end": iso(result.ended),
                "duration_s": round(result.ended - result.started, 6),
                "exit_status": result.exit_status,
            }
            for name, data in (("stdout", result.stdout), ("stderr", result.stderr)):
                rel = f"out/{seq:05d}.{name}" if data else None
                clean = self.writer.create(self.folder / rel, data) if rel else b""
                row[name] = {"bytes": len(clean), "sha256": sha256_bytes(clean), "path": rel}
            self.writer.append_row(self.folder / "commands.jsonl", row)

    @contextmanager
    def bind(self, *hosts: Host) -> Iterator[None]:
        """Every call through these hosts is recorded in this attempt while bound.

        Threads may bind one host at once (engines that share a physical host start
        concurrently through its one session): the host records here until the last of them
        unbinds, never reverting to its previous recorder while another thread still runs."""
        with self._lock:
            for host in hosts:
                _, previous, count = self._bound.get(id(host), (host, host.recorder, 0))
                self._bound[id(host)] = (host, previous, count + 1)
                host.recorder = self
        try:
            yield
        finally:
            with self._lock:
                for host in hosts:
                    _, previous, count = self._bound[id(host)]
                    if count > 1:
                        self._bound[id(host)] = (host, previous, count - 1)
                    else:
                        del self._bound[id(host)]
                        host.recorder = previous

    def _own(self, row: dict[str, Any]) -> None:
        self.writer.append_row(self.folder / "owned.jsonl", {"at": iso(time.time()), **row})

    # What the attempt creates ---------------------------------------------------

    def create_file(self, host: Host, path: str, data: bytes) -> str:
        """Create a new file on host (never replacing one) and own it by inode and sha256."""
        with self.bind(host):
            inode, sha = host.put_file(data, path, exclusive=True)
        self.own_file(host, path, inode, sha)
        return sha

    def own_file(self, host: Host, path: str, inode: int, sha256: str) -> None:
        """Own a new file a command of this attempt made on host (a relayed install file),
        by the inode and sha256 that command reported, as create_file owns its own."""
        self._own({"kind": "file", "host": host.alias, "path": path, "inode": inode,
                   "sha256": sha256})

    def make_dir(self, host: Host, path: str) -> None:
        """Create a new directory (it must not exist) and own it by inode."""
        with self.bind(host):
            host.run(["mkdir", "-m", "700", "--", path], check=True)
            inode = host.stat_dir(path)
        self._own({"kind": "dir", "host": host.alias, "path": path, "inode": inode})

    def own_tree(self, host: Host, path: str) -> None:
        """Own a directory tree a command of this attempt just made (a clone, a venv) by its
        inode: recovery removes it whole, but only while that inode still has the path."""
        with self.bind(host):
            inode = host.stat_dir(path)
        if inode is None:
            raise LedgerError(f"{host.alias}: {path} is not a directory right after it was made")
        self._own({"kind": "tree", "host": host.alias, "path": path, "inode": inode})

    def start_process(self, host: Host, argv: Sequence[str], log_path: str,
                      serves: str = "") -> ProcessRef:
        """Start a detached process and own it by pid and kernel start time; `serves` names
        what it is for (an engine id), so a later attempt can replace exactly that one."""
        with self.bind(host):
            ref = host.start_detached(argv, log_path)
        self._own({"kind": "process", "host": host.alias, "pid": ref.pid,
                   "start_ticks": ref.start_ticks, "argv0": argv[0],
                   **({"serves": serves} if serves else {})})
        return ref

    def adopt_process(self, row: dict[str, Any], started_by: str) -> None:
        """Record that this attempt serves with a process an earlier attempt started (its
        owned row: host, pid, kernel start time), so recovering that earlier attempt keeps it
        and recovering this one never ends what it did not create (ledger/recover.py)."""
        self._own({"kind": "adopted", "host": row["host"], "pid": int(row["pid"]),
                   "start_ticks": int(row["start_ticks"]), "argv0": row.get("argv0", ""),
                   "started_by": started_by,
                   **({"serves": row["serves"]} if row.get("serves") else {})})

    def own_container(self, host: Host, runtime: str, container_id: str, created: str) -> None:
        """Own a container this attempt created, by full id and the runtime's creation time
        (as `<runtime> inspect --format '{{.Id}} {{.Created}}'` prints it), so recovery can
        tell it from a later container with the same id."""
        if runtime not in cl.CONTAINER_RUNTIMES:
            raise LedgerError(f"{host.alias}: container runtime {runtime!r} is not one of "
                              f"{', '.join(cl.CONTAINER_RUNTIMES)}; recovery could not remove it")
        if not cl.CONTAINER_ID_RE.fullmatch(container_id):
            raise LedgerError(f"{host.alias}: container id {container_id[:80]!r} is not the full "
                              "64-hex id; pass the id `run -d` printed, not a name or prefix")
        if not created.strip():
            raise LedgerError(f"{host.alias}: container {container_id[:12]} has no creation "
                              "time; read it with hosts.containers.inspect_container")
        self._own({"kind": "container", "host": host.alias, "runtime": runtime,
                   "id": container_id, "created": created})

    def add_artifact(self, name: str, data: bytes) -> Path:
        """Write a gate artifact into the attempt folder; its sha256 goes into attempt.json."""
        if "/" in name or name.startswith(".") or name in ("attempt.json", "start.json",
                                                            "commands.jsonl", "owned.jsonl"):
            raise LedgerError(f"artifact name {name!r} is reserved or not a plain file name")
        path = self.folder / name
        self.artifacts[name] = sha256_bytes(self.writer.create(path, data))
        return path

    def add_json(self, name: str, doc: Any) -> Path:
        """A JSON artifact, in the one form every evidence document takes (canonical JSON and a
        final newline): byte-stable, so its digest moves only when its content does."""
        return self.add_artifact(name, canonical_json(doc).encode() + b"\n")

    def block(self, cause: str = "", problems: Sequence[Problem] = ()) -> NoReturn:
        """Stop the attempt as blocked; the ledger records it before anything else happens.
        Its problems (each naming the field, what is wrong and the fix) are kept as
        problems.json; the cause, unless given, is the first of them (blocked_cause)."""
        if problems:
            self.add_json("problems.json", [{"field": x.field, "problem": x.problem,
                                             "fix": x.fix} for x in problems])
        raise GateBlocked(self.gate, cause or blocked_cause(problems), list(problems))

    # Verdict ----------------------------------------------------------------------

    def finish(self, verdict: str, cause: str = "") -> dict[str, Any]:
        ended = time.time()
        with self._lock:
            commands = self._seq
        doc = stamp(ATTEMPT_SCHEMA, 1, {
            **self.start_doc, "verdict": verdict, "cause": cause, "ended": iso(ended),
            "duration_s": round(ended - float(self.start_doc["started_epoch"]), 3),
            "commands": commands, "artifacts": dict(sorted(self.artifacts.items())),
        })
        self.writer.create_json(self.folder / "attempt.json", doc)
        return doc
