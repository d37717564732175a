"""A fuzz tier for the `.env` reader and `narwhal inputs`: thousands of generated files a run.

Four properties, each over files the hand-written cases would not think of:

(a) any text, and any bytes on disk, gives validated inputs or an InputError, never another
    exception (a traceback is a bug);
(b) a valid file with one value made hostile (shell structure, line separators, controls, bad
    hosts, bad ports, oversize numbers, a bad engine number) is refused, and a problem names
    the variable that was changed;
(c) an accepted file declares exactly the engines its generator wrote, on the machines it
    meant, however it is formatted (BOM, CRLF, export, quoting, comments that look like lines);
(d) a secret value never appears in a problem, nor in `narwhal inputs` output (table or JSON).

Runs are repeatable: derandomized, no example database. The sum of max_examples below is at
least 2,000, and the last test checks that as many examples really ran.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from narwhal.core.errors import InputError
from narwhal.deploy.cli.inputs_cmd import masked
from narwhal.deploy.cli.main import main
from narwhal.deploy.inputs import load_inputs, parse_inputs
from narwhal.deploy.inputs.destination import parse_destination
from narwhal.deploy.inputs.envfile import parse_env_text
from tests.envtext import IMAGE, REVISION, valid_env

EXAMPLES = {"any_text": 900, "any_lines": 400, "any_bytes": 200, "hostile_value": 700,
            "bad_engine_number": 100, "round_trip": 300, "secrets": 200}
REQUIRED_TOTAL = 2000
RAN: Counter[str] = Counter()


SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                HealthCheck.large_base_example]


def fuzz(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Repeatable hypothesis settings for one property, sized by EXAMPLES."""
    return settings(max_examples=EXAMPLES[name], deadline=None, derandomize=True, database=None,
                    suppress_health_check=SLOW_IS_FINE, print_blob=False)


