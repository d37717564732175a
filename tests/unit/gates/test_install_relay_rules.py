"""Gate B's relay rules on plain data: the tree, which files a host pulls, what a pull said."""

from __future__ import annotations

import pytest

from narwhal.deploy.gates.install_rules import (
    RELAY_FANOUT,
    RELAY_MIN_BYTES,
    relay_lines,
    relay_parents,
    relayed_files,
)


@pytest.mark.parametrize("hosts", [1, 2, 4, 5, 32, 64])
def test_the_workstation_sends_to_one_host_and_every_other_has_an_earlier_parent(
        hosts: int) -> None:
    aliases = [f"node-{i}" for i in range(1, hosts)] + ["router"]
    parents = relay_parents(aliases)
    assert [a for a, p in parents.items() if p is None] == aliases[:1]
    for i, alias in enumerate(aliases[1:], start=1):
        assert aliases.index(str(parents[alias])) < i  # installs start parents first
    children = [p for p in parents.values() if p is not None]
    assert all(children.count(p) <= RELAY_FANOUT for p in set(children))


def test_the_tree_is_shallow_at_64_hosts() -> None:
    aliases = [f"h{i}" for i in range(64)]
    parents = relay_parents(aliases)

    def depth(a: str) -> int:
        return 0 if parents[a] is None else 1 + depth(str(parents[a]))
    assert max(depth(a) for a in aliases) == 3


def test_a_host_pulls_only_large_files_its_parent_receives_and_never_a_secret() -> None:
    big, small = RELAY_MIN_BYTES, RELAY_MIN_BYTES - 1
    child = [("revision.bundle", "b" * 64, big), ("wheelhouse/x.whl", "x" * 64, big * 9),
             ("runs/r/wheels/compiled.whl", "c" * 64, big),  # the parent has the pure one
             ("runs/r/env/engine-2.env", "e" * 64, small),
             ("runs/r/secrets/NARWHAL_HF_TOKEN", None, big)]
    got = relayed_files(child, {"b" * 64, "x" * 64, "e" * 64, "p" * 64})
    assert [path for path, _, _ in got] == ["revision.bundle", "wheelhouse/x.whl"]


def test_only_well_formed_lines_for_asked_paths_count() -> None:
    text = ("created 1234 wheelhouse/a b.whl\n"  # a path with a space
            "kept - revision.bundle\n"
            "created not-an-inode wheelhouse/c.whl\n"  # refused: would own a wrong inode
            "created 99 ../../etc/passwd\n"  # not asked
            "refused - wheelhouse/d.whl\n"
            "failed URLError wheelhouse/e.whl\n"
            "deleted 1 wheelhouse/f.whl\n"  # no such status
            "\n garbage")
    asked = {"wheelhouse/a b.whl", "revision.bundle", "wheelhouse/c.whl", "wheelhouse/d.whl",
             "wheelhouse/e.whl", "wheelhouse/f.whl"}
    lines = relay_lines(text, asked)
    assert {p: (line.status, line.detail) for p, line in lines.items()} == {
        "wheelhouse/a b.whl": ("created", "1234"), "revision.bundle": ("kept", "-"),
        "wheelhouse/d.whl": ("refused", "-"), "wheelhouse/e.whl": ("failed", "URLError")}
