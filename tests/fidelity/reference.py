"""What real vLLM 0.32.0 answered, read from the captures in tests/fixtures/vllm-0.32.0.

The fidelity checks compare any engine with these files, and the real tier compares the live
engines with them too, so the reference cannot drift from vLLM without a test failing.
`python -m tests.real.capture` rewrites them.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.fidelity.client import sse_events

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"


def path(name: str) -> Path:
    return CAPTURES / name


def text(name: str) -> str:
    return path(name).read_text()


@cache
def document(name: str) -> Any:
    """A captured JSON reply, decoded."""
    return json.loads(path(name).read_bytes())


@cache
def stream(name: str) -> tuple[Any, ...]:
    """A captured SSE reply as decoded JSON chunks, without the final [DONE]."""
    events = sse_events(text(name))
    assert events[-1] == "[DONE]", f"{name} does not end with [DONE]"
    return tuple(json.loads(e) for e in events[:-1])


@cache
def manifest() -> dict[str, Any]:
    data: dict[str, Any] = document("capture.json")
    return data


def metric_samples(body: str) -> dict[str, frozenset[str]]:
    """Sample name -> label names, for every sample of a Prometheus text body."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in out.items()}


@cache
def vllm_metric_samples() -> dict[str, frozenset[str]]:
    """The vllm:* samples (and process_start_time_seconds) of an idle NIXL engine."""
    samples = metric_samples(text("metrics-idle.txt"))
    return {name: labels for name, labels in samples.items()
            if name.startswith("vllm:") or name == "process_start_time_seconds"}


def cache_config_labels() -> frozenset[str]:
    """Every label of vllm:cache_config_info, as vLLM 0.32.0 writes it."""
    return vllm_metric_samples()["vllm:cache_config_info"]
