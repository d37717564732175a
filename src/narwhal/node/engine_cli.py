"""`narwhal-engine`: checked engine launch on an engine host and capture of its live KV cache.

Run on the engine host from the installed venv (Gate B), by Gate C over SSH; each subcommand
prints exactly one NARWHAL_RESULT line, last, and keeps its state in the engine's run dir:

    prepare --launch L --run-dir D [--runtime R] [--transfer P] [--secrets S]
                                                   launch record -> run plan (D/launch.json)
    check   --run-dir D                            the plan against the host now (D/checked.json)
    start   --run-dir D [--secrets S]              only a checked, unchanged plan (D/started.json)
    capture --run-dir D [--secrets S] [--timeout T] the live cache layout (D/cache-layout.json)
                                                   and its raw HTTP exchanges (D/http-captures.json)
    evidence --run-dir D [--log-bytes N]           the engine log's tail (D/engine-log-tail.txt)
    idle    --run-dir D                            its load gauges and counters (Gate D's proof)
    stop    --run-dir D                            what start started, if it still is that
    state   --run-dir D                            whether what start started still runs
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from narwhal.core import result_line
from narwhal.core.documents import canonical_json, sha256_bytes
from narwhal.core.errors import NarwhalError
from narwhal.core.flag_types import number
from narwhal.core.launch_record import ENGINE_API_KEY_ENV
from narwhal.core.run_plan import read_plan
from narwhal.core.transfer_path import TransferPath
from narwhal.node.engine.errors import RuntimeError_
from narwhal.node.engine.runtimes import NAMES

if TYPE_CHECKING:
    from narwhal.node.engine.runtimes.base import Started

# Each subcommand imports only what it uses: Gate D runs `idle` on every engine around
# every fabric sample, so its start-up time is part of the gate's overhead.

DESCRIPTION = ("Checked engine launch on an engine host and capture of the live KV cache it "
               "allocated (gate C).")
COMMAND = "narwhal-engine"
LOG_TAIL = "engine-log-tail.txt"
LOG_BYTES = 4 << 20


class Refused(Exception):
    """The subcommand will not do it; the message says why and what to do."""


def _write(path: Path, data: bytes) -> None:
    """Whole or not at all: a full disk leaves neither a torn file nor the part file."""
    part = path.with_name(path.name + f".part-{os.getpid()}")
    try:
        with open(part, "wb") as f:
            f.write(data)
        os.replace(part, path)
    except OSError as exc:
        part.unlink(missing_ok=True)
        full = " (disk full)" if exc.errno == errno.ENOSPC else ""
        raise OSError(exc.errno, f"cannot write {path}: {exc.strerror}{full}") from None


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc
    except FileNotFoundError:
        raise Refused(f"no {path.name} in {path.parent}: run `narwhal-engine {what}` first"
                      ) from None


def _plan(run_dir: Path) -> tuple[dict[str, Any], str]:
    data = (run_dir / "launch.json").read_bytes() if (run_dir / "launch.json").exists() else b""
    if not data:
        raise Refused(f"no launch.json in {run_dir}: run `narwhal-engine prepare` first")
    return read_plan(data, str(run_dir / "launch.json")), sha256_bytes(data)


def _started(run_dir: Path) -> Started:
    from narwhal.node.engine.runtimes.base import Started

    s = _read_json(run_dir / "started.json", "start")
    return Started(s["runtime"], s["id"], s["created"])


def _rdma_nodes(root: str = "/dev/infiniband") -> list[str]:
    """This host's RDMA device nodes, which an RDMA path's container is given."""
    try:
        return [f"{root}/{name}" for name in sorted(os.listdir(root))]
    except OSError:
        return []


def do_prepare(args: argparse.Namespace) -> dict[str, Any]:
    from narwhal.node.engine import runplan

    record, record_sha = runplan.load_record(Path(args.launch))
    runtime = args.runtime or record.runtime
    path = TransferPath.model_validate_json(args.transfer).on_host(_rdma_nodes()) \
        if args.transfer else None
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    built = runplan.build(record, record_sha, runtime, path)
    if args.secrets:  # where start and capture read the plan's secrets unless told otherwise
        built["secrets_dir"] = str(Path(args.secrets).resolve())
    data = runplan.plan_bytes(built)
    _write(run_dir / "launch.json", data)
    return {"engine": record.engine, "plan_sha256": sha256_bytes(data), "runtime": runtime}


def do_check(args: argparse.Namespace) -> dict[str, Any]:
    from narwhal.node.engine import checks

    run_dir = Path(args.run_dir)
    plan, plan_sha = _plan(run_dir)
    found = checks.run_all(plan, plan["runtime"])
    ok = all(c["ok"] for c in found)
    try:
        _write(run_dir / "checked.json", canonical_json(
            {"plan_sha256": plan_sha, "ok": ok, "checks": found}).encode() + b"\n")
    except OSError as exc:  # the checks are still the answer; the run dir joins them
        found.append(checks.failed("run dir", str(exc), f"free space on the filesystem of "
                                   f"{run_dir}, then run the gate again"))
        ok = False
    return {"engine": plan["engine"], "plan_sha256": plan_sha, "ok": ok, "checks": found}


def _owned_container(text: str) -> tuple[str, str]:
    """`--replace-owned ID:CREATED`: a full 64-hex container Id and its creation time."""
    container_id, sep, created = text.partition(":")
    if not sep or not re.fullmatch(r"[0-9a-f]{64}", container_id) or not created \
            or len(created) > 64 or any(c.isspace() for c in created):
        raise Refused(f"--replace-owned {text[:80]!r}: give the full container Id (64 hex "
                      "digits), a colon and its creation time as the runtime reports it")
    return container_id, created


def _secrets(plan: dict[str, Any], folder: str | None) -> dict[str, str]:
    """The plan's secret variables, each read from its 0600 file in `folder` (never argv)."""
    secrets: dict[str, str] = {}
    for name in plan["secret_environment"]:
        if folder is None:
            raise Refused(f"the plan needs the secret {name}: pass --secrets DIR")
        path = Path(folder) / name
        try:
            secrets[name] = path.read_text().rstrip("\n")
        except OSError as exc:
            raise Refused(f"the plan needs the secret {name} and {path} cannot be read "
                          f"({exc.strerror}): install the prepared run again "
                          "(`narwhal install`)") from None
    return secrets


