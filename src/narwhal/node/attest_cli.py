"""`narwhal-attest`: the attestation sidecar of one engine (Gate E), and its client.

    narwhal-attest serve --run-dir D --deployment NAME --bind ADDR --port P [--lease-key-file F]
    narwhal-attest fetch --url URL [--timeout S]
    narwhal-attest fetch-many --url URL [--url URL ...] [--timeout S]

`serve` runs on the engine host, started detached by `narwhal attest` and owned by its
attempt: it builds the attestation from Gate C's state in the run dir, prints one result line
(its digest and URL), then serves it until stopped, re-checking the live engine on every
request. With `--lease-key-file` it also keeps this sidecar's share of the fleet's controller
lease (docs/controller-lease.md): the key file must be private (0600) and hold the key the
router's `controller.quorum.key_file` holds; the grants' state lives in the run dir. `fetch`
runs wherever a peer must see it (the router host) and prints one result line with the status
and document; `fetch-many` asks several sidecars at once and prints one result line with each
answer (`narwhal status` asks the whole fleet in one round trip).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from narwhal.core import result_line
from narwhal.core.errors import NarwhalError

if TYPE_CHECKING:
    from narwhal.node.attest.lease_desk import LeaseDesk

DESCRIPTION = "Attestation sidecar: binds one live engine process and serves its attested contract (gate E)."
COMMAND = "narwhal-attest"
MAX_DOCUMENT_BYTES = 1 << 20
FETCH_WORKERS = 16  # sidecars asked at once by fetch-many


def do_serve(args: argparse.Namespace) -> int:
    from narwhal.node.attest.document import build
    from narwhal.node.attest.server import serve

    desk = _lease_desk(args)  # a bad key file stops the sidecar before it builds anything
    attested = build(Path(args.run_dir), args.deployment)
    server = serve(attested, args.bind, args.port, desk)
    base = f"http://{args.bind}:{args.port}"
    print(result_line.render(f"{COMMAND} serve", True, {
        "engine": attested.document["engine"], "digest": attested.document["digest"],
        "url": f"{base}/v1/attestation",
        "lease_url": f"{base}/v1/lease" if desk is not None else None}), flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def _lease_desk(args: argparse.Namespace) -> LeaseDesk | None:
    from narwhal.core.key_file import read_key_file
    from narwhal.node.attest.lease import STATE_FILE, Keeper
    from narwhal.node.attest.lease_desk import LeaseDesk

    if args.lease_key_file is None:
        return None
    key = read_key_file(Path(args.lease_key_file), "--lease-key-file")
    return LeaseDesk(Keeper(Path(args.run_dir) / STATE_FILE), key, args.deployment)


def fetch(url: str, timeout_s: float) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:  # noqa: S310 - fleet URL
            status, body = reply.status, reply.read(MAX_DOCUMENT_BYTES + 1)
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read(MAX_DOCUMENT_BYTES + 1)
    if len(body) > MAX_DOCUMENT_BYTES:
        raise ValueError(f"{url} answered more than {MAX_DOCUMENT_BYTES} bytes")
    document = json.loads(body)
    if not isinstance(document, dict):
        raise ValueError(f"{url} did not answer a JSON object")
    return {"status": status, "document": document}


def do_fetch(args: argparse.Namespace) -> int:
    got = fetch(args.url, args.timeout)
    print(result_line.render(f"{COMMAND} fetch", True, got))
    return 0


def _fetch_one(url: str, timeout_s: float) -> dict[str, Any]:
    """One URL's answer for fetch-many: its status and document, or why there is none."""
    try:
        return {"url": url, "ok": True, **fetch(url, timeout_s)}
    except (OSError, ValueError) as exc:
        return {"url": url, "ok": False, "error": str(exc)[:500]}


def do_fetch_many(args: argparse.Namespace) -> int:
    """Every URL at once (a status of a fleet asks each sidecar in one round trip to this
    host): one result line, each URL's answer in the order given."""
    with ThreadPoolExecutor(max_workers=min(FETCH_WORKERS, len(args.url))) as pool:
        answers = list(pool.map(lambda url: _fetch_one(url, args.timeout), args.url))
    print(result_line.render(f"{COMMAND} fetch-many", True, {"answers": answers}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=DESCRIPTION)
    sub = parser.add_subparsers(dest="sub", required=True)
    p = sub.add_parser("serve", help="serve one engine's attestation (runs until stopped)")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--deployment", required=True)
    p.add_argument("--bind", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--lease-key-file", metavar="FILE",
                   help="keep this sidecar's share of the controller lease, for routers that "
                        "send the key in FILE (mode 0600); without it the lease routes answer 404")
    p.set_defaults(handler=do_serve)
    p = sub.add_parser("fetch", help="GET an attestation URL; one result line")
    p.add_argument("--url", required=True)
    p.add_argument("--timeout", type=float, default=5.0)
    p.set_defaults(handler=do_fetch)
    p = sub.add_parser("fetch-many", help="GET several attestation URLs at once; one result "
                                          "line with every answer")
    p.add_argument("--url", required=True, action="append")
    p.add_argument("--timeout", type=float, default=5.0)
    p.set_defaults(handler=do_fetch_many)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (NarwhalError, OSError, ValueError, KeyError) as exc:
        print(result_line.render(f"{COMMAND} {args.sub}", False, {}, str(exc)), flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
