"""Poll routers' /ready for a bounded time and print one JSON line per answer.

Run inside a lab namespace (`ip netns exec NS python3 ready_poller.py SECONDS URL...`), so the
same monotonic clock dates what each vantage point saw: the workstation's client, or a router
host's own loopback. Each line: {"t": monotonic, "url": ..., "ok": /ready answered 200}.
Bounded: at most SECONDS of polling, one request per URL every 50 ms, 0.3 s timeout each.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.3) as reply:  # noqa: S310 - lab address
            return bool(reply.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def main(seconds: float, urls: list[str]) -> None:
    end = time.monotonic() + min(seconds, 60.0)
    while time.monotonic() < end:
        for url in urls:
            t = time.monotonic()
            print(json.dumps({"t": t, "url": url, "ok": ready(url)}), flush=True)
        time.sleep(0.05)


if __name__ == "__main__":
    main(float(sys.argv[1]), sys.argv[2:])
