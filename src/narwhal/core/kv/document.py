"""The `narwhal.kv-plan` document: a launch plan, its model config and everything predicted.

`narwhal kv plan --json` writes it and `narwhal kv pair` reads it back. The reader recomputes
the geometry from the embedded plan and config rather than trusting the stored numbers, and
refuses a document whose config digest or prediction no longer matches (edited by hand, or
written by another Narwhal revision).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from narwhal.core.document_io import problems_from
from narwhal.core.documents import digest, stamp
from narwhal.core.errors import InputError, Problem
from narwhal.core.kv.budget import Workload, edge_budget
from narwhal.core.kv.geometry import Geometry, plan_geometry
from narwhal.core.kv.plan import LaunchPlan
from narwhal.core.kv.transfer import request_transfer

SCHEMA = "narwhal.kv-plan"
VERSION = 1
REFERENCE = "docs/kv-contract.md"  # where the launch plan's fields are described


def plan_document(
    config: Mapping[str, Any], geometry: Geometry, workload: Workload
) -> dict[str, Any]:
    """The stamped document for one engine: inputs, geometry, one request, and its edge budget."""
    body = {
        "engine": geometry.engine,
        "launch": geometry.plan.model_dump(mode="json"),
        "model_config": dict(config),
        "model_config_digest": digest(dict(config)),
        "geometry": geometry.model_dump(mode="json", exclude={"plan"}),
        "request": request_transfer(geometry, workload.prompt_tokens).model_dump(mode="json"),
        "budget": edge_budget(geometry, workload).model_dump(mode="json"),
    }
    return stamp(SCHEMA, VERSION, body)


def load_plan_document(document: Any, source: str) -> tuple[dict[str, Any], Geometry]:
    """(model config, recomputed geometry) from a kv-plan document; InputError names the file."""
    fix = "regenerate it with `narwhal kv plan --json`"
    if not isinstance(document, dict):
        raise InputError(source, [Problem("document", "is not a JSON object", fix)])
    got = (document.get("schema"), document.get("schema_version"))
    if got != (SCHEMA, VERSION):
        raise InputError(source, [Problem("schema", f"is {got[0]!r} v{got[1]!r}, expected "
                                          f"{SCHEMA} v{VERSION}", fix)])
    config = document.get("model_config")
    if not isinstance(config, dict):
        raise InputError(source, [Problem("model_config", "missing or not an object", fix)])
    if document.get("model_config_digest") != digest(config):
        raise InputError(source, [Problem("model_config_digest",
                                          "does not match the embedded model_config", fix)])
    try:
        plan = LaunchPlan.model_validate(document.get("launch"))
    except ValidationError as exc:
        raise InputError(source, problems_from(exc, LaunchPlan, reference=REFERENCE,
                                               at=("launch",))) from None
    geometry = plan_geometry(config, plan)
    stored = document.get("geometry")
    if stored is not None and stored != geometry.model_dump(mode="json", exclude={"plan"}):
        raise InputError(source, [Problem("geometry", "differs from what this Narwhal revision "
                                          "predicts for the embedded plan", fix)])
    return config, geometry
