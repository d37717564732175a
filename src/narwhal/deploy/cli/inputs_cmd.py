"""`narwhal init` (write a commented .env template) and `narwhal inputs` (validate, show)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from narwhal.core.cli_common import EXIT_BAD_INPUT, EXIT_OK
from narwhal.core.secret import MASK, Secret
from narwhal.deploy.actions.context import add_common
from narwhal.deploy.inputs import Inputs, load_inputs
from narwhal.deploy.inputs.template import TEMPLATE


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    init = sub.add_parser("init", help="write a commented .env template (mode 0600)")
    init.add_argument("--env", type=Path, default=Path(".env"))
    init.set_defaults(handler=run_init)
    show = sub.add_parser("inputs", help="validate the .env and show resolved inputs")
    add_common(show)
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.set_defaults(handler=run_inputs)


def run_init(args: argparse.Namespace) -> int:
    path: Path = args.env
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        print(f"narwhal init: {path} already exists; edit it, or move it away first")
        return EXIT_BAD_INPUT
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"narwhal init: cannot create {path} ({reason}); give --env a path in an existing, "
              "writable directory", file=sys.stderr)
        return EXIT_BAD_INPUT
    with os.fdopen(fd, "w") as out:
        out.write(TEMPLATE)
    print(f"wrote {path} (mode 0600); fill in the values, then run `narwhal inputs`")
    return EXIT_OK


def masked(inputs: Inputs) -> dict[str, object]:
    """The resolved inputs as JSON-ready data with every secret (ENGINE_ENV tokens included)
    replaced by the mask."""
    def clean(value: object) -> object:
        if isinstance(value, Secret):
            return MASK
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    data = inputs.model_dump(mode="python")
    data["source"] = str(inputs.source)
    data["router"]["ssh"] = inputs.router.ssh.text
    for engine, raw in zip(inputs.engines, data["engines"], strict=True):
        raw["ssh"] = engine.ssh.text
        raw["role"] = engine.role
    return clean(data)  # type: ignore[return-value]


def run_inputs(args: argparse.Namespace) -> int:
    inputs = load_inputs(args.env)
    data = masked(inputs)
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return EXIT_OK
    console = Console()
    table = Table(title=f"deployment {inputs.deployment} (revision {inputs.revision[:12]})")
    for column in ("role", "ssh", "auth", "image", "ports (engine/attest/nixl/events)", "fabric"):
        table.add_column(column)
    table.add_row("router", inputs.router.ssh.text,
                  "password" if inputs.router.ssh_password else "key", "", "", "")
    for engine in inputs.engines:
        table.add_row(engine.role, engine.ssh.text, "password" if engine.ssh_password else "key",
                      engine.engine_image[:19] + "…",
                      f"{engine.engine_port}/{engine.attest_port}/{engine.nixl_side_channel_port}"
                      f"/{engine.kv_events_port or '-'}",
                      f"{engine.fabric_interface} {engine.ip or ''}".strip())
    console.print(table)
    load = inputs.workload
    console.print(f"workload: {load.prompt_tokens} prompt tokens, {load.handoffs_per_s:g} "
                  f"handoffs/s, burst {load.burst:g}, transfer budget "
                  f"{load.transfer_budget_ms:g} ms, headroom {load.headroom:g}")
    console.print(f"kv canary: each producer -> consumer pair probed once per "
                  f"{inputs.kv_canary_interval_s:g} s while the router serves")
    secrets = ", ".join(sorted({s.name for s in inputs.secrets()})) or "none"
    console.print(f"secrets held (values never shown): {secrets}")
    return EXIT_OK