SOURCE = Path(".env")
SHELL = list(";|&$`<>")
SEPARATORS = ["\v", "\f", "\r", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
CONTROLS = ["\x00", "\x01", "\x08", "\x1b", "\x7f", "\x80", "\x9b", "\u200b", "\u200e",
            "\u202e", "\u2066", "\ufeff", "\ud800"]
HOSTILE_CHARS = SHELL + SEPARATORS + CONTROLS
KEYS = ["NARWHAL_DEPLOYMENT", "NARWHAL_DEPLOYMENT_REVISION", "NARWHAL_ENGINE_IMAGE",
        "NARWHAL_ENGINE_MODEL_NAME", "NARWHAL_MODEL_DIR", "NARWHAL_RUN_DIR",
        "NARWHAL_FABRIC_INTERFACE", "NARWHAL_ENGINE_PORT", "NARWHAL_ATTEST_PORT",
        "NARWHAL_NIXL_SIDE_CHANNEL_PORT", "NARWHAL_UCX_TCP_PORT_RANGE", "NARWHAL_ROUTER_SSH",
        "NARWHAL_NODE_1_SSH", "NARWHAL_NODE_2_SSH", "NARWHAL_NODE_3_SSH",
        "NARWHAL_NODE_2_SSH_PASSWORD", "NARWHAL_ENGINE_KEY", "NARWHAL_ENGINE_ARGS",
        "NARWHAL_ENGINE_ENV", "NARWHAL_TRANSFER_DEVICES", "MODEL_REPO_ID", "MODEL_REVISION",
        "NARWHAL_GRAFANA_BIND_ADDRESS", "NARWHAL_NODE_1_URL", "NARWHAL_NODE_999_SSH"]
TOKENS = [*KEYS, *HOSTILE_CHARS, "=", "#", " #", "'", '"', "\\", "\\\"", " ", "\t", "\n",
          "\r\n", "export ", "NARWHAL_NODE_", "_SSH=", "root@", "ssh://", "[", "]", ":", "::",
          "10.0.0.1", "999.999.1.1", "{", "}", '{"HF_TOKEN":"x"}', '["--a"]', "$(reboot)",
          "\ufeff", "0" * 30, "\u0661"]
# A file the engines would accept, with every optional variable set, so each can be mutated.
OPTIONAL = {
    "NARWHAL_GRAFANA_BIND_ADDRESS": "127.0.0.1",
    "NARWHAL_PROMETHEUS_LISTEN_ADDRESS": "127.0.0.1:9090",
    "NARWHAL_SHARED_GPU_ALLOWANCE": "false",
    "NARWHAL_ENGINE_ARGS": '["--max-num-seqs","8","--max-model-len=4096"]',
    "NARWHAL_ENGINE_ENV": '{"VLLM_ATTENTION_BACKEND":"FLASH_ATTN"}',
    "NARWHAL_TRANSFER_DEVICES": '["mlx5_0","mlx5_1:1"]',
    "NARWHAL_TRANSFER_NET_DEVICES": "mlx5_0:1,mlx5_1:1", "NARWHAL_GPU_TLS": "cuda",
    "NARWHAL_TENSOR_PARALLEL_SIZE": "1", "NARWHAL_MODEL_DTYPE": "bfloat16",
    "NARWHAL_BLOCK_SIZE": "64", "NARWHAL_MODEL_CONFIG_SHA256": "cd" * 32,
    "NARWHAL_GPU_MEMORY_UTILIZATION": "0.9", "NARWHAL_SSH_CONNECT_TIMEOUT": "10",
    "NARWHAL_SSH_KNOWN_HOSTS": "/home/ops/.ssh/narwhal_known_hosts",
    "NARWHAL_TTFT_S": "10", "NARWHAL_TPOT_S": "0.125",
    "NARWHAL_NODE_1_IP": "10.213.0.21", "NARWHAL_NODE_1_URL": "http://10.213.0.11:8000",
    "NARWHAL_NODE_1_ATTESTATION_URL": "http://10.213.0.11:8010/v1/attestation",
    "NARWHAL_NODE_1_GPU_IDS": "0,1", "NARWHAL_NODE_2_ENGINE_PORT": "8100",
}
BASE: dict[str, str] = {**dict(line.split("=", 1) for line in valid_env().splitlines()),
                        **OPTIONAL}
SECRET_KEYS = {"NARWHAL_NODE_2_SSH_PASSWORD", "NARWHAL_ENGINE_KEY"}
SSH_KEYS = ["NARWHAL_ROUTER_SSH", "NARWHAL_NODE_1_SSH", "NARWHAL_NODE_2_SSH"]
PORT_KEYS = ["NARWHAL_ENGINE_PORT", "NARWHAL_ATTEST_PORT", "NARWHAL_NIXL_SIDE_CHANNEL_PORT",
             "NARWHAL_NODE_2_ENGINE_PORT"]
NUMBER_KEYS = ["NARWHAL_TENSOR_PARALLEL_SIZE", "NARWHAL_BLOCK_SIZE", "NARWHAL_SSH_CONNECT_TIMEOUT",
               *PORT_KEYS]
MUTABLE = sorted(set(BASE) - SECRET_KEYS)
DECLARED_RE = re.compile(r"[ \t]*(?:export [ \t]*)?NARWHAL_NODE_([1-9][0-9]{0,2})_SSH[ \t]*=")


def _render(values: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


def _declared(text: str) -> set[int]:
    """Engines declared by lines split on "\\n" alone, as a person reading the file sees them."""
    lines = text.removeprefix("\ufeff").split("\n")
    return {int(m[1]) for line in lines if (m := DECLARED_RE.match(line))}


def _single(value: str) -> str:
    """value as a single-quoted .env value (the generators never put a "'" in one)."""
    assert "'" not in value
    return f"'{value}'"


def _double(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _check_accepted_or_refused(text: str) -> None:
    try:
        inputs = parse_inputs(text, SOURCE)
    except InputError as err:
        assert err.problems, "an InputError with no problem"
        for problem in err.problems:
            assert problem.field and problem.problem and problem.fix, problem
        str(err)
        return
    assert {e.n for e in inputs.engines} == _declared(text)
    json.dumps(masked(inputs))


# (a) arbitrary input ---------------------------------------------------------------------------

huge = st.builds(lambda ch, n: ch * n, st.sampled_from(["a", "[", "{", "9", "\u2028", "'", '"',
                                                         "\\", " ", "\x00", "é"]),
                 st.integers(1_000, 100_000))
any_text = st.one_of(
    st.text(max_size=400),
    st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=6)), max_size=80).map("".join),
    st.builds(lambda head, tail: head + tail, st.just(valid_env()),
              st.lists(st.sampled_from(TOKENS), max_size=40).map("".join)),
    st.builds(lambda key, value: valid_env() + f"{key}={value}\n", st.sampled_from(KEYS), huge),
    st.builds(lambda key, value: valid_env() + f"{key}={value}\n",
              st.sampled_from(["NARWHAL_ENGINE_ARGS", "NARWHAL_ENGINE_ENV", "NARWHAL_ENGINE_PORT",
                               "NARWHAL_TRANSFER_DEVICES", "NARWHAL_TTFT_S"]), huge),
    st.builds(lambda digits: valid_env() + f"NARWHAL_NODE_{digits}_SSH=root@10.0.0.9\n",
              st.integers(1, 6000).map(lambda n: "1" * n)),
)


