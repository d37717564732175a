"""Host sessions: one per physical host, every command recorded by the session itself."""

from narwhal.deploy.hosts.base import Host, ProcessRef, Recorder, RunResult
from narwhal.deploy.hosts.local import LocalHost
from narwhal.deploy.hosts.ssh import SshHost

__all__ = ["Host", "LocalHost", "ProcessRef", "Recorder", "RunResult", "SshHost"]
