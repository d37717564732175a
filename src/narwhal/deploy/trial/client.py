"""The open-loop load client: each planned request sent at its time, streamed, and recorded.

Open loop means a request leaves at its scheduled time however many earlier ones are still in
flight: a fleet slower than the arrival rate then shows as a capacity miss at that rate, with
in flight growing, instead of as a client that held requests back and called it lateness.
The one bound is the connection budget (one connection, so one file descriptor, per request
in flight): stated, large (connection_budget), and counted apart. A request that finds it
full waits and is recorded `client_limited`, and the verdict says "client-limited", not late
and not capacity. Lag (actual send minus planned time) beyond that is the event loop's own,
and the client reports the share of one CPU it used, since on a busy workstation a client that
cannot keep up looks exactly like a slow fleet.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from typing import Any, NamedTuple

import aiohttp

from narwhal.deploy.trial.schedule import Planned
from narwhal.deploy.trial.verdict import Record

MAX_CONNECTIONS = 8192  # the most requests in flight at once, whatever the descriptor limit
RESERVED_DESCRIPTORS = 64  # kept for the process besides: its files, SSH forwards, the loop
MAX_BODY = 4 << 20  # a response larger than this is cut and recorded as an error
WORDS = ("sea", "harbour", "lamp", "north", "stone", "river", "cloud", "orchard", "copper",
         "winter", "signal", "marble", "ember", "valley", "anchor", "thistle")


def prompt(p: Planned) -> str:
    """`prompt_words` words, different per request (no shared prefix to cache)."""
    salt = sum(p.request_id.encode())
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(p.prompt_words))


def connection_budget(descriptors: int) -> int:
    """How many requests may be in flight at once: the descriptor limit less what the process
    needs besides, up to MAX_CONNECTIONS. Past it a send would fail with EMFILE, which the
    records would show as the fleet's errors; waiting instead is counted as client-limited."""
    return max(1, min(MAX_CONNECTIONS, descriptors - RESERVED_DESCRIPTORS))


def descriptor_limit() -> int:
    """The process's descriptor limit, its soft limit first raised toward the hard one (as far
    as the budget can use): a default soft limit of 1024 would cap the client, not the fleet."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = MAX_CONNECTIONS + RESERVED_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < want:
        raised = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, raised), hard))
            soft = max(soft, raised)
        except (ValueError, OSError):
            pass  # the soft limit stands; the budget follows it
    return want if soft == resource.RLIM_INFINITY else soft


class Sent(NamedTuple):
    """One rate's sending: the records, seconds from the first planned send to the last
    answer, the client's CPU share of one core over that time, and the budget it sent under."""

    records: list[Record]
    seconds: float
    cpu_share: float
    budget: int


async def _one(session: aiohttp.ClientSession, url: str, model: str, p: Planned,
               start: float, slots: asyncio.Semaphore, headers: dict[str, str],
               timeout_s: float) -> Record:
    loop = asyncio.get_running_loop()
    limited = slots.locked()  # at its scheduled time the budget was full: it waits, counted
    async with slots:
        sent = loop.time() - start
        times: list[float] = []
        size, status, error = 0, 0, ""
        text = p.prompt if p.prompt is not None else prompt(p)
        body = {"model": model, "prompt": text, "max_tokens": p.max_tokens, "stream": True}
        try:
            async with session.post(url, json=body, headers={**headers,
                                                             "x-request-id": p.request_id},
                                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                status = resp.status
                if status != 200:
                    said = await resp.content.read(400)
                    size = len(said)
                    error = f"{status}: {said.decode('utf-8', 'replace').strip()[:300]}"
                done = status != 200
                async for line in resp.content:
                    size += len(line)
                    if size > MAX_BODY:
                        error = f"answer over {MAX_BODY} bytes"
                        break
                    if line.startswith(b"data: [DONE]"):
                        done = True
                    elif line.startswith(b'data: {"error"'):  # a stream broken after its head
                        error = error or f"stream broke: {line[6:].decode('utf-8', 'replace')[:300]}"
                    elif line.startswith(b"data: "):
                        times.append(loop.time() - start)
                if not done and not error:
                    error = "stream ended without [DONE]"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:200]
        first = times[0] - sent if times else None
        return Record(p.request_id, p.at_s, sent, status, first, tuple(times), size, error,
                      limited)


async def run(base_url: str, model: str, planned: list[Planned], api_key: str | None,
              timeout_s: float = 120.0, budget: int | None = None) -> Sent:
    """Send the schedule, each request at its time whatever is in flight, within `budget`
    connections (default: connection_budget of this process's descriptor limit)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = f"{base_url}/v1/completions"
    budget = budget or connection_budget(descriptor_limit())
    slots = asyncio.Semaphore(budget)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    wall0 = time.monotonic()
    # the connector's own limit is the budget too: it never queues a request the budget let go
    connector = aiohttp.TCPConnector(limit=budget)
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
    return Sent(records, wall, (cpu / wall if wall > 0 else 0.0), budget)


def records_jsonl(records: list[Record]) -> bytes:
    return "".join(json.dumps(r.as_dict(), sort_keys=True) + "\n" for r in records).encode()


def parse_state(payload: bytes) -> dict[str, Any]:
    doc = json.loads(payload)
    return doc if isinstance(doc, dict) else {}
