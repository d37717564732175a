"""The one `Range` form a resuming download sends, `bytes=N-`, and its closed cousins.

Pure. A header this module cannot read is ignored and the whole body is sent (RFC 9110 allows
it, and the client then starts its file over); a start beyond the end is 416.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SINGLE = re.compile(r"^bytes=(\d{0,19})-(\d{0,19})$")


@dataclass(frozen=True)
class Span:
    """Bytes start..end inclusive of a body of `size` bytes."""

    start: int
    end: int
    size: int
    partial: bool

    @property
    def length(self) -> int:
        return self.end - self.start + 1 if self.size else 0

    def content_range(self) -> str:
        return f"bytes {self.start}-{self.end}/{self.size}"


@dataclass(frozen=True)
class Unsatisfiable:
    size: int

    def content_range(self) -> str:
        return f"bytes */{self.size}"


def span(header: str | None, size: int) -> Span | Unsatisfiable:
    whole = Span(0, max(size - 1, 0), size, partial=False)
    match = _SINGLE.match(header.strip()) if header else None
    if match is None or match.groups() == ("", ""):
        return whole
    first, last = match.groups()
    if first == "":  # a suffix: the last N bytes
        count = int(last)
        if count == 0:
            return Unsatisfiable(size)
        return Span(max(size - count, 0), size - 1, size, partial=True) if size else whole
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or (last and int(last) < start):
        return Unsatisfiable(size)
    return Span(start, end, size, partial=True)
