"""A chat message's text as vLLM renders it for a string-content chat template.

The emulator renders chat prompts and the router tokenizes them for cache-aware placement; both
must read a message's `content` alike (a string, or the `text` parts of a content list), or
their token ids part.
"""

from __future__ import annotations


def message_text(content: object) -> str:
    """A message's text: a string, or the `text` parts of a content list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content
                       if isinstance(p, dict) and p.get("type", "text") == "text")
    return str(content)
