"""The model's tokenizer files for the router host, when engines publish KV cache events.

The router keys an engine's cached blocks by the token ids its events carry and a request's
blocks by the ids its own tokenizer gives the prompt (serve/router/cache/), so the router host
needs the very tokenizer the engines load. Gate A takes it from the checkpoint it has just
hashed: each file is read over the engine host's session and held to the sha256 Gate A's probe
measured for it (model rows), so the router's copy is the checkpoint's, byte for byte. The
files are kept as Gate A artifacts; Gate F places them beside the fleet it writes on the
router host (`router/tokenizer/`) and names that folder in `prefix_cache.tokenizer_dir`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from narwhal.core.errors import HostError, Problem, TransferMismatch
from narwhal.deploy.gates.discover_checks import EnginePlan
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.base import Host

# What serve/router/cache/prompt_ids.py reads (tokenizer.json, the chat template in
# tokenizer_config.json or, in newer checkpoints, chat_template.jinja) and what a Hugging Face
# tokenizer folder may add beside them.
REQUIRED = "tokenizer.json"
FILES = (REQUIRED, "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
         "tokenizer.model")
MANIFEST = "router-tokenizer.json"  # Gate A's artifact naming the files it kept
ROUTER_DIR = "tokenizer"  # beside the router's fleet.json: prefix_cache.tokenizer_dir


def source(plans: Sequence[EnginePlan]) -> EnginePlan | None:
    """The engine whose checkpoint the router's tokenizer comes from: the first that
    publishes KV events (every engine serves one checkpoint, Gate A checks its digest)."""
    return next((p for p in plans if p.engine.kv_events_port is not None), None)


def wanted(facts: Mapping[str, Any]) -> dict[str, str]:
    """Tokenizer file -> the sha256 Gate A's probe measured, for those at the model's top."""
    rows = (facts.get("model") or {}).get("rows") or []
    found = {str(r[0]): str(r[2]) for r in rows if isinstance(r, list) and len(r) == 3}
    return {name: found[name] for name in FILES if found.get(name)}


def missing(plan: EnginePlan, files: Mapping[str, str]) -> list[Problem]:
    """The checkpoint lacks the file the router tokenizes with: events could not be used."""
    if REQUIRED in files:
        return []
    e = plan.engine
    return [Problem(f"{plan.host}: NARWHAL_KV_EVENTS_PORT",
                    f"{e.role} publishes KV cache events but its checkpoint {e.model_dir} has "
                    f"no {REQUIRED}: the router could not key prompts as the engine does",
                    f"add the model's {REQUIRED} (a fast tokenizer, saved with "
                    "save_pretrained) to the checkpoint, or delete NARWHAL_KV_EVENTS_PORT")]


def fetch(host: Host, model_dir: str, files: Mapping[str, str]) -> dict[str, bytes]:
    """Each file's bytes read over the host's session, held to Gate A's measured sha256."""
    out: dict[str, bytes] = {}
    for name, sha in files.items():
        data = host.run(cl.read_file(f"{model_dir}/{name}"), check=True).stdout
        got = hashlib.sha256(data).hexdigest()
        if got != sha:
            raise TransferMismatch(host.alias, f"{model_dir}/{name}: read sha256 {got}, Gate A "
                                   f"measured {sha} (the checkpoint changed; run discovery "
                                   "again once nothing writes to it)")
        out[name] = data
    return out


def manifest(plan: EnginePlan, files: Mapping[str, str]) -> dict[str, Any]:
    return {"schema": "narwhal.router-tokenizer", "schema_version": 1,
            "engine": plan.engine.role, "host": plan.host, "model_dir": plan.engine.model_dir,
            "files": dict(sorted(files.items()))}


def read_failed(plan: EnginePlan, exc: HostError) -> Problem:
    return Problem(f"{plan.host}: NARWHAL_MODEL_DIR", str(exc).splitlines()[0],
                   "make the checkpoint's tokenizer files readable by the SSH user")
