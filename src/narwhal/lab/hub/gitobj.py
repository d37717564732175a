"""What git and git-LFS would record for a file, computed without git: the ids the real hub
reports (blob ids, LFS pointers) must be the ones the client checks its downloads against.

Pure functions over bytes and names; no file system.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Mapping

from narwhal.core.documents import canonical_json
from narwhal.lab.hub.records import FileEntry

# What a fresh hub repo's .gitattributes sends to LFS (a subset of the hub's default list).
LFS_PATTERNS = (
    "*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", "*.h5", "*.msgpack",
    "*.onnx", "*.npy", "*.npz", "*.pkl", "*.pickle", "*.model", "*.arrow", "*.parquet",
    "*.tar", "*.tgz", "*.zip", "*.gz", "*.zst", "*.xz",
)
# The real hub refuses a plain git file above 10 MB: anything larger is LFS whatever its name.
LFS_ABOVE_BYTES = 10 * 1000 * 1000
LFS_POINTER_VERSION = "https://git-lfs.github.com/spec/v1"
COMMIT_ID = re.compile(r"^[0-9a-f]{40}$")


def git_blob_id(data: bytes) -> str:
    """The git object id of a blob holding data (what `git hash-object` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The pointer file git stores in place of an LFS file's content."""
    return f"version {LFS_POINTER_VERSION}\noid sha256:{sha256}\nsize {size}\n".encode()


def is_lfs(path: str, size: int) -> bool:
    """Whether the hub would keep this file in LFS: by its name's pattern, or by its size."""
    name = path.rsplit("/", 1)[-1]
    return size > LFS_ABOVE_BYTES or any(fnmatch.fnmatchcase(name, p) for p in LFS_PATTERNS)


def file_entry(path: str, data: bytes) -> FileEntry:
    """The tree entry of one file: content hash, size, and the git id the hub reports for it
    (for an LFS file, the id of its pointer, as on the real hub)."""
    sha256 = hashlib.sha256(data).hexdigest()
    if is_lfs(path, len(data)):
        pointer = lfs_pointer(sha256, len(data))
        return FileEntry(sha256=sha256, size=len(data), lfs=True, blob_id=git_blob_id(pointer),
                         pointer_size=len(pointer))
    return FileEntry(sha256=sha256, size=len(data), lfs=False, blob_id=git_blob_id(data))


def commit_id(parent: str | None, files: Mapping[str, FileEntry], message: str) -> str:
    """A commit's 40-hex id from its parent, tree and message (not its date), so the same
    push onto the same parent gives the same id in every lab."""
    tree = {path: [e.blob_id, e.sha256] for path, e in files.items()}
    body = canonical_json({"parent": parent, "tree": tree, "message": message})
    return hashlib.sha1(body.encode(), usedforsecurity=False).hexdigest()
