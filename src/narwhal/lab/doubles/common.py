"""What every double shares: the host's inventory data and injected tool failures."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def host_data(host_dir: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(host_dir) / "data" / "host.json").read_text())
    return data


def injected_failure(host_dir: str, tool: str) -> int | None:
    """If the lab made this tool fail (`lab fault tool`), print what it says and return its exit."""
    path = Path(host_dir) / "faults" / f"{tool}.json"
    if not path.exists():
        return None
    rule = json.loads(path.read_text())
    sys.stdout.write(rule.get("stdout", ""))
    sys.stderr.write(rule.get("stderr", ""))
    return int(rule.get("exit_code", 1))
