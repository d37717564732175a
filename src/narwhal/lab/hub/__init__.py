"""A Hugging Face hub double: the subset of the hub's HTTP API that `huggingface_hub` (2.4)
uses to read a model repo, served from a store on disk, for a lab without the internet.

Clients reach it the normal way, with `HF_ENDPOINT` or `endpoint=`. It is held to the real
client by tests/component/lab/test_hub_double.py, which drives `huggingface_hub` against it.

Served (GET and HEAD only):

    API origin (IP:PORT)
      /api/models/{owner}/{name}                      model_info at main (?blobs=true: sizes,
      /api/models/{owner}/{name}/revision/{rev}       blob ids, LFS data); cardData from the
                                                      README.md front matter
      /api/models/{owner}/{name}/tree/{rev}[/{path}]  list_repo_tree, list_repo_files,
                                                      snapshot_download (?recursive=true)
      /api/models/{owner}/{name}/refs                 list_repo_refs
      /{owner}/{name}/resolve/{rev}/{path}            hf_hub_download, get_hf_file_metadata:
                                                      200 with ETag (git blob id), X-Repo-Commit,
                                                      Range -> 206; an LFS file -> 302 to the
                                                      CDN with X-Linked-Etag (sha256),
                                                      X-Linked-Size, X-Repo-Commit
    CDN origin (IP:PORT+1)
      /lfs/{sha256}?expires=..&signature=..           the LFS object (signed URL, no token;
                                                      Range -> 206)

Errors carry the hub's `X-Error-Code` (RepoNotFound 401, or 404 with a token; GatedRepo 401
without a token, 403 with one not granted; RevisionNotFound 404; EntryNotFound 404) and
`X-Error-Message`, which the client maps to its exceptions.

Store format (one folder; documents are stamped JSON, see records.py):

    objects/{sha256[:2]}/{sha256}            file bytes, content-addressed, written once:
                                             commits share every unchanged file
    repos/{owner}/{name}/repo.json           narwhal.lab-hub-repo: gated (false|auto|manual),
                                             private, token_sha256 (granted tokens, hashed),
                                             created_at
    repos/{owner}/{name}/refs.json           narwhal.lab-hub-refs: branches and tags -> commit
    repos/{owner}/{name}/commits/{id}.json   narwhal.lab-hub-commit: id, parent, message,
                                             date, files {path: sha256, size, lfs, blob_id,
                                             pointer_size}

A commit id is the sha1 of its parent, tree and message (gitobj.commit_id), so pushing the same
folder onto the same parent gives the same id everywhere. A file is LFS by name pattern
(*.safetensors, *.bin, ...) or above 10 MB; its blob id is then its LFS pointer's, as on the
hub. Commands: `python -m narwhal.lab.hub init|push|tag|serve` (cli.py).
"""
