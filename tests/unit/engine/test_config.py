"""`vllm serve` flags as the emulator parses them: what launch scripts write, and their typos."""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal.lab.engine.config import DEFAULT_VLLM_VERSION, StartupError, parse_config
from narwhal.lab.engine.engine_plan import build_plan
from narwhal.lab.engine.model_dir import load_model_dir
from tests.unit.engine.helpers import config, llama8b, plan, tiny


def test_a_vllm_serve_command_line_is_understood(tmp_path: Path) -> None:
    model = tiny(tmp_path)
    cfg = config(model, "--served-model-name", "tiny-llama", "tl", "--port", "8100",
                 "-tp", "1", "--max-model-len", "512", "--dtype", "float32",
                 "--block-size", "16", "--max-num-seqs", "4", "--enforce-eager",
                 "--no-enable-prefix-caching", "--kv-cache-memory-bytes", "64M", "--seed", "7",
                 "--disable-log-requests", "--gpu-memory-utilization", "0.8")
    assert cfg.served_model_names == ("tiny-llama", "tl")
    assert cfg.model == str(model)
    assert cfg.serve.port == 8100
    assert cfg.serve.max_model_len == 512
    assert cfg.serve.kv_cache_memory_bytes == 64 * 2**20
    assert cfg.serve.max_num_seqs == 4
    assert cfg.args.enable_prefix_caching is False
    assert cfg.dtype == "float32"
    assert cfg.vllm_version == DEFAULT_VLLM_VERSION


def test_model_may_be_given_with_dash_dash_model_and_underscored_flags(tmp_path: Path) -> None:
    model = tiny(tmp_path)
    cfg = parse_config(["--model", str(model), "--max_model_len=256", "--tensor_parallel_size",
                        "2"], {})
    assert cfg.model == str(model)
    assert cfg.serve.max_model_len == 256
    assert cfg.args.tensor_parallel_size == 2


def test_sizes_follow_vllm_units(tmp_path: Path) -> None:
    model = tiny(tmp_path)
    assert config(model, "--kv-cache-memory-bytes", "1G").serve.kv_cache_memory_bytes == 2**30
    assert config(model, "--kv-cache-memory-bytes", "1g").serve.kv_cache_memory_bytes == 10**9
    assert config(model, "--max-model-len", "1k").serve.max_model_len == 1000


def test_an_unknown_flag_exits_2_naming_it(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        config(tiny(tmp_path), "--max-modle-len", "512")
    assert exc.value.code == 2
    assert "unrecognized arguments: --max-modle-len" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "named"), [
    (["--kv-transfer-config", "{not json"], "--kv-transfer-config"),
    (["--kv-transfer-config", "[1, 2]"], "--kv-transfer-config"),
    (["--kv-transfer-config", '{"kv_connector": "NixlConnector"}'], "kv_role"),
    (["--kv-transfer-config", '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}'],
     "LMCacheConnectorV1"),
    (["--kv-transfer-config", '{"kv_conector": "NixlConnector"}'], "kv_conector"),
    (["--kv-transfer-config", '{"kv_connector": "NixlConnector", "kv_role": "kv_boss"}'],
     "kv_boss"),
    (["--tensor-parallel-size", "0"], "--tensor-parallel-size"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
    (["--kv-cache-memory-bytes", "lots"], "--kv-cache-memory-bytes"),
    (["--dtype", "int8"], "--dtype"),
    (["--emu-prefill-a", "nan"], "--emu-prefill-a"),
    (["--emu-timing-profile", "/nonexistent/profile.json"], "--emu-timing-profile"),
])
def test_bad_flag_values_exit_2_naming_the_flag(tmp_path: Path, flags: list[str], named: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        config(tiny(tmp_path), *flags)
    assert exc.value.code == 2
    assert named in capsys.readouterr().err


def test_no_model_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(["serve", "--port", "8000"], {})
    assert exc.value.code == 2
    assert "model is required" in capsys.readouterr().err


def test_a_directory_without_config_json_is_refused_naming_model(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match=r"--model: .*has no config.json"):
        parse_config(["serve", str(tmp_path / "missing")], {})


def test_nixl_environment_is_read_once(tmp_path: Path) -> None:
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.5", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5611",
           "UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth1", "HOME": "/root"}
    cfg = config(tiny(tmp_path), "--kv-transfer-config",
                 '{"kv_connector": "NixlConnector", "kv_role": "kv_both", "engine_id": "e1"}',
                 env=env)
    assert (cfg.side_channel_host, cfg.side_channel_port) == ("10.0.0.5", 5611)
    assert dict(cfg.ucx_env) == {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth1"}
    assert cfg.engine_id == "e1"
    assert cfg.kv_role == "kv_both"
    assert cfg.transfer_mode == "pull"


def test_a_bad_side_channel_port_exits_2(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        config(tiny(tmp_path), env={"VLLM_NIXL_SIDE_CHANNEL_PORT": "http"})
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" in capsys.readouterr().err


def test_tp_that_does_not_divide_the_heads_fails_with_core_kv_error(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match=r"TP 3 is invalid: num_attention_heads 4"):
        plan(tiny(tmp_path), "-tp", "3")


def test_max_model_len_above_the_config_is_refused_unless_allowed(tmp_path: Path) -> None:
    model = tiny(tmp_path)
    with pytest.raises(StartupError, match=r"--max-model-len: User-specified max_model_len "
                                           r"\(4096\) is greater"):
        plan(model, "--max-model-len", "4096")
    allowed = plan(model, "--max-model-len", "4096", env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert allowed.max_model_len == 4096


def test_kv_memory_too_small_for_one_request_fails_like_vllm(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match=r"To serve at least one request"):
        plan(llama8b(tmp_path), "--kv-cache-memory-bytes", "16M")


def test_an_unmodelled_vllm_version_is_refused(tmp_path: Path) -> None:
    cfg = config(tiny(tmp_path), "--emu-vllm-version", "0.1.0")
    with pytest.raises(StartupError, match=r"0\.1\.0"):
        build_plan(cfg, load_model_dir(cfg.model_dir))