@fuzz("any_text")
@given(text=any_text)
def test_any_text_gives_inputs_or_an_input_error(text: str) -> None:
    RAN["any_text"] += 1
    parse_env_text(text)
    _check_accepted_or_refused(text)


line_value = st.one_of(st.text(max_size=30), st.sampled_from(TOKENS),
                       st.sampled_from(list(BASE.values())))
any_lines = st.lists(
    st.tuples(st.sampled_from(["", "export ", " ", "\t", "# "]),
              st.one_of(st.sampled_from(KEYS + list(BASE)), st.text(max_size=12)),
              st.sampled_from(["=", " =", "= ", ""]), line_value,
              st.sampled_from(["\n", "\r\n", "\n\n", "\r", "\u2028", ""])),
    max_size=40,
).map(lambda rows: "".join("".join(row) for row in rows))


@fuzz("any_lines")
@given(text=any_lines, bom=st.booleans())
def test_any_lines_give_inputs_or_an_input_error(text: str, bom: bool) -> None:
    RAN["any_lines"] += 1
    _check_accepted_or_refused(("\ufeff" if bom else "") + text)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@st.composite
def text_with_junk(draw: st.DrawFn) -> bytes:
    """Generated text as UTF-8 (lone surrogates encoded, so invalid) with bytes spliced in."""
    raw = draw(any_text).encode("utf-8", "surrogatepass")
    at = draw(st.integers(0, len(raw)))
    return raw[:at] + draw(st.binary(max_size=4)) + raw[at:]


any_bytes = st.one_of(st.binary(max_size=400), text_with_junk(),
                      st.just(b"\xef\xbb\xbf" + valid_env().encode()))


@fuzz("any_bytes")
@given(data=any_bytes)
def test_any_bytes_on_disk_give_inputs_or_an_input_error(workdir: Path, data: bytes) -> None:
    RAN["any_bytes"] += 1
    env = workdir / "bytes.env"
    env.write_bytes(data)
    env.chmod(0o600)
    try:
        inputs = load_inputs(env)
    except InputError as err:
        assert err.problems and all(p.fix for p in err.problems)
        return
    assert {e.n for e in inputs.engines} == _declared(data.decode("utf-8"))


# (b) one hostile value -------------------------------------------------------------------------

