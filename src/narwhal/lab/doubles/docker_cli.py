"""docker double: the CLI subset Narwhal uses, with Docker's output formats and exit codes.

Containers are plain processes on the lab host (the host's own PID namespace is the isolation);
a small supervisor process records each container's exit code the way dockerd would.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from narwhal.lab.doubles.common import host_data, injected_failure
from narwhal.lab.doubles.docker_store import Store, now
from narwhal.lab.doubles.gotemplate import TemplateError, render

VALUE_FLAGS = {"--name", "-e", "--env", "--env-file", "--entrypoint", "--network", "--net", "-v",
               "--volume", "--gpus", "--device", "--ipc", "--shm-size", "--label", "-l", "-p",
               "--publish", "-u", "--user", "-w", "--workdir", "--runtime", "--ulimit", "--cap-add",
               "--security-opt", "--group-add", "--pid", "--restart", "--mount", "--hostname",
               "--memory", "--cpus", "--log-driver", "--log-opt", "--stop-signal"}
BOOL_FLAGS = {"-d", "--detach", "--rm", "-i", "--interactive", "-t", "--tty", "--init",
              "--privileged", "-it"}


def _err(msg: str, code: int = 1) -> int:
    print(msg, file=sys.stderr)
    return code


def _parse_create(args: list[str]) -> tuple[dict[str, Any], list[str]] | str:
    opts: dict[str, Any] = {"env": [], "labels": {}, "detach": False, "rm": False, "name": None,
                            "entrypoint": None, "workdir": "", "host": {}}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        flag, _, inline = args[i].partition("=")
        if flag in BOOL_FLAGS:
            opts["detach"] |= flag in ("-d", "--detach")
            opts["rm"] |= flag == "--rm"
        elif flag in VALUE_FLAGS:
            if not inline:
                i += 1
                if i >= len(args):
                    return f'flag needs an argument: {flag}'
                inline = args[i]
            if flag in ("-e", "--env"):
                opts["env"].append(inline if "=" in inline else f"{inline}={os.environ.get(inline, '')}")
            elif flag == "--env-file":
                opts["env"] += [ln for ln in Path(inline).read_text().splitlines()
                                if ln.strip() and not ln.startswith("#")]
            elif flag in ("--label", "-l"):
                k, _, v = inline.partition("=")
                opts["labels"][k] = v
            elif flag == "--name":
                opts["name"] = inline
            elif flag == "--entrypoint":
                opts["entrypoint"] = [inline] if inline else []
            elif flag in ("-w", "--workdir"):
                opts["workdir"] = inline
            else:
                opts["host"].setdefault(flag.lstrip("-"), []).append(inline)
        else:
            return f"unknown flag: {flag}"
        i += 1
    return opts, args[i:]


def _create(store: Store, args: list[str]) -> tuple[dict[str, Any] | None, int]:
    parsed = _parse_create(args)
    if isinstance(parsed, str):
        return None, _err(f"{parsed}\nSee 'docker run --help'.", 125)
    opts, rest = parsed
    if not rest:
        return None, _err('"docker run" requires at least 1 argument.', 125)
    img = store.image(rest[0])
    if img is None:
        ref = rest[0] if ":" in rest[0] or "@" in rest[0] else rest[0] + ":latest"
        return None, _err(f"Unable to find image '{ref}' locally\ndocker: Error response from daemon: "
                          f"pull access denied for {rest[0]}, repository does not exist or may require "
                          "'docker login'.\nSee 'docker run --help'.", 125)
    if opts["name"] and (other := store.find(opts["name"])) and other["Name"] == "/" + opts["name"]:
        return None, _err(f'docker: Error response from daemon: Conflict. The container name "/{opts["name"]}" '
                          f'is already in use by container "{other["Id"]}". You have to remove (or rename) '
                          "that container to be able to reuse that name.", 125)
    refused = _host_config_problem(store, opts["host"])
    if refused is not None:
        return None, _err(f"docker: Error response from daemon: {refused}.", 125)
    cfg = img["config"]["config"]
    entry = opts["entrypoint"] if opts["entrypoint"] is not None else (cfg["Entrypoint"] or [])
    cmd = rest[1:] or ([] if opts["entrypoint"] is not None else (cfg["Cmd"] or []))
    env = list(cfg["Env"]) + opts["env"]
    c = store.new(img, rest[0], opts["name"], entry, cmd, env, opts["workdir"], opts["labels"],
                  opts["rm"], {"NetworkMode": (opts["host"].get("network") or ["default"])[0],
                               "Binds": opts["host"].get("v"), "Devices": opts["host"].get("device")})
    c["_detach"] = opts["detach"]
    return c, 0


def _host_config_problem(store: Store, host: dict[str, list[str]]) -> str | None:
    """What dockerd refuses before it creates anything: a bind source that does not exist, a
    device node that does not exist, a GPU the host does not have (nvidia-container-cli)."""
    for bind in [*host.get("v", []), *host.get("volume", [])]:
        parts = bind.split(":")
        src = parts[0]
        if src.startswith("/") and not os.path.exists(src):
            return (f'invalid mount config for type "bind": bind source path does not exist: '
                    f"{src}")
        if src.startswith("/") and len(parts) > 1 and parts[1] != src:
            return f"lab docker double: bind {src} to the same path (got {parts[1]})"
    for device in host.get("device", []):
        path = device.split(":", 1)[0]
        if not os.path.exists(path):
            return (f'error gathering device information while adding custom device "{path}": '
                    "no such file or directory")
    hardware = host_data(str(store.root.parents[1])).get("hardware") or {}
    have = {d["uuid"] for d in (hardware.get("accelerators") or {}).get("devices", [])}
    for gpus in host.get("gpus", []):
        wanted = gpus.strip("'\"").removeprefix("device=")
        if gpus == "all" or not wanted:
            continue
        for uuid in wanted.split(","):
            if uuid.startswith("GPU-") and uuid not in have:
                return ("failed to create task for container: failed to create shim task: OCI "
                        "runtime create failed: nvidia-container-cli: device error: "
                        f"{uuid}: unknown device: unknown")
    return None


def _resolve(store: Store, argv0: str, env: dict[str, str]) -> str:
    """argv[0] as the container would find it: on its PATH inside the image's filesystem."""
    if "/" in argv0:
        return argv0
    rootfs = store.root.parents[1] / "image-rootfs"
    for d in env.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(":"):
        candidate = rootfs / d.lstrip("/") / argv0
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return argv0


