"""Load the workstation `.env` into `Inputs`, reporting every problem in one pass.

Nothing here writes a file or contacts a host: a bad `.env` changes nothing. Engine numbers are
1 to 999 without leading zeros: a 23-digit NARWHAL_NODE_<n> is a paste error, not a fleet.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from narwhal.core.errors import InputError, Problem
from narwhal.core.key_file import MIN_KEY_CHARS
from narwhal.core.secret import Secret
from narwhal.deploy.inputs import fields as f
from narwhal.deploy.inputs import refs
from narwhal.deploy.inputs.destination import FORMS, Destination, parse_destination
from narwhal.deploy.inputs.envfile import EnvEntry, parse_env_text
from narwhal.deploy.inputs.envsource import read_env_file
from narwhal.deploy.inputs.hostnames import HOST_FORMS
from narwhal.deploy.inputs.kv_events import conflicts as events_conflicts
from narwhal.deploy.inputs.masked import masked_env
from narwhal.deploy.inputs.model import (
    DEFAULT_ROUTER_URL,
    CheckpointSource,
    EngineInputs,
    Inputs,
    RouterInputs,
    Workload,
)
from narwhal.deploy.inputs.relations import check_colocation
from narwhal.deploy.inputs.secretnames import is_secret_env_name, is_secret_name
from narwhal.deploy.inputs.urls import check_url, url_bind
from narwhal.deploy.inputs.vocabulary import (
    ENGINE_FIELDS,
    GLOBAL_ONLY,
    NODE_ONLY,
    NOT_YET,
    OPTIONAL_TYPED,
    OTHER_KNOWN,
    REQUIRED_ENGINE_FIELDS,
    WORKLOAD_TYPED,
    EngineFieldValues,
)

NODE_RE = re.compile(r"NARWHAL_NODE_([0-9]+)_([A-Z0-9_]+)")
MAX_NODE = 999
PREFIX = "NARWHAL_"
ATTR_TO_FIELD = {attr: name for name, attr in {**ENGINE_FIELDS, **NODE_ONLY}.items()}
# Fields whose raw text may hold a credential (an ENGINE_ENV token, an --api-key value, a
# token written into a hub URL): their problems name the element instead of quoting the text.
UNQUOTED_FIELDS = ("ENGINE_ENV", "ENGINE_ARGS", "HF_ENDPOINT")


def _known_names() -> list[str]:
    names = [PREFIX + n for n in [*ENGINE_FIELDS, *GLOBAL_ONLY]]
    names += [f"NARWHAL_NODE_1_{n}" for n in [*ENGINE_FIELDS, *NODE_ONLY]]
    return names + sorted(OTHER_KNOWN)


def _shown(key: str, value: str) -> str:
    """How a value may appear in an error: never for secrets, truncated otherwise."""
    return "" if is_secret_name(key) or key.endswith(UNQUOTED_FIELDS) else f" {value[:60]!r}"


class _Reader:
    """Collects problems while turning entries into typed inputs."""

    def __init__(self, entries: list[EnvEntry]) -> None:
        self.values = {e.key: e.value for e in entries}
        self.problems: list[Problem] = []
        self.globals: dict[str, str] = {}
        self.nodes: dict[int, dict[str, str]] = {}

    def add(self, field: str, problem: str, fix: str) -> None:
        item = Problem(field, problem, fix)
        if item not in self.problems:
            self.problems.append(item)

    def classify(self) -> None:
        for key, value in self.values.items():
            if value == "":
                self.add(key, "is empty", "set a value or delete the line (an empty override "
                         "would silently replace the fleet-wide value)")
                continue
            node = NODE_RE.fullmatch(key)
            if node:
                number, field = node[1], node[2]
                if number.startswith("0") or len(number) > len(str(MAX_NODE)):
                    self.add(key, f"engine number is not 1 to {MAX_NODE} without leading zeros",
                             f"number engines 1, 2, 3, ... up to {MAX_NODE}")
                elif field not in ENGINE_FIELDS and field not in NODE_ONLY:
                    self._unknown(key)
                else:
                    self.nodes.setdefault(int(number), {})[field] = value
            elif key.startswith(PREFIX) and key[len(PREFIX):] in {*ENGINE_FIELDS, *GLOBAL_ONLY}:
                self.globals[key[len(PREFIX):]] = value
            elif key in NOT_YET:
                self.add(key, *NOT_YET[key])
            elif key not in OTHER_KNOWN:
                self._unknown(key)

    def _unknown(self, key: str) -> None:
        close = difflib.get_close_matches(key, _known_names(), n=1, cutoff=0.75)
        hint = f"did you mean {close[0]}?" if close else "see `narwhal init` for the vocabulary"
        self.add(key, "is not a Narwhal variable (a typo would silently fall back to a default)",
                 hint)

    def _broken(self, field: str, n: int) -> bool:
        """True when the variable had a line-level problem already reported."""
        names = {PREFIX + field, f"NARWHAL_NODE_{n}_{field}"}
        return any(p.field.split(" ")[0] in names for p in self.problems)

    def var(self, n: int, field: str) -> str:
        return f"NARWHAL_NODE_{n}_{field}" if field in self.nodes.get(n, {}) else PREFIX + field

    def destination(self, key: str, text: str) -> Destination | None:
        try:
            return parse_destination(text)
        except ValueError as exc:
            self.add(key, f"{exc}{_shown(key, text)}", f"{FORMS}; the host is {HOST_FORMS}")
            return None

    def engine(self, n: int) -> EngineInputs | None:
        own = self.nodes[n]
        if "SSH" not in own:
            self.add(f"NARWHAL_NODE_{n}_SSH", f"is not set but other NARWHAL_NODE_{n}_* are",
                     f"set NARWHAL_NODE_{n}_SSH to the engine host's SSH destination")
            return None
        dest = self.destination(f"NARWHAL_NODE_{n}_SSH", own["SSH"])
        merged: dict[str, Any] = {}
        for field, attr in ENGINE_FIELDS.items():
            if field in own:
                merged[attr] = own[field]
            elif field in self.globals:
                merged[attr] = self.globals[field]
            elif field in REQUIRED_ENGINE_FIELDS and not self._broken(field, n):
                self.add(PREFIX + field, f"is required (engine-{n} has no value)",
                         f"set {PREFIX + field} or NARWHAL_NODE_{n}_{field}")
        for field in ("IP", "URL", "ATTESTATION_URL"):
            if field in own:
                merged[NODE_ONLY[field]] = own[field]
        key_text = own.get("SSH_KEY") or self.globals.get("SSH_KEY")
        if key_text:
            merged["ssh_key"] = key_text
        typed = self._validate(n, merged)
        if typed is None or dest is None:
            return None
        self._check_urls(n, typed)
        for key, problem, fix in events_conflicts(typed.kv_events_port, typed.engine_args or (),
                                                  self.var(n, "ENGINE_ARGS"),
                                                  self.var(n, "KV_EVENTS_PORT")):
            self.add(key, problem, fix)
        self._check_key_file(self.var(n, "SSH_KEY"), typed.ssh_key)
        password = own.get("SSH_PASSWORD")
        values = typed.model_dump()
        values["engine_env"] = self._engine_env(n, typed.engine_env)
        return EngineInputs(
            n=n, ssh=dest, **values,
            ssh_password=Secret(password, f"NARWHAL_NODE_{n}_SSH_PASSWORD") if password else None,
        )

    def _engine_env(self, n: int, env: dict[str, str] | None) -> dict[str, str | Secret] | None:
        """ENGINE_ENV with every secret-named value (HF_TOKEN, *_API_KEY, ...) a `Secret`, so
        the tables, the JSON and the ledger's redactor all know it."""
        if env is None:
            return None
        var = self.var(n, "ENGINE_ENV")
        return {name: Secret(value, f"{var}[{name}]") if is_secret_env_name(name) else value
                for name, value in env.items()}

    def _validate(self, n: int, merged: dict[str, Any]) -> EngineFieldValues | None:
        def key(field: str) -> str:
            return self.var(n, field) if field in ENGINE_FIELDS or field == "SSH_KEY" \
                else f"NARWHAL_NODE_{n}_{field}"

        try:
            return EngineFieldValues.model_validate(merged)
        except ValidationError as exc:
            self._field_problems(exc, merged, key)
            return None

    def check_globals(self) -> None:
        """Check every fleet-wide engine value on its own. Engines check the values they use,
        but a line-level error can leave no engine to do so (or every engine may override the
        value), and a bad value must never pass unreported."""
        merged = {ENGINE_FIELDS[field]: value for field, value in self.globals.items()
                  if field in ENGINE_FIELDS}
        try:
            EngineFieldValues.model_validate(merged)
        except ValidationError as exc:
            self._field_problems(exc, merged, lambda field: PREFIX + field)

    def _field_problems(self, exc: ValidationError, merged: dict[str, Any],
                        key_of: Callable[[str], str]) -> None:
        """One problem per field pydantic refused, under the variable key_of names."""
        for err in exc.errors():
            if err["type"] == "missing":
                continue  # reported as a required variable where an engine lacks it
            attr = str(err["loc"][0]) if err["loc"] else ""
            key = key_of(ATTR_TO_FIELD.get(attr, attr.upper()))
            message = str(err["msg"]).removeprefix("Value error, ")
            self.add(key, f"{message}{_shown(key, str(merged.get(attr, '')))}",
                     f.FIXES.get(attr, "see `narwhal init` for the expected form"))

    def _check_urls(self, n: int, typed: EngineFieldValues) -> None:
        for attr, path in (("url", ""), ("attestation_url", "/v1/attestation")):
            value = getattr(typed, attr)
            if value is None:
                continue
            key = f"NARWHAL_NODE_{n}_{attr.upper()}"
            try:
                check_url(value, path)
            except ValueError as exc:
                self.add(key, f"{exc}{_shown(key, value)}", f.FIXES[attr])

    def _check_key_file(self, key: str, path: str | None) -> None:
        if path is None:
            return
        try:
            mode = os.stat(path).st_mode
        except OSError:
            self.add(key, f"names {path!r}, which does not exist on this workstation",
                     f.FIXES["ssh_key"])
            return
        if not stat.S_ISREG(mode):
            self.add(key, f"{path!r} is not a regular file", f.FIXES["ssh_key"])

    def router(self, engines: dict[int, EngineInputs]) -> RouterInputs | None:
        url = self._router_url("ROUTER_URL")
        standby = self._router_url("ROUTER_STANDBY_URL")
        if standby is not None and url_bind(standby) == url_bind(url or DEFAULT_ROUTER_URL):
            self.add("NARWHAL_ROUTER_STANDBY_URL", "is the router's own address "
                     f"({url or DEFAULT_ROUTER_URL}){_shown('NARWHAL_ROUTER_STANDBY_URL', standby)}",
                     "give the standby another port on the router host, e.g. "
                     "http://127.0.0.1:8001")
        text = self.globals.get("ROUTER_SSH")
        if text is None:
            if not engines:
                return None
            first = engines[min(engines)]
            return RouterInputs(ssh=first.ssh, ssh_password=first.ssh_password,
                                ssh_key=first.ssh_key, url=url, standby_url=standby,
                                api_key=self._bearer_key("ROUTER_API_KEY"))
        dest = self.destination("NARWHAL_ROUTER_SSH", text)
        key = self.globals.get("ROUTER_SSH_KEY") or self.globals.get("SSH_KEY")
        if key is not None:
            self._check_key_file("NARWHAL_ROUTER_SSH_KEY" if "ROUTER_SSH_KEY" in self.globals
                                 else "NARWHAL_SSH_KEY", key)
        if dest is None:
            return None
        return RouterInputs(ssh=dest, ssh_password=self._secret("ROUTER_SSH_PASSWORD"),
                            ssh_key=key, url=url, standby_url=standby,
                            api_key=self._bearer_key("ROUTER_API_KEY"))

    def _router_url(self, field: str) -> str | None:
        """NARWHAL_<field>: an address on the router host, http://HOST:PORT (None if unset)."""
        url = self.globals.get(field)
        if url is None:
            return None
        try:
            check_url(url, "")
        except ValueError as exc:
            self.add(PREFIX + field, f"{exc}{_shown(PREFIX + field, url)}",
                     "write http://HOST:PORT with an explicit port")
            return None
        return url

    def _secret(self, field: str) -> Secret | None:
        value = self.globals.get(field)
        return Secret(value, PREFIX + field) if value else None

    def _bearer_key(self, field: str) -> Secret | None:
        """A key that travels as `Authorization: Bearer KEY` and is read back from a 0600 file
        (core/key_file.py): as long and as plain as that reader accepts, refused here first."""
        key = self._secret(field)
        if key is not None:
            text = key.reveal()
            if len(text) < MIN_KEY_CHARS or not text.isascii() \
                    or any(not c.isprintable() or c.isspace() for c in text):
                self.add(PREFIX + field, f"is shorter than {MIN_KEY_CHARS} characters or holds "
                         "spaces, control or non-ASCII characters (value not shown)",
                         "use a long random key, e.g. `openssl rand -hex 24`")
                return None
        return key

    def checkpoint(self) -> CheckpointSource | None:
        """MODEL_REPO_ID, MODEL_REVISION and HF_ENDPOINT as one source, or None when no repo
        is named (a revision or endpoint alone is refused: it would stage nothing)."""
        repo = self.typed("MODEL_REPO_ID", f.HfRepoId, refs.REPO_ID_FIX)
        revision = self.typed("MODEL_REVISION", f.GitRevision, refs.REVISION_FIX, "main")
        endpoint = self.typed("HF_ENDPOINT", f.HubEndpoint, f.FIXES["hub_endpoint"])
        if "MODEL_REPO_ID" not in self.values:
            for key in ("MODEL_REVISION", "HF_ENDPOINT"):
                if self.values.get(key):
                    self.add(key, "is set but MODEL_REPO_ID is not (nothing would be staged)",
                             "set MODEL_REPO_ID to the checkpoint's owner/name, or delete "
                             "this line")
            return None
        if repo is None:
            return None
        return CheckpointSource(repo_id=repo, revision=revision, endpoint=endpoint)

    def typed_global(self, field: str, adapter: Any, fix: str, default: Any = None) -> Any:
        return self.typed(PREFIX + field, adapter, fix, default)

    def typed(self, key: str, adapter: Any, fix: str, default: Any = None) -> Any:
        """The value of variable key checked by adapter, or default (with a problem added)."""
        if not self.values.get(key):  # unset, or empty (reported as such by classify)
            return default
        try:
            return TypeAdapter(adapter).validate_python(self.values[key])
        except ValidationError as exc:
            message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
            self.add(key, f"{message}{_shown(key, self.values[key])}", fix)
            return default

    def workload(self) -> Workload:
        """The NARWHAL_WORKLOAD_* values, each checked on its own; unset ones keep the
        defaults declared on Workload."""
        values = {attr: self.typed(key, kind, f.FIXES[f"workload_{attr}"])
                  for key, (attr, kind) in WORKLOAD_TYPED.items()}
        return Workload(**{attr: v for attr, v in values.items() if v is not None})


