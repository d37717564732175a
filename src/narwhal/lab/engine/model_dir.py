"""What the emulator reads from a model directory: config.json and the tokenizer's special tokens.

Only files, never the hub. config.json feeds core/kv (geometry) and the context length;
tokenizer_config.json / generation_config.json, when present, name the BOS/EOS strings and ids
so `/tokenize` counts and EOS stops line up with the real tokenizer's conventions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.core.kv.arch import text_config
from narwhal.lab.engine.config import StartupError

# vLLM's _get_and_verify_max_len: the smallest of these keys that the config sets.
_MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                 "model_max_length", "max_sequence_length", "max_seq_length", "seq_len")
DEFAULT_MAX_LEN = 2048


@dataclass(frozen=True)
class SpecialTokens:
    """BOS/EOS/PAD ids (within the vocabulary) and their text forms."""

    bos_id: int | None
    eos_ids: tuple[int, ...]
    pad_id: int | None
    bos_text: str
    eos_text: str
    pad_text: str
    add_bos: bool


@dataclass(frozen=True)
class ModelDir:
    """The parsed model directory."""

    path: Path
    config: dict[str, Any]
    vocab_size: int
    derived_max_len: int
    derived_from: str
    special: SpecialTokens


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise StartupError(f"{path}: missing")
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StartupError(f"{path}: cannot be read as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise StartupError(f"{path}: must hold a JSON object")
    return data


def _ids(value: Any) -> tuple[int, ...]:
    if isinstance(value, bool):
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool))
    return ()


def _token_text(value: Any, default: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return default


def load_model_dir(path: Path) -> ModelDir:
    """Read config.json (required) and the optional tokenizer/generation configs."""
    config = _read_json(path / "config.json", required=True)
    cfg = text_config(config)
    vocab = cfg.get("vocab_size")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab <= 0:
        raise StartupError(f"{path / 'config.json'}: vocab_size must be a positive integer, "
                           f"got {vocab!r}")
    tok = _read_json(path / "tokenizer_config.json", required=False)
    gen = _read_json(path / "generation_config.json", required=False)
    bos = _ids(gen.get("bos_token_id", cfg.get("bos_token_id")))
    eos = _ids(gen.get("eos_token_id", cfg.get("eos_token_id")))
    pad = _ids(cfg.get("pad_token_id"))
    special = SpecialTokens(
        bos_id=bos[0] if bos and bos[0] < vocab else None,
        eos_ids=tuple(e for e in eos if e < vocab),
        pad_id=pad[0] if pad and pad[0] < vocab else None,
        bos_text=_token_text(tok.get("bos_token"), "<s>"),
        eos_text=_token_text(tok.get("eos_token"), "</s>"),
        pad_text=_token_text(tok.get("pad_token"), "<pad>"),
        add_bos=bool(tok.get("add_bos_token", True)) and bool(bos),
    )
    max_len, source = _derived_max_len(cfg)
    return ModelDir(path=path, config=config, vocab_size=vocab, derived_max_len=max_len,
                    derived_from=source, special=special)


def _derived_max_len(cfg: Mapping[str, Any]) -> tuple[int, str]:
    found = [(int(cfg[k]), k) for k in _MAX_LEN_KEYS
             if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool) and cfg[k] > 0]
    if not found:
        return DEFAULT_MAX_LEN, "default"
    value, key = min(found)
    return value, f"{key}={value}"


def resolve_max_model_len(model: ModelDir, requested: int | None, allow_long: bool) -> int:
    """--max-model-len, refused above the config's limit unless VLLM_ALLOW_LONG_MAX_MODEL_LEN."""
    if requested is None:
        return model.derived_max_len
    if requested > model.derived_max_len and not allow_long:
        raise StartupError(
            f"argument --max-model-len: User-specified max_model_len ({requested}) is greater "
            f"than the derived max_model_len ({model.derived_from} in model's config.json). "
            "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    return requested
