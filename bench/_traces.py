"""Repeating traffic for bench/prefix.py: the Mooncake conversation trace scaled to the lab
model, and a seeded multi-turn chat. Both come out as fixed schedules (arrival times decided in
advance, open loop) of prompts whose token blocks repeat the way the source repeats them.

Prompts are built from words the emulator's tokenizer maps to one token each (" the", " of",
...), so a prompt's token count is known without asking an engine and a Mooncake hash block is
exactly `block` tokens. Completion prompts get a BOS from the engine, so a prompt's first block
holds BOS + block-1 words: token block k of the prompt is then hash block k of the trace, and
two requests that share their first k hash_ids share their first k engine cache blocks.

The reuse ceiling is computed on the token ids the engines will see (chained block hashes, as
the emulator's and vLLM's prefix caches key them): the share of prompt tokens in full blocks
some earlier request already held. It is what an infinite cache with every repeated block hit
would reach; no router can beat it.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.deploy.trial.trace import TRACE_BLOCK_TOKENS, arrival_times, read_trace

HERE = Path(__file__).resolve().parent
MOONCAKE = HERE / "traces" / "mooncake-conversation-1200.jsonl"
MOONCAKE_BLOCK = TRACE_BLOCK_TOKENS  # tokens per hash_id in the Mooncake traces


@dataclass(frozen=True)
class Request:
    """One scheduled request: a completion `prompt` or chat `messages`, never both."""

    at: float  # seconds after the schedule starts
    max_tokens: int
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None


class Vocab:
    """The emulator tokenizer of the lab model and the words it encodes as one token each."""

    def __init__(self, model_dir: Path) -> None:
        from narwhal.lab.engine.model_dir import load_model_dir
        from narwhal.lab.engine.tokenizer import Tokenizer, word_text

        model = load_model_dir(model_dir)
        self.special = model.special
        self.tok = Tokenizer(model.vocab_size, model.special)
        candidates = [word_text(i) for i in range(self.tok.num_words)]
        self.words = [w for w in candidates if w.startswith(" ") and
                      len(self.tok.encode(w, add_special_tokens=False)) == 1]
        if len(self.words) < 64:
            raise RuntimeError(f"only {len(self.words)} one-token words in this vocabulary")

    def text(self, rng: random.Random, count: int) -> str:
        return "".join(rng.choices(self.words, k=count))

    def token_ids(self, req: Request) -> list[int]:
        """The prompt ids an engine computes for `req` (completions add BOS; the chat
        template carries its own `<s>`, and chat requests add no special tokens)."""
        from narwhal.lab.engine.tokenizer import render_chat

        if req.messages is None:
            return self.tok.encode(req.prompt or "")
        text = render_chat(list(req.messages), self.special, True, False, "assistant")
        return self.tok.encode(text, add_special_tokens=False)


def load_mooncake(path: Path = MOONCAKE) -> list[dict[str, Any]]:
    """The trace as `narwhal trial --trace` reads it (every row checked, bounded)."""
    return [row.model_dump() for row in read_trace(path).rows]


def _block_words(vocab: Vocab, seed: int, hash_id: int, block: int) -> list[str]:
    rng = random.Random(f"mooncake:{seed}:{hash_id}")
    return rng.choices(vocab.words, k=block)


def mooncake_prompt(vocab: Vocab, row: dict[str, Any], block: int, max_blocks: int,
                    seed: int) -> str:
    """Scaled prompt: input_length * block / 512 tokens (BOS included), at most max_blocks
    blocks; hash block k becomes token block k, the last one cut where the input ends."""
    ids = row["hash_ids"][:max_blocks]
    tokens = min(max(1, round(row["input_length"] * block / MOONCAKE_BLOCK)), len(ids) * block)
    tokens = max(tokens, 2)  # BOS and at least one word
    out: list[str] = []
    for k, hash_id in enumerate(ids):
        words = _block_words(vocab, seed, hash_id, block)
        if k == 0:
            words = words[1:]  # the engine's BOS takes the first slot of the first block
        room = tokens - 1 - len(out)
        if room <= 0:
            break
        out.extend(words[:room])
    return "".join(out)


def mooncake_schedule(vocab: Vocab, rows: Sequence[dict[str, Any]], rate: float,
                      seconds: float, block: int, max_blocks: int, max_output: int,
                      seed: int) -> list[Request]:
    """The trace in its own order and relative timing, time-scaled so that it offers `rate`
    requests/s on average; requests after `seconds` are dropped."""
    if len(rows) < 2:
        raise ValueError("the trace needs at least two rows")
    out: list[Request] = []
    for row, at in zip(rows, arrival_times([r["timestamp"] for r in rows], rate), strict=True):
        if at >= seconds:
            break
        output = min(max_output, max(2, round(row["output_length"] * block / MOONCAKE_BLOCK)))
        out.append(Request(round(at, 4), output,
                           prompt=mooncake_prompt(vocab, row, block, max_blocks, seed)))
    return out


@dataclass(frozen=True)
class ChatShape:
    """The synthetic chat: tenants share a system prompt; each user talks for `turns` turns."""

    tenants: int = 4
    system_words: int = 192
    turns: int = 5
    user_words: tuple[int, int] = (16, 48)
    reply_tokens: tuple[int, int] = (8, 24)
    think_s: float = 3.0  # mean pause between a user's turns (plus 1 s)


def _conversation(vocab: Vocab, rng: random.Random, system: str, start: float,
                  shape: ChatShape, seconds: float) -> list[Request]:
    """One user's turns; each resends the whole conversation so far (system prompt, earlier
    user turns and a fixed reply text of each earlier turn's planned length) plus a new turn."""
    history: list[dict[str, str]] = [{"role": "system", "content": system}]
    out: list[Request] = []
    at = start
    for _ in range(shape.turns):
        if at >= seconds:
            break
        history.append({"role": "user", "content": vocab.text(rng, rng.randint(*shape.user_words))})
        reply = rng.randint(*shape.reply_tokens)
        out.append(Request(round(at, 4), reply, messages=tuple(dict(m) for m in history)))
        history.append({"role": "assistant", "content": vocab.text(rng, reply)})
        at += 1.0 + rng.expovariate(1.0 / shape.think_s)
    return out


