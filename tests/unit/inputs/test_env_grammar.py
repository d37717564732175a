"""Every value has a grammar: checkpoint names, observability and the JSON launch fields.

Issue 13 item 6, defects 3 and 4: MODEL_REPO_ID, MODEL_REVISION, NARWHAL_GRAFANA_BIND_ADDRESS,
NARWHAL_PROMETHEUS_LISTEN_ADDRESS and NARWHAL_SHARED_GPU_ALLOWANCE took anything, and shell
structure inside ENGINE_ARGS, ENGINE_ENV and TRANSFER_DEVICES elements was accepted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from narwhal.core.errors import InputError
from narwhal.deploy.inputs import parse_inputs, refs
from tests.envtext import valid_env

HOSTILE = ["$(reboot)", ";reboot", "`reboot`", "a b", "x|y", "x&y", "x>y"]
KV_CONFIG = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both",
                        "kv_connector_extra_config": {"backends": ["UCX"], "num_threads": 4}})

REPO_BAD = [*HOSTILE, "Qwen", "a/b/c", "-Qwen/x", "Qwen/x-", "Qwen/x.", "Qwen/.x", "Qwen/a..b",
            "Qwen/a--b", "/x", "Qwen/", "Qwen/" + "x" * 97, "Qwén/x"]
REVISION_BAD = [*HOSTILE, "-main", "main/", "/main", "a..b", "a//b", ".hidden", "x/.y",
                "topic.lock", "v1.", "a@{1}", "a~1", "a^", "a:b", "x" * 256]
REPO_GOOD = ["Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.1-8B-Instruct",
             "openai-community/gpt2", "a/" + "x" * 96]
REVISION_GOOD = ["main", "v1.0.2", "refs/pr/12", "release_2024-06",
                 "0123456789abcdef0123456789abcdef01234567"]
BAD: list[tuple[str, str]] = [
    *[("NARWHAL_GRAFANA_BIND_ADDRESS", v) for v in [*HOSTILE, "999.1.1.1", "localhost:3000",
                                                    "[::1]", "fe80::1%$(id)"]],
    *[("NARWHAL_PROMETHEUS_LISTEN_ADDRESS", v) for v in [*HOSTILE, "9090", "0.0.0.0:0",
                                                         "0.0.0.0:65536", "::1:9090",
                                                         "0.0.0.0:9090;id", "h_st:9090"]],
    *[("NARWHAL_SHARED_GPU_ALLOWANCE", v) for v in [*HOSTILE, "yes", "1", "True", "on"]],
]
GOOD: list[tuple[str, str]] = [
    ("NARWHAL_GRAFANA_BIND_ADDRESS", "127.0.0.1"),
    ("NARWHAL_GRAFANA_BIND_ADDRESS", "0.0.0.0"),
    ("NARWHAL_GRAFANA_BIND_ADDRESS", "::1"),
    ("NARWHAL_PROMETHEUS_LISTEN_ADDRESS", "127.0.0.1:9090"),
    ("NARWHAL_PROMETHEUS_LISTEN_ADDRESS", ":9090"),
    ("NARWHAL_PROMETHEUS_LISTEN_ADDRESS", "[::1]:9090"),
    ("NARWHAL_PROMETHEUS_LISTEN_ADDRESS", "localhost:9090"),
    ("NARWHAL_SHARED_GPU_ALLOWANCE", "true"),
    ("NARWHAL_SHARED_GPU_ALLOWANCE", "false"),
]


def _problems(**overrides: str | None) -> list[str]:
    with pytest.raises(InputError) as err:
        parse_inputs(valid_env(**overrides), Path(".env"))
    return [p.line() for p in err.value.problems]


def _quoted(value: str) -> str:
    """value as one .env value: single-quoted (literal) unless it holds a single quote."""
    return f"'{value}'" if "'" not in value else '"' + value.replace('"', '\\"') + '"'


@pytest.mark.parametrize(("key", "value"), BAD, ids=[f"{k}={v[:24]}" for k, v in BAD])
def test_staging_and_observability_values_outside_their_grammar_are_refused(
        key: str, value: str) -> None:
    lines = _problems(**{key: _quoted(value)})
    assert len(lines) == 1 and lines[0].startswith(f"{key}: "), lines


@pytest.mark.parametrize(("key", "value"), GOOD, ids=[f"{k}={v[:24]}" for k, v in GOOD])
def test_what_an_operator_writes_is_accepted(key: str, value: str) -> None:
    parse_inputs(valid_env(**{key: value}), Path(".env"))


def test_accepted_values_are_typed_in_the_inputs() -> None:
    inputs = parse_inputs(valid_env(NARWHAL_GRAFANA_BIND_ADDRESS="127.0.0.1",
                                    NARWHAL_PROMETHEUS_LISTEN_ADDRESS="[::1]:9090",
                                    NARWHAL_SHARED_GPU_ALLOWANCE="true"), Path(".env"))
    assert inputs.grafana_bind_address == "127.0.0.1"
    assert inputs.prometheus_listen_address == "[::1]:9090"
    assert inputs.shared_gpu_allowance is True


@pytest.mark.parametrize("value", REPO_BAD)
def test_a_repo_id_outside_the_hubs_grammar_is_refused_for_checkpoint_staging(value: str) -> None:
    with pytest.raises(ValueError):
        refs.hf_repo_id(value)


@pytest.mark.parametrize("value", REVISION_BAD)
def test_a_revision_outside_gits_grammar_is_refused_for_checkpoint_staging(value: str) -> None:
    with pytest.raises(ValueError):
        refs.git_revision(value)


@pytest.mark.parametrize(("repo", "revision"), zip(REPO_GOOD, REVISION_GOOD[:4], strict=True))
def test_what_an_operator_names_a_checkpoint_with_reads_as_written(repo: str,
                                                                     revision: str) -> None:
    assert refs.hf_repo_id(repo) == repo and refs.git_revision(revision) == revision
    assert refs.git_revision(REVISION_GOOD[4]) == REVISION_GOOD[4]


def test_a_checkpoint_named_by_repo_and_revision_is_what_gate_a_stages() -> None:
    inputs = parse_inputs(valid_env(MODEL_REPO_ID="Qwen/Qwen2.5-0.5B", MODEL_REVISION="v1.0",
                                    HF_ENDPOINT="http://10.0.0.5:8600/"), Path(".env"))
    assert inputs.checkpoint is not None
    assert (inputs.checkpoint.repo_id, inputs.checkpoint.revision,
            inputs.checkpoint.endpoint) == ("Qwen/Qwen2.5-0.5B", "v1.0", "http://10.0.0.5:8600")


def test_a_repo_without_a_revision_stages_main_and_no_repo_stages_nothing() -> None:
    staged = parse_inputs(valid_env(MODEL_REPO_ID="Qwen/Qwen2.5-0.5B"), Path(".env"))
    assert staged.checkpoint is not None and staged.checkpoint.revision == "main"
    assert parse_inputs(valid_env(), Path(".env")).checkpoint is None


@pytest.mark.parametrize("key", ["MODEL_REVISION", "HF_ENDPOINT"])
def test_a_revision_or_hub_without_a_repo_is_refused_naming_the_missing_field(key: str) -> None:
    lines = _problems(**{key: "main" if key == "MODEL_REVISION" else "https://huggingface.co"})
    assert len(lines) == 1 and lines[0].startswith(f"{key}: ") and "MODEL_REPO_ID" in lines[0]


@pytest.mark.parametrize("value", ["ftp://hub:21", "https://user:tok@huggingface.co",
                                   "https://huggingface.co/api", "https://huggingface.co?x=1",
                                   "http://hub:0", "http://hub:99999", "https://:443", "hub:8600",
                                   "http://$(reboot):80", "http://a b:80"])
def test_a_hub_endpoint_that_is_not_just_a_hubs_address_is_refused(value: str) -> None:
    lines = _problems(MODEL_REPO_ID="Qwen/Qwen2.5-0.5B", HF_ENDPOINT=_quoted(value))
    assert len(lines) == 1 and lines[0].startswith("HF_ENDPOINT: "), lines
    assert value not in lines[0], "a hub URL may carry a token: it is never quoted back"


SHELL = [";", "|", "&", "$", "`", "$(", ">", "<", "\n", "\r", "\x00", "\u2028"]


def _element(ch: str) -> str:
    return f"--served-model-name=a{ch}reboot"


@pytest.mark.parametrize("ch", SHELL, ids=[repr(c) for c in SHELL])
def test_shell_structure_in_an_engine_args_element_is_refused(ch: str) -> None:
    value = json.dumps(["--max-model-len=4096", _element(ch)])
    lines = _problems(NARWHAL_ENGINE_ARGS=_quoted(value))
    assert len(lines) == 1 and lines[0].startswith("NARWHAL_ENGINE_ARGS: element 1 "), lines
    named = repr(ch[0]) if ch[0] in ";|&$`<>" else f"U+{ord(ch[0]):04X}"
    assert f"contains {named}" in lines[0], lines


@pytest.mark.parametrize("ch", SHELL, ids=[repr(c) for c in SHELL])
def test_shell_structure_in_an_engine_env_value_is_refused(ch: str) -> None:
    value = json.dumps({"VLLM_LOGGING_LEVEL": "INFO", "NCCL_DEBUG": f"x{ch}id"})
    lines = _problems(NARWHAL_NODE_1_ENGINE_ENV=_quoted(value))
    assert len(lines) == 1, lines
    assert lines[0].startswith("NARWHAL_NODE_1_ENGINE_ENV: the value of NCCL_DEBUG "), lines


@pytest.mark.parametrize("ch", SHELL, ids=[repr(c) for c in SHELL])
def test_shell_structure_in_a_transfer_device_is_refused(ch: str) -> None:
    value = json.dumps(["mlx5_0", f"mlx5_1{ch}id"])
    lines = _problems(NARWHAL_TRANSFER_DEVICES=_quoted(value))
    assert len(lines) == 1 and lines[0].startswith("NARWHAL_TRANSFER_DEVICES: element 1 "), lines


def test_a_credential_flag_in_engine_args_is_refused_without_its_value() -> None:
    for args in (["--api-key", "sk-live-123"], ["--hf-token=hf_live_123"]):
        lines = _problems(NARWHAL_ENGINE_ARGS=_quoted(json.dumps(args)))
        assert len(lines) == 1 and "element 0" in lines[0], lines
        assert "live" not in lines[0]


def test_a_json_object_naming_a_variable_twice_is_refused() -> None:
    lines = _problems(NARWHAL_ENGINE_ENV="'{\"A\":\"1\",\"A\":\"2\"}'")
    assert lines == [lines[0]] and "names 'A' twice" in lines[0]


def test_legitimate_vllm_launch_values_are_kept() -> None:
    args = ["--max-model-len=4096", "--max-num-seqs", "8", "--kv-transfer-config", KV_CONFIG,
            "--served-model-name", "Qwen/Qwen2.5-0.5B-Instruct", "--enforce-eager",
            "--max-num-batched-tokens", "8192", "--tokenizer-mode", "auto"]
    env = {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN", "PYTORCH_CUDA_ALLOC_CONF":
           "expandable_segments:True", "UCX_TLS": "tcp,cuda_copy", "NCCL_DEBUG": "INFO"}
    inputs = parse_inputs(valid_env(NARWHAL_ENGINE_ARGS=_quoted(json.dumps(args)),
                                    NARWHAL_ENGINE_ENV=_quoted(json.dumps(env)),
                                    NARWHAL_TRANSFER_DEVICES='["mlx5_0","mlx5_1:1"]'),
                          Path(".env"))
    engine = inputs.engines[0]
    assert engine.engine_args == tuple(args)
    assert engine.engine_env == env
    assert engine.transfer_devices == ("mlx5_0", "mlx5_1:1")


@pytest.mark.parametrize(("key", "value"), [
    ("NARWHAL_ENGINE_PORT", "1" * 5000),
    ("NARWHAL_NODE_" + "1" * 5000 + "_SSH", "root@10.0.0.9"),
    ("NARWHAL_ENGINE_ARGS", "[" * 100_000),
    ("NARWHAL_ENGINE_ENV", '{"A":' + "9" * 5000 + "}"),
    ("NARWHAL_TTFT_S", "1_0"),
    ("NARWHAL_TTFT_S", "\u0661"),
    ("NARWHAL_NODE_1_IP", "'fe80::1%$(reboot)'"),
    ("NARWHAL_NODE_1_URL", "http://a;b:8000"),
], ids=["huge-port", "huge-node", "deep-json", "huge-json-int", "underscore-float",
        "arabic-digit", "ip-zone-shell", "url-host-shell"])
def test_oversized_and_odd_numbers_are_problems_not_crashes(key: str, value: str) -> None:
    lines = _problems(**{key: value})
    assert lines and all(len(line) < 800 for line in lines), lines
