"""The workstation `.env` as read, with every secret value masked: the copy each attempt keeps.

Every assignment is written back as `NAME=value` from what the parser read, so the copy says
exactly what Narwhal ran from (one variable per line, on the line it was read from). A
secret-named variable (`is_secret_name`) keeps its name and gets the mask for its value; inside
an ENGINE_ENV JSON object each secret-named entry (`is_secret_env_name`: HF_TOKEN, *_API_KEY,
...) is masked and every other entry kept. Comments are dropped (each becomes a bare `#`, so
line numbers still match the original): a comment is free text that no name rule can judge,
and a commented-out old token is still a credential. A line the parser refused is withheld the
same way, since its value could not be judged either.
"""

from __future__ import annotations

import json

from narwhal.core.secret import MASK
from narwhal.deploy.inputs.envfile import BLANK, parse_env_text, split_lines
from narwhal.deploy.inputs.secretnames import is_secret_env_name, is_secret_name

ENGINE_ENV_SUFFIX = "ENGINE_ENV"  # NARWHAL_ENGINE_ENV and NARWHAL_NODE_<n>_ENGINE_ENV
WITHHELD = "#"


def quoted(value: str) -> str:
    """value written so the `.env` parser reads it back unchanged: bare when it can be,
    otherwise single-quoted (literal), or double-quoted when it holds a single quote."""
    if value and not any(c.isspace() or c in "'\"#\\" for c in value):
        return value
    if "'" not in value:
        return f"'{value}'"
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def masked_engine_env(text: str) -> str:
    """An ENGINE_ENV JSON object with each secret-named entry's value masked; text that is not
    an object of strings is masked whole (no part of it could be told apart from a token)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return MASK
    if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
        return MASK
    return json.dumps({name: MASK if is_secret_env_name(name) else value
                       for name, value in doc.items()}, separators=(",", ":"), ensure_ascii=False)


def masked_value(key: str, value: str) -> str:
    """The value of `.env` variable key as the masked copy holds it."""
    if is_secret_name(key):
        return MASK
    if key.endswith(ENGINE_ENV_SUFFIX):
        return masked_engine_env(value)
    return value


def masked_env(text: str) -> str:
    """The `.env` text with every secret value replaced by the mask and comments withheld."""
    entries, _problems = parse_env_text(text)
    by_line = {entry.line: entry for entry in entries}
    out: list[str] = []
    for number, line in enumerate(split_lines(text), start=1):
        entry = by_line.get(number)
        if entry is not None:
            out.append(f"{entry.key}={quoted(masked_value(entry.key, entry.value))}")
        elif line.strip(BLANK):
            out.append(WITHHELD)  # a comment, or a line the parser refused
        else:
            out.append("")
    return "".join(f"{line}\n" for line in out)
