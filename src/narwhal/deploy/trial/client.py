"""The open-loop load client: each planned request sent at its time, streamed, and recorded.

Sends are bounded by an in-flight cap: a request that waits for a slot is sent late, and its
lag (actual send minus planned time) is what the verdict reads as "client saturated". The
client also reports the share of one CPU it used, since on a busy workstation a client that
cannot keep up looks exactly like a slow fleet.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from typing import Any

import aiohttp

from narwhal.deploy.trial.schedule import Planned
from narwhal.deploy.trial.verdict import Record

MAX_INFLIGHT = 32
MAX_BODY = 4 << 20  # a response larger than this is cut and recorded as an error
WORDS = ("sea", "harbour", "lamp", "north", "stone", "river", "cloud", "orchard", "copper",
         "winter", "signal", "marble", "ember", "valley", "anchor", "thistle")


def prompt(p: Planned) -> str:
    """`prompt_words` words, different per request (no shared prefix to cache)."""
    salt = sum(p.request_id.encode())
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(p.prompt_words))


async def _one(session: aiohttp.ClientSession, url: str, model: str, p: Planned,
               start: float, slots: asyncio.Semaphore, headers: dict[str, str],
               timeout_s: float) -> Record:
    loop = asyncio.get_running_loop()
    async with slots:
        sent = loop.time() - start
        times: list[float] = []
        size, status, error = 0, 0, ""
        body = {"model": model, "prompt": prompt(p), "max_tokens": p.max_tokens, "stream": True}
        try:
            async with session.post(url, json=body, headers={**headers,
                                                             "x-request-id": p.request_id},
                                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                status = resp.status
                if status != 200:
                    said = await resp.content.read(400)
                    size = len(said)
                    error = f"{status}: {said.decode('utf-8', 'replace').strip()[:300]}"
                async for line in resp.content:
                    size += len(line)
                    if size > MAX_BODY:
                        error = f"answer over {MAX_BODY} bytes"
                        break
                    if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                        times.append(loop.time() - start)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:200]
        first = times[0] - sent if times else None
        return Record(p.request_id, p.at_s, sent, status, first, tuple(times), size, error)


async def run(base_url: str, model: str, planned: list[Planned], api_key: str | None,
              timeout_s: float = 120.0) -> tuple[list[Record], float, float]:
    """Send the schedule; (records, seconds from the first planned send to the last answer,
    the client's CPU share of one core over that time)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = f"{base_url}/v1/completions"
    slots = asyncio.Semaphore(MAX_INFLIGHT)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    wall0 = time.monotonic()
    connector = aiohttp.TCPConnector(limit=MAX_INFLIGHT)
    async with aiohttp.ClientSession(connector=connector) as session:
        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks = []
        for p in planned:
            delay = start + p.at_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(session, url, model, p, start, slots,
                                                  headers, timeout_s)))
        records = list(await asyncio.gather(*tasks))
    wall = time.monotonic() - wall0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return records, wall, (cpu / wall if wall > 0 else 0.0)


def records_jsonl(records: list[Record]) -> bytes:
    return "".join(json.dumps(r.as_dict(), sort_keys=True) + "\n" for r in records).encode()


def parse_state(payload: bytes) -> dict[str, Any]:
    doc = json.loads(payload)
    return doc if isinstance(doc, dict) else {}
