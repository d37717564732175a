"""Is the engine idle, and how much has it done so far (`narwhal-engine idle`)?

Gate D measures a fabric edge only while every engine is idle, and proves it from each
engine's own /metrics before and after the sample: nothing running or waiting at either
moment, and no request, token or NIXL transfer counted in between (the counters are
cumulative, so traffic that came and went during the sample still shows).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

from narwhal.core.errors import HostUnreachable
from narwhal.core.kv.capture.endpoints import metric_sum

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
            "vllm:request_success_total", "vllm:nixl_xfer_time_seconds_count")
MAX_METRICS_BYTES = 8 << 20


def activity(plan: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
    """The engine's load gauges and cumulative counters now (absent families are left out)."""
    url = f"{plan['url']}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:  # noqa: S310 - loopback
            text = reply.read(MAX_METRICS_BYTES).decode("utf-8", "replace")
    except (OSError, urllib.error.URLError) as exc:
        raise HostUnreachable(plan["engine"], f"{url} did not answer ({exc})") from None
    values = {name: metric_sum(text, name) for name in (*GAUGES, *COUNTERS)}
    busy = {name: v for name in GAUGES if (v := values[name]) is not None and v > 0}
    return {"engine": plan["engine"], "idle": not busy, "busy": busy,
            "gauges": {n: values[n] for n in GAUGES if values[n] is not None},
            "counters": {n: values[n] for n in COUNTERS if values[n] is not None}}
