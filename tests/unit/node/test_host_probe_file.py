"""The probe as discovery ships it: one stdlib-only file, run as `python3 host_probe.py` with
its request on stdin, answering with exactly one result line the workstation can validate."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from narwhal.core import result_line
from narwhal.core.host_facts import HostFacts, parse_host_facts
from narwhal.lab import identity
from narwhal.node import host_probe
from tests.unit.node.helpers import LAB_IMAGE, h200_hardware, host_dir, install_double

PROBE = Path(host_probe.__file__)
PYTHON3 = shutil.which("python3") or sys.executable


def _python38() -> str | None:
    """A working Python 3.8 (the oldest the probe supports), if this machine has one."""
    candidates = [shutil.which("python3.8"), "/usr/bin/python3.8",
                  *map(str, sorted(Path.home().glob(".pyenv/versions/3.8*/bin/python3.8")))]
    for path in (c for c in candidates if c and Path(c).exists()):
        done = subprocess.run([path, "-c", "import sys; print(sys.version_info[:2] == (3, 8))"],
                              capture_output=True, text=True, check=False)
        if done.stdout.strip() == "True":
            return path
    return None


PYTHON38 = _python38()
# Names that exist only from Python 3.9 on; the probe must run on 3.8 hosts and report them.
NEWER_THAN_38 = {"removeprefix", "removesuffix", "is_relative_to", "file_digest", "UTC", "cache"}


def _request(**overrides: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"schema": "narwhal.host-probe-request", "schema_version": 1,
                               "role": "engine", "run_dir": None, "model_dir": None,
                               "fabric_interface": None, "ports": [], "image": None,
                               "runtime": None, "hash_model": False}
    request.update(overrides)
    return request


def _run(stdin: str, env: dict[str, str] | None = None,
         python: str = PYTHON3) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, str(PROBE)], input=stdin, capture_output=True, text=True,
                          env=env, timeout=120, check=False)


def _facts(request: dict[str, Any], env: dict[str, str] | None = None,
           python: str = PYTHON3) -> HostFacts:
    done = _run(json.dumps(request), env, python)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("NARWHAL_RESULT "), done.stdout
    result = result_line.parse(done.stdout, "narwhal-host-probe")
    assert result.ok and result.error == ""
    return parse_host_facts(result.data, "node-1")


@pytest.fixture
def model(tmp_path: Path) -> Path:
    root = tmp_path / "models" / "tiny-llama"
    (root / "tokenizer").mkdir(parents=True)
    (root / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}\n')
    (root / "generation_config.json").write_text('{"bos_token_id": 1, "eos_token_id": 2}\n')
    (root / "tokenizer" / "tokenizer_config.json").write_text('{"model_max_length": 4096}\n')
    (root / "model.safetensors").write_bytes(os.urandom(3 << 20))
    (root / "README.md").write_text("not part of the checkpoint\n")
    return root


@pytest.fixture
def host_env(tmp_path: Path) -> dict[str, str]:
    """PATH with the lab's nvidia-smi (the H200 spec) and docker doubles in front."""
    hdir = host_dir(tmp_path / "host", h200_hardware(), (LAB_IMAGE,))
    for tool, module in (("nvidia-smi", "nvidia_smi"), ("docker", "docker_cli")):
        install_double(tmp_path / "bin", tool, module, hdir)
    return {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_the_probe_imports_only_the_standard_library() -> None:
    tree = ast.parse(PROBE.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import would need the narwhal package"
            modules.add((node.module or "").split(".")[0])
    assert "narwhal" not in modules
    assert modules <= set(sys.stdlib_module_names), sorted(modules - set(sys.stdlib_module_names))


def test_the_probe_is_python_38_syntax_and_names_nothing_newer() -> None:
    source = PROBE.read_text()
    ast.parse(source, feature_version=(3, 8))
    names = {n.attr for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute)}
    assert not names & NEWER_THAN_38
    assert "from __future__ import annotations" in source  # annotations stay unevaluated on 3.8


@pytest.mark.skipif(PYTHON38 is None, reason="no python3.8 on this machine")
def test_the_probe_runs_on_python_38_and_reports_that_version(
        tmp_path: Path, model: Path, host_env: dict[str, str], listening: int) -> None:
    """Every collector runs on the oldest Python a fleet host may still have."""
    assert PYTHON38 is not None
    request = _request(run_dir=str(tmp_path), model_dir=str(model), fabric_interface="lo",
                       ports=[listening], image=identity.image_id(LAB_IMAGE), runtime="docker",
                       hash_model=True)
    old, new = _facts(request, host_env, python=PYTHON38), _facts(request, host_env)
    assert old.python.version.startswith("3.8.") and old.python.version_tuple() == (3, 8)
    assert old.model is not None and old.model.model_tree_sha256 is not None
    # Apart from the interpreter (and the PATH a pyenv shim gives python3) and the free space
    # that other work on this machine moves, both measure the same host the same way.
    skip: dict[str, Any] = {"python": True, "tools": {"python3": True},
                            "disk": {d: {"free_bytes"} for d in old.disk}}
    assert old.model_dump(exclude=skip) == new.model_dump(exclude=skip)


def test_a_full_engine_request_answers_one_line_the_workstation_validates(
        tmp_path: Path, model: Path, host_env: dict[str, str], listening: int) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ref = f"{LAB_IMAGE.repository}:{LAB_IMAGE.tag}"
    facts = _facts(_request(run_dir=str(run_dir), model_dir=str(model), fabric_interface="lo",
                            ports=[listening, 1], image=ref, runtime="docker", hash_model=True),
                   host_env)
    assert facts.role == "engine" and facts.schema_ == "narwhal.host-facts"
    gpus = facts.accelerators.gpus
    assert [(g.uuid, g.pci_bus_id, g.memory_total_mib) for g in gpus] == [
        ("GPU-00000000-0000-0000-0000-000000000001", "0000:00:06.0", 143771)]
    assert facts.accelerators.driver_version == "580.159.04"
    assert facts.tools["nvidia-smi"].path == str(tmp_path / "bin" / "nvidia-smi")
    assert facts.image is not None and facts.image.found
    assert facts.image.id == identity.image_id(LAB_IMAGE)
    assert facts.image.repo_digests == [identity.repo_digest(LAB_IMAGE)]
    assert facts.fabric_interface is not None and facts.fabric_interface.mtu == 65536
    assert [(x.port, x.address, x.pid) for x in facts.listeners] == [(listening, "127.0.0.1", os.getpid())]
    assert facts.disk[str(run_dir)].writable and facts.disk[str(model)].is_dir
    assert facts.model is not None and facts.model.error is None
    assert [r[0] for r in facts.model.rows] == ["config.json", "generation_config.json",
                                                "model.safetensors", "tokenizer/tokenizer_config.json"]
    assert facts.model.architectures == ["LlamaForCausalLM"]


def test_the_tree_digest_is_stable_and_one_changed_byte_names_its_file(model: Path) -> None:
    request = _request(model_dir=str(model), hash_model=True)
    first, again = _facts(request).model, _facts(request).model
    assert first is not None and again is not None
    assert first.model_tree_sha256 == again.model_tree_sha256 is not None
    target = model / "tokenizer" / "tokenizer_config.json"
    data = bytearray(target.read_bytes())
    data[3] ^= 0x01
    target.write_bytes(bytes(data))
    changed = _facts(request).model
    assert changed is not None and changed.model_tree_sha256 not in (None, first.model_tree_sha256)
    assert first.first_difference(changed) == "tokenizer/tokenizer_config.json"


def test_a_symlink_escaping_the_model_dir_is_an_error_naming_it(tmp_path: Path, model: Path) -> None:
    (tmp_path / "elsewhere.bin").write_bytes(b"weights from somewhere else")
    (model / "tokenizer" / "extra.bin").symlink_to(tmp_path / "elsewhere.bin")
    facts = _facts(_request(model_dir=str(model), hash_model=True)).model
    assert facts is not None and facts.model_tree_sha256 is None
    assert facts.error == f"tokenizer/extra.bin: symlink escapes the model dir (-> {tmp_path / 'elsewhere.bin'})"


def test_a_router_request_reports_no_model_image_or_disk() -> None:
    facts = _facts(_request(role="router"))
    assert (facts.model, facts.image, facts.disk, facts.listeners) == (None, None, {}, [])
    assert set(facts.tools) == set(host_probe.TOOLS)


@pytest.mark.parametrize("stdin, expected", [
    ("not json", "the request on stdin is not JSON"),
    ("[1, 2]", "the request is a JSON list, not an object"),
    (json.dumps(_request(schema_version=2)),
     "the request is 'narwhal.host-probe-request' v2, expected narwhal.host-probe-request v1"),
    (json.dumps({**_request(role="gpu", ports=[80, 70000], hash_model="yes"), "extra": 1}),
     "bad request: unknown key 'extra'"),
])
def test_a_bad_request_is_refused_with_one_result_line_and_exit_2(stdin: str, expected: str) -> None:
    done = _run(stdin)
    assert done.returncode == 2
    assert len(done.stdout.splitlines()) == 1
    result = result_line.parse(done.stdout, "narwhal-host-probe")
    assert not result.ok and result.data == {}
    assert expected in result.error


def test_a_bad_request_lists_every_problem_at_once() -> None:
    request = {**_request(role="gpu", ports=[80, 70000, True], hash_model="yes", runtime="lxc"), "extra": 1}
    del request["image"]
    error = result_line.parse(_run(json.dumps(request)).stdout, "narwhal-host-probe").error
    for part in ("unknown key 'extra'", "missing key 'image'", "hash_model: 'yes' is not bool",
                 "role: 'gpu' is not one of engine, router, workstation",
                 "runtime: 'lxc' is not one of docker, podman or null",
                 "ports: 70000 is not a TCP port", "ports: True is not a TCP port"):
        assert part in error, part


def test_a_probe_that_breaks_still_answers_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    def broken(request: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("boom")

    monkeypatch.setattr(host_probe, "host_facts", broken)
    out = io.StringIO()
    assert host_probe.main(io.StringIO(json.dumps(_request())), out) == 1
    result = result_line.parse(out.getvalue(), "narwhal-host-probe")
    assert not result.ok and result.error == "the probe failed: RuntimeError: boom"


def _hub_cache(tmp_path: Path, plain: Path) -> Path:
    """`plain` laid out as huggingface_hub's cache lays one commit out: every file a blob named
    by its digest, the snapshot a tree of relative symlinks into ../../blobs."""
    repo = tmp_path / "hub" / "models--narwhal-lab--tiny-llama"
    snapshot = repo / "snapshots" / ("c0ffee" * 6 + "abcd")
    (repo / "blobs").mkdir(parents=True)
    for path in sorted(p for p in plain.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / path.relative_to(plain)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def test_a_hugging_face_cache_snapshot_hashes_as_the_plain_copy_of_its_commit(
        tmp_path: Path, model: Path) -> None:
    snapshot = _hub_cache(tmp_path, model)
    plain = _facts(_request(model_dir=str(model), hash_model=True)).model
    cached = _facts(_request(model_dir=str(snapshot), hash_model=True)).model
    assert plain is not None and cached is not None and cached.error is None
    assert cached.model_tree_sha256 == plain.model_tree_sha256 is not None
    assert cached.files == plain.files and cached.bytes == plain.bytes


def test_a_snapshot_link_outside_its_repo_s_blobs_still_escapes(tmp_path: Path,
                                                                 model: Path) -> None:
    snapshot = _hub_cache(tmp_path, model)
    (tmp_path / "elsewhere.bin").write_bytes(b"weights from somewhere else")
    (snapshot / "extra.bin").symlink_to(tmp_path / "elsewhere.bin")
    facts = _facts(_request(model_dir=str(snapshot), hash_model=True)).model
    assert facts is not None and facts.model_tree_sha256 is None
    assert facts.error == f"extra.bin: symlink escapes the model dir (-> {tmp_path / 'elsewhere.bin'})"
    # a folder named like a snapshot but outside a cache repo (no blobs/) is a plain folder
    lone = tmp_path / "lone" / "snapshots" / "abc"
    lone.mkdir(parents=True)
    (lone / "w.bin").symlink_to(tmp_path / "elsewhere.bin")
    facts = _facts(_request(model_dir=str(lone), hash_model=True)).model
    assert facts is not None and facts.error is not None and "escapes" in facts.error
