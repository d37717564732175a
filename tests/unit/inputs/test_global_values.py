"""A bad fleet-wide engine value is reported even when no engine could be read."""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal.core.errors import InputError
from narwhal.deploy.cli.main import main
from narwhal.deploy.inputs import parse_inputs
from tests.envtext import valid_env

SOURCE = Path(".env")
# Both engines' SSH lines lost to one unterminated quote: no engine is parsed at all.
NO_ENGINE = valid_env(NARWHAL_ENGINE_PORT="notaport").replace(
    "NARWHAL_NODE_1_SSH=root@10.213.0.11\n", "NARWHAL_NODE_1_SSH='root@10.213.0.11\n").replace(
    "NARWHAL_NODE_2_SSH=ops@10.213.0.12\n", "").replace("NARWHAL_NODE_2_SSH_PASSWORD=", "X=")


def _fields(text: str) -> dict[str, str]:
    with pytest.raises(InputError) as caught:
        parse_inputs(text, SOURCE)
    return {p.field: p.problem for p in caught.value.problems}


def test_a_bad_global_port_is_reported_when_a_syntax_error_leaves_no_engine() -> None:
    found = _fields(NO_ENGINE)
    assert any("unterminated" in problem for problem in found.values()), found
    assert "NARWHAL_ENGINE_PORT" in found, found
    assert "notaport" in found["NARWHAL_ENGINE_PORT"]


@pytest.mark.parametrize(("name", "value"), [
    ("NARWHAL_ENGINE_IMAGE", "vllm/vllm-openai:latest"),
    ("NARWHAL_MODEL_DIR", "models/qwen"),
    ("NARWHAL_UCX_TCP_PORT_RANGE", "30100-30000"),
    ("NARWHAL_BLOCK_SIZE", "100"),
    ("NARWHAL_GPU_MEMORY_UTILIZATION", "NaN"),
])
def test_any_bad_global_engine_value_is_reported_without_engines(name: str, value: str) -> None:
    text = valid_env(**{name: value, "NARWHAL_NODE_1_SSH": None, "NARWHAL_NODE_2_SSH": None,
                        "NARWHAL_NODE_2_SSH_PASSWORD": None}) + "not a line\n"
    assert name in _fields(text)


def test_a_global_every_engine_overrides_is_still_checked() -> None:
    text = valid_env(NARWHAL_ENGINE_PORT="notaport", NARWHAL_NODE_1_ENGINE_PORT="8000",
                     NARWHAL_NODE_2_ENGINE_PORT="8001")
    assert "NARWHAL_ENGINE_PORT" in _fields(text)


def test_a_bad_global_shared_by_engines_is_reported_once() -> None:
    with pytest.raises(InputError) as caught:
        parse_inputs(valid_env(NARWHAL_ENGINE_PORT="notaport"), SOURCE)
    assert [p.field for p in caught.value.problems].count("NARWHAL_ENGINE_PORT") == 1


def test_narwhal_inputs_prints_the_global_problem(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    env = tmp_path / ".env"
    env.write_text(NO_ENGINE)
    env.chmod(0o600)
    assert main(["inputs", "--env", str(env)]) == 2
    assert "NARWHAL_ENGINE_PORT" in capsys.readouterr().err
