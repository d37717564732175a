"""`narwhal recover` removes a container the failed attempt created, and only that container.

The runtime is the lab's docker double (src/narwhal/lab/doubles/docker_cli.py) on this
machine's PATH, behind a LocalHost: the same CLI, output format and state the lab hosts use.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from narwhal.core.errors import LedgerError
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.containers import inspect_container
from narwhal.deploy.hosts.local import LocalHost
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.ledger.evidence import read_rows
from narwhal.deploy.ledger.recover import recover
from narwhal.lab.identity import image_document
from narwhal.lab.spec import Image
from tests.unit.ledger.records import ledger_for_valid_env

SRC = Path(__file__).resolve().parents[3] / "src"
IMAGE = Image(repository="lab/engine", tag="v1", entrypoint=["sleep"], cmd=["300"])


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `docker` on PATH that is the lab's double, keeping its state under tmp_path/host."""
    host_dir = tmp_path / "host"
    (host_dir / "data").mkdir(parents=True)
    (host_dir / "data" / "host.json").write_text(json.dumps({"images": [image_document(IMAGE)]}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    script.write_text("\n".join([
        f"#!{sys.executable} -I", "import sys", f"sys.path.insert(0, {str(SRC)!r})",
        "from narwhal.lab.doubles.docker_cli import main",
        f"sys.exit(main({str(host_dir)!r}, sys.argv[1:]))", ""]))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return host_dir


_ledger = ledger_for_valid_env


def _failed_attempt_owning_a_container(ledger: Ledger, host: LocalHost) -> str:
    """A failed `engines` attempt that created one container; returns the container id."""
    with pytest.raises(RuntimeError), ledger.attempt("engines", fingerprint={},
                                                     hosts={}) as attempt:
        with attempt.bind(host):
            container_id = host.run(["docker", "create", "lab/engine:v1"], check=True).text.strip()
            made = inspect_container(host, "docker", container_id)
        assert made is not None
        attempt.own_container(host, "docker", made.id, made.created)
        raise RuntimeError("engine failed to start")
    return container_id


def test_a_container_the_attempt_created_is_removed(docker: Path, tmp_path: Path) -> None:
    ledger, host = _ledger(tmp_path), LocalHost()
    container_id = _failed_attempt_owning_a_container(ledger, host)

    report = recover(ledger, "engines", lambda alias: host)

    assert [(r["kind"], r["id"], r["result"]) for r in report] == [
        ("container", container_id, "removed")]
    assert inspect_container(host, "docker", container_id) is None
    recovery = ledger.load()["activities"]["recover"]["attempts"][-1]
    argv = [r["argv"] for r in read_rows(ledger.attempt_folder("recover", recovery)
                                         / "commands.jsonl")]
    assert ["docker", "rm", "-f", container_id] in argv


def test_a_container_recreated_under_the_same_id_is_kept_and_reported(
        docker: Path, tmp_path: Path) -> None:
    ledger, host = _ledger(tmp_path), LocalHost()
    container_id = _failed_attempt_owning_a_container(ledger, host)
    # The double keeps each container as a JSON record; give the id a new creation time, as a
    # container restored or recreated under that id would have.
    record = docker / "docker" / "containers" / container_id / "container.json"
    doc = json.loads(record.read_text())
    doc["Created"] = "2031-02-03T04:05:06.000000Z"
    record.write_text(json.dumps(doc))

    report = recover(ledger, "engines", lambda alias: host)

    (row,) = report
    assert row["result"].startswith("kept: a container with this id was created at "
                                    "2031-02-03T04:05:06.000000Z")
    assert inspect_container(host, "docker", container_id) is not None


def test_a_container_already_gone_is_reported_as_such(docker: Path, tmp_path: Path) -> None:
    ledger, host = _ledger(tmp_path), LocalHost()
    container_id = _failed_attempt_owning_a_container(ledger, host)
    host.run(["docker", "rm", "-f", container_id], check=True)

    assert [r["result"] for r in recover(ledger, "engines", lambda alias: host)] == [
        "already gone"]


@pytest.mark.parametrize(("runtime", "container_id", "created", "words"), [
    ("containerd", "a" * 64, "2026-01-01T00:00:00Z", "runtime"),
    ("docker", "engine-1", "2026-01-01T00:00:00Z", "64-hex"),
    ("docker", "a" * 12, "2026-01-01T00:00:00Z", "64-hex"),
    ("podman", "a" * 64, " ", "creation time"),
])
def test_a_container_recovery_could_not_tell_apart_is_refused_when_owned(
        tmp_path: Path, runtime: str, container_id: str, created: str, words: str) -> None:
    ledger = _ledger(tmp_path)
    with pytest.raises(LedgerError, match=words), \
            ledger.attempt("engines", fingerprint={}, hosts={}) as attempt:
        attempt.own_container(LocalHost(), runtime, container_id, created)


def test_the_identity_line_keeps_podmans_spaced_creation_time() -> None:
    created = "2026-01-01 10:00:00.123456789 +0000 UTC"
    assert cl.parse_container_identity("a" * 64 + f" {created}\n") == ("a" * 64, created)
    with pytest.raises(ValueError, match="not"):
        cl.parse_container_identity("engine-1 2026-01-01T00:00:00Z")


@pytest.mark.parametrize(("runtime", "container_id"), [
    ("sh", "a" * 64), ("docker", "--all"), ("podman", "a" * 63), ("docker", "A" * 64)])
def test_container_command_lines_refuse_what_could_name_another_container(
        runtime: str, container_id: str) -> None:
    for build in (cl.container_identity, cl.container_remove):
        with pytest.raises(ValueError):
            build(runtime, container_id)


def test_the_doubles_restart_keeps_the_container_and_starts_a_new_process(docker: Path) -> None:
    """What the restart acceptance leans on: `docker restart` keeps Id and Created (so the
    container still looks like the one Gate C started) while the process is a new one."""
    host = LocalHost("eng1")
    cid = host.run(["docker", "run", "-d", "lab/engine:v1"], check=True).text.strip()
    fmt = "{{.Id}}|{{.Created}}|{{.State.Pid}}|{{.State.Running}}"
    before = host.run(["docker", "inspect", "--format", fmt, cid], check=True).text.split("|")
    try:
        done = host.run(["docker", "restart", "-t", "5", cid], check=True)
        assert done.text.strip() == cid
        after = host.run(["docker", "inspect", "--format", fmt, cid], check=True).text.split("|")
        assert after[:2] == before[:2] and after[3].strip() == "true"
        assert after[2] != before[2] and int(after[2]) > 0
        os.kill(int(after[2]), 0)  # the new process is alive
    finally:
        host.run(["docker", "rm", "-f", cid])
