"""What Gate A stages on each host, decided from the hub's file list and the host's rows."""

from __future__ import annotations

import hashlib

import pytest

from narwhal.deploy.checkpoint import manifest as mf
from narwhal.node import host_probe

SHA = {name: hashlib.sha256(name.encode()).hexdigest() for name in
       ("config.json", "model.safetensors", "tokenizer.json")}


def _manifest() -> mf.Manifest:
    return mf.Manifest(repo_id="org/model", revision="main", commit="a" * 40, endpoint=None,
                       files=[mf.HubFile(path=p, size=len(p), sha256=SHA[p], lfs=p.endswith(
                           ".safetensors")) for p in sorted(SHA)], card=None)


def _rows(**changed: tuple[int, str] | None) -> list[list[object]]:
    rows = {p: (len(p), SHA[p]) for p in SHA}
    for name, value in changed.items():
        path = name.replace("_", ".")
        if value is None:
            rows.pop(path, None)
        else:
            rows[path] = value
    return [[p, s, h] for p, (s, h) in sorted(rows.items())]


def test_the_manifest_digest_is_the_host_probes_tree_digest_of_the_same_rows() -> None:
    rows = [[f.path, f.size, f.sha256] for f in reversed(_manifest().files)]
    assert host_probe.tree_digest(rows) == _manifest().digest()


def test_a_host_with_every_file_at_the_pinned_sha256_fetches_nothing() -> None:
    diff = mf.compare("eng1", _manifest(), _rows())
    assert diff.matches
    assert mf.fetch_plan([diff], repair=False) == ([], [])


def test_an_empty_model_dir_fetches_every_file() -> None:
    plans, refused = mf.fetch_plan([mf.compare("eng1", _manifest(), [])], repair=False)
    assert refused == [] and [p.files for p in plans] == [tuple(sorted(SHA))]
    assert plans[0].repair == ()


def test_a_changed_file_blocks_everywhere_without_consent_and_is_fetched_alone_with_it() -> None:
    m = _manifest()
    bad = mf.compare("eng2", m, _rows(model_safetensors=(17, "0" * 64)))
    empty = mf.compare("eng3", m, [])
    plans, refused = mf.fetch_plan([bad, empty], repair=False)
    assert plans == [] and [d.host for d in refused] == ["eng2"]
    assert refused[0].differs == ("model.safetensors",)
    plans, refused = mf.fetch_plan([bad, empty], repair=True)
    assert refused == []
    assert {p.host: (p.files, p.repair) for p in plans} == {
        "eng2": (("model.safetensors",), ("model.safetensors",)),
        "eng3": (tuple(sorted(SHA)), ())}


def test_a_file_outside_the_revision_is_refused_even_with_repair() -> None:
    rows = [*_rows(), ["notes.txt", 3, "1" * 64]]
    plans, refused = mf.fetch_plan([mf.compare("eng1", _manifest(), rows)], repair=True)
    assert plans == [] and refused[0].extra == ("notes.txt",)


@pytest.mark.parametrize("path", ["../etc/passwd", "/etc/passwd", "a/../b", "a\\b", "a\x00b",
                                  "-rf", "a//b", "a/./b", "x" * 1025, "", "a;b", "a b",
                                  "$(reboot)", "\u202egnp.exe"])
def test_a_hub_path_that_smuggles_structure_is_refused(path: str) -> None:
    assert mf.path_problem(path) is not None


@pytest.mark.parametrize("path", ["config.json", "model-00001-of-00004.safetensors",
                                  "tokenizer/vocab.json", "1_Pooling/config.json",
                                  "special_tokens_map.json"])
def test_the_paths_real_repos_use_are_accepted(path: str) -> None:
    assert mf.path_problem(path) is None


def test_only_the_weights_vllm_loads_are_staged_when_safetensors_exist() -> None:
    every = ["config.json", "model.safetensors", "pytorch_model.bin", "original/consolidated.pth",
             ".gitattributes", "README.md", "tokenizer.json", "onnx/model.onnx"]
    assert mf.select(every) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert "pytorch_model.bin" in mf.select(["config.json", "pytorch_model.bin"])


@pytest.mark.parametrize("lfs", [None, {}, {"sha256": "x"}, {"sha256": "A" * 64},
                                 {"sha256": ["a" * 64]}, "a" * 64])
def test_an_lfs_hash_the_hub_gives_in_another_shape_is_not_taken(lfs: object) -> None:
    assert mf.hub_sha256({"lfs": lfs}) is None


def _moved() -> tuple[mf.Manifest, mf.Manifest]:
    """A pin, and the next one the operator moved the revision to: config.json changed,
    tokenizer.json gone, generation_config.json new."""
    old = _manifest()
    files = [f for f in old.files if f.path != "tokenizer.json"]
    files = [mf.HubFile(path=f.path, size=f.size + 1, sha256="c" * 64) if f.path == "config.json"
             else f for f in files]
    files.append(mf.HubFile(path="generation_config.json", size=5, sha256="d" * 64))
    return old, old.model_copy(update={"commit": "b" * 40, "files": files})


def test_a_moved_revision_replaces_and_retires_exactly_the_previous_pins_files() -> None:
    old, new = _moved()
    diff = mf.compare("eng1", new, _rows(), previous=old)
    assert (diff.stale, diff.retired) == (("config.json",), ("tokenizer.json",))
    plans, refused = mf.fetch_plan([diff], repair=False)
    assert refused == [] and len(plans) == 1
    assert (plans[0].files, plans[0].repair, plans[0].remove) == (
        ("config.json", "generation_config.json"), ("config.json",), ("tokenizer.json",))


def test_a_moved_revision_still_refuses_a_file_no_pin_had_without_consent() -> None:
    old, new = _moved()
    damaged = _rows(model_safetensors=(17, "0" * 64))
    diff = mf.compare("eng1", new, [*damaged, ["notes.txt", 3, "1" * 64]], previous=old)
    _, refused = mf.fetch_plan([diff], repair=False)
    assert refused and refused[0].extra == ("notes.txt", "tokenizer.json")
    _, refused = mf.fetch_plan([diff], repair=True)
    assert refused, "a file no pin ever had is never removed"
