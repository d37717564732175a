"""narwhal-stage-checkpoint: bring named files of one hub commit into a model dir on this host.

Gate A ships this one file to an engine host (like the host probe) and runs it with the host's
python3 and a `narwhal.stage-request` v1 document on stdin; it prints one `NARWHAL_RESULT` line.
Narwhal is not installed on the host yet, so the hub client comes from the stage kit: the
locked wheels of `huggingface_hub` and what it needs, sent by Gate A, each checked against its
sha256 here and unpacked into `<kit>/site` (a wheel is a zip laid out as site-packages), once
per kit. The token, when there is one, rides in the request on stdin (never argv, a file or a
log) and is moved into this process's environment as HF_TOKEN; the hub's address is HF_ENDPOINT.

Which files to fetch is decided on the workstation (deploy/checkpoint/manifest.py): this
script downloads exactly those, at the pinned commit, with `hf_hub_download(local_dir=...)`
(resumable: a cut download continues from its `.incomplete` part), and says per file what it
did. A host that cannot reach the hub says so (`unreachable`), and the workstation brings it
the files from a host that has them.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import socket
import sys
import urllib.parse
import zipfile
from typing import Any

COMMAND = "narwhal-stage-checkpoint"
MARKER = "NARWHAL_RESULT "
SCHEMA = "narwhal.stage-request"
COMPLETE = ".narwhal-kit-complete"
BLOCK = 1 << 20
DEFAULT_ENDPOINT = "https://huggingface.co"
CONNECT_TIMEOUT_S = 10.0
UNREACHABLE_ERRNOS = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNREFUSED,
                      errno.ETIMEDOUT, errno.EACCES, errno.EPERM}


def render(ok: bool, data: dict[str, Any], error: str = "") -> str:
    """The one result line, in narwhal.core.result_line's canonical form."""
    body = {"schema": "narwhal.result", "schema_version": 1, "command": COMMAND, "ok": ok,
            "data": data, "error": error}
    return MARKER + json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def unpack_kit(kit: str, wheels: list[dict[str, str]], archive: str | None) -> bool:
    """Unpack the kit's wheels into kit/site once; True when this run unpacked them.

    The wheels come in one archive (or as files beside it); every wheel is checked against its
    locked sha256 first, so a damaged or swapped wheel is refused before any of it lands; the
    marker is written last, so a cut unpack is redone."""
    site = os.path.join(kit, "site")
    marker = os.path.join(site, COMPLETE)
    if os.path.exists(marker):
        return False
    blobs = {}
    bundle = zipfile.ZipFile(os.path.join(kit, archive)) if archive else None
    try:
        for wheel in wheels:
            if bundle is not None:
                data = bundle.read(wheel["file"])
            else:
                with open(os.path.join(kit, wheel["file"]), "rb") as f:
                    data = f.read()
            got = hashlib.sha256(data).hexdigest()
            if got != wheel["sha256"]:
                raise ValueError(f"{wheel['file']}: sha256 {got}, the lock says "
                                 f"{wheel['sha256']}")
            blobs[wheel["file"]] = data
    finally:
        if bundle is not None:
            bundle.close()
    os.makedirs(site, exist_ok=True)
    for data in blobs.values():
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            z.extractall(site)  # member names with '..' or a leading '/' are made safe
    with open(marker, "w") as f:
        f.write("\n".join(w["sha256"] for w in wheels) + "\n")
    return True


def _unreachable(exc: BaseException) -> bool:
    """A connection that never reached a hub (no route, refused, timed out, name unknown);
    a hub that answered (401, 403, 404, 5xx) is not that, whatever the client wraps it in."""
    seen: BaseException | None = exc
    chain: list[BaseException] = []
    while seen is not None and len(chain) < 16:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if any(getattr(e, "response", None) is not None for e in chain):
        return False
    return any(type(e).__name__ in ("ConnectError", "ConnectTimeout", "ConnectionError",
                                    "LocalEntryNotFoundError", "OfflineModeIsEnabled")
               or isinstance(e, (ConnectionError, socket.gaierror, TimeoutError))
               or (isinstance(e, OSError) and e.errno in UNREACHABLE_ERRNOS) for e in chain)


