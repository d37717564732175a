"""Drive engines over HTTP from inside a lab namespace (the root namespace cannot reach the lab).

`python -m narwhal.lab.engine.drive ...` under `ip netns exec`; standard library only, so it
starts fast and loads nothing of the engine. Prints one JSON document on stdout. Subcommands:
  health URL... --timeout S          wait until every URL's /health answers 200
  handoff PREFILL DECODE --model M --words N [N...] [--repeat R]
                                     one P/D handoff per prompt size: prefill (max_tokens 1,
                                     do_remote_decode) on PREFILL, decode with the returned
                                     kv_transfer_params on DECODE; wall times of both legs
  get URL                            GET URL, print {"status", "body"}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    # keyed engines (VLLM_API_KEY, as vLLM names it) get the key from the environment, never argv
    key = os.environ.get("VLLM_API_KEY")
    auth = {"authorization": f"Bearer {key}"} if key else {}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",  # noqa: S310
                                 headers={"content-type": "application/json", **auth})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - lab URLs only
        return dict(json.loads(resp.read()))


def _get(url: str, timeout: float) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - lab URLs only
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def health(urls: list[str], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    pending = list(urls)
    while pending and time.monotonic() < deadline:
        for url in list(pending):
            try:
                if _get(f"{url}/health", 1.0)[0] == 200:
                    pending.remove(url)
            except OSError:
                pass
        if pending:
            time.sleep(0.1)
    return {"healthy": [u for u in urls if u not in pending], "pending": pending}


def handoff(prefill: str, decode: str, model: str, sizes: list[int], repeat: int) -> dict[str, Any]:
    rows = []
    for words in sizes:
        for attempt in range(repeat):
            prompt = " ".join(f"w{attempt}x{i}" for i in range(words))
            t0 = time.monotonic()
            first = _post(f"{prefill}/v1/completions", {
                "model": model, "prompt": prompt, "max_tokens": 1, "stream": False,
                "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}, 60)
            t1 = time.monotonic()
            second = _post(f"{decode}/v1/completions", {
                "model": model, "prompt": prompt, "max_tokens": 2, "stream": False,
                "kv_transfer_params": first["kv_transfer_params"]}, 120)
            t2 = time.monotonic()
            rows.append({"words": words, "prompt_tokens": second["usage"]["prompt_tokens"],
                         "remote_num_tokens": first["kv_transfer_params"]["remote_num_tokens"],
                         "prefill_s": t1 - t0, "decode_s": t2 - t1})
    return {"rows": rows}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m narwhal.lab.engine.drive")
    sub = p.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("health")
    h.add_argument("urls", nargs="+")
    h.add_argument("--timeout", type=float, default=30.0)
    o = sub.add_parser("handoff")
    o.add_argument("prefill")
    o.add_argument("decode")
    o.add_argument("--model", required=True)
    o.add_argument("--words", type=int, nargs="+", required=True)
    o.add_argument("--repeat", type=int, default=1)
    g = sub.add_parser("get")
    g.add_argument("url")
    a = p.parse_args(argv)
    if a.cmd == "health":
        out = health(a.urls, a.timeout)
    elif a.cmd == "handoff":
        out = handoff(a.prefill, a.decode, a.model, a.words, a.repeat)
    else:
        status, body = _get(a.url, 10.0)
        out = {"status": status, "body": body}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