def _env(c: dict[str, Any]) -> dict[str, str]:
    env = {"HOSTNAME": c["Config"]["Hostname"], "HOME": "/root"}
    env.update(kv.split("=", 1) for kv in c["Config"]["Env"] if "=" in kv)
    return env


def _spawn(store: Store, c: dict[str, Any], *, attached: bool) -> subprocess.Popen[bytes] | int:
    env = _env(c)
    argv = [_resolve(store, c["Path"], env), *c["Args"]]
    d = store.dir(c["Id"])
    out = None if attached else open(d / "stdout.log", "ab")  # noqa: SIM115
    err = None if attached else open(d / "stderr.log", "ab")  # noqa: SIM115
    try:
        proc = subprocess.Popen(argv, env=env, cwd=c["Config"]["WorkingDir"] or "/",
                                stdin=None if attached else subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)
    except (FileNotFoundError, PermissionError):
        msg = (f'failed to create task for container: failed to create shim task: OCI runtime create failed: '
               f'runc create failed: unable to start container process: exec: "{argv[0]}": '
               "executable file not found in $PATH: unknown")
        c["State"].update(Status="exited", ExitCode=127, Error=msg, FinishedAt=now())
        if c["HostConfig"].get("AutoRemove"):
            store.remove(c["Id"])
        else:
            store.save(c)
        return _err(f"docker: Error response from daemon: {msg}.", 127)
    c["State"].update(Status="running", Running=True, Pid=proc.pid, StartedAt=now())
    store.save(c)
    return proc


def _finish(store: Store, cid: str, code: int) -> None:
    try:
        c = store.load(cid)
    except OSError:
        return
    c["State"].update(Status="exited", Running=False, Pid=0, ExitCode=code, FinishedAt=now())
    if c["HostConfig"].get("AutoRemove"):
        store.remove(cid)
    else:
        store.save(c)


def _supervise(store: Store, cid: str) -> int:
    """Detached helper: run the container's process and record its exit, as dockerd does."""
    proc = _spawn(store, store.load(cid), attached=False)
    if isinstance(proc, int):
        return proc
    code = proc.wait()
    _finish(store, cid, code if code >= 0 else 128 - code)
    return 0


def _start(store: Store, c: dict[str, Any]) -> None:
    subprocess.Popen([sys.executable, "-I", sys.argv[0], "__supervise", c["Id"]],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)
    deadline = time.monotonic() + 5
    while store.load(c["Id"])["State"]["Status"] == "created" and time.monotonic() < deadline:
        time.sleep(0.01)


def _run(store: Store, args: list[str]) -> int:
    c, rc = _create(store, args)
    if c is None:
        return rc
    if c.pop("_detach"):
        _start(store, c)
        print(c["Id"])
        return 0
    proc = _spawn(store, c, attached=True)
    if isinstance(proc, int):
        return proc
    code = proc.wait()
    _finish(store, c["Id"], code if code >= 0 else 128 - code)
    return code if code >= 0 else 128 - code


def _status_text(c: dict[str, Any]) -> str:
    s = c["State"]
    if s["Running"]:
        return "Up"
    if s["Status"] == "created":
        return "Created"
    return f"Exited ({s['ExitCode']})"


