"""`narwhal hosts trust` (pin host keys on first contact) and `narwhal hosts check`."""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor

from narwhal.core.cli_common import EXIT_FAILED, EXIT_OK
from narwhal.core.errors import HostError, HostKeyChanged
from narwhal.deploy.cli.context import Context, add_common
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.hosts.sessions import known_hosts_path, physical_hosts
from narwhal.deploy.hosts.trust import pinned_fingerprints, pinned_lines, scan
from narwhal.deploy.ledger.evidence import private_dir


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    hosts = sub.add_parser("hosts", help="first contact and access checks for every host")
    hosts_sub = hosts.add_subparsers(dest="hosts_command", metavar="ACTION")
    hosts_sub.required = True
    trust = hosts_sub.add_parser("trust", help="scan, show and pin each host's key")
    add_common(trust)
    trust.add_argument("--yes", action="store_true",
                       help="pin without asking (only after verifying fingerprints out of band)")
    trust.add_argument("--replace", metavar="ALIAS", action="append", default=[],
                       help="re-pin a host whose key changed (after verifying it)")
    trust.set_defaults(handler=run_trust)
    check = hosts_sub.add_parser("check", help="run `hostname` on every host, recorded")
    add_common(check)
    check.set_defaults(handler=run_check)


def run_trust(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    path = known_hosts_path(ctx.inputs, ctx.runs)
    private_dir(path.parent)
    keep = path.read_text().splitlines() if path.exists() else []
    added: list[str] = []
    for host in physical_hosts(ctx.inputs):
        keys = scan(host.destination, ctx.inputs.connect_timeout_s, host.alias)
        shown = ", ".join(f"{k.key_type} {k.fingerprint}" for k in keys)
        pinned = pinned_fingerprints(path, host.destination)
        if pinned:
            if set(pinned) & {k.fingerprint for k in keys} and host.alias not in args.replace:
                print(f"{host.alias}: already pinned ({shown})")
                continue
            if host.alias not in args.replace:
                raise HostKeyChanged(host.alias, ", ".join(pinned), shown)
            old = set(pinned_lines(path, host.destination))
            keep = [line for line in keep if line not in old]
        print(f"{host.alias} ({', '.join(host.roles)}): {shown}")
        if not args.yes:
            if not sys.stdin.isatty():
                print("narwhal hosts trust: verify these fingerprints out of band, then rerun "
                      "with --yes", file=sys.stderr)
                return EXIT_FAILED
            if input(f"pin {host.alias}? [y/N] ").strip().lower() != "y":
                continue
        added += [k.line for k in keys]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{line}\n" for line in keep + added))
    tmp.chmod(0o600)
    tmp.replace(path)
    print(f"pinned {len(added)} key(s) in {path}")
    return EXIT_OK


def run_check(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    sessions = ctx.sessions()
    failures = 0
    try:
        with ctx.ledger.attempt("access", fingerprint=ctx.fingerprints()["discover"],
                                hosts=sessions.roles(),
                                deployment_revision=ctx.inputs.revision) as attempt:
            hosts = [sessions.get(alias) for alias in sessions.hosts]
            with attempt.bind(*hosts), ThreadPoolExecutor(max_workers=8) as pool:
                results = list(pool.map(_hostname, hosts))
            for alias, ok, message in results:
                print(f"{alias}: {message}")
                failures += not ok
            if failures:
                attempt.block(f"{failures} host(s) not reachable; see the messages above")
    except HostError:
        return EXIT_FAILED
    finally:
        ctx.close()
    return EXIT_OK


def _hostname(host: Host) -> tuple[str, bool, str]:
    try:
        result = host.run(["hostname"], check=True)
    except HostError as exc:
        return host.alias, False, f"blocked: {exc}"
    return host.alias, True, f"reachable as {result.text.strip()}"
