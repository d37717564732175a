"""The default lab scaled to N engine hosts (`narwhal lab up --engines N`), as the scale bench
and an operator rehearsing a bigger fleet build it."""

from __future__ import annotations

import pytest

from narwhal.lab import defaults, spec
from narwhal.lab.cli import _spec_for, build_parser
from narwhal.lab.run import LabError


@pytest.mark.parametrize("engines", [1, 3, 31, 63])
def test_the_default_lab_scales_to_any_engine_host_count_a_24_subnet_holds(engines: int) -> None:
    lab = spec.validate(defaults.scaled_spec_document(engines, "n32"), "scaled")
    assert lab.name == "n32"
    assert [h.name for h in lab.engines()] == [f"eng{i}" for i in range(1, engines + 1)]
    assert lab.router().name == "router"
    default = spec.validate(defaults.default_spec_document(), "default")
    assert (lab.image, lab.model, lab.hub) == (default.image, default.model, default.hub)
    if engines >= 3:  # the same hosts as the default's, then more of the same kind
        assert lab.hosts[:4] == default.hosts


@pytest.mark.parametrize("engines", [0, -1, 64, 10_000])
def test_a_count_outside_what_the_subnet_holds_is_refused_naming_the_range(engines: int) -> None:
    with pytest.raises(ValueError, match="1 to 63"):
        defaults.scaled_spec_document(engines)


def test_up_takes_a_spec_file_or_an_engine_count_not_both() -> None:
    args = build_parser().parse_args(["up", "--engines", "7", "--name", "n8"])
    lab = _spec_for(args)
    assert (lab.name, len(lab.engines())) == ("n8", 7)
    args = build_parser().parse_args(["up", "--engines", "7", "--spec", "lab.json"])
    with pytest.raises(LabError, match="--spec and --engines"):
        _spec_for(args)
    args = build_parser().parse_args(["up", "--engines", "99"])
    with pytest.raises(LabError, match="1 to 63"):
        _spec_for(args)
