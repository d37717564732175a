"""What `narwhal deploy` runs for each gate: the operator's own command line, with only the
flags that gate takes, and a recapture of exactly the engines the live check found changed."""

from __future__ import annotations

from pathlib import Path

from narwhal.core.gates import gate
from narwhal.deploy.cli.deploy_cmd import gate_argv
from narwhal.deploy.cli.main import build_parser
from narwhal.deploy.gates.restarts import EngineChange


def _args(*extra: str) -> object:
    return build_parser().parse_args(["deploy", *extra])


def test_each_gate_gets_its_own_flags_only() -> None:
    args = _args("--prepared", "20261202T000000Z", "--checkout", "/src", "--fabric-seconds", "2")
    assert gate_argv(gate("B"), args, False, []) == [
        "install", "--prepared", "20261202T000000Z"]  # a prepared run carries its checkout
    assert gate_argv(gate("D"), args, False, []) == [
        "fabric", "--seconds", "2"]
    for name in ("discover", "engines", "attest", "preflight", "serve"):
        assert gate_argv(gate(name), args, False, []) == [gate(name).command]
    plain = _args("--wheelhouse", "/w", "--checkout", "/src")
    assert gate_argv(gate("B"), plain, False, []) == [
        "install", "--wheelhouse", "/w", "--checkout", "/src"]


def test_an_engine_only_the_live_check_found_changed_is_captured_again_alone() -> None:
    changes = [EngineChange("engine-2", "engine process changed", (), True),
               EngineChange("engine-3", "sidecar not vouching", (), False)]
    args = _args()
    assert gate_argv(gate("C"), args, True, changes) == [
        "engines", "--recapture", "engine-2"]
    # inputs moved too: the whole gate runs again
    assert gate_argv(gate("C"), args, False, changes) == ["engines"]


def test_every_flag_a_gate_command_gets_is_one_it_parses() -> None:
    args = _args("--prepared", "r1", "--fabric-seconds", "3")
    parser = build_parser()
    for g in ("A", "B", "C", "D", "E", "F", "G"):
        argv = gate_argv(gate(g), args, False, [])
        parsed = parser.parse_args([*argv, "--env", str(Path("x.env")), "--json"])
        assert parsed.handler is not None


def test_an_engine_that_is_not_running_is_started_again_alone_beside_a_recapture() -> None:
    changes = [EngineChange("engine-2", "engine process changed", (), True),
               EngineChange("engine-3", "engine process changed: the attested container or "
                            "process is gone; its host says it is not running", (), True,
                            restart=True)]
    assert gate_argv(gate("C"), _args(), True, changes) == [
        "engines", "--recapture", "engine-2", "--restart", "engine-3"]
    parsed = build_parser().parse_args(["engines", "--restart", "engine-3,engine-1"])
    assert parsed.restart == ["engine-3", "engine-1"]


def test_the_fabric_runs_again_with_the_parameters_its_last_pass_measured_with() -> None:
    """They are part of every link record: other parameters would measure every edge again,
    not only those whose links moved."""
    kept = {"seconds": 1, "omit_s": 0, "parallel": 1, "port": 5201}
    assert gate_argv(gate("D"), _args(), False, [], kept) == [
        "fabric", "--seconds", "1", "--omit", "0", "--parallel", "1", "--port", "5201"]
    assert gate_argv(gate("D"), _args("--fabric-seconds", "4"), False, [], kept)[1:3] == [
        "--seconds", "4"]  # the operator's word wins
    parsed = build_parser().parse_args(gate_argv(gate("D"), _args(), False, [], kept))
    assert (parsed.seconds, parsed.omit, parsed.parallel, parsed.port) == (1, 0, 1, 5201)


def test_a_row_that_did_not_measure_the_workloads_prompt_length_is_profiled_again() -> None:
    """The runbook's "profiled workload range": a row whose longest measured prompt is short
    of the workload's would extrapolate to it."""
    from narwhal.deploy.gates.preflight import uncovered

    store = {"profiles": [{"engine_id": "engine-1", "prefill": {"max_prompt_tokens": 4095}},
                          {"engine_id": "engine-2", "prefill": {"max_prompt_tokens": 2048}}]}
    assert uncovered(store, 1024) == {}
    assert uncovered(store, 2049) == {"engine-2": 2048}
    assert uncovered(store, 5000) == {"engine-1": 4095, "engine-2": 2048}
