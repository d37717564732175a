"""A valid `.env` used across tiers, and a way to vary one line of it."""

from __future__ import annotations

REVISION = "0123456789abcdef0123456789abcdef01234567"
IMAGE = "sha256:" + "ab" * 32


def valid_env(**overrides: str | None) -> str:
    """A two-engine `.env`; keyword overrides set (or with None delete) variables."""
    values: dict[str, str | None] = {
        "NARWHAL_DEPLOYMENT": "demo",
        "NARWHAL_DEPLOYMENT_REVISION": REVISION,
        "NARWHAL_ENGINE_IMAGE": IMAGE,
        "NARWHAL_ENGINE_MODEL_NAME": "Qwen/Qwen2.5-0.5B-Instruct",
        "NARWHAL_MODEL_DIR": "/srv/models/qwen",
        "NARWHAL_RUN_DIR": "/srv/narwhal/run",
        "NARWHAL_FABRIC_INTERFACE": "fab0",
        "NARWHAL_ENGINE_PORT": "8000",
        "NARWHAL_ATTEST_PORT": "8010",
        "NARWHAL_NIXL_SIDE_CHANNEL_PORT": "5600",
        "NARWHAL_UCX_TCP_PORT_RANGE": "30000-30100",
        "NARWHAL_ROUTER_SSH": "root@10.213.0.10",
        "NARWHAL_NODE_1_SSH": "root@10.213.0.11",
        "NARWHAL_NODE_2_SSH": "ops@10.213.0.12",
        "NARWHAL_NODE_2_SSH_PASSWORD": "correct-horse-battery",
        "NARWHAL_ENGINE_KEY": "sk-engine-ffffffff",
    }
    for key, value in overrides.items():
        values[key] = value
    return "".join(f"{k}={v}\n" for k, v in values.items() if v is not None)