def hub_route(endpoint: str) -> str | None:
    """Why the hub's address cannot be reached from here (None: a connection opens). Asked
    once first, because the client retries a dead route with backoff for many seconds."""
    parts = urllib.parse.urlsplit(endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "", port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


def download(request: dict[str, Any]) -> dict[str, Any]:
    """Fetch each named file of the commit into model_dir; per file: fetched or why not."""
    route = hub_route(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
    if route is not None:
        return {"outcome": "unreachable", "files": {}, "error": route}
    from huggingface_hub import hf_hub_download  # the kit's, on PYTHONPATH

    done: dict[str, str] = {}
    for name in request.get("remove") or []:  # the previous pin's, gone from this revision
        path = os.path.join(request["model_dir"], name)
        if os.path.isfile(path) and not os.path.islink(path):
            os.remove(path)
        done[name] = "removed"
    for name in request["files"]:
        force = name in request["repair"]
        try:
            hf_hub_download(request["repo_id"], name, revision=request["commit"],
                            local_dir=request["model_dir"], force_download=force)
        except Exception as exc:
            kind = type(exc).__name__
            if _unreachable(exc):
                return {"outcome": "unreachable", "files": done,
                        "error": f"{kind}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}
            return {"outcome": "failed", "files": done, "file": name, "kind": kind,
                    "error": (str(exc).splitlines()[0] if str(exc) else kind)[:300]}
        done[name] = "repaired" if force else "fetched"
    return {"outcome": "staged", "files": done, "error": None}


def hub_environment(request: dict[str, Any]) -> None:
    """The hub client's settings, in this process's environment before it is imported: the
    token (taken out of the request), the endpoint, and its state kept inside the kit."""
    token = request.pop("token", None)
    if isinstance(token, str) and token:
        os.environ["HF_TOKEN"] = token
    else:
        os.environ.pop("HF_TOKEN", None)
    if isinstance(request.get("endpoint"), str):
        os.environ["HF_ENDPOINT"] = request["endpoint"]
    os.environ["HF_HOME"] = os.path.join(request["kit"], "hf-home")
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ.pop("HF_HUB_OFFLINE", None)


def request_problem(request: Any) -> str | None:
    if not isinstance(request, dict) or request.get("schema") != SCHEMA \
            or request.get("schema_version") != 1:
        return f"stdin is not a {SCHEMA} v1 document"
    for key in ("repo_id", "commit", "model_dir", "kit"):
        if not isinstance(request.get(key), str) or not request[key]:
            return f"{key} is missing"
    for key in ("files", "repair", "wheels"):
        if not isinstance(request.get(key), list):
            return f"{key} is not a list"
    for name in [*request["files"], *(request.get("remove") or [])]:
        if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name \
                or any(seg in ("", ".", "..") for seg in name.split("/")):
            return f"{str(name)[:80]!r} is not a path inside the model dir"
    if not os.path.isabs(request["model_dir"]) or not os.path.isabs(request["kit"]):
        return "model_dir and kit must be absolute paths"
    return None


def main() -> int:
    try:
        request = json.loads(sys.stdin.read(1 << 22))
    except ValueError as exc:
        print(render(False, {}, f"stdin is not JSON: {exc}"))
        return 2
    problem = request_problem(request)
    if problem is not None:
        print(render(False, {}, problem))
        return 2
    hub_environment(request)
    try:
        archive = request.get("archive")
        unpacked = unpack_kit(request["kit"], request["wheels"],
                              archive if isinstance(archive, str) and "/" not in archive
                              and archive not in ("", ".", "..") else None)
        sys.path.insert(0, os.path.join(request["kit"], "site"))
        os.makedirs(request["model_dir"], exist_ok=True)
        result = download(request)
    except Exception as exc:
        print(render(False, {}, f"{type(exc).__name__}: {exc}"[:500]))
        return 1
    result["kit_unpacked"] = unpacked
    print(render(True, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
