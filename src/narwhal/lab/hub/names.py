"""Which repo ids, revisions and file paths the hub double accepts.

Every name that reaches the store passes here first. Files are looked up in a commit's tree
(a dict), never opened by name, and repo ids become two directory names only after this check,
so `..`, absolute paths, backslashes and NUL cannot walk out of the store.
"""

from __future__ import annotations

import re

_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_REVISION = re.compile(r"^[A-Za-z0-9._/-]{1,255}$")
MAX_PATH_CHARS = 1024


def repo_id_problem(repo_id: str) -> str | None:
    """Why repo_id is not `owner/name`, or None when it is."""
    parts = repo_id.split("/")
    if len(parts) != 2:
        return f"{repo_id!r} is not owner/name"
    for part in parts:
        if not _PART.match(part) or ".." in part or part.endswith("."):
            return f"{part!r} in {repo_id!r} is not a repo name (letters, digits, . _ -)"
    return None


def revision_problem(revision: str) -> str | None:
    if not _REVISION.match(revision) or ".." in revision.split("/") or revision.startswith("/"):
        return f"{revision!r} is not a revision name"
    return None


def file_path_problem(path: str) -> str | None:
    """Why path cannot name a file in a repo (relative, `/`-separated, no dot segments)."""
    if not path or len(path) > MAX_PATH_CHARS:
        return "the file path is empty or too long"
    if "\0" in path or "\\" in path or any(ord(c) < 0x20 for c in path):
        return "the file path holds a NUL, a backslash or a control character"
    if path.startswith("/"):
        return "the file path is absolute"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "the file path has an empty, '.' or '..' segment"
    return None
