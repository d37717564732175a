"""A prompt's token ids in the router process, from the model's own tokenizer files.

Cache-aware placement keys a prompt's blocks by its token ids, so the router must see the ids
the engine will see: the model's tokenizer.json through the `tokenizers` library and, for chat,
the model's chat template (tokenizer_config.json) rendered in a sandboxed Jinja environment
with vLLM's defaults (completions: special tokens added, e.g. BOS; chat: the template writes
them, none added). A per-request /tokenize call would put an engine round trip on every
request's path. A prompt this cannot render (a batch of prompts, a template that raises, a
message shape the template does not take) has no ids: it is placed blind to cache state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from narwhal.core.chat_content import message_text
from narwhal.core.errors import InputError, Problem

CHAT_TEMPLATE_FILE = "chat_template.jinja"  # where newer checkpoints keep the template
MAX_TEMPLATE_BYTES = 1 << 20


def _template(in_config: object, beside: Path) -> str | None:
    """The model's default chat template: tokenizer_config.json's `chat_template` (a string,
    or a list of named templates) or, in newer checkpoints, chat_template.jinja."""
    if isinstance(in_config, list):
        named = {t.get("name"): t.get("template") for t in in_config if isinstance(t, dict)}
        in_config = named.get("default")
    if isinstance(in_config, str):
        return in_config
    try:
        if beside.stat().st_size <= MAX_TEMPLATE_BYTES:
            return beside.read_text()
    except (OSError, UnicodeDecodeError):
        pass
    return None


class PromptTokenizer:
    """The model's tokenizer and chat template, loaded once at router start."""

    def __init__(self, folder: Path) -> None:
        tokenizer_json = folder / "tokenizer.json"
        try:
            self._tokenizer = Tokenizer.from_file(str(tokenizer_json))
        except Exception as exc:  # the library raises its own untyped errors
            raise InputError("the fleet document", [Problem("prefix_cache.tokenizer_dir",
                                      f"{tokenizer_json} cannot be read as a tokenizer: {exc}",
                                      "place the model's tokenizer.json there")]) from None
        config = self._config(folder / "tokenizer_config.json")
        template = _template(config.get("chat_template"), folder / CHAT_TEMPLATE_FILE)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        try:
            self._chat = env.from_string(template) if isinstance(template, str) else None
        except TemplateError as exc:
            raise InputError("the fleet document", [Problem(
                "prefix_cache.tokenizer_dir", f"{folder}: the model's chat template does not "
                f"parse: {exc}", "place the model's own tokenizer_config.json or "
                "chat_template.jinja there")]) from None
        self._specials = {k: self._token_text(config.get(k))
                          for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        self.failures = 0

    @staticmethod
    def _config(path: Path) -> dict[str, Any]:
        if not path.exists():
            return {}
        try:
            value = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InputError("the fleet document", [Problem("prefix_cache.tokenizer_dir", f"{path}: {exc}",
                                      "place the model's tokenizer_config.json there")]) from None
        return value if isinstance(value, dict) else {}

    @staticmethod
    def _token_text(value: object) -> str:
        if isinstance(value, dict):
            value = value.get("content")
        return value if isinstance(value, str) else ""

    def _encode(self, text: str, add_special_tokens: bool, release_gil: bool) -> list[int]:
        """`encode` holds the GIL for the whole call; `encode_batch` releases it, so a worker
        thread tokenizing a long prompt leaves the event loop free (bench/cache_cost.py)."""
        if release_gil:
            return self._tokenizer.encode_batch([text],
                                                add_special_tokens=add_special_tokens)[0].ids
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def completion_ids(self, prompt: object, release_gil: bool = False) -> list[int] | None:
        """/v1/completions: one text prompt (special tokens added) or one list of ids."""
        if isinstance(prompt, str):
            return self._encode(prompt, True, release_gil)
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return prompt
        return None

    def chat_ids(self, body: Mapping[str, Any], release_gil: bool = False) -> list[int] | None:
        """/v1/chat/completions: the messages through the model's chat template."""
        messages = body.get("messages")
        if self._chat is None or not isinstance(messages, list):
            return None
        rows: list[dict[str, str]] = []
        for m in messages:
            if not isinstance(m, dict):
                return None
            rows.append({**{k: v for k, v in m.items() if isinstance(v, str)},
                         "content": message_text(m.get("content"))})
        add = body.get("add_special_tokens", False) is True
        try:
            text = self._chat.render(
                messages=rows, add_generation_prompt=body.get("add_generation_prompt", True),
                continue_final_message=body.get("continue_final_message", False) is True,
                **self._specials)
        except (TemplateError, TypeError, ValueError):
            self.failures += 1
            return None
        return self._encode(text, add, release_gil)

    def ids(self, route: str, body: Mapping[str, Any],
            release_gil: bool = False) -> list[int] | None:
        if route == "chat":
            return self.chat_ids(body, release_gil)
        return self.completion_ids(body.get("prompt"), release_gil)
