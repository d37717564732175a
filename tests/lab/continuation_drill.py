"""The continuation drill's parts (issue 41) for the lab fleet Gate G serves: greedy client
streams through the router from its host that keep their text and the longest wait between two
events, and a stop of one engine while it is decoding. Every call goes from the workstation
namespace to the router host or to the engine's host."""

from __future__ import annotations

import json
import shlex
import threading
import time
from typing import Any

from tests.lab import canary_drill as cd
from tests.lab.installing import Installer

from narwhal.lab.testing import ssh

# Run on the router host: greedy streaming completions through the router (argv[1] its base
# URL, the tenant key read from the file argv[2], the model argv[3]), request ids
# argv[4]-<n> for n in argv[5] .. argv[5]+argv[6]-1, from argv[7] clients at once, argv[8]
# tokens each (EOS ignored, so every answer has that many). The prompt is a function of n
# alone, so a second run with another id prefix asks the same questions. One line per
# request: its n, id, HTTP status, the answer's text, whether it ended with [DONE], the first
# error event or client error, the usage's completion tokens, and the longest wait between two
# events after the first.
GREEDY = """import json, sys, threading, time, urllib.error, urllib.request
base, key_file, model, prefix, first, count, clients, tokens = sys.argv[1:9]
key = open(key_file).read().strip()
words = "the sea and the ships of the world sail on to the far land".split()
todo, lock = list(range(int(first), int(first) + int(count))), threading.Lock()
def one(n):
    prompt = f"turn {n}: " + " ".join(words[(n * 7 + k) % len(words)] for k in range(120))
    body = {"model": model, "prompt": prompt, "max_tokens": int(tokens), "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + key,
                 "x-request-id": f"{prefix}-{n}"})
    got = {"n": n, "id": f"{prefix}-{n}", "status": 0, "text": "", "done": False,
           "error": None, "tokens": None, "gap": 0.0}
    try:
        with urllib.request.urlopen(req, timeout=90) as reply:
            got["status"], last = reply.status, None
            for line in reply:
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                now = time.monotonic()
                if last is not None:
                    got["gap"] = max(got["gap"], now - last)
                last, data = now, line[6:]
                if data == b"[DONE]":
                    got["done"] = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    got["error"] = got["error"] or event["error"]
                    continue
                for choice in event.get("choices") or []:
                    got["text"] += choice.get("text") or ""
                if event.get("usage"):
                    got["tokens"] = event["usage"]["completion_tokens"]
    except urllib.error.HTTPError as e:
        got["status"] = e.code
    except OSError as e:
        got["error"] = str(e)
    return got
def client():
    while True:
        with lock:
            if not todo:
                return
            n = todo.pop(0)
        got = one(n)
        with lock:
            print(json.dumps(got), flush=True)
""" + cd.RUN_CLIENTS
SCRIPT = "/tmp/narwhal-greedy-streams.py"


def put_greedy(fleet: Installer) -> None:
    cd.put_script(fleet, SCRIPT, GREEDY)


def greedy(fleet: Installer, base: str, prefix: str, first: int, count: int, clients: int,
           tokens: int) -> dict[int, dict[str, Any]]:
    """`count` greedy streams through the router, by prompt number n."""
    key = f"{fleet.secrets_dir()}/NARWHAL_ROUTER_API_KEY"
    argv = ["python3", SCRIPT, base, key, fleet.op.plan.spec.model.name, prefix, str(first),
            str(count), str(clients), str(tokens)]
    out = cd.on_router(fleet, shlex.join(argv), timeout=240)
    answers = [json.loads(line) for line in out.splitlines()]
    return {a["n"]: a for a in answers}


class Greedy:
    """`greedy` on a thread, so the test can fault an engine while the streams run."""

    def __init__(self, fleet: Installer, base: str, prefix: str, count: int, clients: int,
                 tokens: int) -> None:
        self.answers: dict[int, dict[str, Any]] = {}
        self._thread = threading.Thread(target=self._run, daemon=True, args=(
            fleet, base, prefix, count, clients, tokens))

    def _run(self, fleet: Installer, base: str, prefix: str, count: int, clients: int,
             tokens: int) -> None:
        self.answers = greedy(fleet, base, prefix, 0, count, clients, tokens)

    def start(self) -> Greedy:
        self._thread.start()
        return self

    def join(self, timeout: float) -> dict[int, dict[str, Any]]:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the greedy streams did not end"
        return self.answers


def engine_counts(fleet: Installer, url: str) -> tuple[float, float]:
    """(requests running, generation tokens so far) from an engine's own /metrics."""
    text = cd.on_router(fleet, f"curl -s {url}/metrics")
    running = generated = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            running += float(line.split()[-1])
        elif line.startswith("vllm:generation_tokens_total"):
            generated += float(line.split()[-1])
    return running, generated


def until_decoding(fleet: Installer, url: str, timeout: float) -> None:
    """Return once the engine runs a request and made tokens since the last look twice in a
    row: it is decoding a stream, not prefilling a leg (a prefill leg makes one token)."""
    deadline = time.monotonic() + timeout
    seen = 0
    _, last = engine_counts(fleet, url)
    while time.monotonic() < deadline:
        time.sleep(0.15)
        running, generated = engine_counts(fleet, url)
        seen = seen + 1 if running >= 1 and generated >= last + 2 else 0
        last = generated
        if seen >= 2:
            return
    raise AssertionError(f"{url} decoded no stream within {timeout:g} s")


def engine_pid(fleet: Installer, host: str) -> int:
    """The engine container's process on its host, as the runtime reports it."""
    done = ssh(fleet.op.plan, host, "docker inspect -f '{{.State.Pid}}' $(docker ps -q)")
    assert done.returncode == 0, done.stderr
    [pid] = done.stdout.split()
    return int(pid)


def signal_engine(fleet: Installer, host: str, pid: int, sig: str) -> None:
    done = ssh(fleet.op.plan, host, f"kill -{sig} {pid}")
    assert done.returncode == 0, done.stderr
