"""`narwhal lab up|down|status|exec|fault|hub`: the rehearsal fleet from the command line.

Dispatched by module name from the product CLI, so product code never imports the lab.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from narwhal.core.errors import NarwhalError
from narwhal.lab import defaults, envfile, lifecycle, spec
from narwhal.lab.run import LabError
from narwhal.lab.state import LabState


def _state_path(args: argparse.Namespace) -> Path:
    return Path(args.state) if args.state else lifecycle.default_state_path(args.name)


def _require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, mounts); run it as root")


def _spec_for(args: argparse.Namespace) -> spec.LabSpec:
    """The spec `up` builds: a file, the default with --engines engine hosts, or the default."""
    if args.engines is None:
        return spec.load(Path(args.spec) if args.spec else None)
    if args.spec:
        raise LabError("--spec and --engines: give one (--engines scales the default spec)")
    try:
        document = defaults.scaled_spec_document(args.engines, args.name)
    except ValueError as exc:
        raise LabError(str(exc)) from None
    return spec.validate(document, f"the default lab with {args.engines} engine hosts")


def cmd_up(args: argparse.Namespace) -> int:
    _require_root()
    lab_spec = _spec_for(args)
    path = Path(args.state) if args.state else lifecycle.default_state_path(lab_spec.name)
    plan = lifecycle.up(lab_spec, path)
    if args.env_out:
        envfile.write(plan, Path(args.env_out))
    sys.stdout.write(envfile.render(plan, reveal=False))
    state = LabState.read(plan.state_file)
    print(f"narwhal lab: {spec.SCHEMA} {lab_spec.name} up in {state.up_seconds:.2f} s; "
          f"state {plan.state_file}" + (f"; full .env (0600) in {args.env_out}" if args.env_out
                                        else "; passwords masked, use --env-out"),
          file=sys.stderr)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    _require_root()
    for line in lifecycle.down(args.name, _state_path(args)):
        print(f"narwhal lab: {line}", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    report = lifecycle.status(_state_path(args))
    if args.json:
        print(json.dumps(report, indent=1))
        return 0 if report["up"] else 1
    if not report["up"]:
        print(f"lab {args.name}: down")
        return 1
    print(f"lab {report['name']}: up (dir {report['dir']})")
    hosts = report["hosts"]
    assert isinstance(hosts, dict)
    for name, h in hosts.items():
        print(f"  {name:8} {h['role']:7} mgmt {h['mgmt_ip']:15} fabric {h['fabric_ip']:15} "
              f"{'running' if h['running'] else 'DOWN'}")
    hub = report.get("hub")
    if isinstance(hub, dict):
        print(f"  {'hub':8} {'hub':7} mgmt {hub['mgmt_ip']:15} {hub['endpoint']:22} "
              f"{'running' if hub['running'] else 'DOWN'}")
    for fault in report["faults"]:  # type: ignore[attr-defined]
        print(f"  fault: {json.dumps(fault, sort_keys=True)}")
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    """Replace this process with CMD inside the workstation namespace (or a host, with --host)."""
    _require_root()
    state = LabState.read(_state_path(args))
    plan = lifecycle.plan_from_state(state)
    command = [c for c in args.cmd if c != "--"] if args.cmd[:1] == ["--"] else list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise LabError("give a command after --, e.g. narwhal lab exec -- ssh ...")
    env = dict(os.environ, NARWHAL_LAB_SSH_CONFIG=str(plan.ssh_config))
    if args.host:
        hs = state.hosts[plan.host(args.host).name]
        if hs.init is None:
            raise LabError(f"host {args.host} is not running")
        argv = ["nsenter", "-t", str(hs.init.pid), "-n", "-m", "-u", "-p", "--", *command]
    else:
        argv = ["ip", "netns", "exec", plan.ws_netns, *command]
    os.execvpe(argv[0], argv, env)  # noqa: S606 - exec is the point: CMD's exit becomes ours
    return 127  # not reached


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="narwhal lab",
                                     description="A multi-host rehearsal fleet in network namespaces.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--name", default="nwl", help="lab name (namespace prefix); default nwl")
        p.add_argument("--state", help="state file path (default /run/narwhal-lab/<name>/state.json)")

    p = sub.add_parser("up", help="build the lab and print its .env inventory")
    common(p)
    p.add_argument("--spec", help="lab spec JSON (default: the embedded default spec)")
    p.add_argument("--engines", type=int, metavar="N",
                   help="the default spec with N engine hosts (1-63) and the router host, "
                        "named by --name")
    p.add_argument("--env-out", help="also write the full .env (with passwords) here, mode 0600")
    p.set_defaults(handler=cmd_up)
    p = sub.add_parser("down", help="remove the lab, also after a crashed run")
    common(p)
    p.set_defaults(handler=cmd_down)
    p = sub.add_parser("status", help="hosts, addresses and active faults")
    common(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_status)
    p = sub.add_parser("exec", help="run CMD in the workstation namespace: exec -- CMD")
    common(p)
    p.add_argument("--host", help="run inside this lab host instead (its network, mounts, PIDs)")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p.set_defaults(handler=cmd_exec)
    from narwhal.lab.fault_cli import register
    from narwhal.lab.hub_cli import register as register_hub

    register(sub, common)
    register_hub(sub, common)
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.handler(args)
        return result
    except NarwhalError as exc:
        print(f"narwhal lab: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
