"""Image identity and PCI facts derived from the spec, shared by `lab up` and the doubles' data.

The image Id is the sha256 of the image config, as Docker computes it, so the same spec always
yields the same `NARWHAL_ENGINE_IMAGE` and a changed entrypoint or env yields a new one.
"""

from __future__ import annotations

import hashlib
from typing import Any

from narwhal.core.documents import canonical_json
from narwhal.lab.spec import Accelerators, Image

# (vendor id, class code, device id) for the accelerators the lab can pretend to have.
PCI_IDS: dict[str, tuple[str, str, str]] = {
    "NVIDIA": ("0x10de", "0x030200", "0x2330"),
    "AMD": ("0x1002", "0x038000", "0x74a1"),
}


def image_config(image: Image) -> dict[str, Any]:
    layer = "sha256:" + hashlib.sha256(f"{image.repository}:{image.tag}".encode()).hexdigest()
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": list(image.env),
            "Entrypoint": list(image.entrypoint),
            "Cmd": list(image.cmd) or None,
            "Labels": {"org.opencontainers.image.title": image.repository},
        },
        "rootfs": {"type": "layers", "diff_ids": [layer]},
    }


def image_id(image: Image) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(image_config(image)).encode()).hexdigest()


def repo_digest(image: Image) -> str:
    manifest = {"config": image_id(image), "mediaType": "application/vnd.oci.image.manifest.v1+json"}
    return f"{image.repository}@sha256:" + hashlib.sha256(canonical_json(manifest).encode()).hexdigest()


def sysfs_bus_id(nvidia_bus_id: str) -> str:
    """`00000000:17:00.0` (nvidia-smi) -> `0000:17:00.0` (sysfs, lspci -D), lower case."""
    domain, rest = nvidia_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def image_document(image: Image) -> dict[str, Any]:
    """What the docker double stores for the image (read by `docker image inspect`)."""
    return {
        "id": image_id(image),
        "repo_tags": [f"{image.repository}:{image.tag}"],
        "repo_digests": [repo_digest(image)],
        "config": image_config(image),
    }


def accelerator_rows(acc: Accelerators) -> list[dict[str, Any]]:
    return [
        {"index": i, "pci_bus_id": d.pci_bus_id, "uuid": d.uuid, "sysfs": sysfs_bus_id(d.pci_bus_id)}
        for i, d in enumerate(acc.devices)
    ]
