"""The hub's answer to one parsed API request: status, headers and body, decided from the
store and the presented token. No sockets here; server.py writes the `Reply` out.

The checks run in the hub's order: the repo (missing or hidden), then access (gated files),
then the revision, then the file. A missing file still names the resolved commit in
`X-Repo-Commit`, which the client uses to cache the file's absence.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from narwhal.lab.hub import access, payloads
from narwhal.lab.hub.records import Commit
from narwhal.lab.hub.routes import Refusal, Route
from narwhal.lab.hub.store import Store

REPO_COMMIT = "X-Repo-Commit"
MAX_META_FILE_BYTES = 1 << 20  # README.md / config.json read for model info, at most


@dataclass(frozen=True)
class FileBody:
    """A store object sent as the body (the server applies Range to it)."""

    path: Path
    size: int


@dataclass(frozen=True)
class Reply:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | FileBody = b""


def error(status: int, code: str, message: str, *extra: tuple[str, str]) -> Reply:
    """An error as the hub sends it: the code and message in headers the client maps to its
    exceptions, and a JSON body for people."""
    headers = [("X-Error-Message", message), *extra]
    if code:
        headers.insert(0, ("X-Error-Code", code))
    return json_reply({"error": message}, status, headers)


def json_reply(data: Any, status: int = 200, headers: list[tuple[str, str]] | None = None) -> Reply:
    body = json.dumps(data, separators=(",", ":")).encode()
    return Reply(status, [("Content-Type", "application/json; charset=utf-8"), *(headers or [])], body)


def refusal(r: Refusal) -> Reply:
    return error(r.status, r.error_code, r.message)


def _small_file(store: Store, commit: Commit, path: str) -> bytes | None:
    entry = commit.files.get(path)
    if entry is None or entry.size > MAX_META_FILE_BYTES:
        return None
    return store.object_path(entry.sha256).read_bytes()


def _model_info(store: Store, route: Route, commit: Commit) -> Reply:
    settings = store.settings(route.repo_id)
    assert settings is not None  # the access check found the repo
    readme = _small_file(store, commit, "README.md")
    raw_config = _small_file(store, commit, "config.json")
    try:
        config = json.loads(raw_config) if raw_config is not None else None
    except ValueError:
        config = None
    return json_reply(payloads.model_info(
        route.repo_id, settings, commit, blobs=route.blobs,
        readme=readme.decode("utf-8", "replace") if readme is not None else None,
        config=config if isinstance(config, dict) else None))


def _resolve(store: Store, route: Route, commit: Commit, cdn_url: Callable[[str], str]) -> Reply:
    here = (REPO_COMMIT, commit.id)
    entry = commit.files.get(route.path)
    if entry is None:
        return error(404, "EntryNotFound", f"{route.path} does not exist on \"{route.revision}\"", here)
    if entry.lfs:  # the ETag/redirect path: metadata here, bytes at the CDN origin
        return Reply(302, [("Location", cdn_url(entry.sha256)), here,
                           ("ETag", f'"{entry.blob_id}"'),
                           ("X-Linked-Etag", f'"{entry.sha256}"'),
                           ("X-Linked-Size", str(entry.size)),
                           ("Content-Type", "text/plain; charset=utf-8")])
    return Reply(200, [here, ("ETag", f'"{entry.blob_id}"'), ("Accept-Ranges", "bytes"),
                       ("Content-Type", "application/octet-stream")],
                 FileBody(store.object_path(entry.sha256), entry.size))


def answer(store: Store, route: Route, token: str | None, cdn_url: Callable[[str], str]) -> Reply:
    settings = store.settings(route.repo_id)
    verdict = access.decide(settings, token, "files" if route.kind == "resolve" else "metadata")
    if verdict is not access.Verdict.ALLOW:
        return error(verdict.status, verdict.error_code, verdict.message)
    if route.kind == "refs":
        return json_reply(payloads.refs(store.refs(route.repo_id)))
    commit = store.resolve(route.repo_id, route.revision)
    if commit is None:
        return error(404, "RevisionNotFound", f"Invalid rev id: {route.revision}")
    if route.kind == "model_info":
        return _model_info(store, route, commit)
    if route.kind == "tree":
        listing = payloads.tree(commit, route.path, route.recursive)
        if listing is None:
            return error(404, "EntryNotFound", f"{route.path} does not exist on "
                         f"\"{route.revision}\"", (REPO_COMMIT, commit.id))
        return json_reply(listing)
    return _resolve(store, route, commit, cdn_url)
