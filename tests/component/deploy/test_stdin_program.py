"""A Python program sent on stdin ahead of its own input (how discovery runs its probe on each
host: one round trip, no file written there), run by the host's real python3."""

from __future__ import annotations

import json

from narwhal.core import result_line
from narwhal.deploy.gates.discover import PROBE_COMMAND, PROBE_FILE
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.local import LocalHost

PROGRAM = b'''
import sys
from dataclasses import dataclass

@dataclass
class Seen:
    name: str
    rest: str

if __name__ == "__main__":
    seen = Seen(__file__, sys.stdin.read())
    print(seen.name, repr(seen.rest))
    sys.exit(3)
'''


def _run(code: bytes, rest: bytes, name: str = "narwhal-test-program") -> tuple[int, str, str]:
    done = LocalHost().run(cl.stdin_program(name), stdin=cl.stdin_program_input(code, rest),
                           timeout=60)
    return done.exit_status, done.text, done.stderr.decode()


def test_the_program_runs_as_main_reads_only_its_own_input_and_keeps_its_exit_status() -> None:
    status, out, _ = _run(PROGRAM, b"line one\n{\"json\": true}\n")
    assert status == 3
    assert out == "narwhal-test-program 'line one\\n{\"json\": true}\\n'\n"


def test_the_host_probe_runs_from_stdin_and_answers_its_request() -> None:
    request = {"schema": "narwhal.host-probe-request", "schema_version": 1, "role": "router",
               "run_dir": "/tmp", "model_dir": None, "fabric_interface": None, "ports": [],
               "image": None, "runtime": None, "hash_model": False}
    status, out, err = _run(PROBE_FILE.read_bytes(), json.dumps(request).encode(), PROBE_COMMAND)
    result = result_line.parse(out, PROBE_COMMAND)
    assert status == 0 and result.ok, (out, err)
    assert result.data["python"]["version"]


def test_a_refused_request_is_the_probe_own_answer() -> None:
    status, out, _ = _run(PROBE_FILE.read_bytes(), b"not json", PROBE_COMMAND)
    result = result_line.parse(out, PROBE_COMMAND)
    assert status == 2 and not result.ok and "not JSON" in str(result.error)


def test_a_program_shorter_than_its_declared_size_fails_at_once_and_runs_nothing() -> None:
    code = b'print("ran")\n'
    data = f"{len(code) + 4096}\n".encode() + code  # stdin ends before the declared size
    done = LocalHost().run(cl.stdin_program("short"), stdin=data, timeout=60)
    assert done.exit_status != 0 and "ran" not in done.text


def test_a_size_line_that_is_not_a_number_fails_without_running_anything() -> None:
    done = LocalHost().run(cl.stdin_program("bad"), stdin=b"print('ran')\n", timeout=60)
    assert done.exit_status != 0 and "ran" not in done.text
