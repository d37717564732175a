"""Resolve the `.env`'s revision to a commit once, on the workstation, through huggingface_hub.

The revision an operator writes may be a branch (`main`) that moves; what every host stages
is the commit it named when Gate A first resolved it, recorded in that attempt as
checkpoint.json and reused by every later Gate A while MODEL_REPO_ID, MODEL_REVISION and
HF_ENDPOINT stay as they are (a new commit pushed to `main` changes nothing until the
operator changes the revision). The hub gives each LFS file's sha256; the other files (small
by the hub's own rule) are downloaded here once, into the workstation's hub cache, and hashed,
so the manifest has every file's sha256 and Gate A can compare a host's tree with the hub's.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from narwhal.core.errors import Problem
from narwhal.core.secret import Secret
from narwhal.deploy.checkpoint import manifest as mf
from narwhal.deploy.inputs.model import CheckpointSource
from narwhal.deploy.inputs.refs import COMMIT_RE

SMALL_FILE_MAX = 64 << 20  # a non-LFS file the workstation hashes; the hub's limit is lower
DEFAULT_ENDPOINT = "https://huggingface.co"
TOKEN_FIELD = "NARWHAL_HF_TOKEN"  # noqa: S105 - the field's name, not a token
TIMEOUT_S = 30.0


class PinError(Exception):
    """The revision could not be pinned: the problems say which field and the way out."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(p.line() for p in problems))
        self.problems = problems


def reusable(previous: mf.Manifest | None, source: CheckpointSource) -> bool:
    """The earlier pin stands while the operator's names for the checkpoint are unchanged."""
    return previous is not None and (previous.repo_id, previous.revision, previous.endpoint) \
        == (source.repo_id, source.revision, source.endpoint)


def _where(source: CheckpointSource) -> str:
    return source.endpoint or DEFAULT_ENDPOINT


def hub_request(source: CheckpointSource | None) -> dict[str, str] | None:
    """What Gate A asks the hub for (None: nothing is staged)."""
    if source is None:
        return None
    return {"endpoint": _where(source), "repo_id": source.repo_id, "revision": source.revision}


def hub_problem(exc: Exception, source: CheckpointSource, has_token: bool) -> Problem:
    """What a hub error means for the operator: the field to change, and how."""
    from huggingface_hub import errors

    where = _where(source)
    if isinstance(exc, errors.GatedRepoError):
        said = "is refused by the hub" if has_token else "is not set"
        return Problem(TOKEN_FIELD, f"{said}: {source.repo_id} is gated on {where}",
                       "accept the repo's terms on the hub and set NARWHAL_HF_TOKEN to a token "
                       "that was granted access")
    if isinstance(exc, errors.RevisionNotFoundError):
        return Problem("MODEL_REVISION", f"{source.revision} is not a branch, tag or commit of "
                       f"{source.repo_id} on {where}", "name an existing revision (a commit id "
                       "pins it exactly)")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return Problem("MODEL_REPO_ID", f"{source.repo_id} is not on {where}, or is private "
                       "and the token cannot read it", "check the repo id, or set "
                       "NARWHAL_HF_TOKEN to a token that can read it")
    text = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return Problem("HF_ENDPOINT", f"the workstation could not read {source.repo_id} from "
                   f"{where}: {text}", "check the workstation reaches the hub (HF_ENDPOINT "
                   "names a mirror), then rerun discovery")


def _files(siblings: list[Any]) -> tuple[list[mf.HubFile], list[Problem]]:
    """The revision's files to stage, each path held to the safe grammar."""
    if len(siblings) > mf.MAX_FILES:
        return [], [Problem("MODEL_REPO_ID", f"the revision lists {len(siblings)} files, more "
                            f"than {mf.MAX_FILES}", "stage a repo that holds one model")]
    listed: dict[str, Any] = {}
    problems = []
    for s in siblings:
        why = mf.path_problem(s.rfilename)
        if why is not None:
            problems.append(Problem("MODEL_REPO_ID", f"the hub lists a file whose path {why}: "
                                    f"{str(s.rfilename)[:80]!r}", "stage a repo whose file "
                                    "names are plain paths"))
        else:
            listed[s.rfilename] = s
    files = []
    for path in mf.select(listed):
        s = listed[path]
        lfs = s.lfs is not None
        sha = mf.hub_sha256({"lfs": {"sha256": s.lfs.sha256}}) if lfs else None
        size = int(s.lfs.size if lfs else (s.size or 0))
        if lfs and sha is None:
            problems.append(Problem("MODEL_REPO_ID", f"the hub gives {path} no sha256",
                                    "stage from a hub that lists LFS hashes"))
        files.append(mf.HubFile(path=path, size=size, sha256=sha, lfs=lfs))
    return files, problems


