"""Our fleet and profile writer for narwhal-inference 0.7.0: accepted by it, loud when it can't.

narwhal-serve refuses to start on a fleet it cannot read or a profile whose generation digest
differs from the live engine, and says little about why; the writer must catch the inputs an
operator gets wrong (missing flags, an engine that is down or exposes no process start time)
and name them.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.component.baselines.conftest import SCRIPTS, our_python
from tests.component.baselines.harness import free_port

pytestmark = pytest.mark.timeout(120)
WRITER = [our_python(), str(SCRIPTS / "narwhal_inference_fleet.py")]


def run_writer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WRITER, *args], capture_output=True, text=True, timeout=30,
                          check=False)


class _Engine(BaseHTTPRequestHandler):
    """Answers /version and /metrics with the bodies the test sets on the server."""

    def do_GET(self) -> None:
        body = self.server.pages.get(self.path)  # type: ignore[attr-defined]
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write((body or "").encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def half_engine() -> Iterator[tuple[str, dict[str, str]]]:
    """A loopback HTTP server standing in for an engine whose pages a test chooses."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    pages: dict[str, str] = {}
    server.pages = pages  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", pages
    finally:
        server.shutdown()
        server.server_close()


def write_fleet(folder: Path, prefill: str, decode: str) -> Path:
    done = run_writer("fleet", "--model", "m", "--prefill", prefill, "--decode", decode,
                      "--dir", str(folder))
    assert done.returncode == 0, done.stderr
    return folder / "fleet.json"


def test_written_fleet_passes_narwhal_inference_own_validator(
    tmp_path: Path, narwhal_inference_venv: Path
) -> None:
    """`narwhal config validate` (0.7.0) reads our v2 fleet without a complaint."""
    fleet = write_fleet(tmp_path, "http://127.0.0.1:1/", "http://127.0.0.1:2")
    doc = json.loads(fleet.read_text())
    assert [e["url"] for e in doc["engines"]] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert Path(doc["profiles"]["path"]).is_absolute()
    done = subprocess.run(
        [str(narwhal_inference_venv / "bin" / "narwhal"), "config", "validate", "--fleet",
         str(fleet)], capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_fleet_without_model_is_refused_naming_the_flag(tmp_path: Path) -> None:
    done = run_writer("fleet", "--prefill", "http://a", "--decode", "http://b", "--dir",
                      str(tmp_path))
    assert done.returncode == 2
    assert "--model" in done.stderr
    assert not (tmp_path / "fleet.json").exists()


def test_profiles_for_an_engine_that_is_down_names_its_url(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    fleet = write_fleet(tmp_path, down, down)
    done = run_writer("profiles", "--fleet", str(fleet), "--timeout", "2")
    assert done.returncode == 1
    assert f"GET {down}/version failed" in done.stderr
    assert not (tmp_path / "profiles.json").exists()


def test_profiles_need_the_engine_process_start_time(
    tmp_path: Path, half_engine: tuple[str, dict[str, str]]
) -> None:
    """Without process_start_time_seconds there is no generation to bind a profile to."""
    url, pages = half_engine
    pages["/version"] = json.dumps({"version": "0.32.0"})
    pages["/metrics"] = "vllm:num_requests_running 0.0\n"
    done = run_writer("profiles", "--fleet", str(write_fleet(tmp_path, url, url)))
    assert done.returncode == 1
    assert "process_start_time_seconds" in done.stderr and url in done.stderr


def test_profiles_need_a_version_string(
    tmp_path: Path, half_engine: tuple[str, dict[str, str]]
) -> None:
    url, pages = half_engine
    pages["/version"] = json.dumps({"version": "  "})
    pages["/metrics"] = "process_start_time_seconds 1.7e9\n"
    done = run_writer("profiles", "--fleet", str(write_fleet(tmp_path, url, url)))
    assert done.returncode == 1
    assert f"{url}/version" in done.stderr


def test_profile_rows_bind_each_engine_to_its_live_generation(
    tmp_path: Path, half_engine: tuple[str, dict[str, str]]
) -> None:
    """The digest is narwhal-inference's: sorted compact JSON of version and start time."""
    url, pages = half_engine
    pages["/version"] = json.dumps({"version": "0.32.0\n"})
    pages["/metrics"] = (
        "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1796041913.25\n"
    )
    fleet = write_fleet(tmp_path, url, url)
    done = run_writer("profiles", "--fleet", str(fleet))
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "profiles.json").read_text())
    assert (doc["schema"], doc["schema_version"]) == ("narwhal.profiles", 1)
    assert [row["iid"] for row in doc["profiles"]] == ["p0", "d0"]
    raw = b'{"engine":{"process_start_time_seconds":1796041913.25,"version":"0.32.0"}}'
    want = "sha256:" + hashlib.sha256(raw).hexdigest()
    assert {row["generation_digest"] for row in doc["profiles"]} == {want}
