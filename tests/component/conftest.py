"""Component fixtures: a real sshd on loopback and a two-engine .env that points at it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.component.sshd import (
    KEY_USER,
    PASS_USER,
    PASSWORD,
    Sshd,
    free_port,
    missing_prerequisite,
)
from tests.envtext import valid_env


@pytest.fixture
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    why = missing_prerequisite()
    if why:
        pytest.skip(why)
    # Not under pytest's 0700 tmp: sshd reads authorized_keys as the (unprivileged) test user.
    root = Path(tempfile.mkdtemp(prefix="nw-sshd-"))
    root.chmod(0o755)
    server = Sshd(root=root, port=free_port(), client_key=root / "client_key")
    try:
        server.prepare()
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def write_env(path: Path, sshd: Sshd, **overrides: str | None) -> Path:
    """A .env whose router and engine-1 use key auth, engine-2 password auth, on the sshd."""
    text = valid_env(
        NARWHAL_ROUTER_SSH=f"ssh://{KEY_USER}@127.0.0.1:{sshd.port}",
        NARWHAL_NODE_1_SSH=f"ssh://{KEY_USER}@127.0.0.1:{sshd.port}",
        NARWHAL_NODE_1_GPU_IDS="0", NARWHAL_NODE_2_GPU_IDS="1",
        NARWHAL_NODE_2_ENGINE_PORT="8001", NARWHAL_NODE_2_ATTEST_PORT="8011",
        NARWHAL_NODE_2_NIXL_SIDE_CHANNEL_PORT="5601",
        NARWHAL_NODE_2_SSH=f"ssh://{PASS_USER}@localhost:{sshd.port}",
        NARWHAL_NODE_2_SSH_PASSWORD=PASSWORD,
        NARWHAL_SSH_KEY=str(sshd.client_key),
        NARWHAL_SSH_CONNECT_TIMEOUT="5",
        **overrides,
    )
    path.write_text(text)
    path.chmod(0o600)
    return path
