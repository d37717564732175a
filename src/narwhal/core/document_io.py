"""How every role reads a JSON document a user or a tool wrote: one reader, one error translator.

`read_json_document` turns a file into parsed JSON (or an InputError naming the file and, for
bad syntax, the line and column); `validate_document` checks the parsed value against a strict
model of one schema version; `problems_from` turns every pydantic error into a Problem naming
the dotted field (`engines[0].url`), what is wrong and the way out. An unknown key lists the
keys allowed where it stands, so a typo is fixed at once instead of silently keeping a default.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from narwhal.core.errors import InputError, Problem

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Every document Narwhal reads: unknown keys, wrong types, NaN and Infinity refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    @classmethod
    def unknown_key_fix(cls, key: str) -> str | None:
        """The way out for an unknown `key` in this model, when it is better than listing the
        allowed keys (a model whose misspelt keys have a known, worse meaning says so here)."""
        return None


_FIXES: dict[str, str] = {
    "missing": "add it",
    "literal_error": "use one of the listed values",
    "float_type": "write a number, e.g. 2.5",
    "int_type": "write a whole number without quotes or decimals",
    "string_type": "write a JSON string",
    "bool_type": "write true or false",
    "finite_number": "write a finite number (NaN and Infinity pass every range check, so they are refused)",
    "greater_than": "raise the value",
    "greater_than_equal": "raise the value",
    "less_than_equal": "lower the value",
    "too_short": "add at least one entry",
    "too_long": "shorten it",
    "string_too_short": "write a non-empty value",
    "string_too_long": "shorten it",
    "model_type": "write a JSON object",
    "tuple_type": "write a JSON array",
}


def _model_at(loc: tuple[str | int, ...], root: type[BaseModel]) -> type[BaseModel] | None:
    """The model class that owns the field at loc[:-1], to list the keys allowed there."""
    model: type[BaseModel] = root
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) or next(
            (f for f in model.model_fields.values() if f.alias == part), None
        )
        if field is None:
            return None
        inner = field.annotation
        args = getattr(inner, "__args__", ())
        candidates = [inner, *args]
        found = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if found is None:
            return None
        model = found
    return model


def _allowed_keys(model: type[BaseModel]) -> str:
    return ", ".join(f.alias or name for name, f in model.model_fields.items())


def _dotted(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def _message(kind: str, msg: str) -> str:
    """pydantic's sentence as a clause after the field; our own validators' text as written."""
    if kind == "value_error":
        return msg.removeprefix("Value error, ")
    return msg[:1].lower() + msg[1:]


def problems_from(exc: ValidationError, root: type[BaseModel], *, reference: str,
                  at: tuple[str | int, ...] = ()) -> list[Problem]:
    """Every pydantic error of a `root` document as a Problem naming the dotted field and a fix.

    `reference` names the page that describes the fields (the fix when no better one is
    known); `at` is where `root` sits inside a larger document (`("launch",)`)."""
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = _dotted(at + loc)
        kind = err["type"]
        if kind == "extra_forbidden":
            owner = _model_at(loc, root)
            allowed = _allowed_keys(owner) if owner else f"see {reference}"
            fix = f"remove or rename it; allowed keys here: {allowed}"
            if owner is not None and issubclass(owner, StrictModel) and loc:
                fix = owner.unknown_key_fix(str(loc[-1])) or fix
            problems.append(Problem(
                where, "unknown key (a misspelt key would otherwise silently keep its default)",
                fix))
            continue
        fix = _FIXES.get(kind, f"see {reference} for the field's meaning")
        problems.append(Problem(where, _message(kind, err["msg"]), fix))
    return problems


def validate_document(raw: Any, source: str, model: type[M], schema: str, version: int,
                      fix_object: str, fix_version: str, *, reference: str) -> M:
    """A parsed JSON value as `model`: an object of this schema version, every problem named.

    Validated in JSON mode (from its own JSON text) so strict rules apply as to a file read.
    """
    if not isinstance(raw, dict):
        raise InputError(source, [Problem("(document)", "is not a JSON object", fix_object)])
    if raw.get("schema") == schema and raw.get("schema_version") != version:
        raise InputError(source, [Problem(
            "schema_version", f"version {raw.get('schema_version')!r} is not readable by this build",
            fix_version)])
    try:
        return model.model_validate_json(json.dumps(raw))
    except ValidationError as exc:
        raise InputError(source, problems_from(exc, model, reference=reference)) from None


def read_document_bytes(path: Path, unreadable_fix: str, *, max_bytes: int | None = None
                        ) -> bytes:
    """A document file's bytes. `max_bytes` bounds one that arrives from elsewhere (a host's
    capture): a larger file is refused after reading max_bytes + 1, never read whole."""
    try:
        with path.open("rb") as f:
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(str(path), [Problem("(file)", f"cannot be read ({exc.strerror})",
                                             unreadable_fix)]) from None
    if max_bytes is not None and len(data) > max_bytes:
        raise InputError(str(path), [Problem("(file)", f"is larger than {max_bytes} bytes",
                                             unreadable_fix)])
    return data


def parse_json_bytes(data: bytes, source: str) -> Any:
    """Parsed JSON, or an InputError naming `source` and, for bad syntax, line and column."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(source, [Problem("(file)", f"is not UTF-8 text (byte {exc.start})",
                                          "write the document as UTF-8 JSON")]) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(source, [Problem(f"line {exc.lineno} column {exc.colno}",
                                          f"not JSON ({exc.msg})", "fix the JSON syntax")]) from None


def read_json_document(path: Path, unreadable_fix: str, *, max_bytes: int | None = None) -> Any:
    """The parsed JSON of a document a user or a tool wrote; InputError naming the file and,
    for bad syntax, the line and column. Schema checks are the caller's (validate_document)."""
    return parse_json_bytes(read_document_bytes(path, unreadable_fix, max_bytes=max_bytes),
                            str(path))
