"""A valid `.env` resolves to typed inputs with NODE overrides applied and secrets wrapped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from narwhal.core.secret import MASK, Secret
from narwhal.deploy.cli.main import main
from narwhal.deploy.inputs import parse_inputs
from tests.envtext import valid_env


def test_node_override_wins_over_global() -> None:
    inputs = parse_inputs(valid_env(NARWHAL_NODE_2_ENGINE_PORT="8100"), Path(".env"))
    assert [e.engine_port for e in inputs.engines] == [8000, 8100]


def test_router_defaults_to_the_lowest_engine_host() -> None:
    inputs = parse_inputs(valid_env(NARWHAL_ROUTER_SSH=None), Path(".env"))
    assert inputs.router.ssh.text == "root@10.213.0.11"


def test_passwords_and_keys_are_secrets_with_masked_forms() -> None:
    inputs = parse_inputs(valid_env(), Path(".env"))
    password = inputs.engines[1].ssh_password
    assert isinstance(password, Secret)
    assert str(password) == MASK and "correct-horse" not in repr(password)
    assert "correct-horse" not in repr(inputs) and "sk-engine" not in repr(inputs)
    assert {s.name for s in inputs.secrets()} == {"NARWHAL_NODE_2_SSH_PASSWORD",
                                                  "NARWHAL_ENGINE_KEY"}


def test_inputs_json_masks_secrets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = tmp_path / ".env"
    env.write_text(valid_env())
    env.chmod(0o600)
    assert main(["inputs", "--env", str(env), "--json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out)
    assert data["engines"][1]["ssh_password"] == MASK
    assert "correct-horse" not in out and "sk-engine" not in out


def test_env_with_secrets_must_be_private(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    env = tmp_path / ".env"
    env.write_text(valid_env())
    env.chmod(0o644)
    assert main(["inputs", "--env", str(env)]) == 2
    assert "chmod 600" in capsys.readouterr().err


def test_init_writes_a_private_template_once(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    assert main(["init", "--env", str(env)]) == 0
    assert env.stat().st_mode & 0o777 == 0o600
    first = env.read_text()
    assert "NARWHAL_NODE_1_SSH=" in first
    assert main(["init", "--env", str(env)]) == 2
    assert env.read_text() == first


def test_quoted_values_keep_spaces_and_no_expansion() -> None:
    text = valid_env(NARWHAL_NODE_2_SSH_PASSWORD=None) + \
        "NARWHAL_NODE_2_SSH_PASSWORD='pa ss $HOME'\n"
    inputs = parse_inputs(text, Path(".env"))
    password = inputs.engines[1].ssh_password
    assert password is not None and password.reveal() == "pa ss $HOME"


def test_kv_buffer_device_reaches_each_engines_kv_transfer_config() -> None:
    """A CPU engine needs NIXL to stage KV in host memory; a node may differ from the fleet."""
    from narwhal.deploy.gates.discover_checks import EnginePlan
    from narwhal.deploy.gates.generated import launch_record

    inputs = parse_inputs(valid_env(NARWHAL_KV_BUFFER_DEVICE="cpu",
                                    NARWHAL_NODE_2_KV_BUFFER_DEVICE="cuda"), Path(".env"))
    assert [e.kv_buffer_device for e in inputs.engines] == ["cpu", "cuda"]
    unset = parse_inputs(valid_env(), Path(".env"))
    configs = []
    for engine in (*inputs.engines, unset.engines[0]):
        plan = EnginePlan(engine, "node")
        plan.fabric_address, plan.accelerator = "10.0.0.5", "none"
        plan.image, plan.model = {"id": "sha256:" + "a" * 64}, {"model_tree_sha256": "b" * 64}
        configs.append(launch_record(inputs, plan)["kv_transfer_config"])
    assert [c.get("kv_buffer_device") for c in configs] == ["cpu", "cuda", None]
    assert all(c["kv_role"] == "kv_both" for c in configs)
