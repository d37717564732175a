"""The store's documents: a repo's settings, its refs, and each commit with its file tree.

Strict models, so a hand-edited store file that drifts from the format is refused by name
rather than half-read.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

REPO_SCHEMA = "narwhal.lab-hub-repo"
REFS_SCHEMA = "narwhal.lab-hub-refs"
COMMIT_SCHEMA = "narwhal.lab-hub-commit"
VERSION = 1

Hex40 = Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]
Hex64 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Gated = Literal[False, "auto", "manual"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class FileEntry(_Strict):
    """One file of a commit's tree; its bytes are the store object named by sha256."""

    sha256: Hex64
    size: Annotated[int, Field(ge=0)]
    lfs: bool
    blob_id: Hex40  # the git id the hub reports: of the content, or of the LFS pointer
    pointer_size: Annotated[int, Field(ge=0)] | None = None


class RepoSettings(_Strict):
    """Who may read a repo. Tokens are kept as their sha256 only: the store never holds one."""

    gated: Gated = False
    private: bool = False
    token_sha256: list[Hex64] = []
    created_at: str


class Refs(_Strict):
    branches: dict[str, Hex40] = {}
    tags: dict[str, Hex40] = {}


class Commit(_Strict):
    id: Hex40
    parent: Hex40 | None
    message: str
    date: str
    files: dict[str, FileEntry]