def do_start(args: argparse.Namespace) -> dict[str, Any]:
    from narwhal.node.engine import runtime as rt

    owned = frozenset(_owned_container(v) for v in args.replace_owned)  # refused first
    run_dir = Path(args.run_dir)
    plan, plan_sha = _plan(run_dir)
    checked = _read_json(run_dir / "checked.json", "check")
    if checked.get("plan_sha256") != plan_sha:
        raise Refused("launch.json changed after `check` (plan edited): run `narwhal-engine "
                      "check` again before starting")
    if not checked.get("ok"):
        raise Refused("the last `check` of this plan failed; fix what it named and check again")
    started, ran = rt.start(plan, _secrets(plan, args.secrets or plan.get("secrets_dir")),
                            run_dir / "engine.log", owned)
    _write(run_dir / "started.json", canonical_json(started.as_json()).encode() + b"\n")
    return {"engine": plan["engine"], **started.as_json(), "commands": ran}


def do_capture(args: argparse.Namespace) -> dict[str, Any]:
    from narwhal.node.engine.capture import capture
    from narwhal.node.engine.http_capture import FILE as HTTP_FILE
    from narwhal.node.engine.http_capture import Exchanges

    run_dir = Path(args.run_dir)
    (run_dir / HTTP_FILE).unlink(missing_ok=True)  # never an earlier capture's as this one's
    plan, _ = _plan(run_dir)
    key = _secrets(plan, args.secrets or plan.get("secrets_dir")).get(ENGINE_API_KEY_ENV) \
        if ENGINE_API_KEY_ENV in plan["secret_environment"] else None
    kept = Exchanges()
    try:
        doc = capture(plan, _started(run_dir), run_dir / "engine.log", args.timeout, key, kept)
    finally:  # what the engine answered is the evidence of a failed capture most of all
        with contextlib.suppress(OSError):
            _write(run_dir / HTTP_FILE, kept.document(plan["engine"]))
    data = canonical_json(doc).encode() + b"\n"
    _write(run_dir / "cache-layout.json", data)
    return {"engine": plan["engine"], "cache_layout_sha256": sha256_bytes(data),
            "cache_layout": doc}


