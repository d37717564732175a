"""A live capture held to core/kv's prediction for its launch record, in one place for every
real test that starts engines (natively, or through Gate C on the rehearsal lab)."""

from __future__ import annotations

from typing import Any

from narwhal.core.kv.capture.sidechannel import metadata_mismatches
from narwhal.core.kv.geometry import Geometry, plan_geometry
from narwhal.core.kv.metadata import AgentMetadata
from narwhal.core.kv.vllm_args import launch_plan_from_args


def assert_capture_is_predicted(layout: dict[str, Any], record: dict[str, Any],
                                name: str) -> Geometry:
    """The capture's rank has the predicted compatibility hash and side-channel metadata;
    returns the predicted geometry (for pair checks)."""
    geometry = plan_geometry(layout["checkpoint_config"], launch_plan_from_args(
        [record["model_dir"], *record["vllm_args"]], name=name, vllm_version=layout["version"],
        environment=record.get("environment") or {}))
    [rank] = layout["ranks"]
    assert rank["compatibility_hash"] == geometry.compatibility_hash
    assert metadata_mismatches(geometry.stages[0].metadata,
                               AgentMetadata.model_validate(rank["metadata"])) == []
    return geometry
