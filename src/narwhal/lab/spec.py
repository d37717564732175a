"""The lab spec: one versioned JSON document that says what rehearsal fleet to build.

Models refuse unknown keys and use strict types, so a typo in a spec is an error with its
dotted path instead of a silent fallback to a default. Relations between fields (one router,
unique names, non-overlapping subnets) are checked after the shapes, and every problem found is
reported at once in one InputError.
"""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from narwhal.core.errors import InputError, Problem
from narwhal.lab.hub.names import repo_id_problem

SCHEMA = "narwhal.lab-spec"
VERSION = 1

HostName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9]{0,9}$")]
UserName = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")]
PciBusId = Annotated[str, Field(pattern=r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")]
AbsPath = Annotated[str, Field(pattern=r"^/[A-Za-z0-9._/-]*$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Gpu(_Strict):
    """One accelerator as the vendor tools report it."""

    pci_bus_id: PciBusId
    uuid: Annotated[str, Field(pattern=r"^GPU-[0-9a-f-]{8,64}$")]
    # The NUMA node sysfs gives the GPU's PCI device; None where it says -1 (a VM's GPU,
    # like the captured H200's).
    numa_node: Annotated[int, Field(ge=0, le=63)] | None = 0


class Accelerators(_Strict):
    vendor: Literal["NVIDIA", "AMD"]
    product: Annotated[str, Field(min_length=1, max_length=96)]
    count: Annotated[int, Field(ge=1, le=16)]
    memory_mib: Annotated[int, Field(ge=1024, le=1_048_576)]
    devices: list[Gpu]


class RdmaDevice(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,15}$")]
    link_layer: Literal["Ethernet", "InfiniBand"] = "Ethernet"


class Hardware(_Strict):
    accelerators: Accelerators
    rdma: list[RdmaDevice] = []


class User(_Strict):
    """A login on a host; `password` users get a generated password and no authorized key."""

    name: UserName
    auth: Literal["key", "password"] = "key"


class Host(_Strict):
    name: HostName
    role: Literal["router", "engine"]
    users: list[User] = [User(name="root")]
    hardware: Hardware | None = None
    disk_mib: Annotated[int, Field(ge=8, le=1024)] = 64
    # The machine's cores this host has to itself, as a separate machine would: every process
    # on it is confined to them and its NUMA view (/sys/devices/system/node) lists only them.
    # None: the machine's cores, shared with every other host.
    cpus: list[Annotated[int, Field(ge=0, le=1023)]] | None = None
    # false: the host has no route to the lab hub (an unreachable route in its namespace),
    # as an engine host behind a firewall; it still reaches every other host
    hub_route: bool = True


class Network(_Strict):
    subnet: Annotated[str, Field(pattern=r"^[0-9.]+/[0-9]{1,2}$")]
    mtu: Annotated[int, Field(ge=1280, le=9000)]


class Image(_Strict):
    """The engine image the docker double holds on every engine host.

    Its `vllm` is the engine emulator, or with `vllm_site` the real vLLM installed in that
    site-packages folder (the real tier's cached vLLM CPU venv), run by the hosts' python3.
    """

    repository: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._/-]{0,127}$")]
    tag: Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")]
    entrypoint: list[str]
    cmd: list[str] = []
    env: list[str] = []
    vllm_site: AbsPath | None = None


class Model(_Strict):
    """The checkpoint staged on every engine host: a tiny config.json and tokenizer files
    (`config`), or every file of a real checkpoint folder on this machine (`source`)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")]
    dir: AbsPath
    config: dict[str, Any] | None = None
    source: AbsPath | None = None
    # true: engine hosts start with an empty `dir`; the checkpoint is the lab hub's repo
    # `name` (two commits on main: the files, then a README.md model card)
    hub: bool = False

    def checkpoint_config(self) -> dict[str, Any]:
        """The model's config.json as the engines read it."""
        if self.config is not None:
            return self.config
        loaded: dict[str, Any] = json.loads((Path(str(self.source)) / "config.json").read_text())
        return loaded


class Ports(_Strict):
    engine: Annotated[int, Field(ge=1024, le=65535)] = 8000
    attest: Annotated[int, Field(ge=1024, le=65535)] = 8010
    nixl_side_channel: Annotated[int, Field(ge=1024, le=65535)] = 5600
    ucx_tcp_range: Annotated[str, Field(pattern=r"^[0-9]{4,5}-[0-9]{4,5}$")] = "30000-30100"
    # the engines publish KV cache events here (NARWHAL_KV_EVENTS_PORT), so the demo deploys
    # with the router following the engines' caches; null deploys without events
    kv_events: Annotated[int, Field(ge=1024, le=65535)] | None = 5557


class Hub(_Strict):
    """The lab's Hugging Face hub double, in its own namespace on the management network:
    the API on `port`, its CDN (where LFS downloads are redirected) on `port + 1`."""

    port: Annotated[int, Field(ge=1024, le=65534)] = 8600
    # true: the model repo is gated (manual approval) and only the lab's token is granted
    gated: bool = False


class LabSpec(_Strict):
    schema_: Literal["narwhal.lab-spec"] = Field(alias="schema")
    schema_version: Literal[1]
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9]{1,5}$")]
    management: Network
    fabric: Network
    hosts: list[Host]
    image: Image
    model: Model
    run_dir: AbsPath = "/srv/narwhal-run"
    ports: Ports = Ports()
    hub: Hub | None = None
    # the `.env`'s NARWHAL_KV_CANARY_INTERVAL_S (the router's canary probes each pair once per
    # this many seconds while it serves); None: the product's default
    kv_canary_interval_s: Annotated[float, Field(ge=0.1, le=86_400)] | None = None

    def engines(self) -> list[Host]:
        return [h for h in self.hosts if h.role == "engine"]

    def router(self) -> Host:
        return next(h for h in self.hosts if h.role == "router")


def _loc(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(document)"


def _shape_problems(exc: ValidationError) -> list[Problem]:
    problems = []
    for err in exc.errors():
        field = _loc(err["loc"])
        if err["type"] == "extra_forbidden":
            fix = "remove it or fix its spelling: unknown keys are refused so a typo cannot fall back to a default"
        elif err["type"] == "missing":
            fix = "add it"
        else:
            fix = f"got {err.get('input')!r}; give a value that matches"
        problems.append(Problem(field, err["msg"], fix))
    return problems


def _network_problems(spec: LabSpec) -> tuple[list[Problem], dict[str, ipaddress.IPv4Network]]:
    problems: list[Problem] = []
    nets: dict[str, ipaddress.IPv4Network] = {}
    for key in ("management", "fabric"):
        net: Network = getattr(spec, key)
        try:
            parsed = ipaddress.ip_network(net.subnet, strict=True)
        except ValueError as exc:
            problems.append(Problem(f"{key}.subnet", str(exc), "give a network address such as 10.213.0.0/24"))
            continue
        if not isinstance(parsed, ipaddress.IPv4Network) or not parsed.is_private:
            problems.append(Problem(f"{key}.subnet", f"{net.subnet} is not a private IPv4 network",
                                    "use an RFC 1918 range such as 10.213.0.0/24"))
        elif not 16 <= parsed.prefixlen <= 28:
            problems.append(Problem(f"{key}.subnet", f"prefix /{parsed.prefixlen} out of range",
                                    "use a prefix between /16 and /28"))
        elif parsed.num_addresses < len(spec.hosts) + 12:
            problems.append(Problem(f"{key}.subnet", f"{net.subnet} too small for {len(spec.hosts)} hosts",
                                    "use a larger subnet"))
        else:
            nets[key] = parsed
    if len(nets) == 2 and nets["management"].overlaps(nets["fabric"]):
        problems.append(Problem("fabric.subnet", "overlaps management.subnet",
                                "give the fabric its own subnet, as on a real fleet"))
    if spec.management.mtu == spec.fabric.mtu:
        problems.append(Problem("fabric.mtu", "equals management.mtu",
                                "use different MTUs (e.g. 1500 and 9000) so MTU checks can tell them apart"))
    return problems, nets


def _host_problems(spec: LabSpec) -> list[Problem]:
    problems: list[Problem] = []
    routers = [h.name for h in spec.hosts if h.role == "router"]
    if len(routers) != 1:
        problems.append(Problem("hosts", f"{len(routers)} router hosts", "declare exactly one host with role router"))
    if not spec.engines():
        problems.append(Problem("hosts", "no engine host", "declare at least one host with role engine"))
    seen: set[str] = set()
    uuids: set[str] = set()
    for i, host in enumerate(spec.hosts):
        where = f"hosts.{i}"
        if host.name in seen or host.name in ("ws", "sw", "hub"):
            problems.append(Problem(f"{where}.name", f"{host.name!r} is taken", "give each host a unique name (not ws, sw or hub)"))
        seen.add(host.name)
        users = [u.name for u in host.users]
        if len(set(users)) != len(users):
            problems.append(Problem(f"{where}.users", "a user is listed twice", "list each user once"))
        if host.role == "router" and host.hardware is not None:
            problems.append(Problem(f"{where}.hardware", "a router host has no accelerators", "remove hardware"))
        if host.role == "engine" and host.hardware is None:
            problems.append(Problem(f"{where}.hardware", "an engine host needs an inventory", "add hardware.accelerators"))
        if host.cpus is not None:
            have = os.cpu_count() or 1
            if not host.cpus or len(set(host.cpus)) != len(host.cpus) or max(host.cpus) >= have:
                problems.append(Problem(f"{where}.cpus", f"{host.cpus} on a machine of {have} "
                                        "core(s)", f"list distinct cores from 0 to {have - 1}"))
        if host.hardware is None:
            continue
        acc = host.hardware.accelerators
        if len(acc.devices) != acc.count:
            problems.append(Problem(f"{where}.hardware.accelerators.devices",
                                    f"{len(acc.devices)} devices listed but count is {acc.count}",
                                    "list one device per accelerator"))
        buses = [d.pci_bus_id for d in acc.devices]
        if len(set(buses)) != len(buses):
            problems.append(Problem(f"{where}.hardware.accelerators.devices", "duplicate PCI bus id",
                                    "give each device its own bus id"))
        for d in acc.devices:
            if d.uuid in uuids:
                problems.append(Problem(f"{where}.hardware.accelerators.devices", f"UUID {d.uuid} reused",
                                        "UUIDs are unique across the whole lab"))
            uuids.add(d.uuid)
    return problems


def _hub_problems(spec: LabSpec) -> list[Problem]:
    """What needs the hub section has it, and the model's name can be a hub repo id."""
    problems: list[Problem] = []
    if spec.hub is None:
        if spec.model.hub:
            problems.append(Problem("model.hub", "true but the spec has no hub section",
                                    'add "hub": {} or set model.hub to false'))
        problems += [Problem(f"hosts.{i}.hub_route", "false but the spec has no hub section",
                             "remove hub_route or add a hub section")
                     for i, h in enumerate(spec.hosts) if not h.hub_route]
    elif spec.model.hub and repo_id_problem(spec.model.name):
        problems.append(Problem("model.name", repo_id_problem(spec.model.name) or "",
                                "name the model owner/name, e.g. narwhal-lab/tiny-llama"))
    return problems


def _world_problems(spec: LabSpec) -> list[Problem]:
    """The model is one of the two kinds, and what a real engine needs is on this machine."""
    problems: list[Problem] = []
    model = spec.model
    if (model.config is None) == (model.source is None):
        problems.append(Problem("model", "give exactly one of config and source",
                                "config: a config.json for the emulator; source: a checkpoint "
                                "folder for real vLLM"))
    if model.source is not None and not (Path(model.source) / "config.json").is_file():
        problems.append(Problem("model.source", f"{model.source} has no config.json",
                                "give a checkpoint folder (config.json, weights, tokenizer)"))
    site = spec.image.vllm_site
    if site is not None and not (Path(site) / "vllm" / "__init__.py").is_file():
        problems.append(Problem("image.vllm_site", f"{site} holds no vllm package",
                                "give the site-packages folder of a venv with vLLM installed"))
    return problems


def validate(document: Any, source: str) -> LabSpec:
    """Parse a spec document (already JSON-decoded); raise InputError listing every problem."""
    try:
        spec = LabSpec.model_validate(document, strict=True)
    except ValidationError as exc:
        raise InputError(source, _shape_problems(exc)) from None
    problems, _ = _network_problems(spec)
    problems += _host_problems(spec)
    problems += _world_problems(spec)
    problems += _hub_problems(spec)
    if problems:
        raise InputError(source, problems)
    return spec


def load(path: Path | None) -> LabSpec:
    """Read a spec file, or the embedded default when no path is given."""
    if path is None:
        from narwhal.lab.defaults import default_spec_document

        return validate(default_spec_document(), "embedded default lab spec")
    try:
        document = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(str(path), [Problem("(file)", exc.strerror or str(exc), "give a readable file")]) from None
    except json.JSONDecodeError as exc:
        raise InputError(str(path), [Problem(f"line {exc.lineno}", exc.msg, "fix the JSON syntax")]) from None
    return validate(document, str(path))


def subnet(spec: LabSpec, key: Literal["management", "fabric"]) -> ipaddress.IPv4Network:
    net = ipaddress.ip_network(getattr(spec, key).subnet)
    assert isinstance(net, ipaddress.IPv4Network)
    return net
