"""One adapter knows each vLLM release; unknown releases are named; core/kv stays pure."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import ValidationError

from narwhal.core.errors import ContractError
from narwhal.core.kv.plan import LaunchPlan
from narwhal.core.kv.versions import V0_29_0, V0_33_0, facts_for

KV_SRC = Path(__file__).resolve().parents[3] / "src" / "narwhal" / "core" / "kv"


def test_reference_release_uses_connector_version_9_and_0_33_uses_15() -> None:
    assert facts_for("0.29.0").nixl_connector_version == 9
    assert facts_for("0.33.0+g4ba787ec9") is V0_33_0
    assert V0_33_0.hash_factor_keys == V0_29_0.hash_factor_keys


@pytest.mark.parametrize("version", ["0.31.0", "0.28.1", "1.0.0", ""])
def test_unknown_vllm_release_fails_with_a_message_naming_it(version: str) -> None:
    with pytest.raises(ContractError, match=f"vLLM '{version}' is not a modelled release"):
        facts_for(version)


def test_a_plan_for_an_unknown_release_is_refused_at_the_field() -> None:
    with pytest.raises(ValidationError, match=r"0\.31\.0"):
        LaunchPlan(model="m", vllm_version="0.31.0")


def test_a_misspelt_plan_key_is_refused_instead_of_defaulting() -> None:
    with pytest.raises(ValidationError, match="block_sise"):
        LaunchPlan.model_validate({"model": "m", "block_sise": 32})


def test_core_kv_imports_nothing_outside_narwhal_core_and_does_no_io() -> None:
    allowed_third_party = {"pydantic", "msgpack"}
    forbidden_calls = {"open", "print", "input"}
    for path in KV_SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                mod = node.module
                assert not mod.startswith(("narwhal.deploy", "narwhal.node", "narwhal.serve",
                                           "narwhal.lab")), (path, mod)
                if not mod.startswith("narwhal."):
                    root = mod.split(".")[0]
                    assert root in allowed_third_party or root in _STDLIB_PURE, (path, mod)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    root = alias.name.split(".")[0]
                    assert root in allowed_third_party or root in _STDLIB_PURE, (path, alias.name)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in forbidden_calls, (path, node.func.id)


_STDLIB_PURE = {"__future__", "collections", "dataclasses", "typing", "math", "re", "json",
                "hashlib"}
