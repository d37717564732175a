"""Each role's environment file and secret files, cut from the workstation `.env`.

A host gets the variables of its own roles: the globals, its engine's NARWHAL_NODE_<n>_*
(an engine host never sees another engine's) or the router's NARWHAL_ROUTER_*. It never gets
a way into another host: every SSH variable (destinations, keys, passwords, known_hosts) is
withheld, and a value that would still carry an SSH credential (an SSH password, a key path
or a private key, a name like SSHPASS or SSH_AUTH_SOCK inside an engine environment) is
refused naming the variable, before anything is sent. Credentials a role does need (an engine
key, a Hugging Face token, an engine environment naming a secret) go to one file each, mode
0600, under secrets/; the role file itself holds no secret. An engine host also gets, under
secrets/env/, one file per secret variable its engine's launch record names (vLLM's API key
from NARWHAL_ENGINE_KEY, each secret of NARWHAL_ENGINE_ENV): `narwhal-engine start` passes
them to the engine through its environment, by those names.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from narwhal.core.errors import InputError, Problem
from narwhal.core.launch_record import ENGINE_API_KEY_ENV, HF_TOKEN_ENV
from narwhal.core.secret import Secret
from narwhal.deploy.inputs.envfile import EnvEntry, parse_env_text
from narwhal.deploy.inputs.envsource import read_env_file
from narwhal.deploy.inputs.model import Inputs
from narwhal.deploy.inputs.secretnames import is_secret_env_name, is_secret_name

NODE = re.compile(r"^NARWHAL_NODE_(\d+)_")
WITHHELD = re.compile(r"(^|_)SSH(_|$)|^NARWHAL_KNOWN_HOSTS$")
SSH_ENV_NAME = re.compile(r"SSH", re.IGNORECASE)
PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
FIX = "remove it from the .env: hosts never need the workstation's SSH credentials"


@dataclass(frozen=True)
class RoleFiles:
    """What one role's host gets: its environment text and its secret files (name -> value)."""

    role: str
    env_text: str
    secrets: dict[str, str]
    withheld: tuple[str, ...]  # variable names kept off the host (never their values)


def _applies(key: str, role: str) -> bool:
    node = NODE.match(key)
    if node:
        return role == f"engine-{node[1]}"
    if key.startswith("NARWHAL_ROUTER_"):
        return role == "router"
    return True


def _ssh_credentials(inputs: Inputs) -> list[tuple[str, str]]:
    """(what, value) of every SSH credential the workstation holds: passwords and key paths."""
    found = [("an SSH password", s.reveal()) for s in
             [inputs.router.ssh_password, *(e.ssh_password for e in inputs.engines)]
             if s is not None and s.reveal()]
    found += [("an SSH key path", k) for k in
              [inputs.ssh_key, inputs.router.ssh_key, *(e.ssh_key for e in inputs.engines)] if k]
    return found


def _credential_in(entry: EnvEntry, credentials: list[tuple[str, str]]) -> str | None:
    for what, value in credentials:
        if value and value in entry.value:
            return what
    if PRIVATE_KEY.search(entry.value):
        return "a private key"
    if entry.key.endswith("ENGINE_ENV"):
        try:
            names = list(json.loads(entry.value))
        except (ValueError, TypeError):
            names = []
        ssh = [n for n in names if isinstance(n, str) and SSH_ENV_NAME.search(n)]
        if ssh:
            return f"the SSH variable {ssh[0]}"
    return None


def _secret_entry(entry: EnvEntry) -> bool:
    if is_secret_name(entry.key):
        return True
    if entry.key.endswith("ENGINE_ENV"):
        try:
            return any(is_secret_env_name(str(n)) for n in json.loads(entry.value))
        except (ValueError, TypeError):
            return False
    return False


def engine_secret_environment(inputs: Inputs, role: str) -> dict[str, str]:
    """Secret variable name -> value for the engine of `role` (none for other roles): what
    its launch record lists in secret_environment, by the same rule (generated.py)."""
    engine = next((e for e in inputs.engines if e.role == role), None)
    if engine is None:
        return {}
    out = {name: v.reveal() for name, v in (engine.engine_env or {}).items()
           if isinstance(v, Secret)}
    if inputs.engine_key is not None:
        out[ENGINE_API_KEY_ENV] = inputs.engine_key.reveal()
    if inputs.hf_token is not None:
        out.setdefault(HF_TOKEN_ENV, inputs.hf_token.reveal())
    return out


def role_files(inputs: Inputs, roles: list[str]) -> dict[str, RoleFiles]:
    """Every role's files, or every SSH credential a role would carry as problems."""
    text, _ = read_env_file(Path(inputs.source))
    entries, problems = parse_env_text(text)
    if problems:  # load_inputs accepted this file moments ago; it changed under us
        raise InputError(str(inputs.source), problems)
    credentials = _ssh_credentials(inputs)
    out: dict[str, RoleFiles] = {}
    found: list[Problem] = []
    for role in roles:
        lines = [f"NARWHAL_ROLE={role}"]
        secrets: dict[str, str] = {}
        withheld = []
        for entry in entries:
            if not _applies(entry.key, role):
                continue
            if WITHHELD.search(entry.key):
                withheld.append(entry.key)
                continue
            what = _credential_in(entry, credentials)
            if what is not None:
                found.append(Problem(f"{role}: {entry.key}", f"would carry {what} to the host",
                                     FIX))
            elif _secret_entry(entry):
                secrets[entry.key] = entry.value
            else:
                lines.append(f"{entry.key}={shlex.quote(entry.value)}")
        for name, value in engine_secret_environment(inputs, role).items():
            secrets[f"env/{name}"] = value
        out[role] = RoleFiles(role, "\n".join(lines) + "\n", secrets, tuple(withheld))
    if found:
        raise InputError(str(inputs.source), found)
    return out
