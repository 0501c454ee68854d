"""harness.workload.trace_file: JSONL trace records, recovery from a cut last line, errors, windows, shipped
file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from harness.workload import trace_file
from harness.workload.trace_file import TraceFormatError, TraceRecord

SHIPPED_SHA256 = "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"


def _rec(ts: int, n: int, out: int, ids: list[int]) -> dict:
    return {"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": ids}


RECORDS = [
    _rec(0, 1000, 10, [0, 1]),
    _rec(5, 512, 3, [0]),
    _rec(5, 1025, 7, [0, 1, 2]),
    _rec(9, 20, 1, [3]),
]


def _write(tmp_path: Path, text: str, name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def _jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_valid_file(tmp_path: Path) -> None:
    text = _jsonl(RECORDS)
    p = _write(tmp_path, text)
    trace = trace_file.load(p)
    assert trace.records[0] == TraceRecord(0, 1000, 10, (0, 1))
    assert [r.input_length for r in trace.records] == [1000, 512, 1025, 20]
    prov = trace.provenance
    assert prov.records == 4 and not prov.truncated and prov.truncated_line is None
    assert prov.sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert prov.size_bytes == len(text.encode()) and prov.path == str(p)
    assert prov.source is None and prov.hash_block_tokens == 512
    with pytest.raises(AttributeError):
        trace.records[0].input_length = 3  # type: ignore[misc]


def test_last_line_without_newline_is_complete(tmp_path: Path) -> None:
    p = _write(tmp_path, _jsonl(RECORDS).rstrip("\n"))
    trace = trace_file.load(p)
    assert trace.provenance.records == 4 and not trace.provenance.truncated


def test_truncated_last_line_keeps_complete_records(tmp_path: Path) -> None:
    text = _jsonl(RECORDS)
    cut = text[: len(text) - 12]  # inside the fourth record
    p = _write(tmp_path, cut)
    trace = trace_file.load(p)
    assert len(trace.records) == 3
    assert trace.provenance.truncated and trace.provenance.truncated_line == 4
    assert trace.provenance.records == 3


def test_truncated_only_line_is_an_error(tmp_path: Path) -> None:
    p = _write(tmp_path, json.dumps(RECORDS[0])[:20])
    with pytest.raises(TraceFormatError, match="no complete trace record.*line 1 is cut"):
        trace_file.load(p)


def test_malformed_json_in_the_middle_names_the_line(tmp_path: Path) -> None:
    lines = _jsonl(RECORDS).splitlines()
    lines[1] = lines[1][:-5]  # broken, but followed by a newline: not a cut at the end
    p = _write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError, match=r"line 2: not valid JSON"):
        trace_file.load(p)


def test_bad_last_line_with_newline_is_an_error_not_a_cut(tmp_path: Path) -> None:
    p = _write(tmp_path, _jsonl(RECORDS[:2]) + '{"timestamp": 1,\n')
    with pytest.raises(TraceFormatError, match=r"line 3: not valid JSON"):
        trace_file.load(p)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"timestamp": 0, "input_length": 5, "output_length": 1}, "missing field 'hash_ids'"),
        ({"input_length": 5, "output_length": 1, "hash_ids": [1]}, "missing field 'timestamp'"),
        (_rec(0, 5, 1, [1]) | {"input_length": "5"}, "'input_length' must be an integer"),
        (_rec(0, 5, 1, [1]) | {"output_length": True}, "'output_length' must be an integer"),
        (_rec(-1, 5, 1, [1]), "'timestamp' must be >= 0"),
        (_rec(0, 0, 1, []), "'input_length' must be >= 1"),
        (_rec(0, 5, 1, [1, -2]), "'hash_ids' must be a list of non-negative integers"),
        (_rec(0, 600, 1, [1]), "1 hash_ids for input_length 600; expected 2"),
        ([1, 2, 3], "expected a JSON object, got list"),
    ],
)
def test_malformed_record(tmp_path: Path, record: object, message: str) -> None:
    p = _write(tmp_path, _jsonl(RECORDS[:1]) + json.dumps(record) + "\n" + _jsonl(RECORDS[1:2]))
    with pytest.raises(TraceFormatError, match=f"line 2: {message}"):
        trace_file.load(p)


def test_hash_block_size_is_a_parameter(tmp_path: Path) -> None:
    p = _write(tmp_path, _jsonl([_rec(0, 600, 1, [7, 8, 9])]))
    with pytest.raises(TraceFormatError, match="expected 2"):
        trace_file.load(p)
    trace = trace_file.load(p, hash_block_tokens=256)
    assert trace.hash_block_tokens == 256 and trace.records[0].hash_ids == (7, 8, 9)
    with pytest.raises(ValueError, match="hash_block_tokens"):
        trace_file.load(p, hash_block_tokens=0)


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    p = _write(tmp_path, text)
    with pytest.raises(TraceFormatError, match="no complete trace record.*empty"):
        trace_file.load(p)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="trace file not found"):
        trace_file.load(tmp_path / "nope.jsonl")


def test_window_time_first_and_scale() -> None:
    recs = [trace_file.parse_record(r, "x") for r in RECORDS]
    shuffled = [recs[3], recs[1], recs[0], recs[2]]
    ordered = trace_file.arrival_order(shuffled)
    assert [r.timestamp_ms for r in ordered] == [0, 5, 5, 9]
    assert ordered[1] is recs[1] and ordered[2] is recs[2]  # equal timestamps keep file order
    w = trace_file.window(recs, start_ms=5, duration_ms=4)
    assert [(r.timestamp_ms, r.input_length) for r in w] == [(0, 512), (0, 1025)]
    w = trace_file.window(recs, first=3, time_scale=2.0)
    assert [r.timestamp_ms for r in w] == [0, 10, 10]
    w = trace_file.window(recs, start_ms=1, time_scale=0.5)
    assert [r.timestamp_ms for r in w] == [2, 2, 4]
    assert trace_file.window(recs, first=0) == []
    for bad in ({"time_scale": 0.0}, {"duration_ms": 0}, {"first": -1}, {"start_ms": -3}):
        with pytest.raises(ValueError):
            trace_file.window(recs, **bad)  # type: ignore[arg-type]


def test_cap_input_length_drop_or_cut() -> None:
    recs = [trace_file.parse_record(r, "x") for r in RECORDS]
    kept, n = trace_file.cap_input_length(recs, 1000)
    assert n == 1 and [r.input_length for r in kept] == [1000, 512, 20]
    cut, n = trace_file.cap_input_length(recs, 600, mode="cut")
    assert n == 2
    expected = [(600, (0, 1)), (512, (0,)), (600, (0, 1)), (20, (3,))]
    assert [(r.input_length, r.hash_ids) for r in cut] == expected
    with pytest.raises(ValueError, match="mode"):
        trace_file.cap_input_length(recs, 600, mode="clip")


def test_shipped_trace_counts() -> None:
    trace = trace_file.load()
    prov = trace.provenance
    assert prov.records == 12031 and len(trace.records) == 12031
    assert not prov.truncated and prov.sha256 == SHIPPED_SHA256
    assert prov.source is not None and "Mooncake" in prov.source
    assert max(r.input_length for r in trace.records) == 126195
    assert trace.records[-1].timestamp_ms == 3536999
    ids = [h for r in trace.records for h in r.hash_ids]
    assert len(ids) == 288500 and len(set(ids)) == 182790
    # the provenance file beside it states the same
    text = (Path(trace_file.SHIPPED_TRACE).parent / "PROVENANCE.md").read_text()
    assert SHIPPED_SHA256 in text and "12,031" in text