def _ps(store: Store, args: list[str]) -> int:
    args = _split_short(args)
    show_all, quiet, fmt, filters = "-a" in args or "--all" in args, "-q" in args or "--quiet" in args, None, []
    for i, a in enumerate(args):
        if a == "--format":
            fmt = args[i + 1]
        elif a in ("--filter", "-f"):
            filters.append(args[i + 1])
    rows = []
    for c in store.all():
        if not show_all and not c["State"]["Running"]:
            continue
        row = {"ID": c["Id"][:12], "Image": c["Config"]["Image"],
               "Command": json.dumps(" ".join([c["Path"], *c["Args"]])[:20]), "CreatedAt": c["Created"],
               "Status": _status_text(c), "Ports": "", "Names": c["Name"].lstrip("/"),
               "State": c["State"]["Status"], "Labels": ",".join(f"{k}={v}" for k, v in c["Config"]["Labels"].items())}
        ok = all((k == "name" and v in row["Names"]) or (k == "id" and c["Id"].startswith(v))
                 or (k == "status" and v == row["State"])
                 or (k == "label" and v in row["Labels"].split(","))
                 for k, _, v in (f.partition("=") for f in filters))
        if ok:
            rows.append(row)
    if quiet:
        print("".join(r["ID"] + "\n" for r in rows), end="")
    elif fmt:
        print("".join(render(fmt, r) + "\n" for r in rows), end="")
    else:
        print(f"{'CONTAINER ID':15}{'IMAGE':30}{'COMMAND':25}{'CREATED':20}{'STATUS':20}{'PORTS':10}NAMES")
        for r in rows:
            print(f"{r['ID']:15}{r['Image'][:29]:30}{r['Command']:25}{'now':20}{r['Status']:20}{'':10}{r['Names']}")
    return 0


def _split_short(args: list[str]) -> list[str]:
    """`-aq` means `-a -q`, as in Docker's flag parser."""
    out: list[str] = []
    for a in args:
        if len(a) > 2 and a[0] == "-" and a[1] != "-":
            out += [f"-{ch}" for ch in a[1:]]
        else:
            out.append(a)
    return out


def _inspect(store: Store, args: list[str], *, images_only: bool = False) -> int:
    fmt, refs, kind = None, [], "image" if images_only else None
    i = 0
    while i < len(args):
        if args[i] in ("-f", "--format"):
            fmt, i = args[i + 1], i + 1
        elif args[i].startswith("--format="):
            fmt = args[i].split("=", 1)[1]
        elif args[i] == "--type":
            kind, i = args[i + 1], i + 1
        else:
            refs.append(args[i])
        i += 1
    found, rc = [], 0
    for ref in refs:
        obj: dict[str, Any] | None = None
        if kind != "image" and (c := store.find(ref)):
            obj = c
        elif kind != "container" and (img := store.image(ref)):
            obj = store.image_inspect(img)
        if obj is None:
            what = "image" if images_only else "object"
            print(f"Error: No such {what}: {ref}", file=sys.stderr)
            rc = 1
        else:
            found.append(obj)
    if fmt is not None:
        try:
            for obj in found:
                print(render(fmt, obj))
        except TemplateError as exc:
            return _err(f"template parsing error: {exc}")
    else:
        print(json.dumps(found, indent=4))
    return rc


def _need(store: Store, ref: str) -> dict[str, Any] | None:
    c = store.find(ref)
    if c is None:
        print(f"Error response from daemon: No such container: {ref}", file=sys.stderr)
    return c


def _stop_proc(c: dict[str, Any], sig: int) -> None:
    pid = c["State"]["Pid"]
    if c["State"]["Running"] and pid:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)  # the container's own session, created by this double


def _rm(store: Store, args: list[str]) -> int:
    force, rc = "-f" in args or "--force" in args, 0
    for ref in [a for a in args if not a.startswith("-")]:
        c = _need(store, ref)
        if c is None:
            rc = 1
            continue
        if c["State"]["Running"] and not force:
            rc = _err(f'Error response from daemon: cannot remove container "{c["Name"]}": container is '
                      "running: stop the container before removing or force remove")
            continue
        _stop_proc(c, signal.SIGKILL)
        store.remove(c["Id"])
        print(ref)
    return rc


def _logs(store: Store, args: list[str]) -> int:
    c = _need(store, args[-1]) if args else None
    if c is None:
        return 1
    d = store.dir(c["Id"])
    follow = "-f" in args or "--follow" in args
    offsets = [0, 0]
    while True:
        for k, (name, stream) in enumerate((("stdout.log", sys.stdout), ("stderr.log", sys.stderr))):
            p = d / name
            if p.exists():
                data = p.read_bytes()[offsets[k]:]
                offsets[k] += len(data)
                stream.buffer.write(data)
                stream.flush()
        if not follow or not (d / "container.json").exists() or not store.load(c["Id"])["State"]["Running"]:
            return 0
        time.sleep(0.1)


