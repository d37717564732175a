"""The fleet document is strict and closed, and every mistake names its field and its fix."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.errors import InputError
from narwhal.core.fleet import load_fleet, parse_fleet
from narwhal.serve.router.settings import settle

GOOD: dict[str, Any] = {
    "schema": "narwhal.fleet",
    "schema_version": 1,
    "model": "tiny-llama",
    "engines": [
        {"id": "p0", "url": "http://10.0.0.5:8000", "role": "prefill"},
        {"id": "d0", "url": "http://10.0.0.6:8000", "role": "decode"},
    ],
    "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
    "journal": {"path": "runs/journal.jsonl"},
}


def _problems(doc: Any) -> list[str]:
    with pytest.raises(InputError) as info:
        parse_fleet(doc, "fleet.json")
    return [f"{p.field}: {p.problem}; {p.fix}" for p in info.value.problems]


def _with(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    doc.update(changes)
    return doc


def test_a_minimal_document_is_accepted_with_named_defaults() -> None:
    doc = parse_fleet(GOOD, "fleet.json")
    assert doc.serving.max_request_bytes == 1_048_576
    assert doc.serving.prompt_length == "prefill_usage"
    assert doc.health.eject_after_failures == 3
    assert doc.tenants == ()


def test_an_unknown_key_is_refused_and_the_allowed_keys_are_listed() -> None:
    (line,) = _problems(_with(serving={"max_concurent": 5}))
    assert line.startswith("serving.max_concurent: unknown key")
    assert "max_concurrent" in line and "max_request_bytes" in line
    (line,) = _problems(_with(engines=[{**GOOD["engines"][0], "pin": True}, GOOD["engines"][1]]))
    assert line.startswith("engines[0].pin: unknown key")
    assert "allowed keys here: id, url, role" in line


def test_every_problem_is_reported_at_once() -> None:
    doc = _with(slo={"ttft_s": -1, "tpot_s": "fast"}, model="", extra_thing=1)
    fields = {line.split(":")[0] for line in _problems(doc)}
    assert {"slo.ttft_s", "slo.tpot_s", "model", "extra_thing"} <= fields


def test_a_missing_section_says_to_add_it() -> None:
    doc = copy.deepcopy(GOOD)
    del doc["journal"]
    (line,) = _problems(doc)
    assert line.startswith("journal: field required; add it")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_numbers_are_refused(value: float) -> None:
    (line,) = _problems(_with(slo={"ttft_s": value, "tpot_s": 0.1}))
    assert line.startswith("slo.ttft_s") and "finite" in line


def test_a_number_in_quotes_is_not_a_number() -> None:
    (line,) = _problems(_with(serving={"max_concurrent": "64"}))
    assert line.startswith("serving.max_concurrent") and "whole number" in line


def test_another_schema_version_is_refused_by_name() -> None:
    (line,) = _problems(_with(schema_version=2))
    assert "version 2 is not readable" in line and "write schema_version 1" in line
    assert _problems(_with(schema="narwhal.inputs"))[0].startswith("schema")


def test_a_role_outside_the_three_is_refused() -> None:
    doc = _with(engines=[{"id": "x", "url": "http://h:1", "role": "kv_both"}])
    lines = _problems(doc)
    assert lines[0].startswith("engines[0].role") and "'prefill'" in lines[0]


@pytest.mark.parametrize(("url", "why"), [
    ("https://h:8000", "http://"),
    ("http://h", "explicit port"),
    ("http://h:8000/v1", "without path"),
    ("http://user:pw@h:8000", "credentials"),
])
def test_engine_urls_must_be_bare_http_base_urls(url: str, why: str) -> None:
    doc = _with(engines=[{"id": "p0", "url": url, "role": "both"}])
    (line,) = _problems(doc)
    assert line.startswith("engines[0].url") and why in line


def test_engine_ids_and_urls_are_unique_and_both_legs_have_an_engine() -> None:
    e = {"id": "p0", "url": "http://h:1", "role": "prefill"}
    lines = _problems(_with(engines=[e, dict(e)]))
    assert any(line.startswith("engines[1].id") and "repeats" in line for line in lines)
    assert any(line.startswith("engines[1].url") for line in lines)
    assert any(line.startswith("engines: no engine can take a decode leg") for line in lines)


def test_a_tenant_names_a_variable_never_a_key() -> None:
    (line,) = _problems(_with(tenants=[{"name": "a", "key_env": "sk-live-1234567890"}]))
    assert line.startswith("tenants[0].key_env") and "never the key" in line
    lines = _problems(_with(tenants=[{"name": "a", "key": "sk-live-1234567890"}]))
    line = next(line for line in lines if line.startswith("tenants[0].key:"))
    assert "unknown key" in line and "environment variable" in line
    assert not any("sk-live" in line for line in lines)  # the value is never echoed


def test_a_missing_key_variable_stops_startup_naming_it(tmp_path: Path) -> None:
    doc = parse_fleet(_with(tenants=[{"name": "a", "key_env": "NW_KEY_A"},
                                     {"name": "b", "key_env": "NW_KEY_B"}]), "f")
    with pytest.raises(InputError) as info:
        settle(doc, {"NW_KEY_A": "k" * 32}, tmp_path / "fleet.json")
    (problem,) = info.value.problems
    assert problem.field == "tenants[1].key_env"
    assert "NW_KEY_B is not set" in problem.problem
    assert "export NW_KEY_B=" in problem.fix


def test_short_or_shared_keys_are_refused(tmp_path: Path) -> None:
    doc = parse_fleet(_with(tenants=[{"name": "a", "key_env": "NW_KEY_A"},
                                     {"name": "b", "key_env": "NW_KEY_B"}]), "f")
    with pytest.raises(InputError) as info:
        settle(doc, {"NW_KEY_A": "short", "NW_KEY_B": "k" * 32}, tmp_path / "fleet.json")
    assert "shorter than 16" in info.value.problems[0].problem
    with pytest.raises(InputError) as info:
        settle(doc, {"NW_KEY_A": "k" * 32, "NW_KEY_B": "k" * 32}, tmp_path / "fleet.json")
    assert "same key" in info.value.problems[0].problem


def test_settled_tenants_never_print_their_key(tmp_path: Path) -> None:
    doc = parse_fleet(_with(tenants=[{"name": "a", "key_env": "NW_KEY_A"}]), "f")
    settings = settle(doc, {"NW_KEY_A": "secret-value-0123456789"}, tmp_path / "fleet.json")
    assert "secret-value" not in repr(settings)
    assert settings.tenants.tenant_for(b"secret-value-0123456789") == "a"
    assert settings.tenants.tenant_for(b"secret-value-0123456780") is None


def test_a_relative_journal_path_is_resolved_against_the_documents_folder(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "fleet.json"
    path.parent.mkdir()
    path.write_text(json.dumps(GOOD))
    settings = settle(load_fleet(path), {}, path)
    assert settings.journal_path == tmp_path / "conf" / "runs" / "journal.jsonl"


def test_an_unreadable_or_malformed_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot be read"):
        load_fleet(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "narwhal.fleet",\n "model": }')
    with pytest.raises(InputError, match="line 2 column"):
        load_fleet(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(InputError, match="not a JSON object"):
        load_fleet(bad)


def test_a_file_that_is_not_utf8_is_an_input_error_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'{"model": "caf\xe9"}')
    with pytest.raises(InputError, match="is not UTF-8 text"):
        load_fleet(bad)


QUORUM: dict[str, Any] = {"deployment": "fleet-1", "key_file": "controller.key",
                          "lease_urls": [f"http://10.0.1.{i}:9100/v1/lease" for i in (1, 2, 3)]}


def _key(folder: Path, text: str = "0123456789abcdef0123\n", mode: int = 0o600) -> Path:
    path = folder / "controller.key"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_quorum_of_sidecars_settles_into_the_lease_with_its_key_beside_the_document(
        tmp_path: Path) -> None:
    _key(tmp_path)
    doc = parse_fleet(_with(controller={"quorum": QUORUM}), "fleet.json")
    control = settle(doc, {}, tmp_path / "fleet.json").controller
    assert control.backend == "quorum of 3 sidecars" and control.quorum is not None
    assert control.quorum.key.reveal() == "0123456789abcdef0123"  # the final newline is not key
    assert control.quorum.key_file == tmp_path / "controller.key"
    assert "http://10.0.1.2:9100/v1/lease" in control.where
    assert "0123456789abcdef" not in repr(control)
    assert settle(parse_fleet(GOOD, "f"), {}, tmp_path / "fleet.json").controller.backend == "file"


@pytest.mark.parametrize(("urls", "why"), [
    (QUORUM["lease_urls"][:2], "at least 3 items"),
    ([*QUORUM["lease_urls"][:2], "http://10.0.1.1:9100/v1/lease"], "names the same sidecar"),
    ([*QUORUM["lease_urls"][:2], "http://10.0.1.9:9100/v1/attestation"], "must end in /v1/lease"),
    ([*QUORUM["lease_urls"][:2], "ftp://10.0.1.9:9100/v1/lease"], "http(s) URL"),
    ([*QUORUM["lease_urls"][:2], "http://u:p@10.0.1.9:9100/v1/lease"], "without query or credentials"),
    ([*QUORUM["lease_urls"][:2], "http://10.0.1.9:99999/v1/lease"], "port that is not a number"),
])
def test_quorum_lease_urls_are_three_or_more_distinct_sidecar_lease_routes(
        urls: list[str], why: str) -> None:
    lines = _problems(_with(controller={"quorum": {**QUORUM, "lease_urls": urls}}))
    assert any(line.startswith("controller.quorum.lease_urls") and why in line
               for line in lines), lines


def test_a_quorum_and_a_lease_file_are_not_both_named() -> None:
    (line,) = _problems(_with(controller={"quorum": QUORUM, "lease_path": "x.lease"}))
    assert line.startswith("controller.lease_path: is set while controller.quorum is")


def test_a_quorum_with_an_unknown_key_or_no_deployment_is_refused() -> None:
    lines = _problems(_with(controller={"quorum": {**QUORUM, "urls": [], "deployment": ""}}))
    assert any(line.startswith("controller.quorum.urls: unknown key") for line in lines)
    assert any(line.startswith("controller.quorum.deployment") for line in lines)


@pytest.mark.parametrize(("text", "mode", "why"), [
    ("0123456789abcdef0123", 0o644, "has mode 0644"),
    ("0123456789abcdef0123", 0o640, "chmod 600"),
    ("\n", 0o600, "is empty"),
    ("short", 0o600, "shorter than 16"),
    ("0123456789 abcdef0123", 0o600, "spaces"),
])
def test_an_open_empty_or_weak_key_file_stops_the_router_naming_the_file(
        tmp_path: Path, text: str, mode: int, why: str) -> None:
    key = _key(tmp_path, text, mode)
    doc = parse_fleet(_with(controller={"quorum": QUORUM}), "fleet.json")
    with pytest.raises(InputError) as info:
        settle(doc, {}, tmp_path / "fleet.json")
    (problem,) = info.value.problems
    assert problem.field == "controller.quorum.key_file" and str(key) in problem.problem
    assert why in problem.line()


def test_a_missing_or_linked_key_file_is_refused(tmp_path: Path) -> None:
    doc = parse_fleet(_with(controller={"quorum": QUORUM}), "fleet.json")
    with pytest.raises(InputError, match="cannot be opened"):
        settle(doc, {}, tmp_path / "fleet.json")
    real = tmp_path / "real.key"
    real.write_text("0123456789abcdef0123")
    real.chmod(0o600)
    (tmp_path / "controller.key").symlink_to(real)
    with pytest.raises(InputError, match="cannot be opened"):
        settle(doc, {}, tmp_path / "fleet.json")


def _cached(**changes: Any) -> dict[str, Any]:
    doc = _with(**{"profiles": {"path": "profiles.json"},
                   "prefix_cache": {"tokenizer_dir": "model"}, **changes})
    doc["engines"][0]["kv_events"] = {"endpoint": "tcp://10.0.0.5:5557"}
    return doc


def test_cache_aware_placement_settles_tokenizer_and_event_endpoints(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(_cached()))
    settings = settle(load_fleet(path), {}, path)
    assert settings.cache is not None
    assert settings.cache.tokenizer_dir == tmp_path / "model"
    assert settings.cache.events == {"p0": ("tcp://10.0.0.5:5557", "")}


@pytest.mark.parametrize(("endpoint", "why"), [
    ("tcp://*:5557", "must name the engine's host"),
    ("http://10.0.0.5:5557", "must start with tcp://"),
    ("tcp://10.0.0.5", "must name the engine's host and port"),
    ("tcp://10.0.0.5:99999", "not a number in 1-65535"),
    ("tcp://10.0.0.5:5557/x?y", "without path"),
    ("ipc:///tmp/kv", "must start with tcp://"),
])
def test_an_event_endpoint_the_router_cannot_connect_to_is_refused(endpoint: str,
                                                                   why: str) -> None:
    doc = _cached()
    doc["engines"][0]["kv_events"]["endpoint"] = endpoint
    assert any(p.startswith("engines[0].kv_events.endpoint") and why in p
               for p in _problems(doc)), _problems(doc)


def test_cache_awareness_needs_curves_and_a_tokenizer_folder() -> None:
    doc = _cached()
    del doc["profiles"]
    assert any(p.startswith("prefix_cache: prices placement") for p in _problems(doc))
    doc = _cached(prefix_cache={"tokenizer_dir": " "})
    assert any(p.startswith("prefix_cache.tokenizer_dir: is empty") for p in _problems(doc))
    doc = _cached(prefix_cache={"tokenizer_dir": "m", "approximate_blocks": -1})
    assert any(p.startswith("prefix_cache.approximate_blocks") for p in _problems(doc))


@pytest.mark.parametrize("value", [-1, 1 << 25, True, "2048", 2.5])
def test_the_off_loop_threshold_is_a_bounded_token_count(value: object) -> None:
    doc = _cached(prefix_cache={"tokenizer_dir": "m", "off_loop_tokens": value})
    assert any(p.startswith("prefix_cache.off_loop_tokens") for p in _problems(doc)), value
    fine = parse_fleet(_cached(prefix_cache={"tokenizer_dir": "m", "off_loop_tokens": 0}), "f")
    assert fine.prefix_cache is not None and fine.prefix_cache.off_loop_tokens == 0


@pytest.mark.parametrize(("section", "named"), [
    ({"path": " "}, "kv_canary.path"),
    ({"path": "kv.json", "interval_s": 0}, "kv_canary.interval_s"),
    ({"path": "kv.json", "interval_s": 1e9}, "kv_canary.interval_s"),
    ({"path": "kv.json", "release_after": 0}, "kv_canary.release_after"),
    ({"path": "kv.json", "logprob_tolerance": -1}, "kv_canary.logprob_tolerance"),
    ({"path": "kv.json", "rate": 3}, "kv_canary.rate"),
    ({"interval_s": 5}, "kv_canary.path"),
    ("kv.json", "kv_canary"),
])
def test_a_kv_canary_section_that_is_not_one_names_its_field(section: Any, named: str) -> None:
    assert any(p.startswith(named) for p in _problems(_with(kv_canary=section))), \
        _problems(_with(kv_canary=section))


@pytest.mark.parametrize(("section", "named"), [
    ({"stall_steps": 0}, "serving.stall_steps"), ({"stall_floor_s": 0}, "serving.stall_floor_s"),
    ({"continue_midstream": "yes"}, "serving.continue_midstream"),
    ({"deadline_factor": 0.5}, "serving.deadline_factor"),
    ({"deadline_factor": float("nan")}, "serving.deadline_factor"),
    ({"deadline_floor_s": 0}, "serving.deadline_floor_s"),
    ({"deadline_floor_s": 1e9}, "serving.deadline_floor_s"),
    ({"handoff_budget_s": 0}, "serving.handoff_budget_s"),
    ({"handoff_budget_s": -1}, "serving.handoff_budget_s"),
    ({"handoff_budget_s": "1s"}, "serving.handoff_budget_s"),
    ({"handoff_budget_s": 1e300}, "serving.handoff_budget_s"),
])
def test_stall_and_continuation_settings_are_bounded(section: dict[str, Any], named: str) -> None:
    assert any(p.startswith(named) for p in _problems(_with(serving=section)))


def test_a_missing_kv_canary_reference_stops_settling_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(_with(kv_canary={"path": "gone.json"})))
    with pytest.raises(InputError) as info:
        settle(load_fleet(path), {}, path)
    assert "gone.json" in str(info.value) and "--canary-out" in str(info.value)
