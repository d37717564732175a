"""The lab fleet as `.env` lines in Narwhal's workstation vocabulary.

The product reads these exactly as it reads an operator's `.env`; the lab adds nothing the
product must special-case. NARWHAL_DEPLOYMENT_REVISION is left to the caller.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from narwhal.core.secret import MASK
from narwhal.lab import identity, labhub
from narwhal.lab.hostfs import password_file
from narwhal.lab.network import FABRIC_IF
from narwhal.lab.plan import HostPlan, LabPlan


def _login(plan: LabPlan, h: HostPlan) -> tuple[str, str | None]:
    """The SSH destination of a host and its password (None for key auth)."""
    user = next((u for u in h.host.users if u.name == "root"), h.host.users[0])
    password = None
    if user.auth == "password":
        password = password_file(plan, h.name, user.name).read_text()
    return f"{user.name}@{h.mgmt_ip}", password


def env_pairs(plan: LabPlan, *, reveal: bool) -> list[tuple[str, str]]:
    spec = plan.spec
    pairs: list[tuple[str, str]] = []

    def login(var: str, h: HostPlan) -> None:
        dest, password = _login(plan, h)
        pairs.append((var, dest))
        if password is not None:
            pairs.append((f"{var}_PASSWORD", password if reveal else MASK))

    login("NARWHAL_ROUTER_SSH", plan.router())
    for n, h in enumerate(plan.engines(), start=1):
        login(f"NARWHAL_NODE_{n}_SSH", h)
    pairs.append(("NARWHAL_SSH_KEY", str(plan.client_key)))
    pairs += [
        ("NARWHAL_ENGINE_IMAGE", identity.image_id(spec.image)),
        ("NARWHAL_ENGINE_MODEL_NAME", spec.model.name),
        ("NARWHAL_MODEL_DIR", spec.model.dir),
        ("NARWHAL_RUN_DIR", spec.run_dir),
        ("NARWHAL_FABRIC_INTERFACE", FABRIC_IF),
    ]
    pairs += [(f"NARWHAL_NODE_{n}_IP", h.fabric_ip) for n, h in enumerate(plan.engines(), start=1)]
    pairs += [
        ("NARWHAL_ENGINE_PORT", str(spec.ports.engine)),
        ("NARWHAL_ATTEST_PORT", str(spec.ports.attest)),
        ("NARWHAL_NIXL_SIDE_CHANNEL_PORT", str(spec.ports.nixl_side_channel)),
        ("NARWHAL_UCX_TCP_PORT_RANGE", spec.ports.ucx_tcp_range),
    ]
    if spec.ports.kv_events is not None:
        pairs.append(("NARWHAL_KV_EVENTS_PORT", str(spec.ports.kv_events)))
    access = labhub.hub_access(plan)
    if access is not None and spec.model.hub:  # empty model dirs: Gate A stages from the hub
        pairs += [("MODEL_REPO_ID", access.repo_id), ("HF_ENDPOINT", access.endpoint)]
        if access.token_path is not None:
            pairs.append(("NARWHAL_HF_TOKEN", access.token_path.read_text().strip()
                          if reveal else MASK))
    if spec.kv_canary_interval_s is not None:
        pairs.append(("NARWHAL_KV_CANARY_INTERVAL_S", f"{spec.kv_canary_interval_s:g}"))
    return pairs


def render(plan: LabPlan, *, reveal: bool) -> str:
    head = f"# narwhal lab {plan.spec.name}: {len(plan.hosts)} hosts; add NARWHAL_DEPLOYMENT_REVISION\n"
    return head + "".join(f"{k}={shlex.quote(v)}\n" for k, v in env_pairs(plan, reveal=reveal))


def write(plan: LabPlan, path: Path) -> None:
    """Write the full `.env` (with the password) as 0600, replacing any previous file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(render(plan, reveal=True))
