"""What an API request asks for, read from its target (path and query) alone. Pure.

The client quotes a revision whole (`refs%2Fpr%2F1` is one segment) and a file path per
segment, so the target is split on `/` first and each segment decoded after. Anything that is
not one of the routes is a `Refusal` carrying the hub's status and error code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

from narwhal.lab.hub import names

Kind = Literal["model_info", "tree", "refs", "resolve"]
DEFAULT_REVISION = "main"
MAX_QUERY_FIELDS = 32
TRUE = ("1", "true", "True")


@dataclass(frozen=True)
class Route:
    kind: Kind
    repo_id: str
    revision: str
    path: str = ""  # the file (resolve) or folder (tree) inside the repo
    blobs: bool = False  # model_info: sizes, blob ids and LFS data of every file
    recursive: bool = False  # tree: the whole subtree, not one level


@dataclass(frozen=True)
class Refusal:
    status: int
    error_code: str
    message: str


NOT_FOUND = Refusal(404, "", "Not Found")


def _decoded(segments: list[str]) -> list[str] | Refusal:
    out = []
    for raw in segments:
        part = unquote(raw, errors="strict") if "%" in raw else raw
        if "\0" in part or "\\" in part:
            return Refusal(400, "", "a path segment holds a NUL or a backslash")
        out.append(part)
    return out


def _file_path(parts: list[str]) -> str | Refusal:
    path = "/".join(parts)
    problem = names.file_path_problem(path)
    return Refusal(400, "", problem) if problem else path


def _revision(raw: str) -> str | Refusal:
    problem = names.revision_problem(raw)
    return Refusal(400, "", problem) if problem else raw


def _api(parts: list[str], query: dict[str, list[str]]) -> Route | Refusal:
    """`/api/models/{owner}/{name}[/revision/{rev} | /tree/{rev}[/{path}] | /refs]`."""
    if len(parts) < 4 or parts[1] != "models":
        return NOT_FOUND
    repo_id, rest = f"{parts[2]}/{parts[3]}", parts[4:]
    if names.repo_id_problem(repo_id):
        return Refusal(400, "", names.repo_id_problem(repo_id) or "")

    def flag(key: str) -> bool:
        return query.get(key, [""])[0] in TRUE

    if not rest:
        return Route("model_info", repo_id, DEFAULT_REVISION, blobs=flag("blobs"))
    if rest == ["refs"]:
        return Route("refs", repo_id, DEFAULT_REVISION)
    if len(rest) < 2 or rest[0] not in ("revision", "tree"):
        return NOT_FOUND
    revision = _revision(rest[1])
    if isinstance(revision, Refusal):
        return revision
    if rest[0] == "revision":
        return (Route("model_info", repo_id, revision, blobs=flag("blobs")) if len(rest) == 2
                else NOT_FOUND)
    folder = _file_path(rest[2:]) if rest[2:] else ""
    if isinstance(folder, Refusal):
        return folder
    return Route("tree", repo_id, revision, path=folder, recursive=flag("recursive"))


def _resolve(parts: list[str]) -> Route | Refusal:
    """`/{owner}/{name}/resolve/{rev}/{path...}`."""
    if len(parts) < 5 or parts[2] != "resolve":
        return NOT_FOUND
    repo_id = f"{parts[0]}/{parts[1]}"
    if names.repo_id_problem(repo_id):
        return Refusal(400, "", names.repo_id_problem(repo_id) or "")
    revision = _revision(parts[3])
    if isinstance(revision, Refusal):
        return revision
    path = _file_path([p for seg in parts[4:] for p in seg.split("/")])
    if isinstance(path, Refusal):
        return path
    return Route("resolve", repo_id, revision, path=path)


def parse(target: str) -> Route | Refusal:
    """The route a request target names (unknown query keys are ignored)."""
    if not target.startswith("/"):
        return Refusal(400, "", "the request target is not a path")
    split = urlsplit(target)
    try:
        query = parse_qs(split.query, max_num_fields=MAX_QUERY_FIELDS)
        parts = _decoded(split.path.split("/")[1:])
    except (ValueError, UnicodeDecodeError):
        return Refusal(400, "", "the request target cannot be decoded")
    if isinstance(parts, Refusal):
        return parts
    if parts[:1] == ["api"]:
        return _api(parts, query)
    return _resolve(parts)
