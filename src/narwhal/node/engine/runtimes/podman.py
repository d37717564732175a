"""Podman: docker's CLI, but NVIDIA GPUs as one CDI device `nvidia.com/gpu=UUID` each
(podman's documented way; it has no `--gpus` of its own meaning)."""

from __future__ import annotations

from narwhal.core import launch_record as lr
from narwhal.node.engine.runtimes.container import ContainerRuntime


class PodmanRuntime(ContainerRuntime):
    def __init__(self) -> None:
        super().__init__("podman")

    def nvidia_args(self, record: lr.LaunchRecord) -> list[str]:
        return [a for d in record.devices for a in ("--device", f"nvidia.com/gpu={d.uuid}")]


RUNTIME = PodmanRuntime()
