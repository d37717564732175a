"""Gate C's evidence beyond the capture: each engine's log and the capture's raw HTTP exchanges.

The runbook keeps "ENGINE_RUN, image-check and HTTP captures" for host and engine validation.
The capture document holds what Gate C parsed; these hold what it was parsed from, so a
blocked start or a contract finding can be read from the record alone. On the engine host
`narwhal-engine evidence` writes the log's last LOG_BYTES beside the capture's
http-captures.json and names both with length and sha256; here each is read through the
host (bounded, checked against that sha256) and kept as an attempt artifact:

    engine-log-<role>.txt   a first line saying which part of which log, then the log bytes
    http-<role>.json        /version, /v1/models, /metrics and the test completion, as sent
                            and received (status, headers less credentials, bodies)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from narwhal.core import result_line
from narwhal.core.errors import HostError, TransferMismatch
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.ledger.attempt import Attempt

LOG_BYTES = 4 << 20  # the last 4 MiB: the startup lines of a fresh engine and then some
HTTP_BYTES = 8 << 20  # four bodies of at most 1 MiB each, JSON-escaped, with headers
Call = Callable[..., result_line.ResultLine]


def log_header(role: str, log: dict[str, Any]) -> bytes:
    """The artifact's first line: which log, and whether it is whole or its last part."""
    kept, total = int(log["bytes"]), int(log["total_bytes"])
    part = (f"the whole log, {total} bytes" if kept >= total else
            f"its last {kept} of {total} bytes (the last {int(log['limit_bytes']) >> 20} MiB, "
            "cut at a line start)")
    return f"# narwhal: {role}'s engine log from {log['source']}: {part}\n".encode()


def fetch_all(host: Host, named: list[tuple[dict[str, Any], int]]) -> list[bytes]:
    """Files the host named with their length and sha256 (each at most its `limit`), read in
    one round trip, each exactly its named length, each checked against its sha256: a torn,
    shortened or substituted file is refused and nothing is kept."""
    for facts, limit in named:
        if int(facts["bytes"]) > limit:
            raise HostError(host.alias, f"{facts['path']} holds {facts['bytes']} bytes, more "
                            f"than the {limit} the record keeps")
    wanted = [(str(facts["path"]), int(facts["bytes"])) for facts, _ in named]
    data = host.run(cl.read_heads(wanted), timeout=120, check=True).stdout
    out, at = [], 0
    for facts, _ in named:
        part = data[at:at + int(facts["bytes"])]
        at += len(part)
        got = hashlib.sha256(part).hexdigest()
        if got != facts["sha256"]:
            raise TransferMismatch(host.alias, f"{facts['path']}: host sha256 "
                                   f"{facts['sha256']}, received {got}; nothing was kept")
        out.append(part)
    return out


def keep(call: Call, host: Host, role: str, run_dir: str, attempt: Attempt) -> list[str]:
    """Keep one engine's log and HTTP exchanges in `attempt`; the artifact names kept.
    `call` runs a `narwhal-engine` subcommand on the engine's host (engines.Remote.call)."""
    got = call("evidence", "--run-dir", run_dir, "--log-bytes", str(LOG_BYTES), timeout=120.0)
    if not got.ok:
        raise HostError(host.alias, f"{role}: its log cannot be read: {got.error}")
    log, http = got.data["log"], got.data.get("http")  # no http when no capture ran there
    read = fetch_all(host, [(log, LOG_BYTES)] + ([(http, HTTP_BYTES)] if http else []))
    names = [f"engine-log-{role}.txt"]
    attempt.add_artifact(names[0], log_header(role, log) + read[0])
    if http:
        names.append(f"http-{role}.json")
        attempt.add_artifact(names[1], read[1])
    return names
