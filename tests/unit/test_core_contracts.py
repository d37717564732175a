"""Result lines, digests and secrets behave the same on every machine."""

from __future__ import annotations

import json
import pickle

import pytest
from pydantic import BaseModel

from narwhal.core import result_line
from narwhal.core.documents import digest, expect, stamp
from narwhal.core.errors import ContractError
from narwhal.core.secret import MASK, Secret


def test_result_line_round_trips() -> None:
    line = result_line.render("narwhal-engine start", True, {"pid": 42})
    parsed = result_line.parse(f"noise\n{line}\nmore noise\n", "narwhal-engine start")
    assert parsed.ok and parsed.data == {"pid": 42}


@pytest.mark.parametrize("stdout", [
    "",
    "NARWHAL_RESULT {not json}",
    'NARWHAL_RESULT {"schema":"narwhal.result","schema_version":2,"command":"x","ok":true}',
    'NARWHAL_RESULT {"schema":"narwhal.result","schema_version":1,"command":"y","ok":true,'
    '"data":{},"error":""}',
    'NARWHAL_RESULT {"schema":"narwhal.result","schema_version":1,"command":"x","ok":"yes",'
    '"data":{},"error":""}',
    'NARWHAL_RESULT {"schema":"narwhal.result","schema_version":1,"command":"x","ok":true,'
    '"data":{},"error":"","extra":1}',
], ids=["missing", "not-json", "wrong-version", "wrong-command", "non-bool-ok", "extra-key"])
def test_bad_result_lines_are_contract_errors(stdout: str) -> None:
    with pytest.raises(ContractError):
        result_line.parse(stdout, "x")


def test_two_result_lines_are_refused() -> None:
    line = result_line.render("x", True)
    with pytest.raises(ContractError, match="exactly one"):
        result_line.parse(f"{line}\n{line}\n", "x")


def test_digest_is_canonical_and_rejects_nan() -> None:
    assert digest({"b": 1, "a": [1, 2]}) == digest({"a": [1, 2], "b": 1})
    with pytest.raises(ValueError):
        digest({"x": float("nan")})


def test_expect_names_schema_and_version() -> None:
    doc = stamp("narwhal.thing", 1, {"x": 1})
    assert expect(doc, "narwhal.thing", 1) is doc
    with pytest.raises(ContractError, match=r"narwhal\.thing v2"):
        expect(doc, "narwhal.thing", 2)


def test_secret_never_prints_serialises_or_pickles() -> None:
    secret = Secret("s3cr3t-value", "NARWHAL_ENGINE_KEY")
    assert "s3cr3t" not in f"{secret} {secret!r} {secret:>20}"

    class Holder(BaseModel):
        model_config = {"arbitrary_types_allowed": True}
        key: Secret

    held = Holder(key=secret)
    assert json.loads(held.model_dump_json())["key"] == MASK
    assert "s3cr3t" not in repr(held)
    with pytest.raises(TypeError):
        pickle.dumps(secret)
    assert secret.reveal() == "s3cr3t-value"