def _file_facts(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    data = path.read_bytes()
    return {"path": str(path), "bytes": len(data), "sha256": sha256_bytes(data)}


def do_evidence(args: argparse.Namespace) -> dict[str, Any]:
    """The engine log's last `--log-bytes` written to the run dir beside the capture's HTTP
    exchanges, each named with its length and sha256, for the workstation to read as Gate C's
    evidence. Works after a failed start or capture too: that is when the log matters most."""
    from narwhal.node.engine import runtime as rt
    from narwhal.node.engine.http_capture import FILE as HTTP_FILE

    run_dir = Path(args.run_dir)
    log_path = run_dir / "engine.log"
    started = _started(run_dir) if (run_dir / "started.json").exists() else None
    data, total = rt.log_tail(started, log_path, args.log_bytes)
    _write(run_dir / LOG_TAIL, data)
    source = rt.log_source(started, log_path)
    return {"log": {**(_file_facts(run_dir / LOG_TAIL) or {}), "source": source,
                    "total_bytes": total, "limit_bytes": args.log_bytes},
            "http": _file_facts(run_dir / HTTP_FILE)}


def do_idle(args: argparse.Namespace) -> dict[str, Any]:
    from narwhal.node.engine.idle import activity

    plan, _ = _plan(Path(args.run_dir))
    return activity(plan)


def do_stop(args: argparse.Namespace) -> dict[str, Any]:
    from narwhal.node.engine import runtime as rt

    run_dir = Path(args.run_dir)
    started = _started(run_dir)
    return {"result": rt.stop(started), **started.as_json()}


def do_state(args: argparse.Namespace) -> dict[str, Any]:
    """Whether the engine `start` started is still that process (or container) and running:
    what `narwhal status` asks when an engine's sidecar says its process is gone or cannot
    be read. Never started (no started.json, e.g. a host whose run dir was lost) is not
    running either."""
    from narwhal.node.engine import runtime as rt

    run_dir = Path(args.run_dir)
    if not (run_dir / "started.json").exists():
        return {"started": False, "running": False}
    started = _started(run_dir)
    return {"started": True, "running": rt.alive(started), **started.as_json()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=DESCRIPTION)
    sub = parser.add_subparsers(dest="sub", required=True)
    p = sub.add_parser("prepare", help="launch record -> run plan (launch.json)")
    p.add_argument("--launch", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--runtime", choices=list(NAMES), default=None)
    p.add_argument("--transfer", default=None, metavar="PATH_JSON",
                   help="the KV transfer path Gate C derived (core/transfer_path.py)")
    p.add_argument("--secrets", default=None, help="the folder of 0600 secret files start "
                   "and capture read (recorded in the plan; never read here)")
    p.set_defaults(handler=do_prepare)
    p = sub.add_parser("check", help="the plan against the host now (checked.json)")
    p.add_argument("--run-dir", required=True)
    p.set_defaults(handler=do_check)
    p = sub.add_parser("start", help="start a checked, unchanged plan (started.json)")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--secrets", default=None, help="folder of 0600 secret files")
    p.add_argument("--replace-owned", action="append", default=[], metavar="ID:CREATED",
                   help="a container the deployment record owns (its full Id and creation "
                        "time): removed first if it holds the plan's container name")
    p.set_defaults(handler=do_start)
    p = sub.add_parser("capture", help="the live cache layout (cache-layout.json)")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--secrets", default=None, help="folder of 0600 secret files (the engine's "
                   "API key, when its plan has one)")
    p.add_argument("--timeout", type=float, default=300.0)
    p.set_defaults(handler=do_capture)
    p = sub.add_parser("evidence", help="the engine log's tail (engine-log-tail.txt) and "
                       "what the capture's HTTP exchanges file holds")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--log-bytes", type=number(int, 1, 64 << 20), default=LOG_BYTES, metavar="N",
                   help=f"keep the log's last N bytes (default {LOG_BYTES >> 20} MiB)")
    p.set_defaults(handler=do_evidence)
    p = sub.add_parser("idle", help="the engine's load gauges and counters now")
    p.add_argument("--run-dir", required=True)
    p.set_defaults(handler=do_idle)
    p = sub.add_parser("stop", help="stop what start started, if it still is that")
    p.add_argument("--run-dir", required=True)
    p.set_defaults(handler=do_stop)
    p = sub.add_parser("state", help="whether what start started still runs")
    p.add_argument("--run-dir", required=True)
    p.set_defaults(handler=do_state)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = f"{COMMAND} {args.sub}"
    try:
        data = args.handler(args)
    except (Refused, RuntimeError_, NarwhalError, OSError, ValueError) as exc:
        print(result_line.render(command, False, {}, str(exc)))
        return 1
    ok = bool(data.get("ok", True))
    print(result_line.render(command, ok, data, "" if ok else "a check failed"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