octet = st.integers(0, 255).map(str)
bad_octet = st.integers(256, 10**6).map(str)
bad_ipv4 = st.one_of(
    st.lists(st.one_of(octet, bad_octet), min_size=4, max_size=4)
    .filter(lambda parts: any(int(p) > 255 for p in parts)).map(".".join),
    st.lists(octet, min_size=1, max_size=3).map(".".join),
    st.lists(octet, min_size=5, max_size=6).map(".".join),
    st.builds(lambda a, b: f"0{a}.{b}.0.1", st.integers(0, 99), octet),
)
bad_name = st.one_of(
    st.text("abc", min_size=64, max_size=70),
    st.lists(st.text("ab", min_size=60, max_size=63), min_size=5, max_size=5).map(".".join),
    st.sampled_from(["-gpu", "gpu-", "g_pu", "gpu..a", ".gpu", "gpu.", "g pu", "gpü", "h\u0435st",
                     "gpu:", "gpu:x"]),
)
bad_bracketed = st.one_of(st.text("0123456789abcdefxyz:.%", max_size=12),
                          st.sampled_from(["1", ":::::", "::1::", "fe80::1%$(id)", "", "1.2.3.4"])
                          ).filter(lambda t: _not_ipv6(t)).map(lambda t: f"[{t}]")
bad_destination = st.builds(lambda user, host: f"{user}{host}",
                            st.sampled_from(["", "root@", "ops@", "ssh://root@"]),
                            st.one_of(bad_ipv4, bad_name, bad_bracketed))


def _not_ipv6(text: str) -> bool:
    try:
        parse_destination(f"[{text}]")
    except ValueError:
        return True
    return False


bad_port = st.one_of(st.just("0"), st.integers(65_536, 10**40).map(str),
                     st.integers(-10**6, -1).map(str), st.just("8o00"), st.just("0x1f90"))
oversize = st.integers(19, 80).flatmap(lambda n: st.text("123456789", min_size=n, max_size=n))


@st.composite
def hostile_mutation(draw: st.DrawFn) -> tuple[str, str]:
    """(variable, hostile value): a character inserted, or a value of the wrong shape."""
    kind = draw(st.sampled_from(["insert", "insert", "insert", "smuggle", "host", "port",
                                 "number"]))
    if kind == "host":
        return draw(st.sampled_from(SSH_KEYS)), draw(bad_destination)
    if kind == "port":
        return draw(st.sampled_from(PORT_KEYS)), draw(bad_port)
    if kind == "number":
        return draw(st.sampled_from(NUMBER_KEYS)), draw(oversize)
    key = draw(st.sampled_from(MUTABLE))
    value = BASE[key]
    if kind == "smuggle":  # an engine hidden behind a character some reader breaks lines at
        sep = draw(st.sampled_from(SEPARATORS + CONTROLS))
        return key, f"{value}{sep}NARWHAL_NODE_3_SSH=root@10.0.0.3"
    at = draw(st.integers(0, len(value)))
    chars = draw(st.lists(st.sampled_from(HOSTILE_CHARS), min_size=1, max_size=3))
    return key, value[:at] + "".join(chars) + value[at:]


def test_the_base_file_for_mutations_is_accepted() -> None:
    inputs = parse_inputs(_render(BASE), SOURCE)
    assert inputs.grafana_bind_address == OPTIONAL["NARWHAL_GRAFANA_BIND_ADDRESS"]
    assert len(inputs.engines) == 2


@fuzz("hostile_value")
@given(mutation=hostile_mutation(), quoted=st.booleans())
def test_one_hostile_value_is_refused_naming_its_variable(mutation: tuple[str, str],
                                                         quoted: bool) -> None:
    RAN["hostile_value"] += 1
    key, value = mutation
    written = _single(value) if quoted or any(c.isspace() for c in value) else value
    with pytest.raises(InputError) as err:
        parse_inputs(_render({**BASE, key: written}), SOURCE)
    named = {p.field.split(" ")[0] for p in err.value.problems}
    assert key in named, (key, value, err.value.problems)


bad_number = st.one_of(st.integers(1000, 10**30).map(str), st.integers(0, 999).map(lambda n: f"0{n}"),
                       st.text("0123456789", min_size=4, max_size=40).filter(lambda t: len(t) > 3))


@fuzz("bad_engine_number")
@given(number=bad_number, field=st.sampled_from(["SSH", "ENGINE_PORT", "SSH_PASSWORD"]))
def test_an_engine_number_outside_1_to_999_is_refused(number: str, field: str) -> None:
    RAN["bad_engine_number"] += 1
    key = f"NARWHAL_NODE_{number}_{field}"
    with pytest.raises(InputError) as err:
        parse_inputs(_render({**BASE, key: "root@10.0.0.9" if field == "SSH" else "8001"}), SOURCE)
    assert key in {p.field.split(" ")[0] for p in err.value.problems}


