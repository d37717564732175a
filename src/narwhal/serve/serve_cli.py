"""`narwhal-serve`: the prefill/decode-aware router in front of the fleet (gate G).

    narwhal-serve --fleet FLEET.json [--host 127.0.0.1] [--port 8000] [--log-level warning]
                  [--standby-of http://PRIMARY:PORT]

The fleet document is read and checked before anything listens; every problem in it is
printed at once (exit 2). A router then claims the fleet's controller lease (a file, or a
majority of the attestation sidecars: `controller.quorum`); if another router holds it, this
one refuses to serve and names that router (exit 1), unless it was started as a warm standby
(`--standby-of`), which waits for the lease. The process runs until
SIGTERM/SIGINT (or until it loses the lease: exit 1), drains, and prints one `NARWHAL_RESULT`
line with what it served.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import uvloop

from narwhal.core import result_line
from narwhal.core.cli_common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from narwhal.core.errors import InputError
from narwhal.core.fleet import load_fleet
from narwhal.serve.router.app import Router
from narwhal.serve.router.calibrated_deadline import check_fleet_deadline
from narwhal.serve.router.control.lease import LeaseHeld
from narwhal.serve.router.control.quorum_lease import LeaseUnavailable
from narwhal.serve.router.settings import settle

DESCRIPTION = "The prefill/decode-aware router in front of the fleet (gate G)."
COMMAND = "narwhal-serve"


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return int(text)


def _base_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme != "http" or not parts.hostname or parts.port is None \
            or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a router base URL; write http://HOST:PORT of the primary router")
    return text.rstrip("/")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=COMMAND, description=DESCRIPTION,
        epilog="Serves /v1/completions, /v1/chat/completions, /v1/models, /health, /ready, "
               "/metrics and /narwhal/state; see docs/router.md.")
    p.add_argument("--fleet", required=True, type=Path, metavar="FLEET.json",
                   help="the narwhal.fleet v1 document (engines, SLO, limits, tenants, journal)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", default=8000, type=_port, help="port to listen on (default 8000)")
    p.add_argument("--log-level", default="warning",
                   choices=["debug", "info", "warning", "error"],
                   help="stderr log level (default warning; nothing is logged per request)")
    p.add_argument("--standby-of", type=_base_url, metavar="URL",
                   help="run as a warm standby of the primary router at URL: follow its handoff "
                        "document and take over only by acquiring the fleet's lease")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"{COMMAND}: %(levelname)s %(name)s: %(message)s")
    try:
        fleet = load_fleet(args.fleet)
        check_fleet_deadline(fleet, args.fleet)  # a deadline below the calibrated one: exit 2
        settings = settle(fleet, os.environ, args.fleet)
        router = Router(settings, standby_of=args.standby_of)  # reads the profile store
    except InputError as exc:
        print(f"{COMMAND}: {exc}", file=sys.stderr)
        print(result_line.render(COMMAND, False, error=str(exc).splitlines()[0]))
        return EXIT_BAD_INPUT
    try:
        summary = uvloop.run(router.serve(args.host, args.port))
    except LeaseHeld as exc:
        message = (f"refusing to serve: {exc}; this fleet has one active router. Stop that "
                   f"router first, or start this one with --standby-of {exc.record.url} to take "
                   f"over when it goes ({settings.controller.where})")
        print(f"{COMMAND}: {message}", file=sys.stderr)
        print(result_line.render(COMMAND, False, error=message))
        return EXIT_FAILED
    except LeaseUnavailable as exc:
        message = (f"cannot acquire the controller lease ({settings.controller.where}): {exc}")
        print(f"{COMMAND}: {message}", file=sys.stderr)
        print(result_line.render(COMMAND, False, error=message))
        return EXIT_FAILED
    except OSError as exc:
        message = f"cannot serve on {args.host}:{args.port} or open the journal: {exc}"
        print(f"{COMMAND}: {message}", file=sys.stderr)
        print(result_line.render(COMMAND, False, error=message))
        return EXIT_FAILED
    fenced = router.leadership.role == "fenced"
    if fenced:
        print(f"{COMMAND}: stopped because it lost the controller lease: "
              f"{router.leadership.fenced_reason}", file=sys.stderr)
    print(result_line.render(COMMAND, not fenced, summary,
                             error="lost the controller lease" if fenced else ""))
    return EXIT_FAILED if fenced else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
