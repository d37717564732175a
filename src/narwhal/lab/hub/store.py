"""The hub double's repo store on disk (format in the package docstring).

Objects are written once under their sha256 and never changed, then the commit document, and
only then the branch moves (one atomic rename of refs.json): a reader in another thread or
process sees the old commit or the new one, never a branch naming a half-written commit.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from narwhal.core.documents import expect, stamp
from narwhal.core.errors import InputError, Problem
from narwhal.lab.hub import gitobj, names
from narwhal.lab.hub.records import (
    COMMIT_SCHEMA,
    REFS_SCHEMA,
    REPO_SCHEMA,
    VERSION,
    Commit,
    FileEntry,
    Gated,
    Refs,
    RepoSettings,
)

SKIPPED_DIRS = (".git", ".cache")  # git's own folder; huggingface_hub's local_dir metadata


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _dump(schema: str, model: BaseModel) -> bytes:
    return (json.dumps(stamp(schema, VERSION, model.model_dump()), indent=1) + "\n").encode()


def _body(path: Path, schema: str) -> dict[str, Any]:
    document = expect(json.loads(path.read_text()), schema, VERSION)
    return {k: v for k, v in document.items() if k not in ("schema", "schema_version")}


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _require_repo_id(repo_id: str) -> None:
    problem = names.repo_id_problem(repo_id)
    if problem:
        raise InputError("--repo", [Problem("repo", problem, "give owner/name, e.g. narwhal-lab/tiny-llama")])


class Store:
    """One store folder. Reads are safe from many threads; writes take the repo's lock."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def object_path(self, sha256: str) -> Path:
        return self.root / "objects" / sha256[:2] / sha256

    def _repo_dir(self, repo_id: str) -> Path:
        return self.root / "repos" / repo_id  # repo_id already passed names.repo_id_problem

    @contextlib.contextmanager
    def _locked(self, repo_id: str) -> Iterator[None]:
        folder = self._repo_dir(repo_id)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    # reading ---------------------------------------------------------------
    def settings(self, repo_id: str) -> RepoSettings | None:
        """The repo's settings, or None when no such repo exists."""
        if names.repo_id_problem(repo_id):
            return None
        path = self._repo_dir(repo_id) / "repo.json"
        if not path.is_file():
            return None
        return RepoSettings.model_validate(_body(path, REPO_SCHEMA))

    def refs(self, repo_id: str) -> Refs:
        path = self._repo_dir(repo_id) / "refs.json"
        return Refs.model_validate(_body(path, REFS_SCHEMA)) if path.is_file() else Refs()

    def commit(self, repo_id: str, commit_id: str) -> Commit | None:
        if not gitobj.COMMIT_ID.match(commit_id):
            return None
        path = self._repo_dir(repo_id) / "commits" / f"{commit_id}.json"
        return Commit.model_validate(_body(path, COMMIT_SCHEMA)) if path.is_file() else None

    def resolve(self, repo_id: str, revision: str) -> Commit | None:
        """The commit a revision names: a branch, a tag, or a full commit id of this repo."""
        refs = self.refs(repo_id)
        target = refs.branches.get(revision) or refs.tags.get(revision) or revision
        return self.commit(repo_id, target)

    # writing ---------------------------------------------------------------
    def init_repo(self, repo_id: str, *, gated: Gated = False, private: bool = False,
                  tokens: tuple[str, ...] = ()) -> RepoSettings:
        """Create the repo, or change its access settings (grants add to earlier ones)."""
        _require_repo_id(repo_id)
        with self._locked(repo_id):
            before = self.settings(repo_id)
            granted = list(before.token_sha256) if before else []
            granted += [d for d in map(token_digest, tokens) if d not in granted]
            settings = RepoSettings(gated=gated, private=private, token_sha256=granted,
                                    created_at=before.created_at if before else _now())
            _write_atomic(self._repo_dir(repo_id) / "repo.json", _dump(REPO_SCHEMA, settings))
        return settings

    def _put_object(self, data: bytes, sha256: str) -> None:
        path = self.object_path(sha256)
        if not path.exists():  # content-addressed: an existing object already holds these bytes
            _write_atomic(path, data)

    def push(self, repo_id: str, folder: Path, *, branch: str = "main",
             message: str = "Upload folder") -> Commit:
        """Commit the whole folder as the branch's next commit and move the branch to it
        (creating a public repo on its first push)."""
        _require_repo_id(repo_id)
        problem = names.revision_problem(branch)
        if problem or gitobj.COMMIT_ID.match(branch):
            raise InputError("--branch", [Problem("branch", problem or "looks like a commit id",
                                                  "give a branch name such as main")])
        files = read_folder(folder)
        if self.settings(repo_id) is None:
            self.init_repo(repo_id)
        with self._locked(repo_id):
            refs = self.refs(repo_id)
            parent = refs.branches.get(branch)
            entries = {}
            for path, data in files.items():
                entries[path] = entry = gitobj.file_entry(path, data)
                self._put_object(data, entry.sha256)
            cid = gitobj.commit_id(parent, entries, message)
            commit = self.commit(repo_id, cid) or Commit(
                id=cid, parent=parent, message=message, date=_now(), files=entries)
            _write_atomic(self._repo_dir(repo_id) / "commits" / f"{cid}.json",
                          _dump(COMMIT_SCHEMA, commit))
            moved = refs.model_copy(update={"branches": {**refs.branches, branch: cid}})
            _write_atomic(self._repo_dir(repo_id) / "refs.json", _dump(REFS_SCHEMA, moved))
        return commit

    def tag(self, repo_id: str, tag: str, revision: str) -> str:
        """Point tag at the commit revision names; return that commit's id."""
        _require_repo_id(repo_id)
        problem = names.revision_problem(tag)
        if problem:
            raise InputError("--tag", [Problem("tag", problem, "give a name such as v1")])
        with self._locked(repo_id):
            commit = self.resolve(repo_id, revision)
            if commit is None:
                raise InputError("--revision", [Problem("revision", f"{revision!r} names no commit "
                                                        f"of {repo_id}", "give a branch, tag or commit id")])
            refs = self.refs(repo_id)
            moved = refs.model_copy(update={"tags": {**refs.tags, tag: commit.id}})
            _write_atomic(self._repo_dir(repo_id) / "refs.json", _dump(REFS_SCHEMA, moved))
        return commit.id


def read_folder(folder: Path) -> dict[str, bytes]:
    """Every regular file under folder by its repo path; links and odd names are refused."""
    if not folder.is_dir():
        raise InputError("--from", [Problem("from", f"{folder} is not a folder", "give the checkpoint folder")])
    files: dict[str, bytes] = {}
    problems = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(folder).as_posix()
            why = names.file_path_problem(rel)
            if why or full.is_symlink() or not full.is_file():
                problems.append(Problem(rel, why or "not a regular file", "push regular files only"))
                continue
            files[rel] = full.read_bytes()
    if problems:
        raise InputError(str(folder), problems)
    return files


__all__ = ["FileEntry", "Store", "read_folder", "token_digest"]
