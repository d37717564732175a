"""SSH destinations: `[user@]host` or `ssh://[user@]host[:port]`, parsed once and checked.

The host follows hostnames' grammar; `machine` is the (canonical host, port) pair that decides
whether two destinations reach one physical host, however each was written.
"""

from __future__ import annotations

import re

from pydantic import ConfigDict

from narwhal.core.document_io import StrictModel
from narwhal.deploy.inputs.hostnames import canonical_host

USER_RE = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
PORT_RE = re.compile(r"(.*):([0-9]{1,5})")
SSH_PORT = 22
FORMS = "write user@host or ssh://user@host:port (no leading '-', no spaces)"


class Destination(StrictModel):
    """Where one physical host is reached: `host` as written (without brackets), checked."""

    model_config = ConfigDict(strict=False)  # built from parsed `.env` text, as before

    text: str
    user: str | None
    host: str
    port: int | None

    @property
    def target(self) -> str:
        """The `[user@]host` word OpenSSH takes (the port goes to -p)."""
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"{self.user}@{host}" if self.user else host

    @property
    def canonical_host(self) -> str:
        """Lower-case name, IPv4 as is, compressed IPv6: one spelling per host."""
        return canonical_host(self.host, bare_ipv6=True)

    @property
    def machine(self) -> tuple[str, int]:
        """(canonical host, SSH port): equal for every spelling of one sshd, whichever user
        logs in, so engines behind it share that machine's ports and GPUs."""
        return (self.canonical_host, self.port or SSH_PORT)

    @property
    def identity(self) -> tuple[str, str, int]:
        """(user, canonical host, SSH port): equal when two destinations are one login."""
        return (self.user or "", *self.machine)


def parse_destination(text: str) -> Destination:
    """Parse and check one destination; ValueError says what is wrong."""
    if not text:
        raise ValueError("is empty")
    if text.startswith("-"):
        raise ValueError("starts with '-' (ssh would read it as an option)")
    if any(c.isspace() for c in text):
        raise ValueError("contains whitespace")
    rest = text
    port: int | None = None
    if rest.startswith("ssh://"):
        rest = rest[len("ssh://") :]
        match = PORT_RE.fullmatch(rest)
        if match and (match[1].endswith("]") or ":" not in match[1]):
            rest, port = match[1], int(match[2])
            if not 1 <= port <= 65535:
                raise ValueError("has a port outside 1-65535")
    user: str | None = None
    if "@" in rest:
        user, _, rest = rest.rpartition("@")
        if not USER_RE.fullmatch(user):
            raise ValueError(f"has an invalid user name {user[:32]!r}")
    canonical_host(rest)
    host = rest[1:-1] if rest.startswith("[") and rest.endswith("]") else rest
    return Destination(text=text, user=user, host=host, port=port)
