"""`python -m narwhal.lab.hub init|push|tag|serve`: make and serve a hub double's store.

Tokens are read from files, never from argv (argv is visible to every process on the host).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from narwhal.core.errors import InputError, NarwhalError, Problem
from narwhal.core.private_file import write_private_json
from narwhal.lab.hub.records import Gated
from narwhal.lab.hub.server import HubServer
from narwhal.lab.hub.store import Store

GATED_CHOICES: dict[str, Gated] = {"no": False, "auto": "auto", "manual": "manual"}


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65534:
        raise InputError("--listen", [Problem("listen", f"{value!r} is not IP:PORT",
                                              "give e.g. 127.0.0.1:8600 (the CDN takes PORT+1)")])
    return host, int(port)


def cmd_init(args: argparse.Namespace) -> int:
    tokens = tuple(Path(p).read_text().strip() for p in args.grant_token_file)
    gated: Gated = GATED_CHOICES[args.gated]
    settings = Store(Path(args.store)).init_repo(args.repo, gated=gated, private=args.private,
                                                 tokens=tokens)
    print(json.dumps({"repo": args.repo, "gated": settings.gated, "private": settings.private,
                      "granted_tokens": len(settings.token_sha256)}))
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    commit = Store(Path(args.store)).push(args.repo, Path(args.from_), branch=args.branch,
                                          message=args.message)
    print(commit.id)
    return 0


def cmd_tag(args: argparse.Namespace) -> int:
    print(Store(Path(args.store)).tag(args.repo, args.tag, args.revision))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    host, port = _listen(args.listen)
    cdn_port = args.cdn_port if args.cdn_port is not None else (port + 1 if port else 0)
    hub = HubServer(Store(Path(args.store)), host, port, cdn_port, log=sys.stderr)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    hub.start()
    if args.ready_file:
        write_private_json(Path(args.ready_file), {"endpoint": hub.endpoint, "cdn": hub.cdn_base})
    hub.note(f"serving {args.store} at {hub.endpoint} (CDN {hub.cdn_base})")
    stop.wait()
    hub.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m narwhal.lab.hub",
                                     description="A Hugging Face hub double for the lab.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = sub.add_parser("init", help="create a repo or change who may read it")
    p.add_argument("--store", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--gated", choices=["no", "auto", "manual"], default="no")
    p.add_argument("--private", action="store_true")
    p.add_argument("--grant-token-file", action="append", default=[],
                   help="a file holding a token to grant (repeatable)")
    p.set_defaults(handler=cmd_init)
    p = sub.add_parser("push", help="commit a folder as the branch's next commit; print its id")
    p.add_argument("--store", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--from", dest="from_", required=True)
    p.add_argument("--branch", default="main")
    p.add_argument("--message", default="Upload folder")
    p.set_defaults(handler=cmd_push)
    p = sub.add_parser("tag", help="point a tag at a revision; print its commit id")
    p.add_argument("--store", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--revision", default="main")
    p.set_defaults(handler=cmd_tag)
    p = sub.add_parser("serve", help="serve the store over HTTP until SIGTERM")
    p.add_argument("--store", required=True)
    p.add_argument("--listen", required=True, help="IP:PORT of the API; the CDN takes PORT+1")
    p.add_argument("--cdn-port", type=int, help="the CDN's port instead of PORT+1")
    p.add_argument("--ready-file", help="written (0600 JSON) once both origins listen")
    p.set_defaults(handler=cmd_serve)
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.handler(args)
        return result
    except NarwhalError as exc:
        print(f"narwhal lab hub: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"narwhal lab hub: {exc}", file=sys.stderr)
        return 1
