"""Gate A's staging pieces against the lab's hub double with the real huggingface_hub client:
the pin on the workstation, and the host script that fetches, repairs and reports."""

from __future__ import annotations

import hashlib
import json
import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from narwhal.core import result_line
from narwhal.core.secret import Secret
from narwhal.deploy.checkpoint import manifest as mf
from narwhal.deploy.checkpoint import pin
from narwhal.deploy.inputs.model import CheckpointSource
from narwhal.lab.hub.server import HubServer
from narwhal.lab.hub.store import Store
from narwhal.node import host_probe

SCRIPT = Path(__file__).resolve().parents[3] / "src" / "narwhal" / "node" / "stage_checkpoint.py"
REPO, GATED = "narwhal-lab/tiny", "narwhal-lab/gated"
CARD = b"---\nlicense: apache-2.0\nbase_model: narwhal-lab/base\npipeline_tag: text-generation\n---\n"


@dataclass
class Hub:
    server: HubServer
    store: Store
    first: str
    second: str
    files: dict[str, bytes]  # the second commit's
    token: str
    tmp: Path


def _folder(path: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return path


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    tmp = tmp_path_factory.mktemp("stage")
    store = Store(tmp / "store")
    v1 = {"config.json": b'{"model_type": "llama"}\n', "tokenizer.json": b'{"v": 1}\n',
          "model.safetensors": random.Random(1).randbytes(1 << 20),
          "pytorch_model.bin": b"old weights"}
    v2 = {**v1, "README.md": CARD, "model.safetensors": random.Random(2).randbytes(1 << 20)}
    first = store.push(REPO, _folder(tmp / "v1", v1)).id
    second = store.push(REPO, _folder(tmp / "v2", v2)).id
    token = "hf_lab_" + hashlib.sha256(str(tmp).encode()).hexdigest()[:24]
    store.init_repo(GATED, gated="manual", tokens=(token,))
    store.push(GATED, tmp / "v2")
    server = HubServer(store, "127.0.0.1", 0, 0, socket_timeout=0.5)
    server.start()
    yield Hub(server, store, first, second, v2, token, tmp)
    server.close()


def _stage(manifest: mf.Manifest, model_dir: Path, files: list[str], repair: list[str],
           token: str | None = None, endpoint: str | None = None) -> dict[str, Any]:
    """The host script as Gate A runs it (stdin request; this interpreter has the hub client,
    so the kit it is given is empty)."""
    request = {"schema": "narwhal.stage-request", "schema_version": 1,
               "repo_id": manifest.repo_id, "commit": manifest.commit,
               "model_dir": str(model_dir), "endpoint": endpoint or manifest.endpoint,
               "files": files, "repair": repair, "kit": str(model_dir.parent / "kit"),
               "wheels": [], "token": token}
    done = subprocess.run([sys.executable, str(SCRIPT)], input=json.dumps(request).encode(),
                          capture_output=True, timeout=120, check=False)
    assert token is None or token.encode() not in done.stdout + done.stderr
    result = result_line.parse(done.stdout.decode(), "narwhal-stage-checkpoint")
    assert result.ok, result.error
    return dict(result.data)


def _rows(model_dir: Path) -> list[list[Any]]:
    return [[p.relative_to(model_dir).as_posix(), p.stat().st_size,
             hashlib.sha256(p.read_bytes()).hexdigest()] for p in sorted(model_dir.rglob("*"))
            if p.is_file() and ".cache" not in p.relative_to(model_dir).parts]


def test_main_is_pinned_to_its_commit_with_every_files_sha256_and_the_card(hub: Hub) -> None:
    m = pin.resolve(CheckpointSource(repo_id=REPO, revision="main", endpoint=hub.server.endpoint),
                    None, hub.tmp / "cache-a")
    assert m.commit == hub.second
    assert [f.path for f in m.files] == ["config.json", "model.safetensors",
                                         "tokenizer.json"]  # no second weights format, no card
    assert all(f.sha256 == hashlib.sha256(hub.files[f.path]).hexdigest() for f in m.files)
    assert m.card is not None and (m.card.license, m.card.pipeline_tag, m.card.base_model) == (
        "apache-2.0", "text-generation", ("narwhal-lab/base",))
    older = pin.resolve(CheckpointSource(repo_id=REPO, revision=hub.first,
                                         endpoint=hub.server.endpoint), None, hub.tmp / "c-b")
    assert older.commit == hub.first and older.card is None  # said, not an error


def test_an_empty_model_dir_gets_the_pinned_tree_and_a_changed_byte_is_repaired_alone(
        hub: Hub) -> None:
    m = pin.resolve(CheckpointSource(repo_id=REPO, endpoint=hub.server.endpoint), None,
                    hub.tmp / "cache-c")
    model = hub.tmp / "host1" / "model"
    plans, _ = mf.fetch_plan([mf.compare("host1", m, [])], repair=False)
    got = _stage(m, model, list(plans[0].files), [])
    assert got["outcome"] == "staged" and set(got["files"]) == {f.path for f in m.files}
    assert host_probe.tree_digest(_rows(model)) == m.digest()
    shard = model / "model.safetensors"
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0xFF
    shard.write_bytes(bytes(data))
    diff = mf.compare("host1", m, _rows(model))
    assert diff.differs == ("model.safetensors",) and not diff.missing
    assert mf.fetch_plan([diff], repair=False)[0] == []  # refused: nothing fetched
    before = {p: (model / p).stat().st_mtime_ns for p in ("config.json", "tokenizer.json")}
    plans, _ = mf.fetch_plan([diff], repair=True)
    got = _stage(m, model, list(plans[0].files), list(plans[0].repair))
    assert got["files"] == {"model.safetensors": "repaired"}
    assert host_probe.tree_digest(_rows(model)) == m.digest()
    assert before == {p: (model / p).stat().st_mtime_ns for p in before}


def test_a_gated_repo_without_a_token_is_refused_naming_the_token_field(hub: Hub) -> None:
    source = CheckpointSource(repo_id=GATED, endpoint=hub.server.endpoint)
    with pytest.raises(pin.PinError) as err:
        pin.resolve(source, None, hub.tmp / "cache-d")
    assert err.value.problems[0].field == "NARWHAL_HF_TOKEN"
    m = pin.resolve(source, Secret(hub.token, "NARWHAL_HF_TOKEN"), hub.tmp / "cache-e")
    wrong = _stage(m, hub.tmp / "host2" / "model", ["config.json"], [], token="hf_wrong_token")
    assert wrong["outcome"] == "failed" and wrong["kind"] == "GatedRepoError"
    right = _stage(m, hub.tmp / "host3" / "model", ["config.json"], [], token=hub.token)
    assert right["outcome"] == "staged"


def test_a_host_that_cannot_reach_the_hub_says_unreachable_not_failed(hub: Hub) -> None:
    m = pin.resolve(CheckpointSource(repo_id=REPO, endpoint=hub.server.endpoint), None,
                    hub.tmp / "cache-f")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening
        got = _stage(m, hub.tmp / "host4" / "model", ["config.json"], [], endpoint=closed)
    assert got["outcome"] == "unreachable" and got["files"] == {}


@pytest.mark.parametrize("request_doc", [
    {}, {"schema": "narwhal.stage-request", "schema_version": 2},
    {"schema": "narwhal.stage-request", "schema_version": 1, "repo_id": "a/b", "commit": "c",
     "model_dir": "relative", "kit": "/k", "files": [], "repair": [], "wheels": []},
    {"schema": "narwhal.stage-request", "schema_version": 1, "repo_id": "a/b", "commit": "c",
     "model_dir": "/m", "kit": "/k", "files": "config.json", "repair": [], "wheels": []},
    *({"schema": "narwhal.stage-request", "schema_version": 1, "repo_id": "a/b", "commit": "c",
       "model_dir": "/nonexistent-m", "kit": "/nonexistent-k", "files": files, "repair": [],
       "wheels": [], "remove": remove}
      for files, remove in ((["../etc/passwd"], []), (["/etc/passwd"], []), (["a//b"], []),
                            ([], ["../../root/.ssh/authorized_keys"]), ([], ["a\\b"])))])
def test_a_request_the_script_cannot_read_changes_nothing_and_exits_2(
        request_doc: dict[str, Any]) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], input=json.dumps(request_doc).encode(),
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 2
    assert not result_line.parse(done.stdout.decode(), "narwhal-stage-checkpoint").ok
