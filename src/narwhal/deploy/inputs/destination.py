"""SSH destinations: `[user@]host` or `ssh://[user@]host[:port]`, parsed once and checked."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

USER_RE = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
HOST_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?")
IPV6_RE = re.compile(r"\[[0-9A-Fa-f:.]+\]")


class Destination(BaseModel):
    """Where one physical host is reached; the same text means the same physical host."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str
    user: str | None
    host: str
    port: int | None

    @property
    def target(self) -> str:
        """The `[user@]host` word OpenSSH takes (the port goes to -p)."""
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"{self.user}@{host}" if self.user else host


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
        match = re.fullmatch(r"(.*?)(?::([0-9]{1,5}))?", rest)
        if match and match[2] is not None and not rest.endswith("]"):
            rest, port = match[1], int(match[2])
            if not 1 <= port <= 65535:
                raise ValueError("has a port outside 1-65535")
    user: str | None = None
    if "@" in rest:
        user, _, rest = rest.rpartition("@")
        if not USER_RE.fullmatch(user):
            raise ValueError(f"has an invalid user name {user[:32]!r}")
    if IPV6_RE.fullmatch(rest):
        host = rest[1:-1]
    elif HOST_RE.fullmatch(rest):
        host = rest
    else:
        raise ValueError(f"has an invalid host {rest[:64]!r}")
    return Destination(text=text, user=user, host=host, port=port)