# (c) round trip --------------------------------------------------------------------------------

def _ipv4(n: int) -> str:
    return f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}"


@st.composite
def written_host(draw: st.DrawFn) -> tuple[str, str]:
    """(host as written, canonical host) for one machine in a small pool, so some collide."""
    n = draw(st.integers(1, 4))
    form = draw(st.sampled_from(["ipv4", "name", "ipv6"]))
    if form == "ipv4":
        return _ipv4(n), _ipv4(n)
    if form == "name":
        name = f"gpu-{n}.fleet.example"
        return "".join(c.upper() if draw(st.booleans()) else c for c in name), name
    spelled = draw(st.sampled_from([f"fd00::{n:x}", f"FD00:0:0:0:0:0:0:{n:X}", f"fd00:0::{n}"]))
    return f"[{spelled}]", f"fd00::{n:x}"


@st.composite
def fleet(draw: st.DrawFn) -> tuple[str, dict[int, tuple[str, int]], dict[int, str]]:
    """(file text, engine -> (canonical host, ssh port), engine -> password) for a valid fleet."""
    numbers = draw(st.lists(st.integers(1, 999), min_size=2, max_size=6, unique=True))
    lines: list[str] = []
    machines: dict[int, tuple[str, int]] = {}
    passwords: dict[int, str] = {}
    for slot, n in enumerate(numbers):
        host, canonical = draw(written_host())
        port = draw(st.sampled_from([None, 22, 2222]))
        user = draw(st.sampled_from(["root", "ops", "svc_narwhal"]))
        dest = f"ssh://{user}@{host}:{port}" if port else f"{user}@{host}"
        machines[n] = (canonical, port or 22)
        lines += [f"NARWHAL_NODE_{n}_SSH={dest}", f"NARWHAL_NODE_{n}_ENGINE_PORT={8000 + slot}",
                  f"NARWHAL_NODE_{n}_ATTEST_PORT={8100 + slot}",
                  f"NARWHAL_NODE_{n}_NIXL_SIDE_CHANNEL_PORT={5600 + slot}",
                  f"NARWHAL_NODE_{n}_GPU_IDS={slot}"]
        if draw(st.booleans()):
            # A password that reads like more lines, or a comment, but is one quoted value.
            password = draw(st.one_of(
                st.text(st.characters(exclude_categories=("Cc", "Cf", "Zl", "Zp", "Cs")),
                        min_size=1, max_size=20),
                st.sampled_from([f"x NARWHAL_NODE_{n + 1000}_SSH=root@10.9.9.9",
                                 "a\\nNARWHAL_NODE_77_SSH=root@10.9.9.9", "#not-a-comment",
                                 "p=w 'q' \"r\"", "$(reboot);`id`"])))
            passwords[n] = password
            lines.append(f"NARWHAL_NODE_{n}_SSH_PASSWORD={_double(password)}")
    common = dict(line.split("=", 1) for line in valid_env().splitlines()
                  if not line.startswith("NARWHAL_NODE_"))
    lines += [f"{k}={v}" for k, v in common.items()]
    lines += draw(st.lists(st.sampled_from([
        "", "   ", "# NARWHAL_NODE_500_SSH=root@10.9.9.9", "#NARWHAL_NODE_501_SSH=x",
        "\t# comment", "# é ünïcode"]), max_size=4))
    order = draw(st.permutations(lines))
    styled = [draw(_styled(line)) for line in order]
    end = draw(st.sampled_from(["\n", "\r\n"]))
    text = ("\ufeff" if draw(st.booleans()) else "") + end.join(styled) + end
    return text, machines, passwords


