"""Names that point at a checkpoint: a Hugging Face repo id and a revision within it.

Kept for checkpoint staging (MODEL_REPO_ID and MODEL_REVISION, refused by the `.env` until a
download command on the engine hosts takes them: vocabulary.NOT_YET). Each gets the
grammar its owner enforces, narrowed to a safe charset, so `$(reboot)`, `;reboot`, backticks
and spaces are refused here rather than quoted later:

- a repo id is `owner/name`; each part starts with a letter or digit, continues with letters,
  digits, '.', '_' or '-', does not end with '.' or '-', is at most 96 characters, and holds
  no '..' or '--' (the Hugging Face Hub's own rules);
- a revision is a full 40-hex commit id, or a branch or tag name under `git check-ref-format`
  (no '..', no '//', no component starting with '.' or ending with '.lock', no leading '-'
  or '/', no trailing '/' or '.') written with letters, digits and '.', '_', '-', '/'.
"""

from __future__ import annotations

import re
from typing import Any

REPO_PART_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?")
REPO_PART_MAX = 96
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
REF_CHARS_RE = re.compile(r"[A-Za-z0-9._/-]+")
REF_MAX = 255

REPO_ID_FIX = ("write the Hugging Face repo id as owner/name, e.g. Qwen/Qwen2.5-0.5B-Instruct "
               "(letters, digits, '.', '_', '-'; at most 96 characters a part)")
REVISION_FIX = ("give a full 40-hex commit id, or a branch or tag name such as main or v1.0 "
                "(letters, digits, '.', '_', '-', '/')")


def hf_repo_id(value: Any) -> str:
    """Check one `owner/name`; ValueError names the first rule it breaks."""
    text = str(value)
    owner, sep, name = text.partition("/")
    if not sep or "/" in name:
        raise ValueError("is not owner/name")
    for part in (owner, name):
        if len(part) > REPO_PART_MAX:
            raise ValueError(f"has a part longer than {REPO_PART_MAX} characters")
        if not REPO_PART_RE.fullmatch(part):
            raise ValueError(f"has a part {part[:40]!r} that is not letters, digits, '.', '_' "
                             "and '-' (starting with a letter or digit, not ending in '.' or '-')")
        if ".." in part or "--" in part:
            raise ValueError(f"has '..' or '--' in {part[:40]!r}")
    return text


def git_revision(value: Any) -> str:
    """Check one commit id or ref name; ValueError names the first rule it breaks."""
    text = str(value)
    if COMMIT_RE.fullmatch(text):
        return text
    if len(text) > REF_MAX:
        raise ValueError(f"is longer than {REF_MAX} characters")
    if not REF_CHARS_RE.fullmatch(text):
        raise ValueError("has characters outside letters, digits, '.', '_', '-' and '/'")
    if text.startswith(("-", "/")) or text.endswith(("/", ".")):
        raise ValueError("starts with '-' or '/', or ends with '/' or '.'")
    if ".." in text or "//" in text:
        raise ValueError("contains '..' or '//'")
    for component in text.split("/"):
        if component.startswith(".") or component.endswith(".lock"):
            raise ValueError(f"has a component {component[:40]!r} starting with '.' or ending "
                             "with '.lock'")
    return text
