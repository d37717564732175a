"""/metrics and /version replies: cache_config_info labels, process start time, vLLM version.

`vllm:cache_config_info` is a gauge whose labels are the engine's CacheConfig stringified; the
process start time binds a capture to one engine generation (a restart changes it), so a reply
without it is refused rather than treated as "unknown".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from narwhal.core.errors import ContractError

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'\s*(?P<key>[A-Za-z_][A-Za-z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True)
class CacheConfigInfo:
    """The labels of one engine's vllm:cache_config_info sample."""

    labels: dict[str, str]

    def int_label(self, key: str) -> int | None:
        value = self.labels.get(key)
        if value is None or value == "None":
            return None
        try:
            return int(value)
        except ValueError:
            raise ContractError(
                f"cache_config_info label {key}={value!r} is not an integer") from None


def _labels(raw: str, line: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(raw):
        m = _LABEL.match(raw, pos)
        if m is None:
            raise ContractError(f"cannot read the labels of metrics line {line!r}")
        value = re.sub(r"\\\\|\\\"|\\n", lambda e: _UNESCAPE[e.group(0)], m["value"])
        out[m["key"]] = value
        pos = m.end()
    return out


def _samples(text: str, name: str) -> list[tuple[dict[str, str], str]]:
    found = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m and m["name"] == name:
            found.append((_labels(m["labels"] or "", line), m["value"]))
    return found


def parse_cache_config_info(text: str) -> list[CacheConfigInfo]:
    """Every vllm:cache_config_info sample (one per engine behind the API server)."""
    samples = _samples(text, "vllm:cache_config_info")
    if not samples:
        raise ContractError("/metrics has no vllm:cache_config_info sample; is this a vLLM "
                            "engine's /metrics endpoint?")
    return [CacheConfigInfo(labels) for labels, _ in samples]


def parse_process_start_time(text: str) -> float:
    """process_start_time_seconds: the engine generation a capture belongs to."""
    samples = _samples(text, "process_start_time_seconds")
    if len(samples) != 1:
        raise ContractError(f"/metrics has {len(samples)} process_start_time_seconds samples, "
                            "expected exactly 1; without it a restart cannot be detected")
    try:
        return float(samples[0][1])
    except ValueError:
        raise ContractError(
            f"process_start_time_seconds {samples[0][1]!r} is not a number") from None


def parse_version_reply(body: str | bytes) -> str:
    """The `version` of a /version reply: hash factor vllm_version, verbatim."""
    try:
        data = json.loads(body)
    except ValueError:
        raise ContractError("/version reply is not JSON") from None
    version = data.get("version") if isinstance(data, dict) else None
    if not isinstance(version, str) or not version:
        raise ContractError(f"/version reply has no version string: {data!r}")
    return version


def metric_sum(text: str, name: str) -> float | None:
    """The sum of every sample of one metric family over its label sets (None: no sample)."""
    samples = _samples(text, name)
    if not samples:
        return None
    try:
        return sum(float(value) for _, value in samples)
    except ValueError:
        raise ContractError(f"/metrics has a non-numeric {name} sample") from None
