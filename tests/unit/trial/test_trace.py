"""`narwhal trial --trace FILE`: a Mooncake-format trace read strictly and replayed with its own
timing and its own repetition (equal hash_ids are equal prompt text), scaled to the fleet."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from narwhal.deploy.actions.context import Context
from narwhal.deploy.cli.main import main
from narwhal.deploy.trial import trace as tr
from narwhal.deploy.trial.trace import Scale, TraceError, TraceRow, read_trace
from tests.unit.ledger.records import ledger_for_valid_env

MOONCAKE = Path(__file__).resolve().parents[3] / "bench" / "traces" / \
    "mooncake-conversation-1200.jsonl"


def _row(ts: float, hash_ids: list[int], input_length: int | None = None,
         output_length: int = 100) -> dict[str, object]:
    return {"timestamp": ts, "input_length": input_length or 512 * len(hash_ids),
            "output_length": output_length, "hash_ids": hash_ids}


def _write(tmp_path: Path, rows: list[object]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_public_mooncake_conversation_trace_reads_whole() -> None:
    trace = read_trace(MOONCAKE)
    assert len(trace.rows) == 1200 and trace.name == MOONCAKE.name
    assert all(len(r.hash_ids) >= 1 for r in trace.rows)
    assert len(trace.sha256) == 64


def test_equal_hash_ids_are_equal_text_and_different_ones_differ() -> None:
    scale = Scale(block_tokens=16, block_words=10, max_blocks=4, max_tokens=16)
    a = TraceRow.model_validate(_row(0, [1, 2, 3]))
    b = TraceRow.model_validate(_row(0, [1, 2, 9]))
    c = TraceRow.model_validate(_row(0, [7, 2, 3]))
    wa, wb, wc = (tr.prompt_text(r, scale, seed=0).split() for r in (a, b, c))
    assert len(wa) == 30
    assert wa[:20] == wb[:20] and wa[20:] != wb[20:]  # the shared prefix, then not
    assert wa[:10] != wc[:10]
    assert tr.prompt_text(a, scale, seed=0) == tr.prompt_text(a, scale, seed=0)
    assert tr.prompt_text(a, scale, seed=1) != tr.prompt_text(a, scale, seed=0)


def test_a_prompt_ends_where_its_input_ends_and_long_ones_are_cut() -> None:
    scale = Scale(block_tokens=16, block_words=10, max_blocks=2, max_tokens=8)
    short = TraceRow.model_validate(_row(0, [1, 2], input_length=512 + 256))
    long = TraceRow.model_validate(_row(0, [1, 2, 3, 4, 5]))
    assert len(tr.prompt_text(short, scale, 0).split()) == 15  # one and a half blocks
    assert len(tr.prompt_text(long, scale, 0).split()) == 20  # max_blocks of 10 words
    assert scale.output_tokens(TraceRow.model_validate(_row(0, [1], output_length=5000))) == 8
    assert scale.output_tokens(TraceRow.model_validate(_row(0, [1], output_length=64))) == 2


def test_replay_keeps_the_traces_timing_stretched_to_the_rate() -> None:
    rows = [_row(t, [n]) for n, t in enumerate([0, 1000, 1000, 4000, 9000])]
    trace = tr.Trace("t", "0" * 64, tuple(TraceRow.model_validate(r) for r in rows))
    scale = Scale(16, 8, 4, 16)
    planned = tr.replay(trace, rate=2.0, count=5, scale=scale, seed=0, tag="x")
    assert [p.request_id for p in planned] == [f"x-{n:05d}" for n in range(5)]
    assert planned[-1].at_s == pytest.approx(4 / 2.0)  # 4 gaps at 2 per second on average
    gaps = [b.at_s - a.at_s for a, b in itertools.pairwise(planned)]
    assert gaps[1] == 0 and gaps[3] == pytest.approx(gaps[0] * 5)  # the trace's own shape
    assert all(p.prompt is not None for p in planned)
    assert len(tr.replay(trace, 2.0, count=3, scale=scale, seed=0, tag="x")) == 3
    assert len(tr.replay(trace, 2.0, count=50, scale=scale, seed=0, tag="x")) == 5
    same = tr.arrival_times([5.0, 5.0, 5.0], rate=4.0)
    assert same == [0.0, 0.25, 0.5]


def test_blocks_are_sized_so_most_prompts_fit_the_profiled_range() -> None:
    rows = [TraceRow.model_validate(_row(0, list(range(n)))) for n in [2] * 19 + [40]]
    assert tr.block_tokens_for(rows, 512) == 256  # the 95th percentile is 2 blocks
    assert tr.block_tokens_for(rows, 20) == tr.MIN_BLOCK_TOKENS


def test_reuse_counts_a_block_only_with_its_whole_prefix() -> None:
    rows = [TraceRow.model_validate(_row(0, ids)) for ids in ([1, 2], [1, 2, 3], [5, 2])]
    got = tr.reuse(rows, max_blocks=8)
    assert got == {"rows": 3, "blocks": 7, "repeated_block_share": round(2 / 7, 4),
                   "rows_cut": 0}
    assert tr.reuse(rows, max_blocks=1)["rows_cut"] == 3


@pytest.mark.parametrize(("line", "said"), [
    (b"{not json", "line 2: not JSON"),
    (b"[1, 2]", "a list, not an object"),
    (json.dumps(_row(0, [1]) | {"input_length": True}).encode(), "input_length"),
    (json.dumps(_row(0, [1]) | {"input_length": 3.5}).encode(), "input_length"),
    (json.dumps(_row(0, [1]) | {"input_length": "512"}).encode(), "input_length"),
    (json.dumps(_row(0, [1]) | {"output_length": 0}).encode(), "output_length"),
    (json.dumps(_row(-1, [1])).encode(), "timestamp"),
    (b'{"timestamp": NaN, "input_length": 1, "output_length": 1, "hash_ids": [1]}',
     "timestamp"),
    (json.dumps(_row(0, [1]) | {"input_length": 10 ** 30}).encode(), "input_length"),
    (b'{"timestamp": 0, "input_length": 1' + b"0" * 5000 + b', "output_length": 1}',
     "not a UTF-8 JSON object"),
    (json.dumps(_row(0, list(range(tr.MAX_HASH_IDS + 1)))).encode(), "hash_ids"),
    (json.dumps(_row(0, [1]) | {"hash_ids": ["a"]}).encode(), "hash_ids.0"),
    (json.dumps(_row(0, [1]) | {"hash_ids": [-4]}).encode(), "hash_ids.0"),
    (json.dumps(_row(0, [1]) | {"hash_ids": []}).encode(), "hash_ids"),
    (json.dumps(_row(0, [1]) | {"text_input": "x"}).encode(), "text_input"),
    (json.dumps({"timestamp": 0, "input_length": 5, "hash_ids": [1]}).encode(),
     "output_length"),
    (b"\xff\xfe{}", "line 2: not JSON"),
])
def test_a_row_that_is_not_the_mooncake_format_is_refused_naming_line_and_field(
        tmp_path: Path, line: bytes, said: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(json.dumps(_row(0, [1])).encode() + b"\n" + line + b"\n")
    with pytest.raises(TraceError) as caught:
        read_trace(path)
    assert str(path) in str(caught.value) and said in str(caught.value), caught.value
    assert "line 2" in str(caught.value)


def test_a_trace_out_of_time_order_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, [_row(0, [1]), _row(2000, [2]), _row(1000, [3])])
    with pytest.raises(TraceError, match="line 3: timestamp 1000 is before the row above"):
        read_trace(path)


def test_files_without_bound_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    long_line = tmp_path / "long.jsonl"
    long_line.write_bytes(b" " * (tr.MAX_LINE_BYTES + 1) + b"\n")
    with pytest.raises(TraceError, match="line 1 is over"):
        read_trace(long_line)
    monkeypatch.setattr(tr, "MAX_ROWS", 3)
    with pytest.raises(TraceError, match="over 3 rows"):
        read_trace(_write(tmp_path, [_row(n, [n]) for n in range(4)]))
    monkeypatch.setattr(tr, "MAX_FILE_BYTES", 1000)
    with pytest.raises(TraceError, match="over 0 MiB"):
        read_trace(_write(tmp_path, [_row(n, [n, n + 1]) for n in range(3)] * 10))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("# only a comment\n\n")
    with pytest.raises(TraceError, match="no rows"):
        read_trace(empty)
    with pytest.raises(TraceError, match="cannot be read"):
        read_trace(tmp_path)
    with pytest.raises(TraceError, match="cannot be read"):
        read_trace(tmp_path / "absent.jsonl")


def test_the_trial_refuses_a_bad_trace_before_anything_is_asked_or_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    ledger = ledger_for_valid_env(tmp_path)

    def no_hosts(self: Context) -> None:
        raise AssertionError("the trial reached for its hosts")

    monkeypatch.setattr(Context, "sessions", no_hosts)
    bad = _write(tmp_path, [_row(0, [1]), {"timestamp": 1}])
    with pytest.raises(SystemExit) as exited:
        main(["trial", "--rates", "1", "--trace", str(bad), "--env", str(tmp_path / ".env"),
              "--runs", str(tmp_path / "runs")])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"{bad}: line 2: input_length" in err, err
    assert not ledger.exists()  # nothing recorded: not even the deployment's record
