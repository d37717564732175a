"""Lines end at a newline only; every other break or control character is refused, by line.

Issue 13 item 6, defects 1 and 2: str.splitlines() split a value at a form feed or U+2028, so
`NARWHAL_ENGINE_MODEL_NAME=x<FF>NARWHAL_NODE_3_SSH=...` declared a third engine; and a leading
byte-order mark made the first variable name invalid.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal.core.errors import InputError
from narwhal.deploy.inputs import parse_inputs
from narwhal.deploy.inputs.envfile import parse_env_text
from tests.envtext import valid_env

# Everything str.splitlines() splits on besides "\n" and "\r\n".
SPLITTERS = ["\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\r"]
CONTROLS = ["\x00", "\x01", "\x1b", "\x1f", "\x7f", "\x80", "\x9f", "\u200b", "\u202e", "\ufeff"]
SMUGGLED = "NARWHAL_NODE_3_SSH=root@10.0.0.99"


def _refusal(text: str) -> list[str]:
    with pytest.raises(InputError) as err:
        parse_inputs(text, Path(".env"))
    return [p.line() for p in err.value.problems]


@pytest.mark.parametrize("sep", SPLITTERS, ids=[f"U+{ord(c):04X}" for c in SPLITTERS])
def test_a_line_separator_inside_a_value_is_refused_not_split(sep: str) -> None:
    text = valid_env(NARWHAL_ENGINE_MODEL_NAME=f"x{sep}{SMUGGLED}")
    lines = _refusal(text)
    wanted = "NARWHAL_ENGINE_MODEL_NAME (line 4): contains a control or line-separator " \
             f"character U+{ord(sep):04X}; remove it"
    assert any(problem.startswith(wanted) for problem in lines), lines
    entries, _ = parse_env_text(text)
    assert "NARWHAL_NODE_3_SSH" not in {e.key for e in entries}


@pytest.mark.parametrize("sep", SPLITTERS, ids=[f"U+{ord(c):04X}" for c in SPLITTERS])
def test_a_separator_in_a_comment_does_not_start_a_line(sep: str) -> None:
    entries, problems = parse_env_text(f"# note{sep}{SMUGGLED}\n")
    assert entries == []
    assert [p.field for p in problems] == ["line 1"]


@pytest.mark.parametrize("ch", CONTROLS, ids=[f"U+{ord(c):04X}" for c in CONTROLS])
def test_controls_del_and_format_characters_are_refused_in_values(ch: str) -> None:
    lines = _refusal(valid_env(NARWHAL_RUN_DIR=f"/srv/run{ch}x"))
    assert any(line.startswith("NARWHAL_RUN_DIR (line 6): contains a control")
               and f"U+{ord(ch):04X}" in line for line in lines), lines


@pytest.mark.parametrize("ch", CONTROLS, ids=[f"U+{ord(c):04X}" for c in CONTROLS])
def test_controls_are_refused_in_keys(ch: str) -> None:
    entries, problems = parse_env_text(f"NARWHAL_{ch}ENGINE_PORT=8000\n")
    assert entries == []
    assert len(problems) == 1 and problems[0].field == "line 1"
    assert f"U+{ord(ch):04X}" in problems[0].problem


def test_a_control_inside_a_quoted_secret_is_named_without_the_secret() -> None:
    text = valid_env(NARWHAL_NODE_2_SSH_PASSWORD="'hunter2\u2028more'")
    lines = _refusal(text)
    assert any(line.startswith("NARWHAL_NODE_2_SSH_PASSWORD (line 15)") for line in lines)
    assert not any("hunter2" in line for line in lines)


def test_crlf_line_ends_are_still_read() -> None:
    inputs = parse_inputs(valid_env().replace("\n", "\r\n"), Path(".env"))
    assert [e.n for e in inputs.engines] == [1, 2]


def test_tab_is_refused_inside_a_value_but_not_around_a_comment() -> None:
    entries, problems = parse_env_text("\tNARWHAL_ENGINE_PORT=8000\t# the engine\n")
    assert problems == [] and entries[0].value == "8000"
    _, problems = parse_env_text("NARWHAL_RUN_DIR='/srv/a\tb'\n")
    assert [p.field for p in problems] == ["NARWHAL_RUN_DIR (line 1)"]
    assert "U+0009" in problems[0].problem


def test_a_leading_byte_order_mark_is_stripped() -> None:
    inputs = parse_inputs("\ufeff" + valid_env(), Path(".env"))
    assert inputs.deployment == "demo"


@pytest.mark.parametrize("text", [
    "\ufeff\ufeff" + valid_env(),
    valid_env() + "\ufeffNARWHAL_TTFT_S=5\n",
    valid_env(NARWHAL_ENGINE_MODEL_NAME="Qwen\ufeff"),
], ids=["twice-at-start", "start-of-a-later-line", "inside-a-value"])
def test_a_byte_order_mark_anywhere_else_is_refused(text: str) -> None:
    lines = _refusal(text)
    assert any("U+FEFF" in line and "first character of the file" in line for line in lines)


def test_the_name_of_a_line_without_a_valid_name_is_not_echoed() -> None:
    # A password typed on its own line, then '=': no part of it is printed.
    _, problems = parse_env_text("hunter2 secret=x\n")
    assert problems[0].field == "line 1" and "hunter2" not in problems[0].line()
