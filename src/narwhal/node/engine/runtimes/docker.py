"""Docker: NVIDIA GPUs through the NVIDIA container toolkit (`--gpus device=UUID,...`)."""

from __future__ import annotations

from narwhal.core import launch_record as lr
from narwhal.node.engine.runtimes.container import ContainerRuntime


class DockerRuntime(ContainerRuntime):
    def __init__(self) -> None:
        super().__init__("docker")

    def nvidia_args(self, record: lr.LaunchRecord) -> list[str]:
        return ["--gpus", "device=" + ",".join(d.uuid for d in record.devices)]


RUNTIME = DockerRuntime()
