#!/usr/bin/env python3
"""Write the two documents narwhal-inference 0.7.0's `narwhal-serve` needs before it serves.

    narwhal_inference_fleet.py fleet --model M --prefill URL --decode URL --dir DIR
    narwhal_inference_fleet.py profiles --fleet DIR/fleet.json

`fleet` writes a contract-free v2 fleet (`narwhal.fleet`, schema_version 2) with one pinned
prefill engine and one pinned decode engine; every path in it is absolute, because
narwhal-serve resolves relative paths against its working directory.

`profiles` writes the `narwhal.profiles` v1 document the fleet names. narwhal-serve refuses to
start unless there is exactly one row per engine and each row's `generation_digest` equals the
live engine's generation: sha256 over the sorted, compact JSON of
`{"engine": {"version": GET /version .version, "process_start_time_seconds": from GET /metrics}}`.
So run `profiles` after the engines are up, and again after any engine restarts. The
coefficients are deliberately cheap and flat (about 2 ms TTFT, 1 ms TPOT, 512 decode seats):
the baseline tests need the router to admit every request, not to price it well. No engine
is profiled; narwhal-profile would need timing-model engines and a long sweep.

Standard library only, so it runs with any Python 3.11 (ours or narwhal-inference's venv)
without importing either project's `narwhal` package (both are called `narwhal`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
import urllib.request
from pathlib import Path
from typing import Any

FLEET_SCHEMA = {"schema": "narwhal.fleet", "schema_version": 2}
PROFILES_SCHEMA = {"schema": "narwhal.profiles", "schema_version": 1}
# narwhal-serve reads the same sample with the same pattern (labels allowed, first match).
_PROCESS_START = re.compile(
    r"^process_start_time_seconds(?:\{[^}]*\})?\s+([0-9.eE+-]+)(?:\s|$)", re.MULTILINE
)


def fleet_document(
    model: str, prefill: str, decode: str, folder: Path, first_token_timeout_s: float
) -> dict[str, Any]:
    """A v2 fleet: two pinned engines, generous SLOs, all state files under `folder`."""
    folder = folder.resolve()
    return {
        **FLEET_SCHEMA,
        "model": model,
        "engines": [
            {"iid": "p0", "url": prefill.rstrip("/"), "role": "prefill", "pin": True},
            {"iid": "d0", "url": decode.rstrip("/"), "role": "decode", "pin": True},
        ],
        "slo": {"ttft_s": 10.0, "tpot_s": 0.125},
        # The first pull on a fresh engine pair includes the NIXL handshake; on a loaded
        # 2-core machine that can exceed the 2.5 s default and fail the decode leg.
        "engine": {"first_token_timeout_s": first_token_timeout_s},
        "profiles": {"path": str(folder / "profiles.json")},
        "recovery": {"state_path": str(folder / "state.json")},
    }


def canonical_digest(value: Any) -> str:
    """sha256 of sorted, compact JSON: how narwhal-inference digests a generation."""
    raw = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _get(url: str, timeout_s: float) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - fleet URL
            return str(response.read().decode())
    except (OSError, UnicodeDecodeError) as exc:  # URLError and HTTPError are OSErrors
        raise ValueError(f"GET {url} failed: {exc}") from exc


def engine_generation(base_url: str, timeout_s: float = 5.0) -> str:
    """The live generation digest narwhal-serve will compare the profile row against."""
    base = base_url.rstrip("/")
    version = json.loads(_get(f"{base}/version", timeout_s)).get("version")
    if not isinstance(version, str) or not version.strip():
        raise ValueError(f"{base}/version returned no version string")
    match = _PROCESS_START.search(_get(f"{base}/metrics", timeout_s))
    if match is None:
        raise ValueError(f"{base}/metrics has no process_start_time_seconds sample")
    start = float(match.group(1))
    if not math.isfinite(start) or start <= 0:
        raise ValueError(f"{base}/metrics: process_start_time_seconds {start} is not positive")
    return canonical_digest(
        {"engine": {"version": version.strip(), "process_start_time_seconds": start}}
    )


def profile_row(iid: str, generation: str) -> dict[str, Any]:
    """A flat, cheap cost model with the decode bounds the 0.7.0 schema requires."""
    return {
        "iid": iid,
        "generation_digest": generation,
        "ttft_a": 0.0,  # seconds per token squared
        "ttft_b": 2e-6,  # seconds per token
        "ttft_c": 0.002,  # seconds
        "tpot_slope": 1e-8,  # seconds per resident KV token
        "tpot_intercept": 0.001,  # seconds
        "kv_capacity_tokens": 1_000_000,
        "decode_min_requests": 1,
        "decode_max_requests": 512,
        "decode_min_kv_tokens": 1,
        "decode_max_kv_tokens": 1_000_000,
        "decode_fit_mape": 0.0,
        "decode_cv_mape": 0.0,
        "prefill_min_tokens": 1,
        "prefill_max_tokens": 100_000,
        "decode_min_output_tokens": 1,
        "decode_max_output_tokens": 100_000,
    }


def profiles_document(fleet: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
    """One row per fleet engine, each bound to that engine's live generation."""
    rows = [
        profile_row(engine["iid"], engine_generation(engine["url"], timeout_s))
        for engine in fleet["engines"]
    ]
    meta = {"writer": "narwhal scripts/baselines/narwhal_inference_fleet.py", "measured": False}
    return {**PROFILES_SCHEMA, "meta": meta, "profiles": rows}


def _write(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fleet = commands.add_parser("fleet", help="write DIR/fleet.json")
    fleet.add_argument("--model", required=True, help="served model name of both engines")
    fleet.add_argument("--prefill", required=True, help="prefill engine base URL")
    fleet.add_argument("--decode", required=True, help="decode engine base URL")
    fleet.add_argument("--dir", required=True, type=Path, help="folder for fleet and state")
    fleet.add_argument("--first-token-timeout", type=float, default=30.0, metavar="S")
    profiles = commands.add_parser("profiles", help="write the profiles file a fleet names")
    profiles.add_argument("--fleet", required=True, type=Path)
    profiles.add_argument("--timeout", type=float, default=5.0, metavar="S")
    args = parser.parse_args(argv)
    try:
        if args.command == "fleet":
            doc = fleet_document(
                args.model, args.prefill, args.decode, args.dir, args.first_token_timeout
            )
            out = args.dir / "fleet.json"
            _write(out, doc)
        else:
            fleet_doc = json.loads(args.fleet.read_text())
            out = Path(fleet_doc["profiles"]["path"])
            _write(out, profiles_document(fleet_doc, args.timeout))
    except (OSError, ValueError, KeyError) as exc:
        print(f"narwhal_inference_fleet: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
