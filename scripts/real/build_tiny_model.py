"""Build the real tier's tiny random-weight Llama, locally, with no hub access.

Run with the vLLM venv's python (it needs `tokenizers` and `transformers`):

    <venv>/bin/python scripts/real/build_tiny_model.py [--cache DIR]

The model is cached under `<cache>/tiny-llama-<digest>`, where the digest covers this file, so
editing the recipe builds a new model and an old cache entry is never reused by mistake. It is
built in a scratch folder beside the target and renamed into place only when complete, so an
interrupted build never looks ready. Prints the model folder on stdout's last line.

The shape is what vLLM's CPU backend accepts and what the KV tests predict: head_dim 32 (the
CPU attention kernels have no head size 16), 2 layers, 2 KV heads, float32, so one token of KV
is 2 layers x (K+V) x 2 heads x 32 x 4 bytes = 1 KiB. Weights are random with a fixed seed,
so every build of one digest is the same model and decodes are reproducible across machines.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

SEED = 20261130
READY = ".narwhal-ready"
# One paragraph, repeated, is the whole training corpus: the vocabulary only has to cover the
# prompts the tests send, and a fixed corpus keeps the token ids stable between builds.
CORPUS = (
    "A narwhal fleet hands the key and value cache from a prefill engine to a decode engine. "
    "The prefill side computes the prompt once, keeps its blocks under a short lease, and "
    "tells the router where they live. The decode side pulls those blocks over the fabric, "
    "checks that both engines agree on the model, the data type and the layout, and then "
    "writes one token after another. If they differ, it fails."
)
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def recipe_digest() -> str:
    """12 hex digits of this file: the cache key of the model it builds."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]


def build(out: Path) -> None:
    """Write tokenizer, config and random float32 weights into `out`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS] * 8, trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(  # the *_token arguments are special tokens, not secrets
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",  # noqa: S106
        chat_template=CHAT_TEMPLATE)
    hf_tok.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=len(hf_tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
        bos_token_id=hf_tok.bos_token_id, eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id, tie_word_embeddings=False, torch_dtype="float32")
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out)


def ensure(cache: Path) -> Path:
    """The cached model folder for this recipe, built first if absent."""
    target = cache / f"tiny-llama-{recipe_digest()}"
    if (target / READY).is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".tiny-llama.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time; the others reuse its model
        if (target / READY).is_file():
            return target
        scratch = Path(tempfile.mkdtemp(prefix=".tiny-llama-", dir=cache))
        try:
            build(scratch / "model")
            (scratch / "model" / READY).write_text(f"seed {SEED}\n")
            shutil.rmtree(target, ignore_errors=True)
            (scratch / "model").rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "narwhal"
    parser.add_argument("--cache", type=Path, default=default_cache)
    args = parser.parse_args()
    print(ensure(args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
