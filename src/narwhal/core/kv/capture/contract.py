"""The live KV contract: each captured engine against core/kv's prediction for its launch record,
and every producer -> consumer pair by core/kv's pair rules.

One place for it because two roles hold a fleet to it: the workstation right after Gate C's
captures (`narwhal engines`) and the router host before serving (narwhal-check's contract
gate). Each finding is a Problem naming the engine (or both engines and the factor) and the
fix, so either caller can print it or turn it into a verdict.
"""

from __future__ import annotations

from narwhal.core.cache_layout import CacheLayout
from narwhal.core.errors import Problem
from narwhal.core.kv.capture.sidechannel import metadata_mismatches
from narwhal.core.kv.geometry import Geometry, plan_geometry
from narwhal.core.kv.pair import PairReport
from narwhal.core.kv.vllm_args import launch_plan_from_args
from narwhal.core.launch_record import LaunchRecord


def predicted(engine: str, record: LaunchRecord, capture: CacheLayout) -> Geometry:
    """core/kv's geometry for the launch record, at the vLLM version the engine reports and
    the checkpoint config it serves. The record's environment counts as much as its arguments:
    the engine takes its KV layout and Mamba conv state orientation from there (InputError
    when either cannot be read)."""
    launch = launch_plan_from_args([record.model_dir, *record.vllm_args], name=engine,
                                   vllm_version=capture.version,
                                   where=f"{engine}: vllm_args",
                                   environment=record.environment,
                                   environment_where=f"{engine}: environment")
    return plan_geometry(capture.checkpoint_config, launch)


def capture_findings(where: str, record_sha256: str, capture: CacheLayout) -> list[Problem]:
    """The capture belongs to this launch record (a capture of another plan proves nothing)."""
    if capture.launch_record_sha256 == record_sha256:
        return []
    return [Problem(where, f"the capture was taken from launch record "
                    f"{capture.launch_record_sha256[:12]}, not {record_sha256[:12]}",
                    "capture the engine again from this launch record (`narwhal engines`)")]


def engine_findings(where: str, geometry: Geometry, capture: CacheLayout) -> list[Problem]:
    """The live engine against the prediction for its launch record, rank by rank."""
    problems = []
    if len(capture.ranks) != geometry.tp * len(geometry.stages):
        problems.append(Problem(where, f"{len(capture.ranks)} side-channel rank(s) answered, "
                                f"the plan has {geometry.tp * len(geometry.stages)}",
                                "check the engine's tensor and pipeline parallel sizes"))
    for rank in capture.ranks:
        label = f"{where} rank {rank.pp_rank}/{rank.tp_rank}"
        if rank.compatibility_hash != geometry.compatibility_hash:
            problems.append(Problem(label, f"compatibility hash {rank.compatibility_hash} "
                                    f"is not the predicted {geometry.compatibility_hash}",
                                    "the engine was not started with its launch record's "
                                    "arguments, or its vLLM differs: compare the image"))
        if rank.pp_rank >= len(geometry.stages):
            problems.append(Problem(label, f"pipeline rank {rank.pp_rank} is not in the plan",
                                    "check the engine's pipeline parallel size"))
            continue
        for m in metadata_mismatches(geometry.stages[rank.pp_rank].metadata, rank.metadata):
            problems.append(Problem(label, m, "compare the engine's arguments with its launch "
                                    "record"))
    if not capture.completion.text:
        problems.append(Problem(where, "the test completion returned no text",
                                "read the engine log in the run dir"))
    return problems


def pair_problems(report: PairReport) -> list[Problem]:
    """One ordered pair's findings, each naming both engines, the factor and the fix."""
    return [Problem(f"{f.producer} -> {f.consumer}: {f.factor}",
                    f"{f.message} ({f.producer}: {f.producer_value!r}, "
                    f"{f.consumer}: {f.consumer_value!r})", f.fix) for f in report.findings]
