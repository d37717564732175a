"""The fidelity checks catch and name a drifted reply (no vLLM needed: captures are replayed).

A stdlib HTTP server replays the real captures; it passes the checks as is, and fails them
with the exact path of each difference once a key is dropped, renamed or retyped. This keeps
the checks themselves honest: a check that could not fail would prove nothing about the
emulator.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.fidelity import checks, reference
from tests.fidelity.shapes import shape_diff

Mutation = Callable[[str, Any], Any]
ROUTES = {("POST", "/v1/completions"): "completion.json",
          ("POST", "/v1/chat/completions"): "chat.json",
          ("GET", "/version"): "version.json", ("GET", "/v1/models"): "models.json"}


class _Replay(BaseHTTPRequestHandler):
    mutate: Mutation = staticmethod(lambda name, body: body)

    def _send(self, method: str) -> None:
        length = int(self.headers.get("content-length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        name = ROUTES.get((method, self.path))
        if name is None or request.get("stream"):
            self.send_error(404)
            return
        body = json.dumps(type(self).mutate(name, reference.document(name))).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send("GET")

    def do_POST(self) -> None:
        self._send("POST")

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def replay() -> Iterator[Callable[[Mutation], str]]:
    servers: list[ThreadingHTTPServer] = []

    def serve(mutate: Mutation) -> str:
        handler = type("Replay", (_Replay,), {"mutate": staticmethod(mutate)})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    try:
        yield serve
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_replayed_captures_pass_their_own_checks(replay: Callable[[Mutation], str]) -> None:
    base = replay(lambda name, body: body)
    for check in (checks.check_version, checks.check_models, checks.check_completion,
                  checks.check_chat):
        check(base)


def _drop_usage_detail(name: str, body: Any) -> Any:
    if name == "completion.json":
        body = json.loads(json.dumps(body))
        del body["usage"]["prompt_tokens_details"]
        body["choices"][0]["finish_reason"] = 1
        body["extra"] = True
    return body


def test_a_dropped_key_an_extra_key_and_a_retyped_value_are_each_named(
    replay: Callable[[Mutation], str]
) -> None:
    base = replay(_drop_usage_detail)
    with pytest.raises(checks.FidelityError) as err:
        checks.check_completion(base)
    message = str(err.value)
    assert "3 difference(s)" in message
    assert "$.usage: missing key 'prompt_tokens_details'" in message
    assert "$: unexpected key 'extra'" in message
    assert "$.choices[].finish_reason: vLLM sends string, got number" in message


def test_a_model_list_without_the_served_name_fails(replay: Callable[[Mutation], str]) -> None:
    def rename(name: str, body: Any) -> Any:
        if name == "models.json":
            body = json.loads(json.dumps(body))
            body["data"][0]["id"] = "other"
        return body

    with pytest.raises(checks.FidelityError, match="expected the served name 'tiny-llama'"):
        checks.check_models(replay(rename))


def test_top_logprobs_keys_are_tokens_not_schema() -> None:
    want = reference.document("decode-reply.json")
    got = json.loads(json.dumps(want))
    got["choices"][0]["logprobs"]["top_logprobs"] = [{"other token": -1.0}]
    assert shape_diff(want, got, free_maps=checks.TOP_LOGPROBS) == []
    got["choices"][0]["logprobs"]["top_logprobs"] = [{"other token": "x"}]
    assert shape_diff(want, got, free_maps=checks.TOP_LOGPROBS) == [
        "$.choices[].logprobs.top_logprobs[].*: vLLM sends number, got string ('x')"]


def test_the_reference_label_set_is_the_real_one() -> None:
    labels = reference.cache_config_labels()
    assert len(labels) == 37
    assert {"block_size", "num_gpu_blocks", "kv_sharing_fast_prefill", "engine"} <= labels
