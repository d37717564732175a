"""An engine whose model dir is a Hugging Face cache snapshot gets its repo's blobs/ mounted
beside it (read-only, at its own path): the snapshot's files are links into it."""

from __future__ import annotations

from pathlib import Path

from tests.unit.node.test_engine_runplan import _argv, _record


def _mounts(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]


def test_a_snapshot_s_blobs_are_mounted_read_only_beside_it(tmp_path: Path) -> None:
    repo = tmp_path / "models--org--m"
    snapshot = repo / "snapshots" / "c0ffee"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for runtime in ("docker", "podman"):
        mounts = _mounts(_argv(_record(runtime, "nvidia", model_dir=str(snapshot))))
        blobs = str((repo / "blobs").resolve())
        assert f"{snapshot}:{snapshot}:ro" in mounts and f"{blobs}:{blobs}:ro" in mounts


def test_a_plain_model_dir_gets_only_itself(tmp_path: Path) -> None:
    plain = tmp_path / "snapshots" / "looks-like-one"  # no repo blobs/ beside it
    plain.mkdir(parents=True)
    mounts = _mounts(_argv(_record("docker", "nvidia", model_dir=str(plain))))
    assert mounts == [f"{plain}:{plain}:ro", "/srv/run:/srv/run"]
