"""Who may read what: the hub's answer for a repo, a presented token and the kind of request.

One table, checked whole at import: every combination of (repo state, token, request kind)
has exactly one row, so a case cannot be forgotten. As on the real hub, a gated repo's
metadata and file list are public and only its files need a granted token; a private repo
looks missing to anyone not granted.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
from enum import Enum
from typing import Literal

from narwhal.lab.hub.records import RepoSettings


class Repo(Enum):
    MISSING = "missing"
    PUBLIC = "public"
    GATED = "gated"
    PRIVATE = "private"


class Token(Enum):
    NONE = "none"
    NOT_GRANTED = "not-granted"
    GRANTED = "granted"


Want = Literal["metadata", "files"]


class Verdict(Enum):
    ALLOW = (200, "", "")
    REPO_NOT_FOUND = (401, "RepoNotFound", "Repository not found")
    REPO_NOT_FOUND_AUTHED = (404, "RepoNotFound", "Repository not found")
    GATED_LOG_IN = (401, "GatedRepo", "Access to this model is restricted. You must have access "
                                      "to it and be authenticated to access it. Please log in.")
    GATED_NOT_GRANTED = (403, "GatedRepo", "Access to this model is restricted and you are not "
                                           "in the authorized list.")

    @property
    def status(self) -> int:
        return self.value[0]

    @property
    def error_code(self) -> str:
        return self.value[1]

    @property
    def message(self) -> str:
        return self.value[2]


def _hidden(token: Token) -> Verdict:
    return Verdict.REPO_NOT_FOUND if token is Token.NONE else Verdict.REPO_NOT_FOUND_AUTHED


TABLE: dict[tuple[Repo, Token, str], Verdict] = {}
for _token, _want in itertools.product(Token, ("metadata", "files")):
    TABLE[(Repo.MISSING, _token, _want)] = _hidden(_token)
    TABLE[(Repo.PUBLIC, _token, _want)] = Verdict.ALLOW
    TABLE[(Repo.PRIVATE, _token, _want)] = (Verdict.ALLOW if _token is Token.GRANTED
                                           else _hidden(_token))
    TABLE[(Repo.GATED, _token, _want)] = (
        Verdict.ALLOW if _want == "metadata" or _token is Token.GRANTED
        else Verdict.GATED_LOG_IN if _token is Token.NONE else Verdict.GATED_NOT_GRANTED)
if len(TABLE) != len(Repo) * len(Token) * 2:  # pragma: no cover - a missing row stops the import
    raise RuntimeError("access table is incomplete")


def repo_state(settings: RepoSettings | None) -> Repo:
    if settings is None:
        return Repo.MISSING
    if settings.private:
        return Repo.PRIVATE
    return Repo.GATED if settings.gated else Repo.PUBLIC


def token_state(settings: RepoSettings | None, token: str | None) -> Token:
    """Whether the presented token is one granted on this repo (compared in constant time)."""
    if token is None:
        return Token.NONE
    presented = hashlib.sha256(token.encode()).hexdigest()
    granted = settings.token_sha256 if settings else []
    hits = [hmac.compare_digest(presented, g) for g in granted]  # every one, no early exit
    return Token.GRANTED if any(hits) else Token.NOT_GRANTED


def decide(settings: RepoSettings | None, token: str | None, want: Want) -> Verdict:
    return TABLE[(repo_state(settings), token_state(settings, token), want)]
