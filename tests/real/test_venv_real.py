"""The cached vLLM venv is usable as an operator would use it: its console scripts run."""

from __future__ import annotations

import subprocess
from pathlib import Path


def test_every_console_script_names_an_interpreter_that_exists(real_python: Path) -> None:
    """The venv is built in a scratch folder and moved: a shebang naming the scratch folder
    made `bin/vllm` exit 127."""
    broken = []
    for script in sorted(real_python.parent.iterdir()):
        if script.is_symlink() or not script.is_file():
            continue
        with script.open("rb") as f:
            first = f.readline(4096)
        if first.startswith(b"#!"):
            interpreter = first[2:].split()[0].decode()
            if not Path(interpreter).exists():
                broken.append(f"{script.name}: {interpreter}")
    assert broken == []
    done = subprocess.run([str(real_python.parent / "pip"), "--version"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
