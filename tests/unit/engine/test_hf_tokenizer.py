"""The tokenizer.json an emulated model carries encodes exactly as the emulator does, and the
router's prompt ids (from those files) are the ids the emulator computes for the same request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.lab.engine.model_dir import load_model_dir
from narwhal.lab.engine.testing import write_llama3_8b, write_tiny_llama
from narwhal.lab.engine.tokenizer import Tokenizer, render_chat, word_text
from narwhal.serve.router.cache.prompt_ids import PromptTokenizer

WORDS = [word_text(i) for i in range(600)]
PIECES = st.one_of(st.sampled_from(WORDS), st.text(max_size=6),
                   st.sampled_from(["<s>", "</s>", "<|begin_of_text|>", "\n\n", "  ", "a", "xa"]))


@pytest.fixture(scope="module", params=[write_tiny_llama, write_llama3_8b],
                ids=["tiny-llama", "llama3-8b"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Tokenizer, PromptTokenizer]:
    folder = request.param(tmp_path_factory.mktemp("model") / "m")
    loaded = load_model_dir(folder)
    return Tokenizer(loaded.vocab_size, loaded.special), PromptTokenizer(folder)


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(PIECES, max_size=40))
def test_a_completion_prompt_has_the_emulator_s_ids(
        model: tuple[Tokenizer, PromptTokenizer], parts: list[str]) -> None:
    emulator, router = model
    text = "".join(parts)
    assert router.completion_ids(text) == emulator.encode(text, add_special_tokens=True)
    # the worker thread's call (GIL released) reads the same ids
    assert router.completion_ids(text, release_gil=True) == router.completion_ids(text)


@settings(max_examples=100, deadline=None)
@given(turns=st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]),
                                st.lists(PIECES, max_size=12)), min_size=1, max_size=5),
       generation=st.booleans())
def test_a_chat_prompt_has_the_emulator_s_ids(
        model: tuple[Tokenizer, PromptTokenizer], turns: list[tuple[str, list[str]]],
        generation: bool) -> None:
    emulator, router = model
    messages: list[dict[str, object]] = [{"role": r, "content": "".join(p)} for r, p in turns]
    text = render_chat(messages, emulator.special, generation, False, "assistant")
    body = {"messages": messages, "add_generation_prompt": generation}
    assert router.chat_ids(body) == emulator.encode(text, add_special_tokens=False)
    assert router.chat_ids(body, release_gil=True) == router.chat_ids(body)


def test_content_parts_and_token_id_prompts_are_read_as_the_engine_reads_them(
        model: tuple[Tokenizer, PromptTokenizer]) -> None:
    emulator, router = model
    parts = {"role": "user", "content": [{"type": "text", "text": "the world"},
                                         {"type": "image_url", "image_url": {"url": "x"}}]}
    text = render_chat([{"role": "user", "content": "the world"}], emulator.special, True,
                       False, "assistant")
    assert router.chat_ids({"messages": [parts]}) == emulator.encode(text, False)
    assert router.completion_ids([5, 6, 7]) == [5, 6, 7]


@pytest.mark.parametrize("body", [
    {"messages": "hello"}, {"messages": [["user", "hi"]]}, {"prompt": ["a", "b"]},
    {"prompt": [1, "2"]}, {"prompt": [[1, 2]]}, {"prompt": {"text": "x"}}, {"prompt": []},
])
def test_a_prompt_it_cannot_read_is_placed_blind(
        model: tuple[Tokenizer, PromptTokenizer], body: dict[str, object]) -> None:
    _, router = model
    assert router.ids("chat" if "messages" in body else "completions", body) is None


def test_a_template_that_reaches_for_python_internals_is_refused(tmp_path: Path) -> None:
    folder = write_tiny_llama(tmp_path / "m")
    config = folder / "tokenizer_config.json"
    config.write_text('{"chat_template": "{{ messages.__class__.__mro__ }}"}')
    router = PromptTokenizer(folder)
    assert router.chat_ids({"messages": [{"role": "user", "content": "x"}]}) is None
    assert router.failures == 1


def test_a_folder_without_tokenizer_json_is_an_error_naming_the_field(tmp_path: Path) -> None:
    from narwhal.core.errors import InputError
    with pytest.raises(InputError, match=r"prefix_cache\.tokenizer_dir"):
        PromptTokenizer(tmp_path)


@pytest.mark.parametrize(("name", "text", "says"), [
    ("tokenizer.json", "{not json", "cannot be read as a tokenizer"),
    ("tokenizer.json", '{"model": {"type": "Nope"}}', "cannot be read as a tokenizer"),
    ("tokenizer_config.json", '{"chat_template": "{% for %}"}', "does not parse"),
    ("tokenizer_config.json", "[1, 2", "tokenizer_config.json"),
])
def test_broken_tokenizer_files_stop_startup_naming_the_field(
        tmp_path: Path, name: str, text: str, says: str) -> None:
    from narwhal.core.errors import InputError
    folder = write_tiny_llama(tmp_path / "m")
    (folder / name).write_text(text)
    with pytest.raises(InputError, match=r"prefix_cache\.tokenizer_dir") as info:
        PromptTokenizer(folder)
    assert says in str(info.value)


def test_a_template_file_too_large_to_be_one_is_not_read(tmp_path: Path) -> None:
    folder = write_tiny_llama(tmp_path / "m")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text("x" * (2 << 20))
    assert PromptTokenizer(folder).chat_ids({"messages": [{"role": "user", "content": "a"}]}) \
        is None
