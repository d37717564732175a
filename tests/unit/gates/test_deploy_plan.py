"""What `narwhal deploy` runs for each gate: the options an operator would give its command,
with only the flags that gate takes, and a recapture of exactly the engines the live check
found changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from narwhal.deploy.actions.gate_commands import (
    COMMANDS,
    DeployFlags,
    engine_options,
    fabric_choice,
    install_options,
)
from narwhal.deploy.actions.gate_runs import DiscoverOptions, EngineOptions, InstallOptions
from narwhal.deploy.cli.main import build_parser
from narwhal.deploy.gates.fabric import FabricOptions
from narwhal.deploy.gates.live_check import Live, findings
from narwhal.deploy.gates.registry import SPECS
from narwhal.deploy.gates.restarts import EngineChange

NO_CONTEXT: Any = None  # these options read nothing from the record
FLAGS = DeployFlags(prepared="20261202T000000Z", checkout=Path("/src"), fabric_seconds=2)


def test_each_gate_gets_its_own_flags_only() -> None:
    options, argv = install_options(NO_CONTEXT, FLAGS, {})
    assert argv == ["install", "--prepared", "20261202T000000Z"]  # a prepared run carries its
    assert options == InstallOptions(prepared="20261202T000000Z")  # checkout
    assert fabric_choice(None, FLAGS.fabric_seconds) == (FabricOptions(seconds=2),
                                                          ["fabric", "--seconds", "2"])
    assert fabric_choice({"seconds": 10, "omit_s": 1}, None, 0) == (
        FabricOptions(seconds=10, omit_s=0), ["fabric", "--seconds", "10", "--omit", "0"])
    for name in ("attest", "preflight", "serve"):
        assert COMMANDS[name].deploy_options(NO_CONTEXT, FLAGS, {}) == (None, [name])
    assert COMMANDS["discover"].deploy_options(NO_CONTEXT, FLAGS, {}) == (
        DiscoverOptions(), ["discover"])
    consent = DeployFlags(repair_checkpoint=True, wheelhouse=Path("/w"), fabric_seconds=2)
    assert COMMANDS["discover"].deploy_options(NO_CONTEXT, consent, {}) == (
        DiscoverOptions(True, Path("/w")), ["discover", "--repair-checkpoint", "--wheelhouse",
                                            "/w"])
    plain = DeployFlags(wheelhouse=Path("/w"), checkout=Path("/src"))
    assert install_options(NO_CONTEXT, plain, {}) == (
        InstallOptions(Path("/w"), Path("/src")),
        ["install", "--wheelhouse", "/w", "--checkout", "/src"])


def test_an_engine_only_the_live_check_found_changed_is_captured_again_alone() -> None:
    changes = [EngineChange("engine-2", "engine process changed", (), True),
               EngineChange("engine-3", "sidecar not vouching", (), False)]
    partial = SPECS["engines"].partial
    assert partial is not None
    named = partial.subjects(findings(Live(engines=changes)))
    assert named == {"recapture": ["engine-2"]}
    assert engine_options(NO_CONTEXT, DeployFlags(), named) == (
        EngineOptions(recapture=("engine-2",)), ["engines", "--recapture", "engine-2"])
    # inputs moved too: the whole gate runs again
    assert engine_options(NO_CONTEXT, DeployFlags(), {}) == (EngineOptions(), ["engines"])


def test_every_command_line_deploy_prints_parses_to_the_options_it_ran() -> None:
    parser = build_parser()
    options, argv = install_options(NO_CONTEXT, DeployFlags(prepared="r1"), {})
    parsed = parser.parse_args([*argv, "--env", str(Path("x.env")), "--json"])
    assert parsed.prepared == options.prepared and parsed.handler is not None
    options, argv = engine_options(NO_CONTEXT, DeployFlags(), {"recapture": ["e2"],
                                                               "restart": ["e3", "e1"]})
    parsed = parser.parse_args(argv)
    assert (tuple(parsed.recapture), tuple(parsed.restart)) == (options.recapture,
                                                                options.restart)
    kept = {"seconds": 1, "omit_s": 0, "parallel": 1, "port": 5201}
    options, argv = fabric_choice(kept, None)
    parsed = parser.parse_args(argv)
    assert (parsed.seconds, parsed.omit, parsed.parallel, parsed.port) == (
        options.seconds, options.omit_s, options.parallel, options.port)


def test_an_engine_that_is_not_running_is_started_again_alone_beside_a_recapture() -> None:
    changes = [EngineChange("engine-2", "engine process changed", (), True),
               EngineChange("engine-3", "engine process changed: the attested container or "
                            "process is gone; its host says it is not running", (), True,
                            restart=True)]
    partial = SPECS["engines"].partial
    assert partial is not None
    named = partial.subjects(findings(Live(engines=changes)))
    assert engine_options(NO_CONTEXT, DeployFlags(), named)[1] == [
        "engines", "--recapture", "engine-2", "--restart", "engine-3"]
    parsed = build_parser().parse_args(["engines", "--restart", "engine-3,engine-1"])
    assert parsed.restart == ["engine-3", "engine-1"]


def test_the_fabric_runs_again_with_the_parameters_its_last_pass_measured_with() -> None:
    """They are part of every link record: other parameters would measure every edge again,
    not only those whose links moved."""
    kept = {"seconds": 1, "omit_s": 0, "parallel": 1, "port": 5201}
    assert fabric_choice(kept, None) == (
        FabricOptions(seconds=1, omit_s=0, parallel=1, port=5201),
        ["fabric", "--seconds", "1", "--omit", "0", "--parallel", "1", "--port", "5201"])
    assert fabric_choice(kept, 4)[1][1:3] == ["--seconds", "4"]  # the operator's word wins


def test_a_row_that_did_not_measure_the_workloads_prompt_length_is_profiled_again() -> None:
    """The runbook's "profiled workload range": a row whose longest measured prompt is short
    of the workload's would extrapolate to it."""
    from narwhal.deploy.gates.preflight import uncovered

    store = {"profiles": [{"engine_id": "engine-1", "prefill": {"max_prompt_tokens": 4095}},
                          {"engine_id": "engine-2", "prefill": {"max_prompt_tokens": 2048}}]}
    assert uncovered(store, 1024) == {}
    assert uncovered(store, 2049) == {"engine-2": 2048}
    assert uncovered(store, 5000) == {"engine-1": 4095, "engine-2": 2048}


@pytest.mark.parametrize("argv", [["--fabric-seconds", "0"], ["--fabric-seconds", "-5"],
                                  ["--fabric-seconds", "601"], ["--fabric-seconds", "1e9"],
                                  ["--fabric-omit", "61"], ["--fabric-omit", "-1"],
                                  ["--fabric-omit", "1;reboot"]])
def test_deploy_refuses_fabric_flags_gate_d_itself_would_refuse(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["deploy", *argv])
    assert refused.value.code == 2 and argv[0] in capsys.readouterr().err


def test_deploy_passes_its_fabric_flags_to_gate_d() -> None:
    parsed = build_parser().parse_args(["deploy", "--fabric-seconds", "1", "--fabric-omit", "0"])
    assert (parsed.fabric_seconds, parsed.fabric_omit) == (1, 0)