def parse_inputs(text: str, source: Path) -> Inputs:
    """Validate .env text; raise InputError listing every problem."""
    entries, problems = parse_env_text(text)
    reader = _Reader(entries)
    reader.problems.extend(problems)
    reader.classify()
    passwords = {n for n, own in reader.nodes.items() if "SSH_PASSWORD" in own and "SSH" not in own}
    for n in sorted(passwords):
        reader.add(f"NARWHAL_NODE_{n}_SSH_PASSWORD", f"is set but NARWHAL_NODE_{n}_SSH is not",
                   f"set NARWHAL_NODE_{n}_SSH or delete the password")
    engines = {n: e for n in sorted(reader.nodes) if (e := reader.engine(n)) is not None}
    reader.check_globals()
    declared = [n for n in reader.nodes if "SSH" in reader.nodes[n]]
    if len(declared) < 2:
        reader.add("NARWHAL_NODE_<n>_SSH", f"{len(declared)} engine(s) declared",
                   "declare at least two engines: NARWHAL_NODE_1_SSH and NARWHAL_NODE_2_SSH")
    router = reader.router(engines)
    revision = reader.typed_global("DEPLOYMENT_REVISION", f.Revision,
                                   "give the full commit id: git rev-parse HEAD")
    if "DEPLOYMENT_REVISION" not in reader.globals:
        reader.add("NARWHAL_DEPLOYMENT_REVISION", "is required",
                   "set it to the approved full commit id (git rev-parse HEAD)")
    deployment = reader.typed_global("DEPLOYMENT", f.DeploymentName,
                                     "use lower-case letters, digits and '-'", "fleet")
    known_hosts = reader.typed_global("SSH_KNOWN_HOSTS", f.AbsPath,
                                      "give an absolute path for the pinned host keys")
    timeout = reader.typed_global("SSH_CONNECT_TIMEOUT", f.PositiveInt,
                                  "give whole seconds, e.g. 10", 10)
    ttft = reader.typed_global("TTFT_S", f.Seconds, "give seconds above 0, e.g. 10", 10.0)
    tpot = reader.typed_global("TPOT_S", f.Seconds, "give seconds above 0, e.g. 0.125", 0.125)
    optional = {attr: reader.typed(key, kind, f.FIXES[attr])
                for key, (attr, kind) in OPTIONAL_TYPED.items()}
    workload = reader.workload()
    for problem in check_colocation(list(engines.values()), reader.var,
                                    bool(optional["shared_gpu_allowance"])):
        reader.add(problem.field, problem.problem, problem.fix)
    engine_key = reader._bearer_key("ENGINE_KEY")
    checkpoint = reader.checkpoint()
    if reader.problems or router is None:
        raise InputError(str(source), reader.problems)
    return Inputs(
        source=source, deployment=deployment, revision=revision,
        engines=tuple(engines.values()), router=router,
        ssh_key=reader.globals.get("SSH_KEY"), known_hosts=known_hosts,
        connect_timeout_s=timeout, ttft_s=ttft, tpot_s=tpot,
        engine_key=engine_key, hf_token=reader._secret("HF_TOKEN"), checkpoint=checkpoint,
        workload=workload, masked_env=masked_env(text),
        **{attr: v for attr, v in optional.items() if v is not None},  # unset: Inputs' default
    )


def load_inputs(path: Path) -> Inputs:
    """Read and validate the `.env` at path (a regular file of at most 1 MiB of UTF-8)."""
    text, status = read_env_file(path)
    inputs = parse_inputs(text, path)
    mode = status.st_mode
    if inputs.secrets() and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InputError(str(path), [Problem(str(path), f"holds secrets but has mode "
                                             f"{stat.S_IMODE(mode):04o}",
                                             f"chmod 600 {path}")])
    return inputs
