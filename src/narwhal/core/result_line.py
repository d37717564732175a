"""The one machine-readable result line that fleet-side commands print.

A fleet-side command (narwhal-engine, narwhal-check, ...) prints exactly one line

    NARWHAL_RESULT {"schema":"narwhal.result","schema_version":1,"command":...,"ok":...,"data":{...}}

on stdout, last. The workstation finds it with `parse`, never by scraping human text.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, ValidationError

from narwhal.core.document_io import StrictModel
from narwhal.core.documents import canonical_json
from narwhal.core.errors import ContractError

MARKER = "NARWHAL_RESULT "
SCHEMA = "narwhal.result"
VERSION = 1


class ResultLine(StrictModel):
    """What a fleet-side command reports back to the workstation."""

    schema_: str = SCHEMA
    schema_version: int = VERSION
    command: str
    ok: bool
    data: dict[str, Any] = Field(default_factory=dict)
    error: str = ""

    def render(self) -> str:
        body = {
            "schema": self.schema_,
            "schema_version": self.schema_version,
            "command": self.command,
            "ok": self.ok,
            "data": self.data,
            "error": self.error,
        }
        return MARKER + canonical_json(body)


def render(command: str, ok: bool, data: dict[str, Any] | None = None, error: str = "") -> str:
    return ResultLine(command=command, ok=ok, data=data or {}, error=error).render()


def parse(stdout: str, command: str) -> ResultLine:
    """Find the single result line in stdout; more than one, none or a bad one is an error."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith(MARKER)]
    if len(lines) != 1:
        raise ContractError(
            f"{command}: expected exactly one {MARKER.strip()} line, found {len(lines)}; "
            "the remote command may be from another Narwhal revision or crashed before reporting"
        )
    try:
        raw = json.loads(lines[0][len(MARKER) :])
    except json.JSONDecodeError as exc:
        raise ContractError(f"{command}: result line is not JSON ({exc.msg})") from exc
    if not isinstance(raw, dict):
        raise ContractError(f"{command}: result line is not an object")
    if (raw.get("schema"), raw.get("schema_version")) != (SCHEMA, VERSION):
        raise ContractError(
            f"{command}: result line is {raw.get('schema')!r} v{raw.get('schema_version')!r}, "
            f"expected {SCHEMA} v{VERSION}; install the same revision on every host"
        )
    raw["schema_"] = raw.pop("schema")
    try:
        result = ResultLine.model_validate(raw)
    except ValidationError as exc:
        raise ContractError(f"{command}: malformed result line: {exc.errors()[0]['msg']}") from exc
    if result.command != command:
        raise ContractError(f"result line is from {result.command!r}, expected {command!r}")
    return result
