"""A run plan is read through its model: one edited into something `start` would misread is
refused naming the field, before any check or start acts on it."""

from __future__ import annotations

import json

import pytest

from narwhal.core.documents import canonical_json
from narwhal.core.errors import InputError
from narwhal.core.run_plan import read_plan
from narwhal.node.engine import runplan
from tests.unit.node.test_engine_runplan import _record


def _bytes(**edits: object) -> bytes:
    plan = runplan.build(_record("docker", "nvidia"), "c" * 64, "docker")
    return canonical_json({**plan, **edits}).encode() + b"\n"


def test_a_plan_prepare_wrote_reads_back_as_written() -> None:
    data = _bytes()
    assert read_plan(data, "launch.json") == json.loads(data)


@pytest.mark.parametrize(("edits", "field"), [
    ({"argv": "docker run --privileged img"}, "argv"),  # a string where argv is a list
    ({"ports": {"engine": 0, "attest": 1, "nixl_side_channel": 2, "ucx_tcp": [3, 4]}},
     "ports.engine"),
    ({"runtime": "lxc"}, "runtime"),
    ({"privileged": True}, "privileged"),  # a key no reader knows is refused, not ignored
    ({"side_channel": {"host": "", "port": 5600}}, "side_channel.host"),
])
def test_a_hand_edited_plan_is_refused_naming_the_field(edits: dict[str, object],
                                                        field: str) -> None:
    with pytest.raises(InputError) as err:
        read_plan(_bytes(**edits), "launch.json")
    assert field in [p.field for p in err.value.problems], err.value


def test_bytes_that_are_no_plan_are_refused_named() -> None:
    for data in (b"\xff\xfe", b"[1, 2]", b'{"schema": "narwhal.engine-run-plan"',
                 b'{"schema": "narwhal.engine-run-plan", "schema_version": 9}'):
        with pytest.raises(InputError):
            read_plan(data, "launch.json")
