"""The ledger index (`ledger.json`) and the creation of attempts under a lock.

`runs/<deployment>/ledger.json` is the only file that changes in place (atomic rename); every
attempt's evidence lives in `runs/<deployment>/<gate>/<attempt>/` and is written once.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from narwhal.core.documents import expect, stamp
from narwhal.core.errors import GateBlocked, LedgerError
from narwhal.core.gates import ACTIVITIES, GATE_NAMES
from narwhal.core.secret import Secret
from narwhal.deploy.ledger.attempt import Attempt, iso
from narwhal.deploy.ledger.evidence import EvidenceWriter, Redactor, private_dir
from narwhal.deploy.ledger.revision import source_revision

LEDGER_SCHEMA = "narwhal.ledger"
START_SCHEMA = "narwhal.attempt-start"
RUNBOOK_INDEX_SCHEMA = "narwhal.runbook-index"
# The runbook's evidence names for attempt folders of ours (its "Evidence and recovery index"):
# `runbook-index.json` maps each to the folder, so a reader (and the export) can follow the
# runbook's names. The capacity trial is the `load-trial` activity (`narwhal trial`), not Gate
# G. Gate B's prepared runs, runs/deployment-env/<run>/, are real folders of the runbook's
# name; package/prepared.py indexes each through `name_in_runbook` all the same, so the index
# lists every name the runbook gives.
RUNBOOK_NAMES = {"discover": "discovery/{id}", "access": "access-{id}",
                 "load-trial": "load-trial-{id}"}
# The workstation `.env` as this attempt read it, secrets masked (deploy/inputs/masked.py).
MASKED_ENV = "env.masked"


class Ledger:
    """One deployment's record."""

    def __init__(self, runs: Path, deployment: str, secrets: Iterable[Secret] = (),
                 masked_env: str = "", gates: Iterable[str] = GATE_NAMES) -> None:
        """`masked_env` is the `.env` the run read, secrets already masked: every attempt keeps
        a copy, so its evidence says what it ran from even after the `.env` is edited.
        `gates`: the names recorded as gates (the runbook's seven; a test's own sequence)."""
        self.gates = tuple(gates)
        self.runs = runs
        self.deployment = deployment
        self.root = runs / deployment
        self.writer = EvidenceWriter(Redactor(secrets))
        self.masked_env = masked_env

    @property
    def index_path(self) -> Path:
        return self.root / "ledger.json"

    def ensure(self) -> Ledger:
        """Create the private deployment folder and an empty index, once."""
        private_dir(self.runs)
        private_dir(self.root)
        if not self.index_path.exists():
            with self.lock():
                if not self.index_path.exists():
                    self.writer.replace_json(self.index_path, stamp(LEDGER_SCHEMA, 1, {
                        "deployment": self.deployment, "created": iso(time.time()),
                        "gates": {}, "activities": {}}))
        return self

    def exists(self) -> bool:
        return self.index_path.exists()

    @contextmanager
    def lock(self) -> Iterator[None]:
        private_dir(self.root)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def load(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.index_path.read_text())
        except FileNotFoundError:
            raise LedgerError(f"no deployment record at {self.root}; run a gate first "
                              "(or `narwhal status` after `narwhal inputs`)") from None
        except json.JSONDecodeError as exc:
            raise LedgerError(f"{self.index_path} is corrupt ({exc.msg})") from exc
        return expect(doc, LEDGER_SCHEMA, 1)

    def _entry(self, doc: dict[str, Any], step: str) -> dict[str, Any]:
        table = "gates" if step in self.gates else "activities"
        if step not in self.gates and step not in ACTIVITIES and step != "recover":
            raise LedgerError(f"unknown gate or activity {step!r}")
        entry: dict[str, Any] = doc[table].setdefault(
            step, {"state": "pending", "attempts": [], "fingerprint": {}, "cause": ""})
        return entry

    def _update(self, step: str, **changes: Any) -> None:
        with self.lock():
            doc = self.load()
            entry = self._entry(doc, step)
            entry.update(changes, updated=iso(time.time()))
            self.writer.replace_json(self.index_path, doc)

    @contextmanager
    def attempt(self, step: str, *, fingerprint: dict[str, str], hosts: dict[str, list[str]],
                deployment_revision: str = "", retry_of: str = "") -> Iterator[Attempt]:
        """Open an attempt; record its verdict (passed, blocked, failed) however it ends."""
        self.ensure()
        started = time.time()
        with self.lock():
            doc = self.load()
            entry = self._entry(doc, step)
            number = len(entry["attempts"]) + 1
            attempt_id = f"{number:03d}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(started))}"
            folder = private_dir(self.root / step / attempt_id)
            starting_state = {name: info["state"] for name, info in doc["gates"].items()}
            start_doc = {
                "deployment": self.deployment, "gate": step, "attempt": attempt_id,
                "retry_of": retry_of or (entry["attempts"][-1] if entry["attempts"] else ""),
                "hosts": hosts, "source_revision": source_revision(),
                "deployment_revision": deployment_revision, "starting_state": starting_state,
                "input_fingerprint": fingerprint, "started": iso(started),
                "started_epoch": started, "pid": os.getpid(),
            }
            self.writer.create_json(folder / "start.json", stamp(START_SCHEMA, 1, start_doc))
            entry["attempts"].append(attempt_id)
            entry.update(state="running", cause="", updated=iso(started))
            self.writer.replace_json(self.index_path, doc)
        attempt = Attempt(self, step, attempt_id, folder, start_doc)
        name = RUNBOOK_NAMES.get(step)
        if name is not None:
            self.name_in_runbook(name.format(id=attempt_id), f"{step}/{attempt_id}")
        try:
            if self.masked_env:
                attempt.add_artifact(MASKED_ENV, self.masked_env.encode())
            yield attempt
        except GateBlocked as exc:
            attempt.finish("blocked", exc.cause)
            self._update(step, state="blocked", cause=exc.cause, last=attempt_id)
            raise
        except BaseException as exc:
            cause = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            attempt.finish("failed", cause)
            self._update(step, state="failed", cause=cause, last=attempt_id)
            raise
        attempt.finish("passed")
        self._update(step, state="passed", cause="", fingerprint=fingerprint, last=attempt_id)

    def name_in_runbook(self, name: str, folder: str) -> None:
        """Record in runbook-index.json that the runbook's `name` is `folder` (relative to the
        deployment), so its evidence names lead to ours; naming a folder again is harmless."""
        path = self.root / "runbook-index.json"
        with self.lock():
            try:
                doc = expect(json.loads(path.read_text()), RUNBOOK_INDEX_SCHEMA, 1)
            except FileNotFoundError:
                doc = stamp(RUNBOOK_INDEX_SCHEMA, 1, {"deployment": self.deployment,
                                                      "names": {}})
            doc["names"][name] = folder
            self.writer.replace_json(path, doc)

    def attempt_folder(self, step: str, attempt_id: str) -> Path:
        return self.root / step / attempt_id
