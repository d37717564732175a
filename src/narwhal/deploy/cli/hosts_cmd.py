"""`narwhal hosts trust` (pin host keys on first contact) and `narwhal hosts check`.

Both are recorded activities: `trust` (runs/<deployment>/trust/<attempt>/trust.json: each
alias's pinned fingerprints, and for --replace the old beside the new) and `access` (each
host's `hostname`, the runbook's runs/access-<id>/)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from narwhal.core.cli_common import EXIT_FAILED, EXIT_OK
from narwhal.core.errors import GateBlocked, HostKeyChanged
from narwhal.core.private_file import write_private
from narwhal.deploy.actions.access import check_hosts
from narwhal.deploy.actions.context import Context, add_common
from narwhal.deploy.hosts.sessions import PhysicalHost, known_hosts_path, physical_hosts
from narwhal.deploy.hosts.trust import (
    CONFIRMED,
    HostTrust,
    ScannedKey,
    known_hosts_after,
    pinned_keys,
    scan,
    trust_action,
    trust_record,
)
from narwhal.deploy.ledger.evidence import private_dir

TRUST = "trust"  # the activity a `hosts trust` run is recorded as


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
    """Pin each host's key, recorded as the `trust` activity: its trust.json names, per host
    alias, the fingerprints pinned (for --replace the old beside the new), so a later "host
    key changed" can be judged against what the operator verified."""
    ctx = Context.load(args)
    path = known_hosts_path(ctx.inputs, ctx.runs)
    private_dir(path.parent)
    hosts = physical_hosts(ctx.inputs)
    destinations = {"hosts": ctx.fingerprints()["discover"]["hosts"]}
    try:
        with ctx.ledger.attempt(TRUST, fingerprint=destinations,
                                hosts={h.alias: list(h.roles) for h in hosts},
                                deployment_revision=ctx.inputs.revision) as attempt:
            survey = [_survey(h, path, ctx.inputs.connect_timeout_s, h.alias in args.replace)
                      for h in hosts]
            try:
                _apply(survey, path, args.yes)
            finally:
                attempt.add_json("trust.json", trust_record(path, survey))
    except GateBlocked as exc:
        print(f"narwhal hosts trust: {exc.cause}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _survey(host: PhysicalHost, known_hosts: Path, timeout: int, replace: bool) -> HostTrust:
    """Scan one host and decide what to do with it (trust_action), before anything is asked."""
    presented = scan(host.destination, timeout, host.alias)
    previous = pinned_keys(known_hosts, host.destination)
    action = trust_action([k.fingerprint for k in previous],
                          [k.fingerprint for k in presented], replace)
    return HostTrust(host.alias, list(host.roles), previous, presented, action)


def _shown(keys: list[ScannedKey]) -> str:
    return ", ".join(f"{k.key_type} {k.fingerprint}" for k in keys)


def _apply(survey: list[HostTrust], known_hosts: Path, yes: bool) -> None:
    """Ask for (or take --yes as) confirmation of each new key, then rewrite known_hosts once.

    A changed key refuses the whole run before anything is asked or written; so does a
    confirmation no one can give (no terminal and no --yes)."""
    refused = [h for h in survey if h.action == "changed"]
    for host in refused:
        host.outcome = "refused"
    if refused:
        raise GateBlocked(TRUST, "; ".join(str(HostKeyChanged(
            h.alias, ", ".join(k.fingerprint for k in h.previous), _shown(h.presented)))
            for h in refused))
    for host in survey:
        if host.action == "kept":
            host.outcome = "kept"
            print(f"{host.alias}: already pinned ({_shown(host.presented)})")
            continue
        print(f"{host.alias} ({', '.join(host.roles)}): {_shown(host.presented)}")
        answer = _confirm(host.alias, yes)
        if answer is None:
            host.outcome = "unconfirmed"
            raise GateBlocked(TRUST, "verify these fingerprints out of band, then rerun with "
                              "--yes")
        host.outcome = CONFIRMED[host.action] if answer else "declined"
    lines = known_hosts.read_text().splitlines() if known_hosts.exists() else []
    write_private(known_hosts, "".join(f"{line}\n" for line in known_hosts_after(lines, survey)))
    pinned = sum(len(h.presented) for h in survey if h.outcome in CONFIRMED.values())
    print(f"pinned {pinned} key(s) in {known_hosts}")


def _confirm(alias: str, yes: bool) -> bool | None:
    """True to pin, False when the operator declines, None when no one can be asked."""
    if yes:
        return True
    if not sys.stdin.isatty():
        return None
    return input(f"pin {alias}? [y/N] ").strip().lower() == "y"


def run_check(args: argparse.Namespace) -> int:
    return check_hosts(Context.load(args), print)
