"""A model card's metadata as the hub reports it: README.md's YAML front matter, plus the
fields the hub derives from it (pipeline tag, library, tags).

Pure: text in, plain data out. A card the hub could not parse gives no cardData, as there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml  # type: ignore[import-untyped]  # PyYAML ships no stubs; huggingface_hub needs it

FENCE = "---"


def front_matter(text: str) -> dict[str, Any] | None:
    """The YAML mapping between a README's opening `---` and the next `---`, or None."""
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != FENCE:
        return None
    try:
        end = next(i for i, line in enumerate(lines[1:], start=1) if line.strip() == FENCE)
    except StopIteration:
        return None
    try:
        data = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) else None


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def library_name(card: dict[str, Any] | None, paths: Iterable[str]) -> str | None:
    """The card's library_name, else `transformers` for a repo with a config.json (as the
    hub infers it for a checkpoint folder)."""
    if card is not None and isinstance(card.get("library_name"), str):
        return str(card["library_name"])
    return "transformers" if "config.json" in set(paths) else None


def pipeline_tag(card: dict[str, Any] | None) -> str | None:
    value = card.get("pipeline_tag") if card is not None else None
    return value if isinstance(value, str) else None


def tags(card: dict[str, Any] | None, paths: Iterable[str]) -> list[str]:
    """The repo's tags: the card's own, then what the hub adds (library, weight format,
    pipeline, license, base model), each once, in that order."""
    names = list(paths)
    found = _strings(card.get("tags")) if card is not None else []
    library = library_name(card, names)
    found += [library] if library else []
    found += ["safetensors"] if any(p.endswith(".safetensors") for p in names) else []
    pipeline = pipeline_tag(card)
    found += [pipeline] if pipeline else []
    if card is not None:
        found += [f"license:{x}" for x in _strings(card.get("license"))]
        found += [f"base_model:{x}" for x in _strings(card.get("base_model"))]
    return list(dict.fromkeys(found))
