"""What `narwhal deploy` runs for each gate: the operator's own command line, with only the
flags that gate takes, and a recapture of exactly the engines the live check found changed."""

from __future__ import annotations

from pathlib import Path

from narwhal.core.gates import gate
from narwhal.deploy.cli.deploy_cmd import gate_argv
from narwhal.deploy.cli.main import build_parser
from narwhal.deploy.gates.restarts import EngineChange
from narwhal.deploy.ledger.status import GateStatus


def _args(*extra: str) -> object:
    return build_parser().parse_args(["deploy", *extra])


def _row(name: str, state: str) -> GateStatus:
    return GateStatus(name, gate(name).letter, state, 1, "001", "", ())


def test_each_gate_gets_its_own_flags_only() -> None:
    args = _args("--prepared", "20261202T000000Z", "--checkout", "/src", "--fabric-seconds", "2")
    assert gate_argv(gate("B"), args, _row("install", "stale"), []) == [
        "install", "--prepared", "20261202T000000Z"]  # a prepared run carries its checkout
    assert gate_argv(gate("D"), args, _row("fabric", "pending"), []) == [
        "fabric", "--seconds", "2"]
    for name in ("discover", "engines", "attest", "preflight", "serve"):
        assert gate_argv(gate(name), args, _row(name, "pending"), []) == [gate(name).command]
    plain = _args("--wheelhouse", "/w", "--checkout", "/src")
    assert gate_argv(gate("B"), plain, _row("install", "pending"), []) == [
        "install", "--wheelhouse", "/w", "--checkout", "/src"]


def test_an_engine_only_the_live_check_found_changed_is_captured_again_alone() -> None:
    changes = [EngineChange("engine-2", "engine process changed", (), True),
               EngineChange("engine-3", "sidecar not vouching", (), False)]
    args = _args()
    assert gate_argv(gate("C"), args, _row("engines", "passed"), changes) == [
        "engines", "--recapture", "engine-2"]
    # inputs moved too: the whole gate runs again
    assert gate_argv(gate("C"), args, _row("engines", "stale"), changes) == ["engines"]


def test_every_flag_a_gate_command_gets_is_one_it_parses() -> None:
    args = _args("--prepared", "r1", "--fabric-seconds", "3")
    parser = build_parser()
    for g in ("A", "B", "C", "D", "E", "F", "G"):
        argv = gate_argv(gate(g), args, _row(gate(g).name, "pending"), [])
        parsed = parser.parse_args([*argv, "--env", str(Path("x.env")), "--json"])
        assert parsed.handler is not None