def _styled(line: str) -> st.SearchStrategy[str]:
    """The same assignment written another way: export, indentation, quotes, a comment."""
    if "=" not in line or line.lstrip().startswith("#"):
        return st.just(line)
    key, value = line.split("=", 1)
    bare = not value.startswith('"') and "'" not in value
    quoted = [value] if not bare else [value, f"'{value}'", _double(value), f"{value} # note"]
    return st.builds(lambda prefix, v: f"{prefix}{key}={v}",
                     st.sampled_from(["", "export ", "  ", "\t"]), st.sampled_from(quoted))


@fuzz("round_trip")
@given(generated=fleet())
def test_an_accepted_file_declares_exactly_the_engines_written(
        generated: tuple[str, dict[int, tuple[str, int]], dict[int, str]]) -> None:
    RAN["round_trip"] += 1
    text, machines, passwords = generated
    inputs = parse_inputs(text, SOURCE)
    assert {e.n: e.ssh.machine for e in inputs.engines} == machines
    assert _declared(text) == set(machines)
    for engine in inputs.engines:
        if engine.n in passwords:
            assert engine.ssh_password is not None
            assert engine.ssh_password.reveal() == passwords[engine.n]
    assert inputs.revision == REVISION and inputs.engines[0].engine_image == IMAGE


# (d) secrets -----------------------------------------------------------------------------------

secret_value = st.builds(
    lambda head, tail: "Zq" + head + tail,
    st.text("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnpqrstuvwxyz23456789", min_size=8, max_size=8),
    st.text(st.characters(exclude_characters="\n"), max_size=16))
SECRET_VARS = ["NARWHAL_NODE_2_SSH_PASSWORD", "NARWHAL_ENGINE_KEY", "NARWHAL_ROUTER_API_KEY",
               "NARWHAL_HF_TOKEN", "NARWHAL_ROUTER_SSH_PASSWORD"]
ENV_SECRET_NAMES = ["HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD"]


def _leaks(secret: str, output: str) -> bool:
    forms = {secret, secret[:10], json.dumps(secret)[1:-1], json.dumps(secret)[1:11]}
    return any(form in output for form in forms)


@fuzz("secrets")
@given(secrets=st.dictionaries(st.sampled_from(SECRET_VARS), secret_value, min_size=1),
       env_secrets=st.dictionaries(st.sampled_from(ENV_SECRET_NAMES), secret_value, max_size=2),
       broken=st.one_of(st.none(), hostile_mutation()), style=st.sampled_from(["single",
                                                                              "double", "json"]))
def test_secrets_never_appear_in_problems_or_output(
        workdir: Path, secrets: dict[str, str], env_secrets: dict[str, str],
        broken: tuple[str, str] | None, style: str) -> None:
    RAN["secrets"] += 1
    values: dict[str, Any] = dict(BASE)
    for key, secret in secrets.items():
        values[key] = _double(secret) if style == "double" or "'" in secret else _single(secret)
    if env_secrets:
        env = {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN", **env_secrets}
        values["NARWHAL_ENGINE_ENV"] = _double(json.dumps(env, ensure_ascii=style == "json"))
    if broken is not None and broken[0] != "NARWHAL_ENGINE_ENV":
        values[broken[0]] = _single(broken[1])
    text = _render(values)
    hidden = [*secrets.values(), *env_secrets.values()]
    try:
        parse_inputs(text, SOURCE)
    except InputError as err:
        assert not any(_leaks(s, str(err)) for s in hidden), str(err)
    path = workdir / "secrets.env"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    path.chmod(0o600)
    for argv in (["inputs", "--json"], ["inputs"]):
        out, err_out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err_out):
            code = main([*argv, "--env", str(path)])
        assert code in (0, 2), err_out.getvalue()
        shown = out.getvalue() + err_out.getvalue()
        assert not any(_leaks(s, shown) for s in hidden), shown


# the count -------------------------------------------------------------------------------------

def test_the_tier_ran_at_least_2000_generated_files() -> None:
    assert sum(EXAMPLES.values()) >= REQUIRED_TOTAL
    if set(RAN) != set(EXAMPLES):
        pytest.skip(f"only {sorted(RAN)} ran in this session; run the whole file to count")
    assert sum(RAN.values()) >= REQUIRED_TOTAL, RAN
