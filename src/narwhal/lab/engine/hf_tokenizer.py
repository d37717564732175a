"""The emulator's tokenizer written as a Hugging Face tokenizer.json, as a real model ships one.

A router that places on cache state tokenizes prompts with the model's own tokenizer files
(the `tokenizers` library, never a per-request /tokenize), so an emulated model must carry
files that encode exactly as the emulator does. tokenizer.py's rules are a BPE with byte
fallback and no merges: the same regex splits the text into pieces, a piece that is a word is
one token, any other piece is its characters, each a word or its UTF-8 bytes (`<0xNN>`); the
special strings are added tokens and BOS comes from the post-processor. The chat template
written beside it in tokenizer_config.json is the one tokenizer.render_chat applies.
tests/unit/engine/test_hf_tokenizer.py holds the two encoders equal on generated text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HfTokenizer

from narwhal.lab.engine.model_dir import SpecialTokens, load_model_dir
from narwhal.lab.engine.tokenizer import _PIECES, BYTE_TOKENS, Tokenizer

# The emulator's chat template (tokenizer.render_chat) in the Jinja form a model card carries.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ bos_token }}{{ m['role'] }}: {{ m['content'] }}"
    "{% if not (continue_final_message and loop.last) %}{{ eos_token }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt and not continue_final_message %}"
    "{{ bos_token }}assistant: {% endif %}"
)


def build(vocab_size: int, special: SpecialTokens) -> HfTokenizer:
    """A `tokenizers` Tokenizer that encodes as tokenizer.Tokenizer(vocab_size, special)."""
    emulator = Tokenizer(vocab_size, special)
    vocab: dict[str, int] = {f"<0x{b:02X}>": emulator.byte_ids[b] for b in range(BYTE_TOKENS)}
    for word, token in emulator._word_ids.items():
        vocab.setdefault(word, token)
    specials = dict(sorted(emulator._special_text.items()))
    for token, text in specials.items():
        vocab.setdefault(text, token)
    hf = HfTokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, ignore_merges=True))
    hf.pre_tokenizer = pre_tokenizers.Split(Regex(_PIECES.pattern), behavior="isolated")
    hf.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    hf.add_special_tokens([AddedToken(text, special=True, normalized=False)
                           for text in sorted(set(specials.values()))])
    if special.add_bos and emulator.bos_id is not None:
        bos = special.bos_text
        hf.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, emulator.bos_id)])
    return hf


def write(model_dir: Path) -> None:
    """tokenizer.json and the chat template (in tokenizer_config.json) for an emulated model."""
    model = load_model_dir(model_dir)
    build(model.vocab_size, model.special).save(str(model_dir / "tokenizer.json"))
    config_path = model_dir / "tokenizer_config.json"
    config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.exists() else {}
    config.setdefault("bos_token", model.special.bos_text)
    config.setdefault("eos_token", model.special.eos_text)
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
