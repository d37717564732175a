"""`narwhal kv plan` and `narwhal kv pair`: what an operator sees and the exit codes scripts use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from narwhal.deploy.cli.main import main
from tests.unit.kv.helpers import FIXTURES, LLAMA

LLAMA_CFG = str(FIXTURES / "llama-3.1-8b.config.json")


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse refuses malformed flags with exit 2
        return int(exc.code or 0)


def write_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, *extra: str) -> str:
    assert run(["kv", "plan", "--config", LLAMA_CFG, "--model", LLAMA, "--name", name,
                "--json", *extra]) == 0
    path = tmp_path / f"{name}.json"
    path.write_text(capsys.readouterr().out)
    return str(path)


def test_plan_table_shows_geometry_hash_and_budget(capsys: pytest.CaptureFixture[str]) -> None:
    code = run(["kv", "plan", "--config", LLAMA_CFG, "--model", LLAMA, "--tp", "8",
                "--prompt-tokens", "1000"])
    out = capsys.readouterr().out
    assert code == 0
    assert "c0e418084b28399f9e8e87432772956394198b766dfba122253930180e1d32fd" in out
    assert "16,515,072" in out and "132,120,576" in out and "32 x 8,192" in out


def test_plan_json_is_a_stamped_document_with_hash_and_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = run(["kv", "plan", "--config", LLAMA_CFG, "--model", LLAMA, "--json",
                "--prompt-tokens", "129", "--burst", "2", "--transfer-budget-s", "0.5"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (doc["schema"], doc["schema_version"]) == ("narwhal.kv-plan", 1)
    assert doc["geometry"]["compatibility_hash"].startswith("c0e41808")
    assert doc["request"]["total_bytes"] == 9 * 2097152
    assert doc["budget"]["required_gbps"] == pytest.approx(8 * 9 * 2097152 * 4 * 1.25 / 1e9)


def test_pair_of_identical_engines_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = write_plan(tmp_path, capsys, "p"), write_plan(tmp_path, capsys, "d", "--tp", "4")
    assert run(["kv", "pair", a, b]) == 0
    out = capsys.readouterr().out
    assert "p -> d: compatible" in out and "d -> p: compatible" in out


def test_pair_with_a_hash_mismatch_exits_1_and_names_factor_and_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_plan(tmp_path, capsys, "p")
    b = write_plan(tmp_path, capsys, "d", "--disable-hybrid-kv-cache-manager")
    assert run(["kv", "pair", a, b, "--json"]) == 1
    verdicts = json.loads(capsys.readouterr().out)
    assert [v["compatible"] for v in verdicts] == [False, False]
    finding = verdicts[0]["findings"][0]
    assert (finding["factor"], finding["producer"], finding["consumer"]) == ("is_hma_enabled",
                                                                             "p", "d")
    assert "--disable-hybrid-kv-cache-manager" in finding["fix"]


@pytest.mark.parametrize(("argv", "needle"), [
    (["--tp", "3"], "TP 3 is invalid"),
    (["--tp", "0"], "tensor_parallel_size"),
    (["--vllm-version", "0.31.0"], "0.31.0"),
    (["--kv-cache-dtype", "fp4"], "kv_cache_dtype"),
    (["--kv-cache-layout", "HND_FLASH"], "kv_cache_layout"),
    (["--dtype", "int8"], "dtype"),
    (["--transfer-mode", "both"], "transfer_mode"),
    (["--attention-backend", "NOPE"], "attention_backend"),
    (["--attention-backend", "FLASHMLA"], "cannot serve this model"),
    (["--block-size", "8"], "no FLASH_ATTN kernel"),
    (["--headroom", "0.5"], "--headroom"),
    (["--prompt-tokens", "0"], "--prompt-tokens (prompt_tokens)"),
    (["--handoffs-per-s", "nan"], "handoffs_per_s"),
    (["--speculative-config", "{not json"], "--speculative-config"),
    (["--speculative-config", '{"method": "eagle", "typo": 1}'], "speculative.typo"),
])
def test_every_bad_plan_input_exits_2_and_says_which(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["kv", "plan", "--config", LLAMA_CFG, "--model", LLAMA, *argv]) == 2
    assert needle in capsys.readouterr().err


def test_plan_without_model_exits_2_explaining_the_model_is_hashed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["kv", "plan", "--config", LLAMA_CFG]) == 2
    assert "hashes the --model string verbatim" in capsys.readouterr().err


@pytest.mark.parametrize("content", [None, "{broken", "[1, 2]", '{"model_type": "llama"}'])
def test_unreadable_or_incomplete_config_exits_2(
    content: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    assert run(["kv", "plan", "--config", str(path), "--model", "m"]) == 2
    assert "problem(s)" in capsys.readouterr().err


def test_pair_with_a_document_that_is_not_a_kv_plan_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write_plan(tmp_path, capsys, "p")
    other = tmp_path / "other.json"
    other.write_text('{"schema": "narwhal.fleet", "schema_version": 1}')
    assert run(["kv", "pair", good, str(other)]) == 2
    assert "expected narwhal.kv-plan v1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("model_config", "num_hidden_layers", 16, "model_config_digest"),
        ("geometry", "block_size", 32, "differs from what this Narwhal revision predicts"),
    ],
    ids=["edited-config", "edited-prediction"],
)
def test_pair_with_a_hand_edited_document_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, key: str, value: int,
    message: str,
) -> None:
    a, b = write_plan(tmp_path, capsys, "p"), write_plan(tmp_path, capsys, "d")
    doc = json.loads(Path(b).read_text())
    doc[section][key] = value
    Path(b).write_text(json.dumps(doc))
    assert run(["kv", "pair", a, b]) == 2
    assert message in capsys.readouterr().err


def test_pair_of_two_documents_with_the_same_engine_name_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_plan(tmp_path, capsys, "p")
    assert run(["kv", "pair", a, a]) == 2
    assert "give each engine its own --name" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["kv", "pair", "/nonexistent/a.json", "/nonexistent/b.json"],
                                  ["kv", "plan"], ["kv", "plan", "--config", "x", "--tp", "two"],
                                  ["kv"]])
def test_missing_files_and_malformed_flags_exit_2(argv: list[str]) -> None:
    assert run(argv) == 2


def test_a_misspelt_launch_key_in_a_plan_document_is_named_with_the_keys_allowed_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = write_plan(tmp_path, capsys, "p"), write_plan(tmp_path, capsys, "d")
    doc = json.loads(Path(b).read_text())
    doc["launch"]["block_sise"] = doc["launch"].pop("block_size")
    Path(b).write_text(json.dumps(doc))
    assert run(["kv", "pair", a, b]) == 2
    err = capsys.readouterr().err
    assert "launch.block_sise: unknown key" in err
    assert "allowed keys here: name, vllm_version, model" in err and "block_size" in err


def test_a_bad_flag_names_the_flag_and_the_plan_field_it_sets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["kv", "plan", "--config", LLAMA_CFG, "--model", LLAMA, "--tp", "0"]) == 2
    assert "--tp (tensor_parallel_size): input should be greater than or equal to 1; " \
           "raise the value" in capsys.readouterr().err


def test_a_config_that_is_not_json_names_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "model_type": }')
    assert run(["kv", "plan", "--config", str(path), "--model", "m"]) == 2
    assert "line 2 column 17: not JSON" in capsys.readouterr().err
