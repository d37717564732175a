"""The host-facts document (`narwhal.host-facts` v1): what the discovery probe measured on a host.

node/host_probe.py writes it on the host (stdlib only, so it cannot import this module) and
the workstation reads it here, so both ends are held to one shape: every key is required,
unknown keys and wrong types are refused, and nothing is coerced. A missing tool, a failing
nvidia-smi or a changed checkpoint file are facts in the document (null paths, `error`
fields), not contract errors; a contract error means the probe and the workstation come from
different revisions, or the probe broke.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator

from narwhal.core.document_io import StrictModel
from narwhal.core.documents import canonical_json
from narwhal.core.errors import ContractError

SCHEMA = "narwhal.host-facts"
VERSION = 1
TOOL_NAMES = ("python3", "git", "make", "curl", "docker", "podman", "iperf3", "ss", "ip",
              "nvidia-smi", "rocminfo", "sshpass", "lspci")
ROWS_RECIPE = "sorted path\tsize\tsha256 lines"

Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
PciBusId = Annotated[str, Field(pattern=r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")]
Port = Annotated[int, Field(ge=1, le=65535)]
Count = Annotated[int, Field(ge=0)]
ModelRow = tuple[str, Count, Sha256Hex]


class OsRelease(StrictModel):
    """The three os-release(5) fields discovery reports; null when the host has no file."""

    ID: str | None
    VERSION_ID: str | None
    PRETTY_NAME: str | None


class PythonFacts(StrictModel):
    """The python3 that ran the probe: the one Narwhal's venv would be built from."""

    executable: str
    version: Annotated[str, Field(pattern=r"^\d+\.\d+\.\d+")]
    has_venv: bool

    def version_tuple(self) -> tuple[int, int]:
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)


class Tool(StrictModel):
    """A host utility: where PATH finds it (null: not installed) and its version if it says."""

    path: str | None
    version: str | None


class Gpu(StrictModel):
    index: Count
    name: str
    uuid: str
    pci_bus_id: PciBusId
    memory_total_mib: Count
    numa_node: Count | None
    render_node: str | None = None  # AMD: the DRI render node a container is given


class Accelerators(StrictModel):
    """The GPU inventory; `error` holds the vendor tool's own words when it failed."""

    vendor: Literal["nvidia", "amd"] | None
    gpus: list[Gpu]
    driver_version: str | None
    error: str | None


class Gid(StrictModel):
    index: Count
    gid: str
    type: str | None


class RdmaPort(StrictModel):
    port: Annotated[int, Field(ge=1)]
    state: str
    link_layer: str
    gids: list[Gid]


class RdmaDevice(StrictModel):
    device: str
    ports: list[RdmaPort]


class Address(StrictModel):
    family: Literal["inet", "inet6"]
    address: str
    prefixlen: Annotated[int, Field(ge=0, le=128)]
    scope: str


class Interface(StrictModel):
    name: str
    mtu: Annotated[int, Field(ge=0)] | None
    operstate: str
    addresses: list[Address]


class Listener(StrictModel):
    """A TCP socket already listening on a requested port, and its owner when ss could tell."""

    port: Port
    address: str
    process: str | None
    pid: Annotated[int, Field(ge=1)] | None


class Disk(StrictModel):
    exists: bool
    is_dir: bool
    free_bytes: Count | None
    writable: bool


class Packages(StrictModel):
    """Versions inside the engine image; null when absent or when the image could not run."""

    vllm: str | None
    torch: str | None
    nixl: str | None


class ImageFacts(StrictModel):
    ref: str
    id: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")] | None
    repo_digests: list[str]
    found: bool
    error: str | None
    packages: Packages


class ModelFacts(StrictModel):
    """The checkpoint tree: rows of (relative path, size, sha256) and their digest."""

    dir: str
    exists: bool
    files: Count
    bytes: Count
    model_tree_sha256: Sha256Hex | None
    rows_digest_of: Literal["sorted path\tsize\tsha256 lines"]
    rows: list[ModelRow]
    config_sha256: Sha256Hex | None
    needs_trust_remote_code: bool
    architectures: list[str]
    error: str | None

    def first_difference(self, other: ModelFacts) -> str | None:
        """The first relative path (in row order) whose size or sha256 differs, or that only
        one side has; None when the rows are equal."""
        return first_differing_path(self.rows, other.rows)


class HostFacts(StrictModel):
    """Everything discovery measured on one host, for one probe request."""

    schema_: Literal["narwhal.host-facts"] = Field(alias="schema")
    schema_version: Literal[1]
    role: Literal["engine", "router", "workstation"]
    hostname: str
    # HMAC-SHA256 keyed by /etc/machine-id (never the id itself): equal for every login and
    # address of one OS install, so GPU sharing is judged per machine; null: the host has none.
    machine_id_hmac: Sha256Hex | None
    kernel: str
    os_release: OsRelease
    python: PythonFacts
    tools: dict[str, Tool]
    accelerators: Accelerators
    device_nodes: list[str]
    rdma: list[RdmaDevice]
    interfaces: list[Interface]
    fabric_interface: Interface | None
    listeners: list[Listener]
    disk: dict[str, Disk]
    image: ImageFacts | None
    model: ModelFacts | None

    @field_validator("tools")
    @classmethod
    def _every_tool_reported(cls, tools: dict[str, Tool]) -> dict[str, Tool]:
        if set(tools) != set(TOOL_NAMES):
            missing = sorted(set(TOOL_NAMES) - set(tools))
            extra = sorted(set(tools) - set(TOOL_NAMES))
            raise ValueError(f"tools must be exactly {', '.join(TOOL_NAMES)}; "
                             f"missing {missing}, unknown {extra}")
        return tools

    def missing_tools(self, names: Sequence[str]) -> list[str]:
        """Which of the named utilities PATH did not find on the host."""
        return [n for n in names if self.tools[n].path is None]


def first_differing_path(a: Sequence[Sequence[Any]], b: Sequence[Sequence[Any]]) -> str | None:
    """The first relative path, in sorted order, whose row differs between two hosts."""
    left = {str(r[0]): tuple(r[1:]) for r in a}
    right = {str(r[0]): tuple(r[1:]) for r in b}
    differing = sorted(p for p in set(left) | set(right) if left.get(p) != right.get(p))
    return differing[0] if differing else None


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(document)"


def parse_host_facts(result_data: dict[str, Any], host_alias: str) -> HostFacts:
    """Validate the probe's result data; a mismatch names the host and the first bad field."""
    got = (result_data.get("schema"), result_data.get("schema_version"))
    if got != (SCHEMA, VERSION):
        raise ContractError(
            f"{host_alias}: the probe reported {got[0]!r} v{got[1]!r}, expected {SCHEMA} "
            f"v{VERSION}; the probe shipped to the host is from another Narwhal revision")
    try:
        # As JSON, so arrays are read as the tuples they stand for and nothing is coerced.
        text = canonical_json(result_data)
    except (TypeError, ValueError) as exc:
        raise ContractError(f"{host_alias}: host facts are not plain JSON ({exc})") from None
    try:
        return HostFacts.model_validate_json(text)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        value = repr(first.get("input"))
        others = ", ".join(_where(e["loc"]) for e in errors[1:6])
        more = f" (and {len(errors) - 1} more: {others})" if len(errors) > 1 else ""
        raise ContractError(
            f"{host_alias}: host facts field {_where(first['loc'])}: {first['msg']} "
            f"(got {value[:120]}){more}; the probe and the workstation must run the same "
            "Narwhal revision") from None
