"""The slice of Go's text/template that `docker --format` users write: `{{.A.B}}`, `{{json .X}}`,
`{{.}}`, `{{index .A "k"}}`, literal text, and Go's printing of bools, nil, lists and maps."""

from __future__ import annotations

import json
import re
from typing import Any

ACTION = re.compile(r"{{\s*(.*?)\s*}}")


class TemplateError(Exception):
    pass


def _go_json(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _go_str(value: Any) -> str:
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + " ".join(_go_str(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_go_str(v)}" for k, v in sorted(value.items())) + "]"
    return str(value)


def _path(obj: Any, expr: str) -> Any:
    if expr == ".":
        return obj
    if not expr.startswith("."):
        raise TemplateError(f'function "{expr}" not defined')
    for part in expr[1:].split("."):
        if not isinstance(obj, dict) or part not in obj:
            raise TemplateError(f"can't evaluate field {part}")
        obj = obj[part]
    return obj


def _action(obj: Any, action: str) -> str:
    words = action.split()
    if words[0] == "json" and len(words) == 2:
        return _go_json(_path(obj, words[1]))
    if words[0] == "index" and len(words) == 3:
        return _go_str(_path(obj, words[1]).get(words[2].strip('"')))
    if len(words) == 1:
        return _go_str(_path(obj, words[0]))
    raise TemplateError(f"unsupported template action {action!r}")


def render(template: str, obj: Any) -> str:
    return ACTION.sub(lambda m: _action(obj, m.group(1)), template.replace("\\t", "\t"))