def _hash_small(source: CheckpointSource, commit: str, token: Secret | None,
                files: list[mf.HubFile], cache: Path) -> list[mf.HubFile]:
    """The non-LFS files with the sha256 of their bytes, downloaded into the hub cache."""
    from huggingface_hub import hf_hub_download

    out = []
    for f in files:
        if f.sha256 is None:
            if f.size > SMALL_FILE_MAX:
                raise PinError([Problem("MODEL_REPO_ID", f"{f.path} is {f.size} bytes and not "
                                        "in LFS", "stage a repo whose large files are in LFS")])
            local = hf_hub_download(source.repo_id, f.path, revision=commit, cache_dir=cache,
                                    endpoint=source.endpoint, etag_timeout=TIMEOUT_S,
                                    token=token.reveal() if token else False)
            data = Path(local).read_bytes()
            f = mf.HubFile(path=f.path, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                           lfs=False)
        out.append(f)
    return out


def local_file(m: mf.Manifest, token: Secret | None, cache: Path, path: str) -> Path:
    """One file of the pin on the workstation (downloaded once into its hub cache), for a
    fleet whose engine hosts cannot reach the hub."""
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(m.repo_id, path, revision=m.commit, cache_dir=cache,
                                endpoint=m.endpoint or DEFAULT_ENDPOINT, etag_timeout=TIMEOUT_S,
                                token=token.reveal() if token else False))


def _card(info: Any) -> mf.Card | None:
    data = info.card_data
    if data is None:
        return None
    base = data.get("base_model")
    return mf.Card(license=data.get("license") if isinstance(data.get("license"), str) else None,
                   gated=info.gated if isinstance(info.gated, (str, bool)) else False,
                   base_model=tuple(b for b in ([base] if isinstance(base, str) else base or [])
                                    if isinstance(b, str))[:16],
                   pipeline_tag=info.pipeline_tag if isinstance(info.pipeline_tag, str) else None)


def resolve(source: CheckpointSource, token: Secret | None, cache: Path) -> mf.Manifest:
    """Ask the hub what the revision is now: its commit, its files and its card."""
    from huggingface_hub import HfApi

    asked = hub_request(source)
    assert asked is not None
    api = HfApi(endpoint=asked["endpoint"], token=token.reveal() if token else False)
    try:
        info = api.model_info(asked["repo_id"], revision=asked["revision"],
                              files_metadata=True, timeout=TIMEOUT_S)
        commit = str(info.sha or "")
        if not COMMIT_RE.fullmatch(commit):
            raise PinError([Problem("MODEL_REVISION", f"the hub resolved {source.revision} to "
                                    f"{commit[:60]!r}, not a commit id", "check HF_ENDPOINT "
                                    "names a Hugging Face hub")])
        if info.gated and token is None:
            raise PinError([Problem(TOKEN_FIELD, f"is not set: {source.repo_id} is gated on "
                                    f"{_where(source)}", "accept the repo's terms on the hub "
                                    "and set NARWHAL_HF_TOKEN to a token granted access")])
        files, problems = _files(list(info.siblings or []))
        if problems:
            raise PinError(problems)
        files = _hash_small(source, commit, token, files, cache)
    except PinError:
        raise
    except Exception as exc:
        raise PinError([hub_problem(exc, source, token is not None)]) from None
    return mf.Manifest(repo_id=source.repo_id, revision=source.revision, commit=commit,
                       endpoint=source.endpoint, files=files, card=_card(info),
                       gated=info.gated if isinstance(info.gated, (str, bool)) else False)
