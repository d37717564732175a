"""A strict reader for the `.env` dialect: KEY=VALUE lines, no shell.

The file is never sourced by a shell: no expansion, no command substitution. Values may be bare,
'single-quoted' (literal) or "double-quoted" (with \\" and \\\\ escapes only). Problems never
quote the value of a secret variable.

Lines end at "\\n" (or "\\r\\n") and nowhere else: str.splitlines would also split at a form
feed or U+2028 inside a value, so `MODEL_NAME=x<FF>NARWHAL_NODE_3_SSH=...` would declare an
engine nobody sees in an editor. Such characters, and every other control, are refused instead
(see charset). One UTF-8 byte-order mark is accepted as the very first character, as editors on
some systems write it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from narwhal.core.errors import Problem
from narwhal.deploy.inputs.charset import code_point, forbidden_in
from narwhal.deploy.inputs.secretnames import is_secret_name

__all__ = ["BOM", "EnvEntry", "is_secret_name", "parse_env_text", "split_lines"]

KEY_RE = re.compile(r"[A-Z][A-Z0-9_]{0,99}")
KEY_CHARS_RE = re.compile(r"[A-Za-z0-9_]+")
BOM = "\ufeff"
BLANK = " \t"
COMMENT_RE = re.compile(r"[ \t]#")


@dataclass(frozen=True)
class EnvEntry:
    key: str
    value: str
    line: int


def split_lines(text: str) -> list[str]:
    """The lines of text, split on "\\n" only, a "\\r" before it dropped, a leading BOM removed."""
    if text.startswith(BOM):
        text = text[len(BOM):]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _key_of(line: str) -> str | None:
    """The variable a line assigns, when it has a well-formed one (for naming problems)."""
    stripped = line.strip(BLANK)
    if stripped.startswith("export "):
        stripped = stripped[len("export "):].lstrip(BLANK)
    key, sep, _ = stripped.partition("=")
    key = key.rstrip(BLANK)
    return key if sep and KEY_RE.fullmatch(key) else None


def _forbidden_line(line: str, lineno: int) -> Problem | None:
    bad = forbidden_in(line, allow_tab=True)
    if not bad:
        return None
    key = _key_of(line)
    where = f"{key} (line {lineno})" if key else f"line {lineno}"
    what = ", ".join(bad)
    fix = "remove it: lines end only at a newline, and values hold no control characters"
    if code_point(BOM) in bad:
        fix += " (a byte-order mark is accepted only as the first character of the file)"
    return Problem(where, f"contains a control or line-separator character {what}", fix)


def _bad_key(key: str, lineno: int) -> Problem:
    if not key:
        shown = " (nothing before '=')"
    elif KEY_CHARS_RE.fullmatch(key) and len(key) > 100:
        shown = f" {key[:40]!r}... (longer than 100 characters)"
    elif KEY_CHARS_RE.fullmatch(key):
        shown = f" {key[:40]!r}"
    else:
        # Not a name: it may be a value (or a password) typed without its '='; show no text.
        at = next(i for i, c in enumerate(key) if not KEY_CHARS_RE.fullmatch(c))
        shown = f" (character {code_point(key[at])} at position {at + 1} of the name)"
    return Problem(f"line {lineno}", f"invalid variable name{shown}",
                   "use upper-case letters, digits and underscores")


def _unquote(raw: str, key: str, lineno: int, problems: list[Problem]) -> str | None:
    where = f"{key} (line {lineno})"
    if raw[:1] == "'":
        end = raw.find("'", 1)
        if end < 0:
            problems.append(Problem(where, "unterminated single quote", "close the quote"))
            return None
        rest = raw[end + 1 :].strip(BLANK)
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
                rest = raw[i + 1 :].strip(BLANK)
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
    value = COMMENT_RE.split(raw, maxsplit=1)[0].rstrip(BLANK)
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
    for lineno, line in enumerate(split_lines(text), start=1):
        forbidden = _forbidden_line(line, lineno)
        if forbidden is not None:
            problems.append(forbidden)
            continue
        stripped = line.strip(BLANK)
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("export "):
            stripped = stripped[len("export ") :].lstrip(BLANK)
        key, sep, raw = stripped.partition("=")
        key = key.rstrip(BLANK)
        if not sep:
            problems.append(
                Problem(f"line {lineno}", "not a KEY=VALUE line", "write NAME=value or delete it")
            )
            continue
        if not KEY_RE.fullmatch(key):
            problems.append(_bad_key(key, lineno))
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
        bad = forbidden_in(value)
        if bad:
            problems.append(Problem(f"{key} (line {lineno})",
                                    f"contains a control character {', '.join(bad)}",
                                    "remove it"))
            continue
        if key in seen:
            problems.append(
                Problem(key, f"set twice (lines {seen[key]} and {lineno})", "keep one assignment")
            )
            continue
        seen[key] = lineno
        entries.append(EnvEntry(key, value, lineno))
    return entries, problems
