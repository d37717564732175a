"""Tokenizer and generator: lossless text, ids inside the vocabulary, deterministic outputs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.lab.engine.generator import Generator
from narwhal.lab.engine.model_dir import SpecialTokens
from narwhal.lab.engine.tokenizer import Tokenizer, render_chat

TINY = SpecialTokens(bos_id=0, eos_ids=(1,), pad_id=2, bos_text="<s>", eos_text="</s>",
                     pad_text="<pad>", add_bos=True)
LLAMA3 = SpecialTokens(bos_id=128000, eos_ids=(128001, 128009), pad_id=None,
                       bos_text="<|begin_of_text|>", eos_text="<|end_of_text|>",
                       pad_text="<pad>", add_bos=True)
TINY_TOK = Tokenizer(432, TINY)
BIG_TOK = Tokenizer(128256, LLAMA3)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_any_text_round_trips_and_stays_in_the_vocabulary(text: str) -> None:
    """Lossless when special tokens are kept (text naming one, e.g. "</s>", encodes to its id
    and, like vLLM's default skip_special_tokens, a plain decode drops it)."""
    for tok in (TINY_TOK, BIG_TOK):
        ids = tok.encode(text, add_special_tokens=False)
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_bos_is_counted_when_special_tokens_are_added() -> None:
    with_bos = TINY_TOK.encode("the cat", add_special_tokens=True)
    without = TINY_TOK.encode("the cat", add_special_tokens=False)
    assert with_bos == [0, *without]
    assert TINY_TOK.decode(with_bos) == "the cat"
    assert TINY_TOK.decode(with_bos, skip_special_tokens=False) == "<s>the cat"


def test_special_token_text_encodes_to_the_special_id() -> None:
    ids = TINY_TOK.encode("<s>user: hi</s>\n", add_special_tokens=False)
    assert ids[0] == 0 and 1 in ids
    assert BIG_TOK.encode("<|begin_of_text|>x", add_special_tokens=False)[0] == 128000


def test_common_words_are_single_tokens_and_special_ids_keep_their_numbers() -> None:
    assert len(BIG_TOK.encode(" the people of the world", add_special_tokens=False)) == 5
    assert len(TINY_TOK.encode(" the", add_special_tokens=False)) == 1
    assert TINY_TOK.token_str(1) == "</s>"
    assert BIG_TOK.token_str(128009) == "<|end_of_text|>"


def test_chat_template_marks_turns_with_the_models_specials() -> None:
    text = render_chat([{"role": "system", "content": "be brief"},
                        {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                       TINY, add_generation_prompt=True, continue_final_message=False,
                       role="assistant")
    assert text == "<s>system: be brief</s>\n<s>user: hi</s>\n<s>assistant: "


def test_the_same_prompt_generates_the_same_tokens_and_logprobs() -> None:
    one, two = Generator(TINY_TOK, 1 / 256), Generator(TINY_TOK, 1 / 256)
    prompt = TINY_TOK.encode("the world of people", add_special_tokens=True)
    a = one.plan(prompt, 64, 0, ignore_eos=True)
    b = two.plan(list(prompt), 64, 0, ignore_eos=True)
    assert a == b
    assert all(0 <= t < 432 and not TINY_TOK.is_special(t) for t in a.token_ids)
    assert one.logprobs(a.states[3], a.token_ids[3], 5) == two.logprobs(b.states[3], b.token_ids[3], 5)
    other = one.plan([*prompt, 300], 64, 0, ignore_eos=True)
    assert other.token_ids != a.token_ids


def test_eos_stops_generation_but_not_before_min_tokens_or_with_ignore_eos() -> None:
    always = Generator(TINY_TOK, 1.0)
    prompt = [5, 6, 7]
    stopped = always.plan(prompt, 16, 0, ignore_eos=False)
    assert (stopped.token_ids, stopped.finish_reason) == ([1], "stop")
    late = always.plan(prompt, 16, 3, ignore_eos=False)
    assert late.token_ids[-1] == 1 and len(late.token_ids) == 4
    ignored = always.plan(prompt, 16, 0, ignore_eos=True)
    assert (len(ignored.token_ids), ignored.finish_reason) == (16, "length")


def test_top_logprobs_rank_the_chosen_token_first_and_are_distinct() -> None:
    gen = Generator(BIG_TOK, 0.0)
    chosen, ranked = gen.logprobs(1234, 5000, 5)
    assert ranked[0] == (5000, chosen)
    assert len({t for t, _ in ranked}) == 5
    assert [lp for _, lp in ranked] == sorted((lp for _, lp in ranked), reverse=True)
    assert chosen < 0


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=47), st.sampled_from(["the world of people", "hi",
                                                                 "a b  c\n"]))
def test_a_request_continued_from_its_first_k_tokens_generates_the_rest(k: int,
                                                                         prompt: str) -> None:
    """What the router's mid-stream continuation relies on: the prompt's text plus the text of
    the first k generated tokens encodes back to the prompt's ids plus those tokens, and a
    request for that prompt generates exactly the tokens (and logprobs) that came after them."""
    for tok in (TINY_TOK, BIG_TOK):
        gen = Generator(tok, 1 / 64)
        ids = tok.encode(prompt)
        whole = gen.plan(ids, 48, 5, ignore_eos=False)
        k = min(k, len(whole.token_ids) - 1)
        text = prompt + tok.decode(whole.token_ids[:k])
        again = tok.encode(text)
        assert again == ids + whole.token_ids[:k]
        rest = gen.plan(again, 48 - k, max(0, 5 - k), ignore_eos=False)
        assert rest.token_ids == whole.token_ids[k:]
        assert rest.finish_reason == whole.finish_reason
        assert rest.states == whole.states[k:]


def test_gate_c_s_capture_completion_answers_with_text_on_the_emulated_models() -> None:
    """The capture (node/engine/capture.py) asks 4 tokens of "The quick brown fox" and
    Gate C refuses an engine that answers nothing: at the default EOS chance, neither
    emulated model may stop at once on it."""
    from narwhal.node.engine.capture import COMPLETION_PROMPT
    for tok in (TINY_TOK, BIG_TOK):
        planned = Generator(tok, 1 / 256).plan(tok.encode(COMPLETION_PROMPT), 4, 0, False)
        assert tok.decode(planned.token_ids).strip()
