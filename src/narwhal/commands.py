"""Command groups that join the `narwhal` console script from outside deploy, named by module.

The console script is deploy's CLI (`narwhal.deploy.cli:main` in pyproject.toml), and product
code may not name the lab. So the distribution root declares here the groups that are not
deploy's own, and deploy's CLI passes their arguments through without knowing what they are.
This is the in-tree form of an entry-point group: moving it into pyproject.toml would change
the router's build stamp and force a rebuild of the compiled modules, for no gain today.

A group is imported only when its command runs, so `narwhal status` never loads the lab; one
whose package is not installed (a fleet host with product code only) says so and exits 3.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

GroupMain = Callable[[list[str]], int]


@dataclass(frozen=True)
class CommandGroup:
    """`narwhal <name> ARGS...` runs `<module>.main(ARGS)`."""

    name: str
    help: str
    module: str
    title: str  # what the group is, for the "not built" message when it is missing


GROUPS: tuple[CommandGroup, ...] = (
    CommandGroup("lab", "a multi-host rehearsal fleet on this machine", "narwhal.lab.cli",
                 "multi-host rehearsal fleet in network namespaces"),
)


def load(group: CommandGroup) -> GroupMain | None:
    """The group's main, or None when its package is not installed.

    Only a missing package of the group's own counts as "not installed": a missing dependency
    inside the group is a bug and propagates with its traceback."""
    try:
        module = importlib.import_module(group.module)
    except ModuleNotFoundError as exc:
        if exc.name and (group.module == exc.name or group.module.startswith(exc.name + ".")):
            return None
        raise
    main: GroupMain = module.main
    return main