def chat_schedule(vocab: Vocab, rate: float, seconds: float, seed: int,
                  shape: ChatShape = ChatShape()) -> list[Request]:
    """Users arrive uniformly over the run until the schedule holds rate*seconds requests."""
    rng = random.Random(f"chat:{seed}")
    systems = [vocab.text(rng, shape.system_words) for _ in range(shape.tenants)]
    want = max(1, round(rate * seconds))
    out: list[Request] = []
    while len(out) < want:
        start = rng.uniform(0.0, seconds)
        out += _conversation(vocab, rng, rng.choice(systems), start, shape, seconds)
    out.sort(key=lambda r: r.at)
    return out[:want]


def block_keys(ids: Sequence[int], block: int) -> list[int]:
    """Chained hashes of the full blocks of `ids` (a block's key names its whole prefix)."""
    keys, parent = [], 0
    for start in range(0, len(ids) - block + 1, block):
        parent = hash((parent, tuple(ids[start:start + block])))
        keys.append(parent)
    return keys


def reuse_ceiling(prompts: Iterable[Sequence[int]], block: int) -> dict[str, Any]:
    """Share of prompt tokens in full blocks an earlier prompt already held (infinite cache,
    every repeated block hit), with the unique blocks the schedule touches."""
    seen: set[int] = set()
    hit = total = 0
    for ids in prompts:
        keys = block_keys(ids, block)
        usable = max(len(ids) - 1, 0) // block  # an engine always computes the last token
        hit += sum(1 for k in keys[:usable] if k in seen) * block
        total += len(ids)
        seen.update(keys)
    return {"ceiling": round(hit / total, 4) if total else None, "prompt_tokens": total,
            "unique_blocks": len(seen)}


def describe(schedule: Sequence[Request], lengths: Sequence[int]) -> dict[str, Any]:
    """What the schedule offers, for the report."""
    span = schedule[-1].at if schedule else 0.0
    return {"requests": len(schedule), "last_arrival_s": span,
            "prompt_tokens_mean": round(sum(lengths) / max(len(lengths), 1), 1),
            "prompt_tokens_max": max(lengths, default=0),
            "output_tokens_mean": round(sum(r.max_tokens for r in schedule) /
                                        max(len(schedule), 1), 1),
            "output_tokens_total": sum(r.max_tokens for r in schedule)}


def _lru_run(keyed: Sequence[tuple[list[int], int]], block: int, capacity: int, engines: int,
             affinity: bool) -> float:
    from collections import OrderedDict

    caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(engines)]
    load = [0] * engines
    hit = total = 0
    for i, (keys, length) in enumerate(keyed):
        usable = keys[:max(length - 1, 0) // block]
        matched = []
        for cache in caches:
            n = 0
            while n < len(usable) and usable[n] in cache:
                n += 1
            matched.append(n)
        if affinity and max(matched) * block >= 0.3 * length:
            e = max(range(engines), key=lambda j: (matched[j], -load[j]))
        else:
            e = i % engines if not affinity else min(range(engines), key=lambda j: load[j])
        hit += matched[e] * block
        total += length
        load[e] += length - matched[e] * block
        for k in keys:
            caches[e][k] = None
            caches[e].move_to_end(k)
        while len(caches[e]) > capacity:
            caches[e].popitem(last=False)
    return round(hit / total, 4) if total else 0.0


def lru_hit_rates(prompts: Sequence[Sequence[int]], block: int, capacity: int,
                  engines: int) -> dict[str, float]:
    """What `engines` prefill engines with LRU caches of `capacity` blocks would hit, routed
    round robin, or each prompt to the engine holding its longest cached prefix when that
    covers 30% of the prompt (cache_aware's default threshold), else to the least-loaded: a reference for reading the measured rows, with no queueing,
    and a check that the cache size makes placement matter at all."""
    keyed = [(block_keys(ids, block), len(ids)) for ids in prompts]
    return {"round_robin": _lru_run(keyed, block, capacity, engines, False),
            "longest_prefix": _lru_run(keyed, block, capacity, engines, True)}
