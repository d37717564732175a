"""`narwhal shell --role ROLE [-- CMD ...]`: a role shell on its host, as the runbook opens them.

In the installed checkout of Gate B's passed attempt, with the role's environment file
loaded and the venv active, over the host's one SSH master. With CMD, that command runs the
same way, its argv and output recorded in the ledger (activity `shell`); without, the shell
is interactive and the ledger records that it was opened and how it ended.
"""

from __future__ import annotations

import argparse
import json
import sys

from narwhal.core.cli_common import EXIT_FAILED
from narwhal.core.errors import InputError, Problem
from narwhal.deploy.actions.context import Context, add_common
from narwhal.deploy.gates.handoff import passed_artifact
from narwhal.deploy.gates.install import install_dir
from narwhal.deploy.gates.spec import Reads
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.ssh import SshHost

INSTALL_PLAN = Reads("install", "plan.json")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("shell", help="a role shell on its host: installed checkout, role "
                       "environment, venv (or run one command so, recorded)")
    add_common(p)
    p.add_argument("--role", required=True, help="engine-<n> or router")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...: run one command")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    cmd = list(args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd)
    plan = passed_artifact(ctx.ledger, "shell", INSTALL_PLAN).json()
    sessions = ctx.sessions()
    roles = sessions.roles()
    alias = next((a for a, rs in roles.items() if args.role in rs), None)
    if alias is None:
        known = ", ".join(r for rs in roles.values() for r in rs)
        raise InputError("--role", [Problem("--role", f"{args.role!r} is not a role of this "
                                            "deployment", f"use one of: {known}")])
    try:
        host = sessions.get(alias)
        base = install_dir(host, str(plan["remote_dir"]))
        env = f"{base}/runs/{plan['prepared_run']}/env/{args.role}.env"
        argv = cl.role_shell(base, env, cmd)
        with ctx.ledger.attempt("shell", fingerprint={}, hosts={alias: [args.role]},
                                deployment_revision=ctx.inputs.revision) as attempt:
            if cmd:
                with attempt.bind(host):
                    done = host.run(argv, timeout=None)
                sys.stdout.buffer.write(done.stdout)
                sys.stderr.buffer.write(done.stderr)
                code = done.exit_status
            elif isinstance(host, SshHost):
                code = host.interactive(argv)
            else:
                print("narwhal shell: the workstation has no role shell", file=sys.stderr)
                return EXIT_FAILED
            attempt.add_artifact("shell.json", json.dumps(
                {"role": args.role, "host": alias, "command": cmd or None,
                 "exit_status": code}, indent=1).encode() + b"\n")
        return code
    finally:
        ctx.close()
