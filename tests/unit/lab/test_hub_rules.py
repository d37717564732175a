"""The hub double's decisions as data: who may read what, which targets name what, which
byte ranges are served, and what the store keeps (shared objects, no tokens)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from narwhal.core.errors import InputError
from narwhal.lab.hub import access, ranges, routes
from narwhal.lab.hub.records import RepoSettings
from narwhal.lab.hub.store import Store

PUBLIC = RepoSettings(created_at="2026-01-01T00:00:00.000Z")
GATED = RepoSettings(gated="auto", token_sha256=[hashlib.sha256(b"granted").hexdigest()],
                     created_at="2026-01-01T00:00:00.000Z")
PRIVATE = GATED.model_copy(update={"gated": False, "private": True})


@pytest.mark.parametrize(("settings", "token", "want", "status", "code"), [
    (None, None, "metadata", 401, "RepoNotFound"),
    (None, "x", "files", 404, "RepoNotFound"),
    (PUBLIC, None, "files", 200, ""),
    (GATED, None, "metadata", 200, ""),
    (GATED, None, "files", 401, "GatedRepo"),
    (GATED, "wrong", "files", 403, "GatedRepo"),
    (GATED, "granted", "files", 200, ""),
    (PRIVATE, None, "metadata", 401, "RepoNotFound"),
    (PRIVATE, "wrong", "metadata", 404, "RepoNotFound"),
    (PRIVATE, "granted", "files", 200, ""),
])
def test_a_gated_repo_shows_its_metadata_to_all_and_its_files_to_granted_tokens_only(
        settings: RepoSettings | None, token: str | None, want: access.Want, status: int,
        code: str) -> None:
    verdict = access.decide(settings, token, want)
    assert (verdict.status, verdict.error_code) == (status, code)


def test_every_repo_token_and_request_kind_has_one_verdict() -> None:
    assert len(access.TABLE) == len(access.Repo) * len(access.Token) * 2


@pytest.mark.parametrize(("target", "expected"), [
    ("/api/models/o/n", ("model_info", "o/n", "main", "", False)),
    ("/api/models/o/n?blobs=true&whatever=1", ("model_info", "o/n", "main", "", True)),
    ("/api/models/o/n/revision/refs%2Fpr%2F1", ("model_info", "o/n", "refs/pr/1", "", False)),
    ("/api/models/o/n/tree/main/a%2Fb?recursive=true", ("tree", "o/n", "main", "a/b", False)),
    ("/o/n/resolve/v1/sub/file.json", ("resolve", "o/n", "v1", "sub/file.json", False)),
    ("/o/n/resolve/main/with%20space.txt", ("resolve", "o/n", "main", "with space.txt", False)),
])
def test_targets_name_the_route_the_client_means(target: str, expected: tuple[object, ...]) -> None:
    route = routes.parse(target)
    assert isinstance(route, routes.Route)
    assert (route.kind, route.repo_id, route.revision, route.path, route.blobs) == expected


@pytest.mark.parametrize("target", [
    "/o/n/resolve/main/../x", "/o/n/resolve/main/%2e%2e/x", "/o/n/resolve/main//etc/passwd",
    "/o/n/resolve/main/a%5Cb", "/o/n/resolve/main/a%00b", "/o/n/resolve/..%2F..%2Fx/f",
    "/o/../resolve/main/f", "/api/models/o/..", "/api/models/../x/tree/main", "*",
    "/o/n/resolve/main/%ff",
])
def test_targets_that_could_leave_a_repo_are_refused_before_any_lookup(target: str) -> None:
    refused = routes.parse(target)
    assert isinstance(refused, routes.Refusal) and refused.status in (400, 404)


@pytest.mark.parametrize(("header", "size", "answer"), [
    (None, 10, (0, 9, False)),
    ("bytes=4-", 10, (4, 9, True)),
    ("bytes=4-6", 10, (4, 6, True)),
    ("bytes=-3", 10, (7, 9, True)),
    ("bytes=4-99", 10, (4, 9, True)),
    ("bytes=0-1,5-6", 10, (0, 9, False)),  # several ranges: the whole body, as RFC 9110 allows
    ("items=1-", 10, (0, 9, False)),
])
def test_a_resuming_range_gets_the_rest_of_the_file(header: str | None, size: int,
                                                    answer: tuple[int, int, bool]) -> None:
    span = ranges.span(header, size)
    assert isinstance(span, ranges.Span) and (span.start, span.end, span.partial) == answer


def test_a_range_past_the_end_is_unsatisfiable() -> None:
    assert ranges.span("bytes=10-", 10) == ranges.Unsatisfiable(10)


def _folder(path: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return path


def test_commits_share_unchanged_files_and_the_same_push_gives_the_same_id(tmp_path: Path) -> None:
    one = {"config.json": b"{}", "model.safetensors": b"w" * 4096}
    two = {**one, "README.md": b"# card"}
    a, b = Store(tmp_path / "a"), Store(tmp_path / "b")
    for store in (a, b):
        store.push("o/n", _folder(tmp_path / "one", one))
        store.push("o/n", _folder(tmp_path / "two", two))
    assert a.refs("o/n") == b.refs("o/n")
    objects = [p for p in (tmp_path / "a" / "objects").rglob("*") if p.is_file()]
    assert len(objects) == 3  # three distinct contents over two commits of five files


def test_the_store_keeps_no_token_only_its_digest(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    store.init_repo("o/n", gated="manual", tokens=("hf_secret_token_value",))
    assert store.settings("o/n") is not None
    for path in (tmp_path / "s").rglob("*"):
        assert not path.is_file() or b"hf_secret_token_value" not in path.read_bytes()


def test_a_push_refuses_links_and_names_each(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "f", {"config.json": b"{}"})
    (folder / "escape").symlink_to("/etc/passwd")
    with pytest.raises(InputError, match="escape"):
        Store(tmp_path / "s").push("o/n", folder)
