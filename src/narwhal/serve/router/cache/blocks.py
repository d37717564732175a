"""The router's own key for a block of prompt tokens: a hash chained over the prefix.

Engines name blocks with hashes that depend on their seed and algorithm (vLLM's
`--prefix-caching-hash-algo`, `PYTHONHASHSEED`), so two engines never agree and the router
cannot compute theirs. It computes its own from the token ids an event carries and from the
prompt's token ids: the same tokens after the same prefix give the same key on every engine.
"""

from __future__ import annotations

from collections.abc import Sequence

ROOT = 0  # the parent of a prompt's first block


def chain(token_ids: Sequence[int], block_size: int, parent: int = ROOT) -> list[int]:
    """The keys of every full block of `token_ids`, the first chained to `parent`."""
    keys: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, *token_ids[start:start + block_size]))
        keys.append(parent)
    return keys


def cacheable_tokens(prompt_tokens: int, block_size: int) -> int:
    """Prompt tokens a prefix hit can cover: whole blocks within the first len-1 (vLLM always
    computes the last prompt token)."""
    return max(prompt_tokens - 1, 0) // block_size * block_size
