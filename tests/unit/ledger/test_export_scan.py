"""An export names no private address in any spelling, no hardware address and no path the
inputs know, and leaves public addresses and ordinary text (timestamps, digests, versions,
slices) as they were, so the exported record still reads. Cases are generated: every address
form in every context a record holds (plain text, JSON, URLs, argv lists, env and log lines)."""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from narwhal.deploy.inputs import load_inputs
from narwhal.deploy.inputs.model import Inputs
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.ledger.export import ALIAS_FILE, export
from tests.envtext import valid_env

# (as written, what must not survive): zones go with their address, embedded IPv4 too.
PRIVATE_V6 = [
    ("fd00::1", ["fd00::1"]),
    ("::1", ["::1"]),
    ("fe80::1%eth0", ["fe80::1"]),
    ("fe80::a8bb:ccff:fedd:eeff%fab0", ["fe80::a8bb:ccff:fedd:eeff"]),
    ("::ffff:10.0.0.5", ["10.0.0.5", "::ffff:"]),
    ("64:ff9b::10.0.0.7", ["10.0.0.7", "64:ff9b"]),
    ("fd12:3456:789a:1::5", ["fd12:3456"]),
    ("fd12:3456:789a:0001:0000:0000:0000:0005", ["fd12:3456"]),
    ("FD00:0:0:0:0:0:0:99", ["FD00:0", "fd00:0"]),
    ("ff02::1:ff00:5", ["ff02::1"]),
]
PUBLIC = ["8.8.8.8", "2001:4860::8888", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


def _url(a: str) -> str:
    return f"http://[{a.replace('%', '%25')}]:8000/v1/models"


CONTEXTS: dict[str, Callable[[str], str]] = {
    "plain text": lambda a: f"peer {a} answered\n",
    "JSON string": lambda a: json.dumps({"peer": a, "n": 1}) + "\n",
    "URL with port": lambda a: json.dumps({"url": _url(a)}) + "\n" + _url(a) + "\n",
    "argv list": lambda a: json.dumps({"argv": ["iperf3", "-c", a, "-B", a, "-p", "5201"]}),
    "env line": lambda a: f"NARWHAL_NODE_9_IP={a}\nADDR='{a}'\n",
    "log line": lambda a: f"2025-01-01T12:30:45.123Z INFO listening on {a}: ready, bound {a}.\n",
    "key=value pairs": lambda a: f"peer={a},port=5201 src:{a} addr:[{a}]\n",
}
ORDINARY = [
    "12:30:45", "2025-01-01 12:30:45,123", "[12:30:45.678]", "took 01:02:03",
    "sha256:" + "ab" * 32, "9850ac7c-0bd6-4a6b-9c2e-3f4a5b6c7d8e",
    "MD5:" + ":".join(["a1"] * 16), "a[::2] b[::-1] c[1::3]", "'::'", "std::vector<int>",
    "Foo::bar::baz", "vllm 0.7.3", "torch 2.6.0+cu124", "CUDA 12.4.1", "numpy==1.26.4",
    "ratio 1:2", "00:00:00:00:00:00", "ff:ff:ff:ff:ff:ff", "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/srv/models/qwen2/config.json",
]


@pytest.fixture(autouse=True)
def _workstation(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The workstation's own host and user names are aliased too; pin them to names that
    occur nowhere in the cases, so an 'unchanged' assertion does not depend on the machine
    (after tmp_path, whose folder is named after the real user)."""
    monkeypatch.setattr(socket, "gethostname", lambda: "ws-quokka")
    monkeypatch.setattr(getpass, "getuser", lambda: "quokka-op")


def _deployment(tmp_path: Path, **env: str) -> tuple[Ledger, Inputs]:
    """A record and its inputs: the shared valid `.env` (plus env) in tmp_path/checkout, the
    record in tmp_path/checkout/runs, as an operator's checkout holds both."""
    checkout = tmp_path / "checkout"
    checkout.mkdir(exist_ok=True)
    path = checkout / ".env"
    path.write_text(valid_env(**env))
    path.chmod(0o600)
    inputs = load_inputs(path)
    return Ledger(checkout / "runs", inputs.deployment, inputs.secrets()).ensure(), inputs


def _export(ledger: Ledger, inputs: Inputs, files: dict[str, str], out: Path) -> dict[str, str]:
    """Write files into one attempt of the record, export it, return the exported texts."""
    attempt = ledger.root / "fabric" / "001-scan"
    attempt.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (attempt / name).write_text(text)
    export(ledger, inputs, out)
    return {name: (out / "fabric" / "001-scan" / name).read_text() for name in files}


def test_no_private_ipv6_spelling_survives_in_any_context_a_record_holds(
        tmp_path: Path) -> None:
    ledger, inputs = _deployment(tmp_path)
    cases = {f"{i:02d}-{j:02d}.txt": (form, needles, context)
             for i, (form, needles) in enumerate(PRIVATE_V6)
             for j, context in enumerate(CONTEXTS)}
    texts = _export(ledger, inputs, {name: CONTEXTS[c](form) for name, (form, _, c)
                                     in cases.items()}, tmp_path / "out")
    leaks = [f"{form!r} in {context}: {needle!r} in {texts[name]!r}"
             for name, (form, needles, context) in cases.items()
             for needle in [form, *needles] if needle in texts[name]]
    assert not leaks, leaks[:10]
    assert all("address-" in text for text in texts.values())


def test_public_addresses_and_ordinary_text_are_exported_byte_for_byte(tmp_path: Path) -> None:
    ledger, inputs = _deployment(tmp_path)
    files = {f"public-{i:02d}-{j:02d}.txt": context(a) for i, a in enumerate(PUBLIC)
             for j, context in enumerate(CONTEXTS.values())}
    files |= {f"ordinary-{i:02d}.txt": f"{text}\n" for i, text in enumerate(ORDINARY)}
    texts = _export(ledger, inputs, files, tmp_path / "out")
    changed = {files[name]: texts[name] for name in files if texts[name] != files[name]}
    assert not changed, changed


def test_one_host_keeps_one_alias_however_its_address_is_spelt(tmp_path: Path) -> None:
    ledger, inputs = _deployment(tmp_path, NARWHAL_NODE_2_SSH="ssh://ops@[fd00:0:0:1::12]:22")
    spellings = ["fd00:0:0:1::12", "FD00:0000:0000:0001:0000:0000:0000:0012", "fd00::1:0:0:0:12",
                 "[fd00:0:0:1::12]:8000"]
    text = _export(ledger, inputs, {"x.txt": " ".join(spellings) + " ::ffff:10.213.0.11 "
                                    "10.213.0.11"}, tmp_path / "out")["x.txt"]
    words = text.replace("[", " ").replace("]:8000", "").split()
    assert len(set(words[:4])) == 1 and words[0].startswith("address-")
    assert words[4] == words[5] != words[0]


def test_a_zone_id_is_aliased_with_its_address_and_two_zones_stay_two_hosts(
        tmp_path: Path) -> None:
    ledger, inputs = _deployment(tmp_path)
    text = _export(ledger, inputs, {"x.txt": "fe80::1%eth0 fe80::1%eth1 fe80::1%eth0\n"},
                   tmp_path / "out")["x.txt"]
    first, second, third = text.split()
    assert first == third != second and "eth" not in text and "%" not in text


def test_hardware_addresses_are_aliased_except_broadcast_and_zero(tmp_path: Path) -> None:
    ledger, inputs = _deployment(tmp_path)
    ipoib = ":".join(["80", "00", "02", "08", "fe", "80"] + ["00"] * 6 + ["b8", "59", "9f", "03",
                                                                         "00", "12", "34", "56"])
    facts = json.dumps([{"ifname": "fab0", "address": "52:54:00:12:34:56",
                         "broadcast": "ff:ff:ff:ff:ff:ff"},
                        {"ifname": "ib0", "address": ipoib},
                        {"ifname": "lo", "address": "00:00:00:00:00:00"}])
    text = _export(ledger, inputs, {"host-facts.json": facts,
                                    "link.txt": "link/ether 52:54:00:12:34:56 brd ff:ff:ff:ff:ff:ff"},
                   tmp_path / "out")
    assert "52:54:00" not in text["host-facts.json"] + text["link.txt"]
    assert "b8:59:9f" not in text["host-facts.json"]
    assert "ff:ff:ff:ff:ff:ff" in text["link.txt"] and "00:00:00:00:00:00" in text["host-facts.json"]
    assert json.loads(text["host-facts.json"])[0]["address"] == "mac-1"
    assert text["link.txt"].startswith("link/ether mac-1 brd")


def _key(folder: Path, name: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("not a real key\n")
    return str(folder / name)


def test_every_path_the_inputs_name_is_aliased_and_a_file_under_it_still_reads(
        tmp_path: Path) -> None:
    keys = tmp_path / "operator-keys"
    env = {"NARWHAL_SSH_KEY": _key(keys, "fleet_ed25519"),
           "NARWHAL_ROUTER_SSH_KEY": _key(keys, "router_ed25519"),
           "NARWHAL_NODE_1_SSH_KEY": _key(keys / "node1", "id"),
           "NARWHAL_SSH_KNOWN_HOSTS": str(tmp_path / "pinned" / "known_hosts"),
           "NARWHAL_MODEL_DIR": "/data/models/tiny/", "NARWHAL_RUN_DIR": "/data/narwhal/run"}
    ledger, inputs = _deployment(tmp_path, **env)
    runs, checkout = str(ledger.runs.resolve()), str(inputs.source.parent.resolve())
    private = [*env.values(), runs, checkout, "/data/models/tiny"]
    record = {
        "argv.json": json.dumps({"argv": ["ssh", "-i", env["NARWHAL_SSH_KEY"], "-o",
                                          f"UserKnownHostsFile={env['NARWHAL_SSH_KNOWN_HOSTS']}",
                                          "-i", env["NARWHAL_NODE_1_SSH_KEY"]]}),
        "engine.log": "loading /data/models/tiny/config.json; run dir /data/narwhal/run.\n"
                      f"router key {env['NARWHAL_ROUTER_SSH_KEY']}: ok\n",
        "where.txt": f"record {runs}/demo/ledger.json from {checkout}/.env\n",
    }
    texts = _export(ledger, inputs, record, tmp_path / "out")
    leaks = [(p, name) for p in private for name, text in texts.items() if p in text]
    assert not leaks, leaks
    aliases = json.loads((ledger.root / ALIAS_FILE).read_text())["path"]
    assert texts["engine.log"].startswith(f"loading <{aliases['/data/models/tiny']}>/config.json;")
    # the runs folder sits inside the checkout; the longer path is replaced first
    assert texts["where.txt"] == (f"record <{aliases[runs]}>/demo/ledger.json from "
                                  f"<{aliases[checkout]}>/.env\n")
    assert aliases[runs] != aliases[checkout]


def test_a_top_level_system_folder_is_not_aliased_so_the_paths_under_it_still_read(
        tmp_path: Path) -> None:
    ledger, inputs = _deployment(tmp_path, NARWHAL_RUN_DIR="/srv")
    text = _export(ledger, inputs, {"x.txt": "/srv/other/file /srv/models/qwen/config.json\n"},
                   tmp_path / "out")["x.txt"]
    assert text.startswith("/srv/other/file <path-")


def test_the_model_dir_seen_under_another_root_is_still_aliased(tmp_path: Path) -> None:
    ledger, inputs = _deployment(tmp_path)
    merged = "/var/lib/docker/overlay2/3f9a/merged/srv/models/qwen/config.json"
    text = _export(ledger, inputs, {"x.txt": merged}, tmp_path / "out")["x.txt"]
    assert text == "/var/lib/docker/overlay2/3f9a/merged<path-1>/config.json"


def test_a_one_name_model_dir_leaves_the_same_name_inside_other_paths_alone(
        tmp_path: Path) -> None:
    ledger, inputs = _deployment(tmp_path, NARWHAL_MODEL_DIR="/models")
    library = "/usr/lib/python3/site-packages/transformers/models/llama/modeling_llama.py"
    text = _export(ledger, inputs, {"x.txt": f"{library} -v /models:/models\n"},
                   tmp_path / "out")["x.txt"]
    assert text == f"{library} -v <path-1>:<path-1>\n"


def test_an_alias_map_written_before_paths_and_macs_were_aliased_still_loads_and_is_kept(
        tmp_path: Path) -> None:
    ledger, inputs = _deployment(tmp_path)
    old: dict[str, dict[str, str]] = {kind: {} for kind in ("secret", "host", "user", "home")}
    old["address"] = {"10.213.0.12": "address-1"}
    (ledger.root / ALIAS_FILE).write_text(json.dumps(old))
    record = {"x.txt": "10.213.0.11 10.213.0.12 /srv/models/qwen 52:54:00:12:34:56\n"}
    first = _export(ledger, inputs, record, tmp_path / "out-1")["x.txt"]
    second = _export(ledger, inputs, record, tmp_path / "out-2")["x.txt"]
    assert first == second == "address-2 address-1 <path-1> mac-1\n"
    stored = json.loads((ledger.root / ALIAS_FILE).read_text())
    assert stored["address"]["10.213.0.12"] == "address-1" and set(stored) >= {"path", "mac"}


def test_a_folder_reached_through_a_link_has_one_alias_by_either_name(tmp_path: Path) -> None:
    real = tmp_path / "real-checkout"
    real.mkdir()
    (tmp_path / "checkout").symlink_to(real)
    ledger, inputs = _deployment(tmp_path)
    link = str(inputs.source.parent)
    text = _export(ledger, inputs, {"x.txt": f"{link}/.env {real}/.env\n"},
                   tmp_path / "out")["x.txt"]
    first, second = text.split()
    assert first == second and first.startswith("<path-") and "checkout" not in text
