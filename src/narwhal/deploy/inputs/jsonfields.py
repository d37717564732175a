"""The JSON-valued fields: ENGINE_ARGS, ENGINE_ENV and TRANSFER_DEVICES.

Their elements end up on an engine host's command line and in its environment. The product
quotes argv once, but an element that carries shell structure (`;`, `|`, `&`, `$`, a backtick,
`<`, `>`, a newline or any other control) is an operator's paste gone wrong, so it is refused
here, naming the element and the character. JSON punctuation stays legal: vLLM's
`--kv-transfer-config '{"kv_connector":"NixlConnector",...}'` is one ordinary element.

Credentials do not belong in these fields (use NARWHAL_ENGINE_KEY and NARWHAL_HF_TOKEN): a
secret-looking flag in ENGINE_ARGS (--api-key, --hf-token) is refused, and a secret-named
ENGINE_ENV value is wrapped in `Secret` by the loader. Messages never print such values.
"""

from __future__ import annotations

import json
import re
from typing import Any

from narwhal.deploy.inputs.charset import unsafe_in_argv
from narwhal.deploy.inputs.secretnames import SECRET_WORDS, is_secret_env_name

ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEVICE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
MAX_REPORTED = 3


class _Twice(ValueError):
    """A JSON object names one key twice."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object that names a key twice is refused: json.loads would keep the last."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Twice(f"names {key[:40]!r} twice")
        out[key] = value
    return out


def _load(value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError("must be text")
    try:
        return json.loads(value, object_pairs_hook=_pairs)
    except json.JSONDecodeError as exc:
        raise ValueError(f"is not JSON ({exc.msg} at character {exc.pos + 1})") from None
    except _Twice:
        raise
    except ValueError:  # a number beyond int()'s digit limit
        raise ValueError("is not JSON Narwhal accepts (a number too long)") from None
    except RecursionError:
        raise ValueError("is not JSON (nested too deeply)") from None


def _string_array(value: Any) -> list[str]:
    parsed = _load(value)
    if not isinstance(parsed, list) or not all(isinstance(v, str) for v in parsed):
        raise ValueError("is not a JSON array of strings")
    return parsed


def _raise(found: list[str]) -> None:
    if found:
        more = f" (and {len(found) - MAX_REPORTED} more)" if len(found) > MAX_REPORTED else ""
        raise ValueError(", ".join(found[:MAX_REPORTED]) + more)


def _secret_flag(item: str) -> bool:
    """`--api-key`, `--hf-token=...`: a flag whose name has a credential word."""
    if not item.startswith("-"):
        return False
    name = item.lstrip("-").split("=", 1)[0]
    return bool(set(name.upper().replace("_", "-").split("-")) & SECRET_WORDS)


def engine_args(value: Any) -> tuple[str, ...]:
    """Extra vLLM arguments: a JSON array of strings without shell structure or secrets."""
    items = _string_array(value)
    flags = [i for i, item in enumerate(items) if _secret_flag(item)]
    if flags:
        # Shown by position and flag name only: the element after it is the credential.
        _raise([f"element {i} ({items[i].split('=', 1)[0][:40]!r}) would put a credential "
                "on the command line and in the record (use NARWHAL_ENGINE_KEY or "
                "NARWHAL_HF_TOKEN)" for i in flags])
    _raise([f"element {i} {item[:40]!r} contains {' '.join(bad)}"
            for i, item in enumerate(items) if (bad := unsafe_in_argv(item))])
    return tuple(items)


def engine_env(value: Any) -> dict[str, str]:
    """Extra engine environment: a JSON object of string values without shell structure."""
    parsed = _load(value)
    if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
        raise ValueError("is not a JSON object of string values")
    found: list[str] = []
    for name, text in parsed.items():
        if not ENV_NAME_RE.fullmatch(name):
            found.append(f"has an invalid variable name {name[:40]!r}")
            continue
        bad = unsafe_in_argv(text)
        if bad and is_secret_env_name(name):
            found.append(f"the value of {name} contains a shell or control character (not "
                         "shown: the name marks it secret)")
        elif bad:
            found.append(f"the value of {name} {text[:40]!r} contains {' '.join(bad)}")
    _raise(found)
    return dict(parsed)


def device_list(value: Any) -> tuple[str, ...]:
    """Transfer devices as UCX and ibv_devices name them, e.g. ["mlx5_0", "mlx5_1:1"]."""
    items = _string_array(value)
    found: list[str] = []
    for i, item in enumerate(items):
        if bad := unsafe_in_argv(item):
            found.append(f"element {i} {item[:40]!r} contains {' '.join(bad)}")
        elif not DEVICE_RE.fullmatch(item):
            found.append(f"element {i} {item[:40]!r} is not a device name (letters, digits, "
                         "'_', '.', ':', '-')")
    _raise(found)
    return tuple(items)
