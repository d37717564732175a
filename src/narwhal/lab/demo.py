"""`make demo`: the main job on the embedded default lab, with the product's own commands.

Brings the lab up (its model held by the lab's hub double, the engine hosts' model dirs
empty), hands its `.env` to the product unchanged (plus the approved revision), pins host
keys, checks access over SSH from the workstation namespace, prepares the install of the
checkout's HEAD, then `narwhal deploy` runs Gates A to G (the checkpoint staged from the hub
at a pinned commit and discovery, the install on
every host, the engines through the hosts' docker with their live KV capture, the fabric, the
attestation sidecars, profiles and preflight on the router host, the router and Prometheus
checked through an SSH forward) and, run again, keeps every gate. Then a capacity trial at two
rates with its HTML report, the live status, KV handoffs over the fabric, the record exported,
the lab taken down, and `narwhal status`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from narwhal.lab import lifecycle
from narwhal.lab.defaults import default_spec_document
from narwhal.lab.faults import Faults
from narwhal.lab.hosted_engines import MODEL_NAME, drive
from narwhal.lab.state import LabState

SHAPED_MBIT = 20


def _say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _run(argv: list[str], *, check: bool = True) -> int:
    print("$ " + " ".join(argv), flush=True)
    code = subprocess.run(argv, check=False).returncode
    if check and code != 0:
        raise SystemExit(f"demo: `{' '.join(argv)}` exited {code}")
    return code


def _json(argv: list[str]) -> dict[str, object]:
    print("$ " + " ".join(argv), flush=True)
    done = subprocess.run(argv, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"demo: `{' '.join(argv)}` exited {done.returncode}:\n"
                         f"{done.stdout}{done.stderr}")
    doc: dict[str, object] = json.loads(done.stdout)
    return doc


def _revision() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit("demo: run it from a git checkout of Narwhal (the approved revision "
                         "is the checkout's HEAD)")
    return done.stdout.strip()


def _keep_client_key(env: Path, work: Path) -> None:
    """Keep the lab's client key beside the .env, as an operator keeps theirs, so the record
    stays readable (`narwhal status`) after the lab is gone."""
    lines = env.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("NARWHAL_SSH_KEY="):
            source = Path(line.split("=", 1)[1].strip("'\""))
            kept = work / "id_ed25519"
            shutil.copyfile(source, kept)
            kept.chmod(0o600)
            lines[i] = f"NARWHAL_SSH_KEY={kept.resolve()}"
    env.write_text("\n".join(lines) + "\n")
    env.chmod(0o600)


def _write_inputs(env: Path, work: Path) -> str:
    """The lab's .env completed as an operator would: the client key kept beside it, the
    deployment and revision, and both keys (the router serves only clients with its key,
    engines only callers with theirs). Returns the engines' key, for the handoff demo."""
    _keep_client_key(env, work)
    engine_key = secrets.token_hex(24)
    with open(env, "a") as out:
        out.write(f"NARWHAL_DEPLOYMENT=demo\nNARWHAL_DEPLOYMENT_REVISION={_revision()}\n"
                  f"NARWHAL_ROUTER_API_KEY={secrets.token_hex(24)}\n"
                  f"NARWHAL_ENGINE_KEY={engine_key}\n")
    return engine_key