def _exec(store: Store, args: list[str]) -> int:
    env_extra, workdir, i = [], None, 0
    while i < len(args) and args[i].startswith("-"):
        flag = args[i]
        if flag in ("-e", "--env", "-w", "--workdir", "-u", "--user"):
            i += 1
            if flag in ("-e", "--env"):
                env_extra.append(args[i])
            elif flag in ("-w", "--workdir"):
                workdir = args[i]
        i += 1
    if len(args) - i < 2:
        return _err('"docker exec" requires at least 2 arguments.')
    c = _need(store, args[i])
    if c is None:
        return 1
    if not c["State"]["Running"]:
        return _err(f"Error response from daemon: container {c['Id']} is not running")
    env = _env(c) | dict(kv.split("=", 1) for kv in env_extra if "=" in kv)
    try:
        return subprocess.call(args[i + 1:], env=env, cwd=workdir or c["Config"]["WorkingDir"] or "/")
    except FileNotFoundError:
        return _err(f'OCI runtime exec failed: exec failed: unable to start container process: exec: '
                    f'"{args[i + 1]}": executable file not found in $PATH: unknown', 126)


def _cp(store: Store, args: list[str]) -> int:
    paths = [a for a in args if not a.startswith("-")]
    if len(paths) != 2 or "-" in paths:
        return _err('"docker cp" requires exactly 2 arguments (streams are not supported in the lab).')
    resolved = []
    for p in paths:
        if ":" in p and not p.startswith("/"):
            ref, path = p.split(":", 1)
            if _need(store, ref) is None:
                return 1
            resolved.append(path)  # a lab container shares its host's filesystem
        else:
            resolved.append(p)
    src, dst = Path(resolved[0]), Path(resolved[1])
    if not src.exists():
        return _err(f"Error response from daemon: Could not find the file {src} in container")
    if src.is_dir():
        shutil.copytree(src, dst / src.name if dst.is_dir() else dst, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)
    return 0


def _restart(store: Store, args: list[str]) -> int:
    """`docker restart [-t S] C...`: stop (SIGTERM, SIGKILL after S seconds) and start again;
    the same container (Id, Created) with a new process, as dockerd does."""
    grace, refs = 10.0, []
    it = iter(args)
    for a in it:
        if a in ("-t", "--time", "--timeout"):
            grace = float(next(it, "10"))
        else:
            refs.append(a)
    rc = 0
    for ref in refs:
        c = _need(store, ref)
        if c is None:
            rc = 1
            continue
        before = c["State"].get("Pid")
        _stop_proc(c, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while store.load(c["Id"])["State"]["Running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        if store.load(c["Id"])["State"]["Running"]:
            _stop_proc(c, signal.SIGKILL)
            while store.load(c["Id"])["State"]["Running"] and time.monotonic() < deadline + 5:
                time.sleep(0.05)
        c = store.load(c["Id"])
        _start(store, c)
        deadline = time.monotonic() + 5
        while not (store.load(c["Id"])["State"]["Running"]
                   and store.load(c["Id"])["State"].get("Pid") != before) and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        print(ref)
    return rc


def main(host_dir: str, argv: list[str]) -> int:
    failed = injected_failure(host_dir, "docker")
    if failed is not None:
        return failed
    store = Store(host_dir, host_data(host_dir)["images"])
    if not argv:
        return _err("Usage:  docker [OPTIONS] COMMAND")
    cmd, args = argv[0], argv[1:]
    if cmd == "image" and args[:1] == ["inspect"]:
        return _inspect(store, args[1:], images_only=True)
    if cmd in ("container",) and args:
        cmd, args = args[0], args[1:]
    if cmd == "__supervise":
        return _supervise(store, args[0])
    if cmd == "create":
        c, rc = _create(store, args)
        if c is not None:
            c.pop("_detach")
            print(c["Id"])
        return rc
    if cmd == "restart":
        return _restart(store, args)
    if cmd in ("start", "stop", "kill"):
        rc = 0
        for ref in args:
            c = _need(store, ref)
            if c is None:
                rc = 1
            elif cmd == "start" and not c["State"]["Running"]:
                _start(store, c)
            elif cmd != "start":
                _stop_proc(c, signal.SIGKILL if cmd == "kill" else signal.SIGTERM)
            if c is not None:
                print(ref)
        return rc
    handlers = {"run": _run, "ps": _ps, "inspect": _inspect, "rm": _rm, "logs": _logs,
                "exec": _exec, "cp": _cp}
    if cmd not in handlers:
        return _err(f"docker: '{cmd}' is not a docker command.\nSee 'docker --help'")
    return handlers[cmd](store, args)
