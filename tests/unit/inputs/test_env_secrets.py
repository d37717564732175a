"""A credential inside NARWHAL_ENGINE_ENV is a secret like any other.

Issue 13 item 6, defect 5: `narwhal inputs --json` printed an ENGINE_ENV HF_TOKEN in clear, and
the ledger's redactor did not know it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from narwhal.core.errors import InputError
from narwhal.core.secret import MASK, Secret
from narwhal.deploy.cli.main import main
from narwhal.deploy.gates.registry import env_fingerprints
from narwhal.deploy.inputs import parse_inputs
from narwhal.deploy.ledger.evidence import Redactor
from tests.envtext import valid_env

TOKEN = "hf_QzTokenValue8675309"
ROOT = Path(__file__).resolve().parents[3]
CLI = "import sys; from narwhal.deploy.cli import main; sys.exit(main(sys.argv[1:]))"


def _env(tmp_path: Path, **overrides: str | None) -> Path:
    path = tmp_path / ".env"
    engine_env = json.dumps({"HF_TOKEN": TOKEN, "WANDB_API_KEY": TOKEN + "w",
                             "VLLM_ATTENTION_BACKEND": "FLASH_ATTN"})
    path.write_text(valid_env(NARWHAL_ENGINE_ENV=f"'{engine_env}'", **overrides))
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("argv", [["inputs", "--json"], ["inputs"]], ids=["json", "table"])
def test_an_engine_env_token_never_appears_in_inputs_output(
        tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--env", str(_env(tmp_path))]) == 0
    out, err = capsys.readouterr()
    assert TOKEN not in out and TOKEN not in err
    if "--json" in argv:
        env = json.loads(out)["engines"][0]["engine_env"]
        assert env == {"HF_TOKEN": MASK, "WANDB_API_KEY": MASK,
                       "VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}
    else:
        assert "NARWHAL_ENGINE_ENV[HF_TOKEN]" in out


def test_the_installed_cli_does_not_print_the_token(tmp_path: Path) -> None:
    env = _env(tmp_path)
    for extra in (["--json"], []):
        done = subprocess.run([sys.executable, "-c", CLI, "inputs", "--env", str(env), *extra],
                              capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert TOKEN not in done.stdout + done.stderr


def test_an_engine_env_token_is_a_known_secret_the_ledger_masks(tmp_path: Path) -> None:
    inputs = parse_inputs(_env(tmp_path).read_text(), Path(".env"))
    value = inputs.engines[0].engine_env["HF_TOKEN"]  # type: ignore[index]
    assert isinstance(value, Secret) and value.reveal() == TOKEN
    assert TOKEN in {s.reveal() for s in inputs.secrets()}
    assert "NARWHAL_ENGINE_ENV[HF_TOKEN]" in {s.name for s in inputs.secrets()}
    assert TOKEN not in Redactor(inputs.secrets()).text(f"curl -H 'Bearer {TOKEN}'")
    assert TOKEN not in repr(inputs) and TOKEN not in json.dumps(env_fingerprints(inputs))


def test_a_file_holding_an_engine_env_token_must_be_private(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = _env(tmp_path, NARWHAL_NODE_2_SSH_PASSWORD=None, NARWHAL_ENGINE_KEY=None)
    env.chmod(0o644)
    assert main(["inputs", "--env", str(env)]) == 2
    assert "chmod 600" in capsys.readouterr().err


def test_problems_in_engine_env_never_quote_a_secret_value() -> None:
    raw = json.dumps({"HF_TOKEN": TOKEN + ";x", "OK": "fine"})
    with pytest.raises(InputError) as err:
        parse_inputs(valid_env(NARWHAL_ENGINE_ENV=f"'{raw}'"), Path(".env"))
    assert "HF_TOKEN" in str(err.value) and TOKEN not in str(err.value)
    with pytest.raises(InputError) as err:
        parse_inputs(valid_env(NARWHAL_ENGINE_ENV=f"'{raw[:-1]}'"), Path(".env"))  # not JSON
    assert TOKEN not in str(err.value)


@pytest.mark.parametrize(("name", "secret"), [
    ("HF_TOKEN", True), ("HUGGING_FACE_HUB_TOKEN", True), ("WANDB_API_KEY", True),
    ("AWS_SECRET_ACCESS_KEY", True), ("DB_PASSWORD", True), ("hf_token", True),
    ("GITHUBTOKEN", True), ("VLLM_ATTENTION_BACKEND", False), ("TOKENIZERS_PARALLELISM", False),
    ("NCCL_DEBUG", False), ("PYTORCH_CUDA_ALLOC_CONF", False),
])
def test_secret_names_in_engine_env(name: str, secret: bool) -> None:
    from narwhal.deploy.inputs.secretnames import is_secret_env_name

    assert is_secret_env_name(name) is secret
