"""The JSON bodies the hub answers with, in the field names the client parses
(`ModelInfo`, `RepoFile`/`RepoFolder`, `GitRefs`). Pure: records in, plain data out.

Note the hub's two spellings of the same LFS data: `siblings[].lfs.sha256` in model info,
`lfs.oid` in a tree listing.
"""

from __future__ import annotations

import hashlib
from typing import Any

from narwhal.lab.hub import card
from narwhal.lab.hub.records import Commit, FileEntry, Refs, RepoSettings


def _sibling(path: str, entry: FileEntry, blobs: bool) -> dict[str, Any]:
    if not blobs:
        return {"rfilename": path}
    out: dict[str, Any] = {"rfilename": path, "size": entry.size, "blobId": entry.blob_id}
    if entry.lfs:
        out["lfs"] = {"sha256": entry.sha256, "size": entry.size, "pointerSize": entry.pointer_size}
    return out


def model_info(repo_id: str, settings: RepoSettings, commit: Commit, *, blobs: bool,
               readme: str | None, config: dict[str, Any] | None) -> dict[str, Any]:
    """`GET /api/models/{repo_id}[/revision/{rev}]`: the repo at one commit."""
    meta = card.front_matter(readme) if readme is not None else None
    paths = sorted(commit.files)
    info: dict[str, Any] = {
        "_id": hashlib.sha1(repo_id.encode(), usedforsecurity=False).hexdigest()[:24],
        "id": repo_id,
        "modelId": repo_id,
        "author": repo_id.split("/")[0],
        "sha": commit.id,
        "lastModified": commit.date,
        "createdAt": settings.created_at,
        "private": settings.private,
        "gated": settings.gated,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "library_name": card.library_name(meta, paths),
        "tags": card.tags(meta, paths),
        "pipeline_tag": card.pipeline_tag(meta),
        "siblings": [_sibling(p, commit.files[p], blobs) for p in paths],
        "spaces": [],
    }
    if meta is not None:
        info["cardData"] = meta
    if config is not None:
        info["config"] = {k: config[k] for k in ("architectures", "model_type") if k in config}
    return info


def _folders(paths: list[str], under: str) -> set[str]:
    prefix = under + "/" if under else ""
    found = set()
    for path in paths:
        if path.startswith(prefix):
            parts = path[len(prefix):].split("/")[:-1]
            found |= {prefix + "/".join(parts[: i + 1]) for i in range(len(parts))}
    return found


def _folder_id(commit: Commit, folder: str) -> str:
    listing = sorted((p, e.blob_id) for p, e in commit.files.items() if p.startswith(folder + "/"))
    return hashlib.sha1(repr(listing).encode(), usedforsecurity=False).hexdigest()


def tree(commit: Commit, under: str, recursive: bool) -> list[dict[str, Any]] | None:
    """`GET /api/models/{repo_id}/tree/{rev}[/{path}]`: files and folders below `under`
    (one level, or all with recursive); None when `under` is not a folder of the commit."""
    paths = sorted(commit.files)
    folders = _folders(paths, under)
    if under and not any(p.startswith(under + "/") for p in paths):
        return None
    depth = under.count("/") + 1 if under else 0
    entries: list[dict[str, Any]] = []
    for folder in sorted(folders):
        if recursive or folder.count("/") == depth:
            entries.append({"type": "directory", "oid": _folder_id(commit, folder), "size": 0,
                            "path": folder})
    prefix = under + "/" if under else ""
    for path in paths:
        if not path.startswith(prefix) or (not recursive and path.count("/") != depth):
            continue
        e = commit.files[path]
        item: dict[str, Any] = {"type": "file", "oid": e.blob_id, "size": e.size, "path": path}
        if e.lfs:
            item["lfs"] = {"oid": e.sha256, "size": e.size, "pointerSize": e.pointer_size}
        entries.append(item)
    return entries


def refs(data: Refs) -> dict[str, Any]:
    """`GET /api/models/{repo_id}/refs`."""
    return {
        "branches": [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": c}
                     for n, c in sorted(data.branches.items())],
        "tags": [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": c}
                 for n, c in sorted(data.tags.items())],
        "converts": [],
        "pullRequests": [],
    }
