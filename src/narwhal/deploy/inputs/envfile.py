"""A strict reader for the `.env` dialect: KEY=VALUE lines, no shell.

The file is never sourced by a shell: no expansion, no command substitution. Values may be bare,
'single-quoted' (literal) or "double-quoted" (with \\" and \\\\ escapes only). Problems never
quote the value of a secret variable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from narwhal.core.errors import Problem

KEY_RE = re.compile(r"[A-Z][A-Z0-9_]*")


@dataclass(frozen=True)
class EnvEntry:
    key: str
    value: str
    line: int


def is_secret_name(key: str) -> bool:
    """Variables whose values are credentials: never printed, logged or written."""
    return key.endswith(("_PASSWORD", "_TOKEN", "_API_KEY")) or key in {"NARWHAL_ENGINE_KEY"}


def _unquote(raw: str, key: str, lineno: int, problems: list[Problem]) -> str | None:
    where = f"{key} (line {lineno})"
    if raw[:1] == "'":
        end = raw.find("'", 1)
        if end < 0:
            problems.append(Problem(where, "unterminated single quote", "close the quote"))
            return None
        rest = raw[end + 1 :].strip()
        if rest and not rest.startswith("#"):
            problems.append(Problem(where, "text after the closing quote", "quote the whole value"))
            return None
        return raw[1:end]
    if raw[:1] == '"':
        out: list[str] = []
        i = 1
        while i < len(raw):
            ch = raw[i]
            if ch == "\\" and i + 1 < len(raw) and raw[i + 1] in '"\\':
                out.append(raw[i + 1])
                i += 2
                continue
            if ch == '"':
                rest = raw[i + 1 :].strip()
                if rest and not rest.startswith("#"):
                    problems.append(
                        Problem(where, "text after the closing quote", "quote the whole value")
                    )
                    return None
                return "".join(out)
            out.append(ch)
            i += 1
        problems.append(Problem(where, "unterminated double quote", "close the quote"))
        return None
    value = raw
    if " #" in value:
        value = value.split(" #", 1)[0]
    value = value.rstrip()
    if any(c.isspace() for c in value):
        problems.append(
            Problem(where, "unquoted value contains whitespace",
                    "remove the whitespace or quote the value if it is meant")
        )
        return None
    return value


def parse_env_text(text: str) -> tuple[list[EnvEntry], list[Problem]]:
    """Parse .env text into entries; every malformed line becomes a Problem."""
    entries: list[EnvEntry] = []
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("export "):
            stripped = stripped[len("export ") :].lstrip()
        key, sep, raw = stripped.partition("=")
        key = key.rstrip()
        if not sep:
            problems.append(
                Problem(f"line {lineno}", "not a KEY=VALUE line", "write NAME=value or delete it")
            )
            continue
        if not KEY_RE.fullmatch(key):
            problems.append(
                Problem(f"line {lineno}", f"invalid variable name {key[:40]!r}",
                        "use upper-case letters, digits and underscores")
            )
            continue
        if raw[:1].isspace():
            problems.append(
                Problem(f"{key} (line {lineno})", "space after '='",
                        "write NAME=value with no space around '='")
            )
            continue
        value = _unquote(raw, key, lineno, problems)
        if value is None:
            continue
        if "\x00" in value or any(ord(c) < 32 for c in value):
            problems.append(Problem(key, "contains control characters", "remove them"))
            continue
        if key in seen:
            problems.append(
                Problem(key, f"set twice (lines {seen[key]} and {lineno})", "keep one assignment")
            )
            continue
        seen[key] = lineno
        entries.append(EnvEntry(key, value, lineno))
    return entries, problems
