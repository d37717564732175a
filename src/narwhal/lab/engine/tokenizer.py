"""A deterministic tokenizer inside the model's vocabulary: text <-> ids, cheap and lossless.

Ids are laid out once from the vocabulary size and the special ids in config.json: the special
ids keep their numbers, the next 256 ids are the bytes 0-255, the rest are words (common English
words first, then made-up syllable words). Encoding splits text into word-like pieces with one C
regex pass and one dict lookup per piece; a piece that is not a word falls back, character by
character, to the character's word or its UTF-8 bytes (a BPE with byte fallback and no merges
does the same, so lab/engine/hf_tokenizer.py can write this tokenizer as a tokenizer.json), so
decode(encode(text)) == text for every string. Special-token strings in the text
(`<s>`, `</s>`) encode to their ids, which is how the chat template marks turns.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from functools import lru_cache

from narwhal.core.chat_content import message_text
from narwhal.lab.engine.model_dir import SpecialTokens

BYTE_TOKENS = 256
MIN_VOCAB = BYTE_TOKENS + 4
ENCODABLE_WORDS = 8192  # words the encoder looks up; higher ids still decode
GENERATION_WORDS = 1024  # the generator picks among the first words: readable output

_PIECES = re.compile(r" ?[A-Za-z]+| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")
_COMMON = tuple(
    ["the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "they", "you", "were", "her", "she", "there", "been", "one", "all", "we", "their", "has", "would", "when", "if", "so", "no", "will", "can", "more", "about", "said", "up", "out", "them", "what", "some", "could", "into", "only", "other", "time", "new", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our", "over", "man", "me", "even", "most", "made", "after", "also", "did", "many", "before", "must", "through", "back", "years", "where", "much", "your", "way", "well", "down", "should", "because", "each", "just", "those", "people", "how", "too", "little", "state", "good", "very", "make", "world", "still", "own", "see", "men", "work", "long", "get", "here", "between", "both", "life", "being", "under", "never", "day", "same", "another", "know", "while", "last", "might", "us", "great", "old", "year", "off", "come", "since", "against", "go", "came", "right", "used", "take", "three", "states", "himself", "few", "house", "use", "during", "without", "again", "place", "around", "however", "home", "small", "found", "thought", "went", "say", "part", "once", "general", "high", "upon", "school", "every", "don", "does", "got", "left", "number", "course", "war", "until", "always", "away", "something", "fact", "though", "water", "less", "public", "put", "think", "almost", "hand", "enough", "far", "took", "head", "yet", "government", "system", "better", "set", "told", "nothing", "night", "end", "why", "called", "didn", "eyes", "find", "going", "look", "asked", "later", "point", "knew", "city", "next", "program", "business", "give", "group", "toward", "young", "days", "let", "room", "president", "side", "social", "given", "present", "several", "order", "national", "possible", "rather", "second", "face", "per", "among", "form", "important", "often", "things", "looked", "early", "white", "case", "john", "become", "large", "big", "need", "four", "within", "felt", "along", "children", "saw", "best", "church", "ever", "least", "power", "development", "light"]
)
_CONSONANTS = "bcdfghjklmnprstvz"
_VOWELS = "aeiou"


def _syllable_word(index: int) -> str:
    """A made-up word for any index (bijective base-85 over consonant-vowel syllables)."""
    syllables = []
    n = index
    base = len(_CONSONANTS) * len(_VOWELS)
    while True:
        n, r = divmod(n, base)
        syllables.append(_CONSONANTS[r // len(_VOWELS)] + _VOWELS[r % len(_VOWELS)])
        if n == 0:
            break
        n -= 1
    return " " + "".join(syllables)


def word_text(index: int) -> str:
    """The text of word number `index`: common words with a leading space, then bare, then made up."""
    common = len(_COMMON)
    if index < common:
        return " " + _COMMON[index]
    if index < 2 * common:
        return _COMMON[index - common]
    return _syllable_word(index - 2 * common)


class Tokenizer:
    """Text <-> ids for one vocabulary; immutable after construction, shared by all requests."""

    def __init__(self, vocab_size: int, special: SpecialTokens) -> None:
        if vocab_size < MIN_VOCAB:
            raise ValueError(f"vocab_size {vocab_size} is too small for the emulator's "
                             f"byte-level tokenizer (needs at least {MIN_VOCAB})")
        self.vocab_size = vocab_size
        self.special = special
        ids = {i for i in (special.bos_id, special.pad_id, *special.eos_ids) if i is not None}
        self._special_ids = sorted(ids)
        self._special_text: dict[int, str] = {}
        for i, text in ((special.pad_id, special.pad_text), (special.bos_id, special.bos_text)):
            if i is not None:
                self._special_text[i] = text
        for i in special.eos_ids:
            self._special_text[i] = special.eos_text
        by_text = {text: i for i, text in sorted(self._special_text.items(), reverse=True)}
        self._special_by_text = by_text
        self._special_split = re.compile(
            "(" + "|".join(re.escape(t) for t in sorted(by_text, key=len, reverse=True)) + ")"
        ) if by_text else None
        self.byte_ids = [self._id_of_rank(b) for b in range(BYTE_TOKENS)]
        self.num_words = vocab_size - len(self._special_ids) - BYTE_TOKENS
        self._word_ids: dict[str, int] = {}
        for w in range(min(self.num_words, ENCODABLE_WORDS)):
            self._word_ids.setdefault(word_text(w), self._id_of_rank(BYTE_TOKENS + w))
        # words that begin with a space and are their text's own encoding: generated text
        # then encodes back to the ids that made it, as a continued request's prompt must (a
        # bare word after another joins it into one piece; a made-up syllable word can spell
        # a common one, " he", whose text encodes to the common word's id)
        self.generation_ids = [
            self._id_of_rank(BYTE_TOKENS + w) for w in range(min(self.num_words, GENERATION_WORDS))
            if word_text(w).startswith(" ")
            and self._word_ids.get(word_text(w)) == self._id_of_rank(BYTE_TOKENS + w)]
        self.bos_id = special.bos_id
        self.eos_id = special.eos_ids[0] if special.eos_ids else None

    def _id_of_rank(self, rank: int) -> int:
        """The rank-th id that is not special (specials keep the ids config.json gives them)."""
        token = rank
        for s in self._special_ids:
            if s <= token:
                token += 1
        return token

    def _rank_of_id(self, token: int) -> int:
        return token - bisect.bisect_left(self._special_ids, token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; BOS first when asked and the model has one."""
        out: list[int] = []
        if add_special_tokens and self.special.add_bos and self.bos_id is not None:
            out.append(self.bos_id)
        parts = self._special_split.split(text) if self._special_split else [text]
        for k, part in enumerate(parts):
            if k % 2:
                out.append(self._special_by_text[part])
            elif part:
                self._encode_plain(part, out)
        return out

    def _encode_plain(self, text: str, out: list[int]) -> None:
        words = self._word_ids
        byte_ids = self.byte_ids
        for piece in _PIECES.findall(text):
            token = words.get(piece)
            if token is not None:
                out.append(token)
                continue
            for char in piece:  # as a BPE with byte fallback: a character that is a word
                token = words.get(char)
                if token is not None:
                    out.append(token)
                else:
                    out.extend(byte_ids[b] for b in char.encode())

    def is_special(self, token: int) -> bool:
        return token in self._special_text

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; byte runs are joined first so multi-byte characters survive."""
        out: list[str] = []
        pending = bytearray()
        for token in ids:
            rank = self._rank_of_id(token) if token not in self._special_text else -1
            if 0 <= rank < BYTE_TOKENS:
                pending.append(rank)
                continue
            if pending:
                out.append(pending.decode(errors="replace"))
                pending.clear()
            if rank < 0:
                if not skip_special_tokens:
                    out.append(self._special_text[token])
            else:
                out.append(token_piece(self, token))
        if pending:
            out.append(pending.decode(errors="replace"))
        return "".join(out)

    def token_str(self, token: int) -> str:
        """One token's own text (`token_strs`, logprob keys): bytes shown as `<0xNN>`."""
        if token in self._special_text:
            return self._special_text[token]
        rank = self._rank_of_id(token)
        if rank < BYTE_TOKENS:
            return chr(rank) if 32 <= rank < 127 else f"<0x{rank:02X}>"
        return token_piece(self, token)

    def in_vocab(self, token: int) -> bool:
        return 0 <= token < self.vocab_size


def token_piece(tok: Tokenizer, token: int) -> str:
    """Text of a word token (cached: the generator reuses a small set of words)."""
    return _word_for_rank(tok._rank_of_id(token) - BYTE_TOKENS)


@lru_cache(maxsize=16384)
def _word_for_rank(index: int) -> str:
    return word_text(index)


def render_chat(messages: Sequence[dict[str, object]], special: SpecialTokens,
                add_generation_prompt: bool, continue_final_message: bool, role: str) -> str:
    """The emulator's chat template: `<s>role: content</s>\\n` per turn, then `<s>assistant: `.

    A model's own Jinja template is not executed (no template engine is shipped); this one is
    the template the real tier's tiny model uses, with the model's BOS/EOS strings.
    """
    bos, eos = special.bos_text, special.eos_text
    out = []
    last = len(messages) - 1
    for i, message in enumerate(messages):
        text = f"{bos}{message.get('role')}: {message_text(message.get('content'))}"
        out.append(text if (continue_final_message and i == last) else f"{text}{eos}\n")
    if add_generation_prompt and not continue_final_message:
        out.append(f"{bos}{role}: ")
    return "".join(out)
