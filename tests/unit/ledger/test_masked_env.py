"""Every attempt keeps the `.env` it ran from, every variable named and no secret value in it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from narwhal.core.documents import sha256_bytes
from narwhal.core.secret import MASK
from narwhal.deploy.actions.context import Context
from narwhal.deploy.inputs.envfile import parse_env_text
from narwhal.deploy.inputs.masked import masked_env
from tests.envtext import valid_env

PASSWORD = "correct-horse-battery"
ENGINE_KEY = "sk-engine-ffffffff"
HF_TOKEN = "hf_workstationTOKEN123"
ENGINE_ENV_TOKEN = "wandb-ENGINE-env-secret-42"
SECRETS = (PASSWORD, ENGINE_KEY, HF_TOKEN, ENGINE_ENV_TOKEN)
ENGINE_ENV = json.dumps({"WANDB_API_KEY": ENGINE_ENV_TOKEN, "VLLM_LOGGING_LEVEL": "INFO"})


def _env_text() -> str:
    return "# the lab fleet; old key was sk-engine-00000000\n" + valid_env(
        NARWHAL_NODE_2_SSH_PASSWORD=PASSWORD, NARWHAL_ENGINE_KEY=ENGINE_KEY,
        NARWHAL_HF_TOKEN=HF_TOKEN, NARWHAL_ENGINE_ENV=f"'{ENGINE_ENV}'")


def test_an_attempt_keeps_the_env_it_ran_from_with_every_secret_masked(tmp_path: Path) -> None:
    """Opened the way every command opens one (Context.load), a gate attempt and an activity
    attempt each hold env.masked: every variable, no secret value, mode 0600, its sha256 in
    attempt.json."""
    env = tmp_path / ".env"
    env.write_text(_env_text())
    env.chmod(0o600)
    ctx = Context.load(argparse.Namespace(env=env, runs=tmp_path / "runs", ssh_config=None))
    names = {entry.key for entry in parse_env_text(_env_text())[0]}
    for step in ("discover", "access"):
        with ctx.ledger.attempt(step, fingerprint={}, hosts={}) as attempt:
            pass
        path = attempt.folder / "env.masked"
        data = path.read_bytes()
        assert path.stat().st_mode & 0o777 == 0o600
        kept = {entry.key: entry.value for entry in parse_env_text(data.decode())[0]}
        assert set(kept) == names
        for secret in SECRETS:
            assert secret.encode() not in data
        assert b"sk-engine-00000000" not in data  # a comment is withheld: it is free text
        assert kept["NARWHAL_NODE_2_SSH_PASSWORD"] == kept["NARWHAL_ENGINE_KEY"] == MASK
        assert kept["NARWHAL_HF_TOKEN"] == MASK
        assert json.loads(kept["NARWHAL_ENGINE_ENV"]) == {"WANDB_API_KEY": MASK,
                                                          "VLLM_LOGGING_LEVEL": "INFO"}
        doc = json.loads((attempt.folder / "attempt.json").read_text())
        assert doc["artifacts"]["env.masked"] == sha256_bytes(data)


def test_the_masked_copy_reads_back_as_the_same_values_on_the_same_lines() -> None:
    """Values that need quoting stay one value, and line N of the copy is line N of the .env,
    so a problem that names a line can be found in the copy."""
    text = ("export NARWHAL_MODEL_DIR='/srv/models/a b'\n\n# note\n"
            'NARWHAL_ENGINE_ARGS=\'["--max-model-len", "4096"]\'\n'
            "NARWHAL_NODE_3_ENGINE_ENV='{\"HF_TOKEN\": \"x\\\\y\", \"N\": \"it\\u0027s\"}'\n")
    copy = masked_env(text)
    before = parse_env_text(text)[0]
    after = parse_env_text(copy)[0]
    assert [(e.key, e.line) for e in after] == [(e.key, e.line) for e in before]
    assert after[0].value == "/srv/models/a b"
    assert after[1].value == before[1].value
    assert json.loads(after[2].value) == {"HF_TOKEN": MASK, "N": "it's"}
    assert copy.splitlines()[2] == "#"
