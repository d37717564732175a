"""Each engine's KV transfer path as Gates C and D both derive it (core/transfer_path.py).

Gate C hands it to `narwhal-engine prepare`, so the engine's UCX_TLS, UCX_NET_DEVICES and
container devices are the path; Gate D measures that path per host and refuses to qualify an
edge whose engines were started on another one (their paths are in Gate C's plan). Both read
it here from the same inputs (the `transport` fingerprint).
"""

from __future__ import annotations

from typing import Any

from narwhal.core.errors import InputError, Problem
from narwhal.core.launch_record import LaunchRecord
from narwhal.core.transfer_path import TransferPath, derive
from narwhal.deploy.inputs.model import Inputs


def transfer_paths(inputs: Inputs, engines: list[tuple[str, str, LaunchRecord]]
                   ) -> dict[str, TransferPath]:
    """role -> its path, for (role, host alias, launch record) triples; InputError naming
    every variable that keeps an engine from a path."""
    by_role = {e.role: e for e in inputs.engines}
    out: dict[str, TransferPath] = {}
    problems: list[Problem] = []
    for role, alias, record in engines:
        e = by_role[role]
        got = derive(transport=e.transfer_transport, fabric_interface=record.fabric_interface,
                     net_devices=e.transfer_net_devices, hcas=e.transfer_devices,
                     gpu_tls=e.gpu_tls, accelerator=record.accelerator,
                     where=f"NARWHAL_NODE_{e.n}_")
        if isinstance(got, list):
            problems += [Problem(f"{alias}: {role}: {p.field}", p.problem, p.fix) for p in got]
        else:
            out[role] = got
    if problems:
        raise InputError("transport", problems)
    return out


def started_paths(engines_plan: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """role -> the path Gate C started it on (None for a start before paths were recorded)."""
    return {str(e["engine"]): e.get("transfer") for e in engines_plan.get("engines", [])}


def _route(started: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if started is None else {k: v for k, v in started.items()
                                         if k not in ("device_nodes", "tls")}


def path_mismatches(edges: list[tuple[str, str, str]], wanted: dict[str, TransferPath],
                    started: dict[str, dict[str, Any] | None],
                    role_host: dict[str, str]) -> list[Problem]:
    """Edges whose engines run on another path than the one Gate D is about to measure; each
    names the edge, the engine and both paths. `edges`: (edge, source host, destination host)."""
    moved = {role for role, path in wanted.items() if _route(started.get(role)) != path.route()}
    problems = []
    for edge, source, destination in edges:
        for role in sorted(r for r in moved if role_host[r] in (source, destination)):
            was = started.get(role)
            shown = "no recorded path" if was is None else \
                f"UCX_NET_DEVICES={','.join(was.get('net_devices') or ())}, " \
                f"UCX_TLS={','.join(was.get('tls') or ())}"
            problems.append(Problem(
                f"{edge}: {role}", f"started on {shown}; the transport settings now give "
                f"{wanted[role].environment()}", "run `narwhal engines` so the engine takes "
                "the path this gate measures (or restore the transport settings)"))
    return problems
