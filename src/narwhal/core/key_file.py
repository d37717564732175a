"""Keys read from private files (the controller key both ends of the quorum lease read, the
engines' API key, a tenant's key as deploy places it): one private file, checked one way.

The router (`controller.quorum.key_file`) and every sidecar (`narwhal-attest serve
--lease-key-file`) read the same key from a file, never from argv (visible to every user in
`ps`) nor from the document. A file anyone but its owner can read would let any local user
take the fleet's controller lease, so a group- or world-accessible file is refused, as is an
empty or short one; each refusal names the file and the command that fixes it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from narwhal.core.errors import InputError, Problem
from narwhal.core.secret import Secret

MIN_KEY_CHARS = 16
MAX_KEY_BYTES = 4096


def read_key_file(path: Path, field: str) -> Secret:
    """The key in `path` (surrounding whitespace, such as a final newline, stripped).
    `field` names where the path came from, for the error (`--lease-key-file`)."""
    def refuse(problem: str, fix: str) -> InputError:
        return InputError(str(path), [Problem(field, problem, fix)])

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise refuse(f"the key file {path} cannot be opened ({exc.strerror})",
                     "write the key to it (e.g. `openssl rand -hex 24 > FILE; "
                     "chmod 600 FILE`)") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise refuse(f"the key file {path} is not a regular file",
                         "point it at a file holding the key")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise refuse(f"the key file {path} has mode {mode:04o}: others than its owner may "
                         "read it", f"run `chmod 600 {path}`")
        data = os.read(fd, MAX_KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_BYTES:
        raise refuse(f"the key file {path} is larger than {MAX_KEY_BYTES} bytes",
                     "write only the key to it")
    try:
        key = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise refuse(f"the key file {path} is not ASCII text",
                     "write a key of letters and digits, e.g. `openssl rand -hex 24`") from None
    if not key:
        raise refuse(f"the key file {path} is empty",
                     f"write the key to it: `openssl rand -hex 24 > {path}`")
    if len(key) < MIN_KEY_CHARS or any(not c.isprintable() or c.isspace() for c in key):
        raise refuse(f"the key in {path} is shorter than {MIN_KEY_CHARS} characters or holds "
                     "spaces or control characters",
                     f"write a long random key: `openssl rand -hex 24 > {path}`")
    return Secret(key, f"key file {path.name}")
