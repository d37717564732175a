"""The attestation of one live engine: everything Gates A-D established, bound to the process.

Built from Gate C's state in the engine's run dir (the checked run plan, the started
identity, the capture) and re-checked against the live engine on every request: the runtime
identity (container Id and creation, or pid and start ticks), the process start time and the
cache config the engine's own /metrics report now. When any of them differs from what was
attested, the answer is the reason, never a document: a restarted engine is a new process
with a new cache allocation and a new NIXL agent, and its old attestation must not vouch for it.
"""

from __future__ import annotations

import itertools
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.core.cache_layout import CacheLayout, parse_cache_layout
from narwhal.core.documents import canonical_json, digest, sha256_bytes, stamp
from narwhal.core.errors import ContractError
from narwhal.core.kv.capture.endpoints import parse_cache_config_info, parse_process_start_time
from narwhal.core.sidecar_answer import RefusalKind
from narwhal.node.engine.runtime import Started, alive

SCHEMA = "narwhal.engine-attestation"
VERSION = 1
MAX_METRICS_BYTES = 8 << 20
SAME_START_S = 1e-3


class Changed(Exception):
    """The sidecar cannot vouch for the live engine: `kind` says why for machines (core's
    sidecar_answer.REFUSAL_KINDS), the message says it for people."""

    def __init__(self, kind: RefusalKind, reason: str) -> None:
        super().__init__(reason)
        self.kind: RefusalKind = kind


@dataclass(frozen=True)
class Attested:
    document: dict[str, Any]  # stamped, with its own digest
    plan: dict[str, Any]
    started: Started
    capture: CacheLayout


def _json(path: Path) -> Any:
    return json.loads(path.read_bytes())


def _kv_transfer_config(argv: list[str]) -> dict[str, Any]:
    """The connector the engine was started with, as its argv says (`--kv-transfer-config`)."""
    for flag, value in itertools.pairwise(argv):
        if flag == "--kv-transfer-config":
            parsed = json.loads(value)
            return parsed if isinstance(parsed, dict) else {}
    return {}


def build(run_dir: Path, deployment: str) -> Attested:
    """The document for the engine Gate C started from `run_dir` (ValueError when the run dir
    does not hold a checked, started and captured engine)."""
    plan_bytes = (run_dir / "launch.json").read_bytes()
    plan = json.loads(plan_bytes)
    checked = _json(run_dir / "checked.json")
    if checked.get("plan_sha256") != sha256_bytes(plan_bytes) or not checked.get("ok"):
        raise ValueError(f"{run_dir}: the run plan is not the one `check` passed")
    s = _json(run_dir / "started.json")
    started = Started(str(s["runtime"]), str(s["id"]), str(s["created"]))
    capture = parse_cache_layout(_json(run_dir / "cache-layout.json"),
                                 f"{run_dir}/cache-layout.json")
    if capture.launch_record_sha256 != plan["launch_record_sha256"]:
        raise ValueError(f"{run_dir}: the capture is of another launch record")
    cfg = capture.checkpoint_config
    body = {
        "deployment": deployment, "engine": plan["engine"],
        "process": {"runtime": started.runtime, "id": started.id, "created": started.created,
                    "process_start_time_seconds": capture.process_start_time_seconds},
        "launch_record_sha256": plan["launch_record_sha256"],
        "checked_plan_sha256": checked["plan_sha256"],
        "image_id": plan["image_id"], "model_tree_sha256": plan["model_tree_sha256"],
        "vllm_version": capture.version,
        "kv_transfer_config": _kv_transfer_config(plan["argv"]),
        "model": {k: cfg.get(k) for k in ("architectures", "num_hidden_layers",
                                          "num_attention_heads", "num_key_value_heads",
                                          "hidden_size", "head_dim") if k in cfg},
        "cache_layout": {"kv_cache_layout": capture.startup.kv_cache_layout,
                         "attention_backends": list(capture.startup.attention_backends),
                         "cache_config_info": list(capture.cache_config_info),
                         "ranks": [r.model_dump(mode="json") for r in capture.ranks]},
        "compatibility_hash": capture.ranks[0].compatibility_hash,
        "transfer": {"mode": "pull", "role": "kv_both",
                     "handshake": "NIXL side channel; the consumer checks the producer's "
                                  "compatibility hash before reading",
                     # the UCX transports and devices the engine was started with: the path
                     # Gate D measured (None for a plan made before paths were recorded)
                     "path": plan.get("transfer")},
    }
    doc = stamp(SCHEMA, VERSION, body)
    doc["digest"] = digest(doc)
    return Attested(doc, plan, started, capture)


def _metrics(url: str, timeout_s: float) -> str:
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=timeout_s) as reply:  # noqa: S310
            text: str = reply.read(MAX_METRICS_BYTES).decode("utf-8", "replace")
            return text
    except (OSError, urllib.error.URLError) as exc:
        raise Changed("unreadable", f"engine not answering ({exc})") from None


def verify(a: Attested, timeout_s: float = 3.0) -> None:
    """Raise Changed with the reason when the live engine is not the attested one."""
    if not alive(a.started):
        raise Changed("process_changed",
                      "engine process changed: the attested container or process is gone")
    text = _metrics(a.plan["url"], timeout_s)
    try:
        start = parse_process_start_time(text)
        live = [c.labels for c in parse_cache_config_info(text)]
    except (ValueError, ContractError) as exc:
        raise Changed("unreadable", f"engine metrics unreadable ({exc})") from None
    if abs(start - a.capture.process_start_time_seconds) > SAME_START_S:
        raise Changed("process_changed",
                      f"engine process changed: it started at {start:.3f}, the attested "
                      f"process at {a.capture.process_start_time_seconds:.3f}")
    if canonical_json(live) != canonical_json(list(a.capture.cache_config_info)):
        raise Changed("layout_changed", "layout changed: the engine's cache_config_info "
                      "differs from the attested capture")
