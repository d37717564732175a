"""The docker double's state: images from the host's inventory, containers as directories.

A container is a plain process on the host; its record holds what `docker inspect` shows.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Store:
    def __init__(self, host_dir: str, images: list[dict[str, Any]]) -> None:
        self.root = Path(host_dir) / "docker" / "containers"
        self.root.mkdir(parents=True, exist_ok=True)
        self.images = images

    # images -------------------------------------------------------------
    def image(self, ref: str) -> dict[str, Any] | None:
        for img in self.images:
            hexid = img["id"].split(":", 1)[1]
            names = {img["id"], *img["repo_tags"], *img["repo_digests"]}
            names |= {t.rsplit(":", 1)[0] for t in img["repo_tags"] if t.endswith(":latest")}
            if ref in names or (len(ref) >= 4 and hexid.startswith(ref.removeprefix("sha256:"))):
                return img
        return None

    @staticmethod
    def image_inspect(img: dict[str, Any]) -> dict[str, Any]:
        cfg = img["config"]
        return {
            "Id": img["id"], "RepoTags": img["repo_tags"], "RepoDigests": img["repo_digests"],
            "Parent": "", "Comment": "", "Created": "2026-01-01T00:00:00Z", "DockerVersion": "",
            "Author": "", "Config": {"Hostname": "", "User": "", "Env": cfg["config"]["Env"],
                                     "Cmd": cfg["config"]["Cmd"], "Entrypoint": cfg["config"]["Entrypoint"],
                                     "WorkingDir": "", "Labels": cfg["config"]["Labels"]},
            "Architecture": cfg["architecture"], "Os": cfg["os"], "Size": 1048576,
            "RootFS": {"Type": "layers", "Layers": cfg["rootfs"]["diff_ids"]},
            "Metadata": {"LastTagTime": "0001-01-01T00:00:00Z"},
        }

    # containers ---------------------------------------------------------
    def all(self) -> list[dict[str, Any]]:
        out = []
        for d in sorted(self.root.iterdir()):
            try:
                out.append(self.load(d.name))
            except (OSError, ValueError):
                continue
        return sorted(out, key=lambda c: str(c["Created"]), reverse=True)

    def find(self, ref: str) -> dict[str, Any] | None:
        for c in self.all():
            if ref in (c["Name"].lstrip("/"), c["Name"]) or (len(ref) >= 3 and c["Id"].startswith(ref)):
                return c
        return None

    def load(self, cid: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.root / cid / "container.json").read_text())
        return doc

    def save(self, c: dict[str, Any]) -> None:
        d = self.root / c["Id"]
        d.mkdir(exist_ok=True)
        tmp = d / "container.json.tmp"
        tmp.write_text(json.dumps(c, indent=1))
        os.replace(tmp, d / "container.json")

    def dir(self, cid: str) -> Path:
        return self.root / cid

    def remove(self, cid: str) -> None:
        shutil.rmtree(self.root / cid, ignore_errors=True)

    def new(self, img: dict[str, Any], ref: str, name: str | None, entrypoint: list[str],
            cmd: list[str], env: list[str], workdir: str, labels: dict[str, str],
            auto_remove: bool, host_config: dict[str, Any]) -> dict[str, Any]:
        cid = secrets.token_hex(32)
        name = name or f"lab_{cid[:8]}"
        argv = entrypoint + cmd
        c = {
            "Id": cid, "Created": now(), "Path": argv[0] if argv else "", "Args": argv[1:],
            "State": {"Status": "created", "Running": False, "Paused": False, "Restarting": False,
                      "OOMKilled": False, "Dead": False, "Pid": 0, "ExitCode": 0, "Error": "",
                      "StartedAt": "0001-01-01T00:00:00Z", "FinishedAt": "0001-01-01T00:00:00Z"},
            "Image": img["id"], "Name": "/" + name, "RestartCount": 0, "Driver": "lab",
            "HostConfig": {"AutoRemove": auto_remove, **host_config},
            "Config": {"Hostname": cid[:12], "Env": env, "Cmd": cmd or None, "Image": ref,
                       "Entrypoint": entrypoint or None, "WorkingDir": workdir, "Labels": labels},
            "Mounts": [], "NetworkSettings": {"Networks": {}},
        }
        self.save(c)
        return c
