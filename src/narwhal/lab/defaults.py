"""The embedded default spec: a router host and three engine hosts with two GPUs each, and
the lab hub holding the model too (every host has a route to it; `lab fault hub-cut` takes one
away).

Built as data (not a file) so it ships with the package without package-data configuration.
eng3 logs in with a password so the product's sshpass path is exercised.
"""

from __future__ import annotations

from typing import Any

from narwhal.core.documents import stamp
from narwhal.lab.spec import SCHEMA, VERSION

_MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "torch_dtype": "bfloat16",
}


def _engine(index: int) -> dict[str, Any]:
    devices = [
        {
            "pci_bus_id": f"00000000:{0x17 + 0x20 * gpu + index:02X}:00.0",
            "uuid": f"GPU-{index:08x}-{gpu:04x}-4a1b-8c2d-{index * 16 + gpu:012x}",
        }
        for gpu in range(2)
    ]
    users: list[dict[str, Any]] = [{"name": "root", "auth": "password" if index == 3 else "key"}]
    return {
        "name": f"eng{index}",
        "role": "engine",
        "users": users,
        "hardware": {
            "accelerators": {
                "vendor": "NVIDIA",
                "product": "NVIDIA H100 80GB HBM3",
                "count": 2,
                "memory_mib": 81559,
                "devices": devices,
            },
            "rdma": [],
        },
    }


MAX_ENGINE_HOSTS = 63  # a /24 holds the router, 63 engine hosts and the lab's own addresses


def scaled_spec_document(engines: int, name: str = "nwl") -> dict[str, Any]:
    """The default lab with `engines` engine hosts (1..63) under `name`: the same router, image,
    model and hub, each engine host as the default's (key logins; eng3 keeps its password
    login), so a fleet of any size is deployed exactly as the 4-host lab is."""
    if not 1 <= engines <= MAX_ENGINE_HOSTS:
        raise ValueError(f"--engines {engines}: give 1 to {MAX_ENGINE_HOSTS} engine hosts")
    doc = default_spec_document()
    doc["name"] = name
    doc["hosts"] = [{"name": "router", "role": "router"}] + [
        _engine(i) for i in range(1, engines + 1)]
    return doc


def default_spec_document() -> dict[str, Any]:
    """The default spec as a JSON-ready document (the same shape a spec file has)."""
    return stamp(
        SCHEMA,
        VERSION,
        {
            "name": "nwl",
            "management": {"subnet": "10.213.0.0/24", "mtu": 1500},
            "fabric": {"subnet": "10.214.0.0/24", "mtu": 9000},
            "hosts": [{"name": "router", "role": "router"}] + [_engine(i) for i in (1, 2, 3)],
            "image": {
                "repository": "narwhal-lab/vllm-emulator",
                "tag": "v0.32.0",
                "entrypoint": ["vllm", "serve"],
                "cmd": [],
                "env": [
                    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "VLLM_USE_V1=1",
                    "UCX_TLS=tcp",
                ],
            },
            # the model is on every engine host and in the lab hub (repo
            # narwhal-lab/tiny-llama, API on management .5:8600); tests/lab/test_stage_lab.py
            # stages it from there into an empty dir ("hub": true empties the model dirs)
            "model": {"name": "narwhal-lab/tiny-llama", "dir": "/srv/models/tiny-llama",
                      "config": _MODEL_CONFIG},
            "hub": {"port": 8600, "gated": False},
            # a corrupt pair is caught within two canary periods: 6 s here, not 2 minutes
            "kv_canary_interval_s": 3,
        },
    )
