"""What the live engine actually allocated (`narwhal-engine capture`): cache-layout.json.

Read from the engine's own surfaces, as any client sees them, never by patching vLLM: the
startup log (layout, backend, capacity), /metrics (cache_config_info and the process start
time), /version, /v1/models, the NIXL side-channel handshake of every rank through node's
read-only probe, and one real completion. The model's config.json rides along so the
workstation can predict the geometry with core/kv and compare.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from narwhal.core.cache_layout import SCHEMA, VERSION
from narwhal.core.documents import stamp
from narwhal.core.errors import ContractError, HostUnreachable
from narwhal.core.kv.capture.endpoints import (
    parse_cache_config_info,
    parse_process_start_time,
    parse_version_reply,
)
from narwhal.core.kv.capture.logs import parse_startup_log
from narwhal.core.kv.vllm_args import launch_plan_from_args
from narwhal.node.engine.http_capture import Exchanges
from narwhal.node.engine.runtime import Started, alive, logs
from narwhal.node.nixl_probe import ProbeTarget, probe

COMPLETION_PROMPT = "The quick brown fox"


def _auth(key: str | None) -> dict[str, str]:
    """The engine's API key as vLLM asks for it on its /v1 routes (none without a key)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def _send(req: urllib.request.Request, timeout: float, keep: Exchanges | None = None,
          what: str = "") -> tuple[int, bytes]:
    """(status, body) of one request, an HTTP error's too; kept in `keep` as sent and as
    received (a connection error is kept with status 0, then raised)."""
    started, status, got_headers, data = time.time(), 0, [], b""
    error = ""
    try:
        with urllib.request.urlopen(req, timeout=timeout) as reply:  # noqa: S310 - loopback
            status, got_headers, data = reply.status, reply.headers.items(), reply.read(4 << 20)
    except urllib.error.HTTPError as exc:
        status, data = exc.code, exc.read(4096)
        got_headers = exc.headers.items() if exc.headers is not None else []
    except OSError as exc:
        error = str(exc)
        raise
    finally:
        if keep is not None:
            keep.add(what, (req.get_method(), req.full_url, req.header_items(),
                            req.data if isinstance(req.data, bytes) else None),
                     (status, got_headers, data if status else None), started, error)
    return status, data


def _get(url: str, timeout: float = 10.0, key: str | None = None,
         keep: Exchanges | None = None, what: str = "") -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=_auth(key))  # noqa: S310 - loopback
    return _send(req, timeout, keep, what)


def _post(url: str, body: dict[str, Any], key: str | None, timeout: float = 60.0,
          keep: Exchanges | None = None, what: str = "") -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",  # noqa: S310
                                 headers={"Content-Type": "application/json", **_auth(key)})
    status, data = _send(req, timeout, keep, what)
    if status != 200:
        raise ContractError(f"POST {url} answered {status}: "
                            f"{data.decode('utf-8', 'replace').strip()[:300]}")
    doc: dict[str, Any] = json.loads(data)
    return doc


def wait_healthy(plan: dict[str, Any], started: Started, log_path: Path,
                 timeout_s: float) -> float:
    """Seconds from now until /health answers 200; the engine dying first is an error."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            if _get(f"{plan['url']}/health", timeout=2.0)[0] == 200:
                return time.monotonic() - t0
        except (OSError, urllib.error.URLError):
            pass
        if not alive(started):
            tail = logs(started, log_path).strip().splitlines()[-5:]
            raise ContractError(f"{plan['engine']} exited before it was healthy: "
                                + " | ".join(tail))
        time.sleep(0.2)
    raise HostUnreachable(plan["engine"], f"{plan['url']}/health did not answer 200 within "
                          f"{timeout_s:.0f} s")


def capture(plan: dict[str, Any], started: Started, log_path: Path,
            timeout_s: float, key: str | None = None,
            keep: Exchanges | None = None) -> dict[str, Any]:
    """The capture document; `key` is the engine's API key when its plan sets one; `keep`
    receives every exchange the document is read from (the health polls are not kept)."""
    healthy_s = wait_healthy(plan, started, log_path, timeout_s)
    url = plan["url"]
    version = parse_version_reply(_get(f"{url}/version", keep=keep, what="version")[1])
    status, models_body = _get(f"{url}/v1/models", key=key, keep=keep, what="models")
    models = [m["id"] for m in json.loads(models_body).get("data", [])] if status == 200 else []
    metrics = _get(f"{url}/metrics", keep=keep, what="metrics")[1].decode("utf-8", "replace")
    cache_config = [c.labels for c in parse_cache_config_info(metrics)]
    start_time = parse_process_start_time(metrics)
    startup = parse_startup_log(logs(started, log_path)).model_dump(mode="json")
    parallel = launch_plan_from_args([plan["model_dir"], *plan["vllm_args"]],
                                     name=plan["engine"], vllm_version=version,
                                     where=f"{plan['engine']}: vllm_args")
    target = ProbeTarget(alias=plan["engine"], host=plan["side_channel"]["host"],
                         port=int(plan["side_channel"]["port"]),
                         pp_size=parallel.pipeline_parallel_size,
                         tp_size=parallel.tensor_parallel_size, vllm_version=version)
    ranks = []
    for (pp, rank), reply in sorted(probe(target).items()):
        ranks.append({"pp_rank": pp, "tp_rank": rank,
                      "compatibility_hash": reply.compatibility_hash,
                      "engine_id": str(reply.metadata.get("engine_id", "")),
                      "metadata": reply.as_agent_metadata().model_dump(mode="json")})
    done = _post(f"{url}/v1/completions", {"model": plan["served_model_name"],
                                           "prompt": COMPLETION_PROMPT, "max_tokens": 4},
                 key, keep=keep, what="completion")
    text = str(((done.get("choices") or [{}])[0]).get("text", ""))
    config = json.loads((Path(plan["model_dir"]) / "config.json").read_text())
    return stamp(SCHEMA, VERSION, {
        "engine": plan["engine"], "launch_record_sha256": plan["launch_record_sha256"],
        "started": started.as_json(), "healthy_after_s": round(healthy_s, 3),
        "version": version, "models": models, "process_start_time_seconds": start_time,
        "cache_config_info": cache_config, "startup": startup, "ranks": ranks,
        "completion": {"prompt": COMPLETION_PROMPT, "text": text,
                       "usage": done.get("usage")},
        "checkpoint_config": config})
