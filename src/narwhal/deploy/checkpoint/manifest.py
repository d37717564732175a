"""What a pinned hub revision holds, and what each engine host must fetch to match it.

Pure: the hub's file list comes in (pin.py reads it), decisions come out. The hub's answer is
input from outside, so every path is held to a safe grammar and the list is bounded before
anything is planned from it. A host's checkpoint matches the revision when its rows (the host
probe's `path, size, sha256`) equal the manifest's; the tree digest is then the probe's own
recipe over those rows, so Gate A's `model_tree_sha256` is comparable with the hub's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from narwhal.core.document_io import StrictModel

MAX_FILES = 10_000
MAX_PATH = 1024
# One path segment: what repos name their files with; no '..', no leading '-', no control
# characters, no backslash (smuggled structure on a host's shell or filesystem).
SEGMENT_RE = re.compile(r"[A-Za-z0-9_+=@,][A-Za-z0-9_.+=@,-]*")
# Weights in other formats than safetensors, and the folders repos keep them in: when the
# revision has safetensors, vLLM loads those, and these would only cost transfer and disk.
OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".onnx_data",
                 ".gguf", ".tflite", ".ot", ".mlmodel")
OTHER_WEIGHT_DIRS = ("original/", "onnx/", "openvino/", "coreml/", "gguf/")
SHA256_RE = re.compile(r"[0-9a-f]{64}")


class HubFile(StrictModel):
    """One file of the revision as the hub lists it (sha256: LFS files; the workstation
    hashes the others itself)."""

    path: str
    size: int = Field(ge=0)
    sha256: str | None = None
    lfs: bool = False


class Card(StrictModel):
    """The model card's facts Gate A records (any may be absent)."""

    license: str | None = None
    gated: str | bool = False
    base_model: tuple[str, ...] = ()
    pipeline_tag: str | None = None


class Manifest(StrictModel):
    """A revision pinned to a commit, with the files to stage and the card."""

    repo_id: str
    revision: str  # as the operator wrote it
    commit: str  # what it resolved to, once; every host stages this
    endpoint: str | None
    files: list[HubFile]
    card: Card | None  # None: the repo has no model card (said, not an error)
    gated: str | bool = False

    def digest(self) -> str:
        return tree_digest([(f.path, f.size, f.sha256 or "") for f in self.files])

    def by_path(self) -> dict[str, HubFile]:
        return {f.path: f for f in self.files}


def path_problem(path: Any) -> str | None:
    """Why a path from the hub cannot be staged as-is, or None."""
    if not isinstance(path, str) or not path:
        return "is not a path"
    if len(path) > MAX_PATH:
        return f"is longer than {MAX_PATH} characters"
    if not all(SEGMENT_RE.fullmatch(seg) for seg in path.split("/")):
        return "is not plain path segments (letters, digits, '._-+=@,'; no '..' or controls)"
    if any(seg in (".", "..") for seg in path.split("/")):
        return "has a '.' or '..' segment"
    return None


def select(paths: Iterable[str]) -> list[str]:
    """The files vLLM needs from a revision: everything, except other weight formats when
    the revision has safetensors, the hub's own bookkeeping (.gitattributes) and README files
    (the model card: read from the hub's metadata; the probe leaves README* out of the tree
    digest, so an edited card is not another checkpoint)."""
    every = sorted(set(paths))
    has_safetensors = any(p.endswith(".safetensors") for p in every)
    kept = []
    for p in every:
        if p == ".gitattributes" or p.startswith(".") or "/." in p:
            continue
        if p.rsplit("/", 1)[-1].startswith("README"):
            continue  # the probe skips dot folders like .cache; a dot file would only differ
        if has_safetensors and (p.endswith(OTHER_WEIGHTS) or p.startswith(OTHER_WEIGHT_DIRS)):
            continue
        kept.append(p)
    return kept


def tree_digest(rows: Sequence[tuple[str, int, str]]) -> str:
    """The probe's model_tree_sha256 recipe (node/host_probe.tree_digest) over these rows."""
    text = "".join(f"{p}\t{s}\t{h}\n" for p, s, h in sorted(rows, key=lambda r: r[0]))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class HostDiff:
    """One host's checkpoint against the manifest (and the pin before it, when the operator
    moved the revision: a file exactly as that pin had it is the old revision, not damage)."""

    host: str
    missing: tuple[str, ...]  # in the revision, absent on the host
    differs: tuple[str, ...]  # present with another size or sha256
    extra: tuple[str, ...]  # on the host, not in the revision
    stale: tuple[str, ...] = ()  # of differs: exactly the previous pin's file
    retired: tuple[str, ...] = ()  # of extra: exactly the previous pin's file

    @property
    def matches(self) -> bool:
        return not (self.missing or self.differs or self.extra)


def compare(host: str, manifest: Manifest, rows: Sequence[Sequence[Any]],
            previous: Manifest | None = None) -> HostDiff:
    """The host probe's rows (path, size, sha256) against the revision's files."""
    want = manifest.by_path()
    have = {str(r[0]): (int(r[1]), str(r[2])) for r in rows}
    was = {p: (f.size, f.sha256 or "") for p, f in (previous.by_path() if previous else {}
                                                   ).items()}
    missing = tuple(p for p in want if p not in have)
    differs = tuple(p for p, f in want.items()
                    if p in have and have[p] != (f.size, f.sha256 or ""))
    extra = tuple(sorted(p for p in have if p not in want))
    return HostDiff(host, missing, differs, extra,
                    stale=tuple(p for p in differs if was.get(p) == have[p]),
                    retired=tuple(p for p in extra if was.get(p) == have[p]))


@dataclass(frozen=True)
class Fetch:
    """What to do on one host: `files` to fetch in order, `repair` the ones replaced in place,
    `remove` the previous pin's files the new revision no longer has."""

    host: str
    files: tuple[str, ...]
    repair: tuple[str, ...]
    remove: tuple[str, ...] = ()


def fetch_plan(diffs: Sequence[HostDiff], repair: bool) -> tuple[list[Fetch], list[HostDiff]]:
    """Per host: missing files are fetched; files exactly as the previous pin had them are
    replaced (or removed) because the operator moved the revision; any other difference only
    with the operator's repair consent, and a file no pin ever had never. Hosts whose files
    stand in the way come back as refused (nothing is fetched anywhere then: an unconsented
    change is none)."""
    refused = [d for d in diffs if set(d.extra) - set(d.retired)
               or (set(d.differs) - set(d.stale) and not repair)]
    if refused:
        return [], refused
    plans = [Fetch(d.host, tuple(sorted((*d.missing, *d.differs))), tuple(sorted(d.differs)),
                   tuple(sorted(d.retired)))
             for d in diffs if d.missing or d.differs or d.retired]
    return plans, []


def hub_sha256(entry: Mapping[str, Any]) -> str | None:
    """The sha256 the hub gives for an LFS file, when it is one (held to 64 hex)."""
    lfs = entry.get("lfs")
    value = lfs.get("sha256") if isinstance(lfs, Mapping) else None
    return value if isinstance(value, str) and SHA256_RE.fullmatch(value) else None
