"""Gate C's evidence handed to the router host: `--captures DIR` for narwhal-check's contract gate.

One folder holds, for every engine of the fleet, `launch-<id>.json` (its launch record, as
Gate A wrote it) and `cache-layout-<id>.json` (its capture, as Gate C wrote it). Both are
files that came from elsewhere, so each is size-bounded and checked in full; every problem in
the folder is reported at once, before any engine is called (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from narwhal.core.cache_layout import CacheLayout, load_cache_layout
from narwhal.core.document_io import parse_json_bytes, read_document_bytes, validate_document
from narwhal.core.documents import sha256_bytes
from narwhal.core.errors import InputError, Problem
from narwhal.core.fleet import FleetDocument
from narwhal.core.launch_record import SCHEMA as LAUNCH_SCHEMA
from narwhal.core.launch_record import VERSION as LAUNCH_VERSION
from narwhal.core.launch_record import LaunchRecord

MAX_LAUNCH_BYTES = 1 << 20


@dataclass(frozen=True)
class EngineCapture:
    """One engine's Gate C evidence: its launch record (and that file's digest) and capture."""

    record: LaunchRecord
    record_sha256: str
    layout: CacheLayout


def _launch_record(path: Path) -> tuple[LaunchRecord, str]:
    data = read_document_bytes(path, "copy Gate A's launch-<engine>.json into the folder",
                               max_bytes=MAX_LAUNCH_BYTES)
    record = validate_document(parse_json_bytes(data, str(path)), str(path), LaunchRecord,
                               LAUNCH_SCHEMA, LAUNCH_VERSION, "copy Gate A's launch record",
                               "discover again with this revision", reference="docs/discover.md")
    return record, sha256_bytes(data)


def load_captures(folder: Path, fleet: FleetDocument) -> dict[str, EngineCapture]:
    """Every fleet engine's evidence from `folder`; one InputError naming every problem."""
    if not folder.is_dir():
        raise InputError("--captures", [Problem(str(folder), "is not a folder",
                                                "name the folder holding Gate C's captures")])
    out: dict[str, EngineCapture] = {}
    problems: list[Problem] = []
    for e in fleet.engines:
        launch, layout = folder / f"launch-{e.id}.json", folder / f"cache-layout-{e.id}.json"
        missing = [p.name for p in (launch, layout) if not p.is_file()]
        if missing:
            problems.append(Problem(f"--captures {folder}", f"has no {' or '.join(missing)} for "
                                    f"engine {e.id}", "run `narwhal engines` for it and copy "
                                    "its evidence, or fix the engine id in the fleet"))
            continue
        try:
            record, sha = _launch_record(launch)
            capture = load_cache_layout(layout)
        except InputError as exc:
            problems += [Problem(f"{exc.source}: {p.field}", p.problem, p.fix)
                         for p in exc.problems]
            continue
        if capture.engine != e.id or record.engine != e.id:
            problems.append(Problem(f"--captures {folder}", f"engine {e.id}'s files describe "
                                    f"{record.engine!r} (launch) and {capture.engine!r} "
                                    "(capture)", "copy the files of the engine this fleet "
                                    "calls by that id"))
            continue
        out[e.id] = EngineCapture(record, sha, capture)
    if problems:
        raise InputError("--captures", problems)
    return out
