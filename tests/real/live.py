"""Helpers the real-tier tests share: the launch plan core/kv predicts from, prompts, counters.

The plan is written from the same constants `engines.py` launches with, so a prediction and the
engine it is compared with can only disagree if core/kv (or vLLM) is wrong.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from narwhal.core.kv.geometry import Geometry, plan_geometry
from narwhal.core.kv.plan import LaunchPlan
from tests.fidelity import client
from tests.fidelity.requests import SERVED_NAME
from tests.real.engines import KV_CACHE_MEMORY_BYTES, MAX_MODEL_LEN, free_port
from tests.real.session import Pair

# Token ids 0-2 are <s>, </s> and <pad>; prompts use the rest of the 432-token vocabulary.
FIRST_ORDINARY_TOKEN = 3


def launch_plan(pair: Pair, name: str, version: str) -> LaunchPlan:
    """The plan each engine of the pair was launched with, as core/kv reads a plan."""
    return LaunchPlan(
        name=name, vllm_version=version, model=str(pair.model), dtype="float32",
        attention_backend="CPU_ATTN", max_model_len=MAX_MODEL_LEN,
        available_kv_bytes=KV_CACHE_MEMORY_BYTES)


def predicted(pair: Pair, name: str, version: str) -> Geometry:
    return plan_geometry(pair.model_config(), launch_plan(pair, name, version))


def prompt_ids(seed: int, length: int, vocab: int = 432) -> list[int]:
    """A reproducible prompt of `length` token ids; distinct seeds share no cached block."""
    rng = random.Random(seed)
    return [rng.randrange(FIRST_ORDINARY_TOKEN, vocab) for _ in range(length)]


def completion(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/completions and insist on 200; the failure message carries vLLM's body."""
    reply = client.post(f"{url}/v1/completions", {"model": SERVED_NAME, **body})
    assert reply.status == 200, f"{url} answered {reply.status}: {reply.text[:500]}"
    data: dict[str, Any] = reply.json()
    return data


class Counters:
    """A /metrics snapshot: sample values by name and labels (engine/model labels ignored)."""

    def __init__(self, text: str) -> None:
        self.values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = frozenset((k, v) for k, v in sample.labels.items()
                                   if k not in ("engine", "model_name"))
                self.values[(sample.name, labels)] = sample.value

    @classmethod
    def read(cls, url: str) -> Counters:
        return cls(client.get(f"{url}/metrics").text)

    def get(self, name: str, **labels: str) -> float:
        return self.values.get((name, frozenset(labels.items())), 0.0)

    def delta(self, before: Counters, name: str, **labels: str) -> float:
        return self.get(name, **labels) - before.get(name, **labels)


def by_source(after: Counters, before: Counters) -> dict[str, float]:
    """Prompt tokens per source between two snapshots."""
    return {source: after.delta(before, "vllm:prompt_tokens_by_source_total", source=source)
            for source in ("local_compute", "local_cache_hit", "external_kv_transfer")}


def settled(url: str, name: str, quiet_s: float = 2.0, limit_s: float = 15.0) -> float:
    """The value of counter `name` once it has not moved for `quiet_s` (vLLM reports NIXL
    failures to the API server asynchronously, up to a second or two after the reply)."""
    deadline = time.monotonic() + limit_s
    value = Counters.read(url).get(name)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        again = Counters.read(url).get(name)
        if again == value:
            return value
        value = again
    raise AssertionError(f"{name} on {url} still moving after {limit_s} s (last {value})")


@contextlib.contextmanager
def serving(folder: Path, fleet: dict[str, Any]) -> Iterator[int]:
    """narwhal-serve on `fleet` (written to folder/fleet.json, its log to folder/router.log):
    its port once /ready answers 200; stopped by its pid on the way out."""
    (folder / "fleet.json").write_text(json.dumps(fleet))
    port = free_port()
    with (folder / "router.log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "narwhal.serve.serve_cli", "--fleet",
                                 str(folder / "fleet.json"), "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=log)
    try:
        for _ in range(300):
            with contextlib.suppress(OSError):
                if client.get(f"http://127.0.0.1:{port}/ready").status == 200:
                    break
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
