"""Which characters an input may hold, and how to name the ones it may not.

A `.env` is split into lines on "\\n" alone. Every other character that some reader treats as a
line break (str.splitlines also splits on \\v \\f \\r \\x1c-\\x1e \\x85 U+2028 U+2029), every
other C0 or C1 control, DEL, and the invisible format characters (byte-order marks, bidi
overrides, zero-width spaces) is refused: text that reads as one line to a person and as two to
some parser is how an extra engine gets smuggled into a fleet. Problems name such a character by
its code point, since printing it would reproduce the confusion.
"""

from __future__ import annotations

import unicodedata

# Control (Cc: C0, DEL, C1), format (Cf), line and paragraph separators, lone surrogates.
FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
# Characters that give a shell command structure: a list, a pipe, a substitution, a redirection.
# Values that end up in a remote argv are quoted once anyway; these catch pasted shell.
ARGV_SHELL = frozenset(";|&$`<>")
MAX_NAMED = 3


def code_point(ch: str) -> str:
    """`U+2028`: how a problem names a character it must not print."""
    return f"U+{ord(ch):04X}"


def is_forbidden(ch: str, *, allow_tab: bool = False) -> bool:
    """A control, format or separator character; a tab only where allow_tab is False."""
    if ch == "\t":
        return not allow_tab
    return unicodedata.category(ch) in FORBIDDEN_CATEGORIES


def forbidden_in(text: str, *, allow_tab: bool = False) -> list[str]:
    """The distinct forbidden characters of text as code points, in order, at most three."""
    found: list[str] = []
    for ch in text:
        if is_forbidden(ch, allow_tab=allow_tab) and code_point(ch) not in found:
            found.append(code_point(ch))
            if len(found) == MAX_NAMED:
                break
    return found


def unsafe_in_argv(text: str) -> list[str]:
    """Shell structure or control characters in one argv word or environment value, named
    printably (shell characters quoted, controls by code point), at most three."""
    found: list[str] = []
    for ch in text:
        if ch in ARGV_SHELL:
            name = repr(ch)
        elif is_forbidden(ch):
            name = code_point(ch)
        else:
            continue
        if name not in found:
            found.append(name)
            if len(found) == MAX_NAMED:
                break
    return found
