"""The lab's nvidia-smi double answers in the shapes a real GPU host's nvidia-smi does.

The reference is tests/fixtures/h200-host: scripts/device/host_probe.py run on a real H200
host (driver 580.159.04), redacted on that host before it left. Discovery parses the double's
output in the lab, so every shape it relies on is held to the real tool here: the CSV header
units, the cell formats, the `-L` line, the XML element paths, and the error texts and exit
statuses for the mistakes an operator's query can make.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from narwhal.lab.doubles import nvidia_smi

REAL = Path(__file__).parent.parent / "fixtures" / "h200-host"
FIELDS = ("index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,driver_version,count,"
          "serial,compute_cap,pci.domain,pci.bus")

# What each query field's cell looks like, for both outputs; names and numbers differ by design.
CELL = {
    "index": r"\d+", "name": r"NVIDIA [\w ]+", "uuid": r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}",
    "pci.bus_id": r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", "memory.total": r"\d+",
    "memory.used": r"\d+", "memory.free": r"\d+", "driver_version": r"\d+\.\d+\.\d+",
    "count": r"\d+", "serial": r"\S+", "compute_cap": r"\d+\.\d+", "pci.domain": r"0x[0-9A-F]{4}",
    "pci.bus": r"0x[0-9A-F]{2}",
}


def real(name: str) -> tuple[str, int]:
    return (REAL / f"{name}.out").read_text(), int((REAL / f"{name}.rc").read_text())


@pytest.fixture
def host_dir(tmp_path: Path) -> Path:
    """One lab host with two H100s, in the inventory format hostfs writes."""
    devices = [{"uuid": f"GPU-1111111{i}-2222-3333-4444-55555555555{i}", "pci_bus_id": f"00000000:1{i}:00.0"}
               for i in range(2)]
    data = {"hardware": {"accelerators": {"vendor": "NVIDIA", "product": "NVIDIA H100 80GB HBM3",
                                          "memory_mib": 81559, "count": 2, "devices": devices}}}
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "host.json").write_text(json.dumps(data))
    return tmp_path


def double(host_dir: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, int]:
    rc = nvidia_smi.main(str(host_dir), list(argv))
    return capsys.readouterr().out, rc


def test_csv_header_with_units_is_the_real_header(host_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, rc = double(host_dir, capsys, f"--query-gpu={FIELDS}", "--format=csv")
    assert rc == 0
    assert out.splitlines()[0] == real("nvidia-smi-query-csv")[0].splitlines()[0]


@pytest.mark.parametrize("fmt, name", [("csv", "nvidia-smi-query-csv"),
                                       ("csv,noheader,nounits", "nvidia-smi-query-csv-noheader-nounits")])
def test_every_cell_has_the_real_cells_shape(host_dir: Path, capsys: pytest.CaptureFixture[str],
                                             fmt: str, name: str) -> None:
    def rows(text: str) -> Iterator[list[str]]:
        lines = text.splitlines()
        yield from (line.split(", ") for line in (lines if "noheader" in fmt else lines[1:]))

    units = "nounits" not in fmt
    shapes = [re.compile(CELL[f] + (" MiB" if units and f.startswith("memory.") else ""))
              for f in FIELDS.split(",")]
    out, _ = double(host_dir, capsys, f"--query-gpu={FIELDS}", f"--format={fmt}")
    for source, text in (("real", real(name)[0]), ("double", out)):
        for row in rows(text):
            bad = [(f, c) for f, c, s in zip(FIELDS.split(","), row, shapes, strict=True) if not s.fullmatch(c)]
            assert not bad, f"{source} nvidia-smi cells off shape: {bad}"


def test_list_line_matches_the_real_one(host_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shape = re.compile(r"GPU (\d+): (NVIDIA [\w ]+) \(UUID: (GPU-[0-9a-f-]{36})\)")
    real_out, real_rc = real("nvidia-smi-L")
    out, rc = double(host_dir, capsys, "-L")
    assert (rc, real_rc) == (0, 0)
    assert all(shape.fullmatch(line) for line in real_out.splitlines() + out.splitlines())


def _paths(xml_text: str) -> set[str]:
    # Our own committed fixture and our own double; the declaration and DOCTYPE lines are dropped.
    root = ET.fromstring(xml_text.split("\n", 2)[2])  # noqa: S314
    found: set[str] = set()

    def walk(node: ET.Element, prefix: str) -> None:
        path = f"{prefix}/{node.tag}"
        found.add(path)
        for child in node:
            walk(child, path)

    walk(root, "")
    return found


def test_xml_elements_the_double_writes_all_exist_in_the_real_report(
        host_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real_xml, _ = real("nvidia-smi-q-x")
    out, rc = double(host_dir, capsys, "-q", "-x")
    assert rc == 0
    missing = _paths(out) - _paths(real_xml)
    assert not missing, f"the double writes elements real nvidia-smi does not: {sorted(missing)}"
    assert out.splitlines()[1].startswith('<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v')


@pytest.mark.parametrize("name, argv", [
    ("nvidia-smi-query-unknown-field", ["--query-gpu=index,no.such.field", "--format=csv"]),
    ("nvidia-smi-bad-flag", ["--no-such-flag"]),
    ("nvidia-smi-i-missing", ["-i", "7", "-L"]),
    ("nvidia-smi-query-no-csv", ["--query-gpu=index", "--format=noheader"]),
])
def test_operator_mistakes_get_the_real_text_and_exit_status(
        host_dir: Path, capsys: pytest.CaptureFixture[str], name: str, argv: list[str]) -> None:
    real_out, real_rc = real(name)
    out, rc = double(host_dir, capsys, *argv)
    assert rc == real_rc
    first_real = real_out.splitlines()[0]
    # A query's values differ per host; an error's first line must be the same words.
    assert (out.splitlines()[0] == first_real) if rc else re.fullmatch(r"\d+", out.splitlines()[0])


def test_the_capture_holds_no_machine_identifier() -> None:
    """The fixture is committed: no serial, UUID, PDI, MAC or routable address may be in it."""
    text = "".join(p.read_text() for p in REAL.iterdir())
    assert not re.search(r"GPU-(?!00000000-0000-0000-0000-)[0-9a-f]{8}-", text)
    assert not re.search(r"<(serial|pdi|board_id|module_id)>(?!redacted-)", text)
    assert not re.search(r"\b\d{13}\b", text), "a 13-digit board serial survived"
    assert "nvidia-smi" in json.loads((REAL / "manifest.json").read_text())["commands"][0]["argv"]
