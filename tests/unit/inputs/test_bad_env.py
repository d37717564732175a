"""Every bad `.env` gets an error naming the variable, and nothing is written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from narwhal.core.errors import InputError
from narwhal.deploy.cli.main import main
from narwhal.deploy.inputs import parse_inputs
from tests.envtext import valid_env

# (case id, overrides or raw text, the variable the error must name)
CASES: list[tuple[str, dict[str, str | None] | str, str]] = [
    ("missing-revision", {"NARWHAL_DEPLOYMENT_REVISION": None}, "NARWHAL_DEPLOYMENT_REVISION"),
    ("short-revision", {"NARWHAL_DEPLOYMENT_REVISION": "abc123"}, "NARWHAL_DEPLOYMENT_REVISION"),
    ("uppercase-revision", {"NARWHAL_DEPLOYMENT_REVISION": "A" * 40},
     "NARWHAL_DEPLOYMENT_REVISION"),
    ("missing-image", {"NARWHAL_ENGINE_IMAGE": None}, "NARWHAL_ENGINE_IMAGE"),
    ("unpinned-image", {"NARWHAL_ENGINE_IMAGE": "vllm/vllm-openai:latest"},
     "NARWHAL_ENGINE_IMAGE"),
    ("missing-model-dir", {"NARWHAL_MODEL_DIR": None}, "NARWHAL_MODEL_DIR"),
    ("relative-model-dir", {"NARWHAL_MODEL_DIR": "models/qwen"}, "NARWHAL_MODEL_DIR"),
    ("shell-in-run-dir", {"NARWHAL_RUN_DIR": "/srv/run;reboot"}, "NARWHAL_RUN_DIR"),
    ("command-substitution", {"NARWHAL_NODE_1_RUN_DIR": "/srv/$(id)"}, "NARWHAL_NODE_1_RUN_DIR"),
    ("bad-port", {"NARWHAL_ENGINE_PORT": "70000"}, "NARWHAL_ENGINE_PORT"),
    ("kv-buffer-device-unknown", {"NARWHAL_KV_BUFFER_DEVICE": "tpu"}, "NARWHAL_KV_BUFFER_DEVICE"),
    ("kv-buffer-device-smuggled", {"NARWHAL_NODE_2_KV_BUFFER_DEVICE": "cpu,\"kv_role\":\"kv_producer\""},
     "NARWHAL_NODE_2_KV_BUFFER_DEVICE"),
    ("port-zero", {"NARWHAL_ATTEST_PORT": "0"}, "NARWHAL_ATTEST_PORT"),
    ("port-not-number", {"NARWHAL_NIXL_SIDE_CHANNEL_PORT": "56OO"},
     "NARWHAL_NIXL_SIDE_CHANNEL_PORT"),
    ("duplicate-port-one-host", {"NARWHAL_NODE_2_SSH": "root@10.213.0.11",
                                 "NARWHAL_NODE_1_GPU_IDS": "0", "NARWHAL_NODE_2_GPU_IDS": "1"},
     "NARWHAL_ENGINE_PORT"),
    ("engine-equals-attest-port", {"NARWHAL_ATTEST_PORT": "8000"}, "NARWHAL_ATTEST_PORT"),
    ("destination-dash", {"NARWHAL_NODE_1_SSH": "-oProxyCommand=sh"}, "NARWHAL_NODE_1_SSH"),
    ("destination-whitespace", "NARWHAL_NODE_1_SSH='root@ 10.0.0.1'\n", "NARWHAL_NODE_1_SSH"),
    ("destination-metachar", {"NARWHAL_ROUTER_SSH": "root@host;id"}, "NARWHAL_ROUTER_SSH"),
    ("empty-override", {"NARWHAL_NODE_2_ENGINE_PORT": ""}, "NARWHAL_NODE_2_ENGINE_PORT"),
    ("non-numeric-tp", {"NARWHAL_TENSOR_PARALLEL_SIZE": "eight"},
     "NARWHAL_TENSOR_PARALLEL_SIZE"),
    ("zero-tp", {"NARWHAL_NODE_1_TENSOR_PARALLEL_SIZE": "0"},
     "NARWHAL_NODE_1_TENSOR_PARALLEL_SIZE"),
    ("one-engine", {"NARWHAL_NODE_2_SSH": None, "NARWHAL_NODE_2_SSH_PASSWORD": None},
     "NARWHAL_NODE_<n>_SSH"),
    ("typo-variable", {"NARWHAL_ENGINE_PROT": "8000"}, "NARWHAL_ENGINE_PROT"),
    ("unknown-node-field", {"NARWHAL_NODE_1_GPUS": "0"}, "NARWHAL_NODE_1_GPUS"),
    ("leading-zero-node", {"NARWHAL_NODE_01_SSH": "root@10.0.0.9"}, "NARWHAL_NODE_01_SSH"),
    ("node-without-ssh", {"NARWHAL_NODE_3_ENGINE_PORT": "8003"}, "NARWHAL_NODE_3_SSH"),
    ("password-without-ssh", {"NARWHAL_NODE_4_SSH_PASSWORD": "pw-x"},
     "NARWHAL_NODE_4_SSH_PASSWORD"),
    ("bad-dtype", {"NARWHAL_MODEL_DTYPE": "float32"}, "NARWHAL_MODEL_DTYPE"),
    ("block-not-power-of-two", {"NARWHAL_BLOCK_SIZE": "100"}, "NARWHAL_BLOCK_SIZE"),
    ("engine-args-not-list", {"NARWHAL_ENGINE_ARGS": '{"a":1}'}, "NARWHAL_ENGINE_ARGS"),
    ("engine-env-not-object", {"NARWHAL_ENGINE_ENV": '["A"]'}, "NARWHAL_ENGINE_ENV"),
    ("bad-gpu-ids", {"NARWHAL_NODE_1_GPU_IDS": "0,,1"}, "NARWHAL_NODE_1_GPU_IDS"),
    ("colocated-gpus-overlap", {"NARWHAL_NODE_2_SSH": "root@10.213.0.11",
                                "NARWHAL_NODE_1_GPU_IDS": "0,1", "NARWHAL_NODE_2_GPU_IDS": "1",
                                "NARWHAL_NODE_2_ENGINE_PORT": "8001",
                                "NARWHAL_NODE_2_ATTEST_PORT": "8011",
                                "NARWHAL_NODE_2_NIXL_SIDE_CHANNEL_PORT": "5601"},
     "NARWHAL_NODE_2_GPU_IDS"),
    ("bad-port-range", {"NARWHAL_UCX_TCP_PORT_RANGE": "30100-30000"},
     "NARWHAL_UCX_TCP_PORT_RANGE"),
    ("bad-ip", {"NARWHAL_NODE_1_IP": "10.0.0.300"}, "NARWHAL_NODE_1_IP"),
    ("url-with-path", {"NARWHAL_NODE_1_URL": "http://10.0.0.1:8000/v1"}, "NARWHAL_NODE_1_URL"),
    ("url-without-port", {"NARWHAL_NODE_1_URL": "http://10.0.0.1"}, "NARWHAL_NODE_1_URL"),
    ("nan-ttft", {"NARWHAL_TTFT_S": "nan"}, "NARWHAL_TTFT_S"),
    ("negative-tpot", {"NARWHAL_TPOT_S": "-0.1"}, "NARWHAL_TPOT_S"),
    ("bad-transport", {"NARWHAL_TRANSFER_TRANSPORT": "tcp"}, "NARWHAL_TRANSFER_TRANSPORT"),
    ("missing-key-file", {"NARWHAL_SSH_KEY": "/nonexistent/id_ed25519"}, "NARWHAL_SSH_KEY"),
    ("duplicate-line", "NARWHAL_ENGINE_PORT=8000\n", "NARWHAL_ENGINE_PORT"),
    ("unterminated-quote", "NARWHAL_RUN_DIR='/srv/x\n", "NARWHAL_RUN_DIR"),
    ("not-key-value", "this is not a line\n", "line"),
    ("bad-deployment-name", {"NARWHAL_DEPLOYMENT": "Prod_1"}, "NARWHAL_DEPLOYMENT"),
]


def _text(case: dict[str, str | None] | str) -> str:
    return valid_env() + case if isinstance(case, str) else valid_env(**case)


@pytest.mark.parametrize(("case", "variable"), [(c[1], c[2]) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_env_names_the_variable(case: dict[str, str | None] | str, variable: str) -> None:
    with pytest.raises(InputError) as err:
        parse_inputs(_text(case), Path(".env"))
    fields = [p.field for p in err.value.problems]
    # A field is the variable, optionally followed by " (line N)".
    assert any(f.startswith(variable) for f in fields), fields
    for problem in err.value.problems:
        assert problem.fix, problem


def test_there_are_at_least_25_distinct_bad_cases() -> None:
    assert len({c[0] for c in CASES}) >= 25


def test_every_problem_is_reported_in_one_pass() -> None:
    text = valid_env(NARWHAL_ENGINE_PORT="x", NARWHAL_MODEL_DTYPE="fp8",
                     NARWHAL_NODE_1_SSH="-bad", NARWHAL_ENGINE_PROT="1")
    with pytest.raises(InputError) as err:
        parse_inputs(text, Path(".env"))
    fields = {p.field for p in err.value.problems}
    assert {"NARWHAL_ENGINE_PORT", "NARWHAL_MODEL_DTYPE", "NARWHAL_NODE_1_SSH",
            "NARWHAL_ENGINE_PROT"} <= fields


def test_secret_values_never_appear_in_errors() -> None:
    secret = "hunter2 with space"
    text = valid_env(NARWHAL_NODE_2_SSH_PASSWORD=None) + f"NARWHAL_NODE_2_SSH_PASSWORD={secret}\n"
    with pytest.raises(InputError) as err:
        parse_inputs(text, Path(".env"))
    assert "hunter2" not in str(err.value)


@pytest.mark.parametrize(("case", "variable"), [(c[1], c[2]) for c in CASES[:25]],
                         ids=[c[0] for c in CASES[:25]])
def test_cli_exits_2_and_writes_nothing(tmp_path: Path, case: dict[str, str | None] | str,
                                        variable: str, capsys: pytest.CaptureFixture[str]) -> None:
    env = tmp_path / ".env"
    env.write_text(_text(case))
    env.chmod(0o600)
    before = sorted(os.listdir(tmp_path))
    code = main(["status", "--env", str(env), "--runs", str(tmp_path / "runs")])
    assert code == 2
    assert variable.split(" ")[0].split("<")[0] in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == before
