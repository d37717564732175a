"""The lab's hub double, held to the real `huggingface_hub` client: every claim here is what
the client does against it (model info, snapshots, the cache layout, resumed downloads, gated
access, the client's own exceptions), plus the refusals a hostile request gets."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

hf = pytest.importorskip("huggingface_hub")
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url  # noqa: E402
from huggingface_hub import snapshot_download as hf_snapshot_download  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError,
    GatedRepoError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from narwhal.lab.hub.server import HubServer  # noqa: E402
from narwhal.lab.hub.store import Store  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
REPO = "narwhal-lab/tiny"
GATED = "narwhal-lab/gated"
NO_CARD = "narwhal-lab/no-card"
BIG = "narwhal-lab/big"
CARD = ("---\nlicense: apache-2.0\nbase_model: narwhal-lab/base\npipeline_tag: text-generation\n"
        "tags:\n- lab\n---\nA tiny model for rehearsals.\n")
MIB = 1 << 20


@dataclass
class Hub:
    server: HubServer
    first: str  # commit 1 of REPO
    second: str  # commit 2 of REPO (main)
    v1: dict[str, bytes]  # commit 1's files
    v2: dict[str, bytes]  # commit 2's files
    token: str
    tmp: Path

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def api(self, token: str | bool = False) -> HfApi:
        return HfApi(endpoint=self.endpoint, token=token)


def _folder(path: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return path


def _weights(seed: int) -> bytes:
    return random.Random(seed).randbytes(4 * MIB)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    tmp = tmp_path_factory.mktemp("hub")
    store = Store(tmp / "store")
    v1 = {"config.json": b'{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}\n',
          "tokenizer.json": b'{"version": "1.0"}\n', "original/params.json": b"{}\n",
          "model.safetensors": _weights(1)}
    v2 = {**v1, "config.json": b'{"model_type": "llama", "hidden_size": 64}\n', "README.md": CARD.encode(),
          "model.safetensors": _weights(2)}
    first = store.push(REPO, _folder(tmp / "v1", v1), message="weights").id
    second = store.push(REPO, _folder(tmp / "v2", v2), message="card").id
    store.tag(REPO, "v1", first)
    token = "hf_lab_" + hashlib.sha256(str(tmp).encode()).hexdigest()[:24]
    store.init_repo(GATED, gated="manual", tokens=(token,))
    store.push(GATED, tmp / "v2")
    store.push(NO_CARD, tmp / "v1")
    server = HubServer(store, "127.0.0.1", 0, 0, socket_timeout=0.5)
    server.start()
    yield Hub(server, first, second, v1, v2, token, tmp)
    server.close()


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and ".cache" not in p.relative_to(folder).parts}


def test_model_info_names_the_main_commit_and_each_files_git_and_lfs_ids(hub: Hub) -> None:
    info = hub.api().model_info(REPO, files_metadata=True)
    assert info.sha == hub.second
    files = {s.rfilename: s for s in info.siblings or []}
    assert set(files) == set(hub.v2)
    weights = files["model.safetensors"]
    assert weights.lfs is not None and weights.size == 4 * MIB
    assert weights.lfs.sha256 == hashlib.sha256(hub.v2["model.safetensors"]).hexdigest()
    assert files["config.json"].lfs is None and files["config.json"].size == len(hub.v2["config.json"])
    if shutil.which("git"):  # the blob id git itself gives the file
        git = subprocess.run(["git", "hash-object", "--stdin"], input=hub.v2["config.json"],
                             capture_output=True, check=True).stdout.decode().strip()
        assert files["config.json"].blob_id == git
    assert info.card_data is not None and info.card_data.license == "apache-2.0"
    assert info.pipeline_tag == "text-generation" and "license:apache-2.0" in (info.tags or [])
    assert info.gated is False and info.private is False and info.last_modified is not None
    plain = hub.api().model_info(REPO, revision=hub.first)
    assert plain.sha == hub.first and plain.card_data is None
    assert {s.rfilename for s in plain.siblings or []} == set(hub.v1)
    assert all(s.size is None for s in plain.siblings or [])


def test_file_listings_show_folders_and_every_file(hub: Hub) -> None:
    api = hub.api()
    assert sorted(api.list_repo_files(REPO)) == sorted(hub.v2)
    top = {f.path: type(f).__name__ for f in api.list_repo_tree(REPO)}
    assert top["original"] == "RepoFolder" and "original/params.json" not in top
    inner = [f.path for f in api.list_repo_tree(REPO, path_in_repo="original", revision="v1")]
    assert inner == ["original/params.json"]
    refs = api.list_repo_refs(REPO)
    assert [(b.name, b.target_commit) for b in refs.branches] == [("main", hub.second)]
    assert [(t.name, t.target_commit) for t in refs.tags] == [("v1", hub.first)]


def test_a_snapshot_pinned_to_a_commit_keeps_that_commits_bytes_after_main_moves(hub: Hub) -> None:
    pinned = Path(hf_snapshot_download(REPO, revision=hub.first, local_dir=hub.tmp / "pinned",
                                       endpoint=hub.endpoint, token=False))
    assert _tree(pinned) == hub.v1  # main is at the second commit: none of its bytes came
    only = Path(hf_snapshot_download(REPO, revision="v1", local_dir=hub.tmp / "json",
                                     allow_patterns=["*.json"], endpoint=hub.endpoint, token=False))
    assert set(_tree(only)) == {"config.json", "tokenizer.json", "original/params.json"}


def test_the_cache_layout_is_snapshots_of_the_commit_linking_into_blobs(hub: Hub) -> None:
    cache = hub.tmp / "cache"
    weights = Path(hf_hub_download(REPO, "model.safetensors", cache_dir=cache,
                                   endpoint=hub.endpoint, token=False))
    config = Path(hf_hub_download(REPO, "config.json", cache_dir=cache, endpoint=hub.endpoint,
                                  token=False))
    repo_dir = cache / "models--narwhal-lab--tiny"
    assert weights.parent == repo_dir / "snapshots" / hub.second == config.parent
    assert weights.is_symlink() and config.is_symlink()
    assert weights.resolve().parent == repo_dir / "blobs"
    assert weights.resolve().name == hashlib.sha256(hub.v2["model.safetensors"]).hexdigest()
    assert weights.read_bytes() == hub.v2["model.safetensors"]
    assert (repo_dir / "refs" / "main").read_text() == hub.second
    snap = Path(hf_snapshot_download(REPO, cache_dir=cache, endpoint=hub.endpoint, token=False))
    assert snap == repo_dir / "snapshots" / hub.second and _tree(snap) == hub.v2


def test_the_etag_redirect_path_sends_lfs_downloads_to_another_origin(hub: Hub) -> None:
    lfs = get_hf_file_metadata(hf_hub_url(REPO, "model.safetensors", endpoint=hub.endpoint),
                               token=False)
    assert lfs.etag == hashlib.sha256(hub.v2["model.safetensors"]).hexdigest()
    assert lfs.size == 4 * MIB and lfs.commit_hash == hub.second
    assert lfs.location.startswith(hub.server.cdn_base + "/") and hub.server.cdn_base != hub.endpoint
    url = hf_hub_url(REPO, "config.json", revision=hub.first, endpoint=hub.endpoint)
    plain = get_hf_file_metadata(url, token=False)
    assert plain.location == url and plain.commit_hash == hub.first
    assert plain.size == len(hub.v1["config.json"])


def test_a_download_cut_mid_file_resumes_with_a_range_request(hub: Hub) -> None:
    """The client keeps what it has written and asks for the rest (it writes in 10 MiB
    chunks, so a cut past the first chunk is what a resume can show)."""
    big = {"model.safetensors": random.Random(3).randbytes(12 * MIB)}
    Store(hub.tmp / "store").push(BIG, _folder(hub.tmp / "big", big))
    sha = hashlib.sha256(big["model.safetensors"]).hexdigest()
    hub.server.faults.cut_once(sha, 11 * MIB)
    got = Path(hf_hub_download(BIG, "model.safetensors", local_dir=hub.tmp / "cut",
                               endpoint=hub.endpoint, token=False))
    assert got.read_bytes() == big["model.safetensors"]
    fetched = [s for s in hub.server.seen if s.origin == "cdn" and s.path == f"/lfs/{sha}"]
    assert [s.status for s in fetched] == [200, 206]
    start = int((fetched[1].range or "").removeprefix("bytes=").removesuffix("-"))
    assert 0 < start <= 11 * MIB
    assert not list((hub.tmp / "cut").rglob("*.incomplete"))


def test_a_gated_repos_files_need_a_granted_token_and_the_token_stays_on_the_hub(hub: Hub) -> None:
    info = hub.api().model_info(GATED)  # metadata is public, as on the hub
    assert info.gated == "manual"
    with pytest.raises(GatedRepoError) as anonymous:
        hf_hub_download(GATED, "config.json", local_dir=hub.tmp / "g0", endpoint=hub.endpoint,
                        token=False)
    assert anonymous.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as stranger:
        hf_snapshot_download(GATED, local_dir=hub.tmp / "g1", endpoint=hub.endpoint,
                             token="hf_not_granted")
    assert stranger.value.response.status_code == 403
    got = Path(hf_snapshot_download(GATED, local_dir=hub.tmp / "g2", endpoint=hub.endpoint,
                                    token=hub.token))
    assert _tree(got) == hub.v2
    sha = hashlib.sha256(hub.v2["model.safetensors"]).hexdigest()
    fetched = [s for s in hub.server.seen if s.origin == "cdn" and s.path == f"/lfs/{sha}"]
    assert fetched and not any(s.authorized for s in fetched)


def test_unknown_repos_revisions_and_files_raise_the_clients_own_exceptions(hub: Hub) -> None:
    api = hub.api()
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("narwhal-lab/absent")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("narwhal-lab/absent", "config.json", local_dir=hub.tmp / "x",
                        endpoint=hub.endpoint, token=False)
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        hf_snapshot_download(REPO, revision="0" * 40, local_dir=hub.tmp / "y",
                             endpoint=hub.endpoint, token=False)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "absent.bin", cache_dir=hub.tmp / "z", endpoint=hub.endpoint,
                        token=False)
    with pytest.raises(RepositoryNotFoundError):  # a private repo looks absent to a stranger
        Store(hub.tmp / "store").init_repo("narwhal-lab/hidden", private=True)
        api.model_info("narwhal-lab/hidden")


def test_model_cards_load_through_hf_endpoint_and_a_repo_without_one_has_none(hub: Hub) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(hub.tmp / "hf-home"),
               HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "tests.component.lab.hub_card_probe", REPO, NO_CARD],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=True)
    cards = json.loads(done.stdout)
    assert cards[REPO] == {"license": "apache-2.0", "base_model": "narwhal-lab/base",
                           "pipeline_tag": "text-generation", "text": "A tiny model for rehearsals."}
    assert cards[NO_CARD] == {"error": "RemoteEntryNotFoundError"}


def _raw(hub: Hub, request: bytes) -> bytes:
    host, port = hub.server.api.server_address[:2]
    with socket.create_connection((str(host), port), timeout=5) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _status(hub: Hub, method: str, target: str, headers: dict[str, str] | None = None) -> int:
    host, port = hub.server.api.server_address[:2]
    conn = http.client.HTTPConnection(str(host), port, timeout=5)
    try:
        conn.request(method, target, headers=headers or {})
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.parametrize("target", [
    "/narwhal-lab/tiny/resolve/main/../../../etc/passwd",
    "/narwhal-lab/tiny/resolve/main/%2e%2e/%2e%2e/etc/passwd",
    "/narwhal-lab/tiny/resolve/main/%2Fetc%2Fpasswd",
    "/narwhal-lab/tiny/resolve/main/..%5C..%5Cconfig.json",
    "/narwhal-lab/tiny/resolve/main/config.json%00.txt",
    "/narwhal-lab/../resolve/main/config.json",
    "/api/models/narwhal-lab/..%2F..%2Fstore/tree/main",
])
def test_paths_that_leave_the_repo_are_refused(hub: Hub, target: str) -> None:
    assert _status(hub, "GET", target) in (400, 404)


def test_hostile_requests_are_refused_and_bounded(hub: Hub) -> None:
    assert _status(hub, "POST", f"/api/models/{REPO}/paths-info/main") == 405
    assert _status(hub, "GET", f"/api/models/{REPO}", {"X-Big": "a" * 70_000}) == 431
    assert _status(hub, "GET", f"/api/models/{REPO}?blobs=true&unknown=1&x") == 200
    # a body on a GET is refused and the connection closed, so its bytes are never parsed
    reply = _raw(hub, f"GET /api/models/{REPO} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"
                 "GET /".encode())
    assert reply.startswith(b"HTTP/1.1 400") and reply.count(b"HTTP/1.1") == 1
    started = time.monotonic()  # a sender that stops mid-request is dropped, not waited on
    assert _raw(hub, b"GET /api/models/narwhal-lab/tiny HTT") == b""
    assert time.monotonic() - started < 3