def _handoffs(engine_key: str) -> None:
    """engine-1 (eng1) and engine-2 (eng2), started by Gate C: P/D handoffs pull real KV bytes
    over the fabric; shaping eng1 -> eng2 slows them in proportion to their bytes. Sent from
    the router host, where the engines are reached (they bind their fabric addresses), with
    the engines' key."""
    state_path = lifecycle.default_state_path("nwl")
    plan = lifecycle.plan_from_state(LabState.read(state_path))
    words = ["150", "600"]
    p, d = (f"http://{plan.host(h).fabric_ip}:{plan.spec.ports.engine}" for h in ("eng1", "eng2"))
    print(f"prefill {p} on eng1, decode {d} on eng2, KV over the fabric", flush=True)

    def handoffs(*sizes: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = drive(plan, "handoff", p, d, "--model", MODEL_NAME,
                                           "--words", *sizes, netns=plan.router().netns,
                                           engine_key=engine_key)["rows"]
        return rows
    handoffs("5")
    open_rows = handoffs(*words)
    with lifecycle.locked():
        Faults(state_path).shape("eng1", "eng2", f"{SHAPED_MBIT}mbit")
    try:
        shaped_rows = handoffs(*words)
    finally:
        with lifecycle.locked():
            Faults(state_path).clear()
    print(f"{'prompt tokens':>14} {'~KV bytes':>10} {'decode leg, open':>17} "
          f"{'decode leg, ' + str(SHAPED_MBIT) + ' mbit':>20}")
    for fast, slow in zip(open_rows, shaped_rows, strict=True):
        kv_bytes = fast["prompt_tokens"] * 2048  # the lab model: 2 KiB of KV per token
        print(f"{fast['prompt_tokens']:>14} {kv_bytes:>10} {fast['decode_s']:>16.3f}s "
              f"{slow['decode_s']:>19.3f}s", flush=True)


def _engines_down(narwhal: str, common: list[str]) -> None:
    _say("engines down, each through its role shell (`narwhal-engine stop` on its host)")
    run_dir = lifecycle.plan_from_state(LabState.read(lifecycle.default_state_path(
        "nwl"))).spec.run_dir
    for n in (1, 2, 3):
        _run([narwhal, "lab", "exec", "--", narwhal, "shell", *common, "--role",
              f"engine-{n}", "--", "narwhal-engine", "stop", "--run-dir",
              f"{run_dir}/engine-{n}"])


def _hub_spec(work: Path) -> Path:
    """The default lab with its model held by the hub only (engine model dirs empty)."""
    doc = default_spec_document()
    doc["model"]["hub"] = True
    path = work / "lab-spec.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def _through_gate_a(narwhal: str, work: Path, common: list[str]) -> list[str]:
    """The wheelhouse, Gate A (staging the checkpoint, then discovery) and Gate B's
    preparation; the `narwhal deploy` command line that resumes at Gate B."""
    deploy = [narwhal, "lab", "exec", "--", narwhal, "deploy", "--fabric-seconds", "2", *common]
    _say("the runtime wheelhouse, built here where a package index answers (the lab's "
         "namespaces have none): gate A's stage kit and gate B's install both take it")
    _run([narwhal, "install", "--wheels-only", *common])
    _say("narwhal deploy --until A: gate A pins the model's revision on the hub to a "
         "commit, stages the checkpoint on every engine host (each downloads with the "
         "locked hub client), then discovers every host at once (GPUs, image, checkpoint "
         "digest, fabric, ports) and checks each engine's allocation")
    _run([*deploy, "--until", "A"])
    _say("gate B's preparation, here: the lab's hosts and workstation namespace have no "
         "package index, so the install is prepared (its wheelhouse built) where one "
         "answers, from Gate A's facts")
    checkout = work / "checkout"  # HEAD exactly: uncommitted edits are not the revision
    _run(["git", "clone", "-q", ".", str(checkout)])
    prepared = str(_json([narwhal, "install", "--checkout", str(checkout), "--prepare-only",
                          "--json", *common])["prepared_run"])
    return [*deploy, "--prepared", prepared]


def main() -> int:
    if os.geteuid() != 0:
        print("demo: the lab builds network namespaces and needs root; run `sudo make demo`")
        return 1
    narwhal = str(Path(sys.executable).parent / "narwhal")
    work = Path(".demo") / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    work.mkdir(parents=True, mode=0o700)
    env = work / ".env"
    common = ["--env", str(env), "--runs", str(work / "runs")]
    _say("lab up: a router host and three engine hosts in network namespaces, and a Hugging "
         "Face hub double holding the model; the engine hosts' model dirs are empty")
    _run([narwhal, "lab", "down"], check=False)
    _run([narwhal, "lab", "up", "--spec", str(_hub_spec(work)), "--env-out", str(env)])
    try:
        engine_key = _write_inputs(env, work)
        _say("inputs: the lab's .env, validated (secrets masked)")
        _run([narwhal, "inputs", *common])
        _say("first contact: scan, show and pin every host key")
        _run([narwhal, "lab", "exec", "--", narwhal, "hosts", "trust", "--yes", *common])
        _say("access: one SSH master per physical host, every command recorded")
        _run([narwhal, "lab", "exec", "--", narwhal, "hosts", "check", *common])
        deploy = _through_gate_a(narwhal, work, common)
        _say("narwhal deploy: resumes at gate B (A is passed and fresh). B installs the "
             "revision offline and hash-checked; C starts every engine through the hosts' "
             "docker and captures its live KV cache; D proves every directed fabric edge "
             "against the budget of that cache; E attests the live engine processes from the "
             "router host; F profiles each engine once and proves every ordered pair's KV "
             "handoff; G starts the router and Prometheus, checked through an SSH forward")
        _run(deploy)
        _say("narwhal deploy again: every gate passed and fresh, so nothing runs")
        _run(deploy)
        _say("gate G trial: two rates through the SSH forward, each after the router drained, "
             "every request reconciled with the router's journal")
        _run([narwhal, "lab", "exec", "--", narwhal, "trial", "--rates", "1,2", "--requests",
              "10", *common])
        _say("status, live: every attested engine's sidecar asked from the router host")
        _run([narwhal, "lab", "exec", "--", narwhal, "status", *common])
        _say("handoffs: the engines Gate C started hand KV to each other across the fabric")
        _handoffs(engine_key)
        _engines_down(narwhal, common)
        _say("export: the record with addresses, users, homes and secrets aliased")
        _run([narwhal, "record", "export", "--out", str(work / "export"), *common])
    finally:
        _say("lab down")
        _run([narwhal, "lab", "down"], check=False)
    _say("status (the record; the lab is down, so no host is asked)")
    _run([narwhal, "status", "--offline", *common])
    return 0


if __name__ == "__main__":
    sys.exit(main())
