"""Writing the profile store and its samples file: checked first, whole or not at all.

Both files are written whole or not at all, mode 0600 (core/private_file.py), so a reader (the
router, narwhal-check) sees the old file or the new one, never half of either. The store is validated with the router's own parser before it is written.

`--only` re-profiles some engines of an existing store: every other row is carried over as the
JSON value it was, and since the store is always written with the same layout, its text is
byte-for-byte what it was. Sample lines of the other engines are kept the same way.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.core.document_io import read_json_document
from narwhal.core.errors import InputError, Problem
from narwhal.core.private_file import write_private
from narwhal.core.profiles import SCHEMA, VERSION, ProfileRow, parse_profiles

SAMPLES_SCHEMA = "narwhal.profile-samples"
SAMPLES_VERSION = 1


@dataclass(frozen=True)
class Target:
    """Where the run writes, and what of an existing store it keeps."""

    store: Path
    samples: Path
    existing_rows: tuple[dict[str, Any], ...]  # raw rows of the store there now (with --only)
    replaced: tuple[str, ...]  # engines whose existing rows this run replaces


def check_target(store: Path, samples: Path, *, model: str, only: tuple[str, ...],
                 overwrite: bool) -> Target:
    """Refuse (InputError, exit 2) before measuring anything that the write would refuse."""
    if not store.exists():
        return Target(store, samples, (), ())
    if not only:
        if not overwrite:
            raise InputError(str(store), [Problem("(file)", "a profile store is already there",
                                                  "pass --overwrite to replace it, or --out "
                                                  "to write elsewhere")])
        return Target(store, samples, (), ())
    raw = read_json_document(store, "pass --out to write the store elsewhere")
    existing = parse_profiles(raw, str(store), model=model)  # InputError names the broken field
    replaced = tuple(eid for eid in only if existing.row(eid) is not None)
    if replaced and not overwrite:
        raise InputError(str(store), [Problem("profiles", f"already has rows for {', '.join(replaced)}",
                                              "pass --overwrite to replace them (other rows are "
                                              "kept as they are)")])
    return Target(store, samples, tuple(raw["profiles"]), replaced)


def store_document(target: Target, model: str, rows: list[ProfileRow],
                   fleet_order: tuple[str, ...]) -> dict[str, Any]:
    """Existing rows where they were (re-profiled ones replaced in place), new ones after them
    in fleet order."""
    fresh = {r.engine_id: r.model_dump(mode="json") for r in rows}
    profiles = [fresh.pop(r["engine_id"], r) for r in target.existing_rows]
    profiles += [fresh[eid] for eid in fleet_order if eid in fresh]
    return {"schema": SCHEMA, "schema_version": VERSION, "model": model, "profiles": profiles}


def render_store(document: dict[str, Any]) -> str:
    """The one layout every store is written in (so kept rows keep their bytes)."""
    return json.dumps(document, indent=1, allow_nan=False) + "\n"


def samples_lines(target: Target, model: str, fresh_ids: tuple[str, ...],
                  lines: list[dict[str, Any]]) -> str:
    """Header, kept lines of other engines (with --only), then this run's samples."""
    header = {"schema": SAMPLES_SCHEMA, "schema_version": SAMPLES_VERSION, "model": model}
    out = [json.dumps(header)]
    if target.existing_rows and target.samples.exists():
        old = target.samples.read_text(encoding="utf-8").splitlines()
        with contextlib.suppress(ValueError, IndexError, TypeError):
            if json.loads(old[0]).get("schema") == SAMPLES_SCHEMA:
                out += [line for line in old[1:]
                        if line.strip() and json.loads(line).get("engine_id") not in fresh_ids]
    out += [json.dumps(line, allow_nan=False) for line in lines]
    return "\n".join(out) + "\n"


def write_all(target: Target, document: dict[str, Any], samples_text: str) -> None:
    """Validate the store as the router will read it, then write samples and store atomically."""
    parse_profiles(document, str(target.store), model=str(document["model"]))
    write_private(target.samples, samples_text)
    write_private(target.store, render_store(document))
