"""`narwhal lab hub push|info`: the running lab's hub from the command line.

`push` commits a folder as main's next commit of the lab model's repo (or --repo), so a drill
can move main under a deployment pinned to an earlier commit.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from narwhal.lab import labhub, lifecycle
from narwhal.lab.plan import LabPlan
from narwhal.lab.state import LabState, alive


def _plan_and_state(args: argparse.Namespace) -> tuple[LabPlan, LabState]:
    state = LabState.read(Path(args.state) if args.state else lifecycle.default_state_path(args.name))
    return lifecycle.plan_from_state(state), state


def _push(args: argparse.Namespace) -> int:
    with lifecycle.locked():
        plan, _ = _plan_and_state(args)
        commit = labhub.push(plan, Path(args.from_), repo_id=args.repo, branch=args.branch,
                             message=args.message)
    print(commit)
    return 0


def _info(args: argparse.Namespace) -> int:
    plan, state = _plan_and_state(args)
    access = labhub.hub_access(plan)
    if access is None:
        print(json.dumps({"hub": None}))
        return 1
    print(json.dumps({"endpoint": access.endpoint, "repo_id": access.repo_id,
                      "token_file": str(access.token_path) if access.token_path else None,
                      "netns": plan.hub_netns, "running": bool(state.hub and alive(state.hub))},
                     indent=1))
    return 0


def register(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("hub", help="the lab's Hugging Face hub double: push, info")
    verbs = p.add_subparsers(dest="hub_command", metavar="VERB", required=True)
    push = verbs.add_parser("push", help="commit a folder to the lab hub; print the commit id")
    common(push)
    push.add_argument("--from", dest="from_", required=True, help="the folder (its whole tree)")
    push.add_argument("--repo", help="owner/name (default: the lab model's repo)")
    push.add_argument("--branch", default="main")
    push.add_argument("--message", default="Upload folder")
    push.set_defaults(handler=_push)
    info = verbs.add_parser("info", help="the hub's endpoint, repo id and token file")
    common(info)
    info.set_defaults(handler=_info)
