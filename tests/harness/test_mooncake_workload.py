"""Trace workloads: prefix sharing reproduced exactly in token space, context filtering and cutting, arrival
times, output lengths, configuration errors, and a replay through the client against the mock server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from harness.client import run_requests
from harness.serve.mock_server import MockConfig, MockServer
from harness.workload import mooncake as mw
from harness.workload.arrivals import LoadSpec
from harness.workload.lengths import LengthDist
from harness.workload.registry import build_workload
from harness.workload.spec import WorkloadSpec
from tests.harness.harness_run import run_harness

REPO = Path(__file__).resolve().parents[2]
B = 512
# (timestamp ms, input length, output length, hash ids): prefixes shared as a conversation trace shares them
RECORDS = [
    (1000, 1300, 40, [0, 1, 2]),
    (1000, 2000, 7, [0, 1, 3, 4]),
    (3000, 700, 0, [0, 5]),
    (7000, 1024, 300, [6, 7]),
    (8000, 2500, 12, [0, 1, 3, 4, 8]),
    (9500, 3000, 5, [0, 9, 10, 11, 12, 13]),
]


def write_trace(path: Path, records=RECORDS) -> Path:
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": o, "hash_ids": h})
                            + "\n" for t, n, o, h in records))
    return path


@pytest.fixture(scope="module")
def tok(tok_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tok_dir))


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    """A small ShareGPT-style file of varied English-like text (enough for ~60 pieces of 512 tokens)."""
    rng = np.random.default_rng(7)
    words = " ".join([
        "the of and to in is that for it as was with be by on not he this are or his from at which but",
        "have an they you were her she there been one all we their has would when if so no will more",
        "cache block range prefix token server model kernel memory request latency"]).split()
    convs = []
    for i in range(80):
        turns = [{"from": "human" if k % 2 == 0 else "gpt",
                  "value": " ".join(rng.choice(words, size=int(rng.integers(80, 300))))} for k in range(4)]
        convs.append({"id": f"c{i}", "conversations": turns})
    path = tmp_path_factory.mktemp("text") / "convs.json"
    path.write_text(json.dumps(convs))
    return path


def mspec(trace: Path, text: Path, **kw) -> WorkloadSpec:
    base = dict(name="m", kind="mooncake", num_requests=len(RECORDS), path=str(trace), dataset=str(text),
                max_model_len=8192, seed=3)
    return WorkloadSpec(**{**base, **kw})


def common_prefix(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# ----------------------------------------------------------------------------------- prefix sharing


def test_equal_hash_id_prefixes_give_equal_token_prefixes_and_nothing_more(tmp_path, text_file, tok_dir):
    w = build_workload(mspec(write_trace(tmp_path / "t.jsonl"), text_file), tok_dir, None)
    reqs = w.requests
    assert [r.prompt_tokens for r in reqs] == [len(r.prompt) for r in reqs] == [n for _, n, _, _ in RECORDS]
    for i, (_, _, _, hi) in enumerate(RECORDS):
        for j, (_, _, _, hj) in enumerate(RECORDS):
            if i >= j:
                continue
            k = common_prefix(hi, hj)
            shared = common_prefix(reqs[i].prompt, reqs[j].prompt)
            # equal ids: equal blocks (up to the shorter prompt); the next block differs in its first tokens
            assert shared >= min(k * B, len(reqs[i].prompt), len(reqs[j].prompt)), (i, j)
            if k < min(len(hi), len(hj)):
                assert shared < k * B + 16, (i, j, k, shared)  # not even one 16-token KV block more


def test_a_hash_id_is_the_same_512_tokens_wherever_it_appears_and_pieces_are_distinct(
        tmp_path, text_file, tok_dir):
    w = build_workload(mspec(write_trace(tmp_path / "t.jsonl"), text_file), tok_dir, None)
    blocks: dict[int, list[int]] = {}
    for r, (_, _, _, ids) in zip(w.requests, RECORDS, strict=True):
        for pos, h in enumerate(ids):
            got = r.prompt[pos * B:(pos + 1) * B]
            if len(got) == B:
                assert blocks.setdefault(h, got) == got
    assert len({tuple(b) for b in blocks.values()}) == len(blocks)  # distinct ids, distinct content
    assert w.provenance["trace"]["distinct_blocks"] == len({h for *_, ids in RECORDS for h in ids})


def test_pieces_are_the_texts_own_tokens(tmp_path, text_file, tok_dir, tok):
    from harness.workload.packing import _conversation_text

    w = build_workload(mspec(write_trace(tmp_path / "t.jsonl"), text_file), tok_dir, None)
    convs = json.loads(text_file.read_text())
    stream = [t for c in convs for t in tok(_conversation_text(c), add_special_tokens=False)["input_ids"]]
    joined = ",".join(map(str, stream + stream))  # the stream from any start, across the wrap
    first = w.requests[3].prompt  # its blocks 6, 7 are handed out after 0..5: consecutive in the stream
    assert ",".join(map(str, first)) in joined
    assert tok.decode(first[:B]).strip()  # real text


def test_builds_are_deterministic_and_seed_dependent(tmp_path, text_file, tok_dir):
    trace = write_trace(tmp_path / "t.jsonl")
    a = build_workload(mspec(trace, text_file), tok_dir, None)
    b = build_workload(mspec(trace, text_file), tok_dir, None)
    c = build_workload(mspec(trace, text_file, seed=4), tok_dir, None)
    assert [r.prompt for r in a.requests] == [r.prompt for r in b.requests]
    assert a.requests[0].prompt[:B] != c.requests[0].prompt[:B]


def test_special_prefix_replaces_the_first_tokens_and_keeps_the_length() -> None:
    pieces = {0: list(range(100, 100 + B)), 1: list(range(1000, 1000 + B))}
    ids = mw.prompt_ids([0, 1], 700, pieces, [1])
    assert len(ids) == 700 and ids[0] == 1 and ids[1:B] == pieces[0][1:] and ids[B:] == pieces[1][:700 - B]
    with pytest.raises(ValueError, match="fewer than input_length"):
        mw.prompt_ids([0], 600, pieces, [])


def test_special_prefix_of_a_tokenizer_with_bos(tok) -> None:
    class WithBos:
        def __call__(self, text, add_special_tokens=True):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            return {"input_ids": ([7] if add_special_tokens else []) + ids}

    assert mw.special_prefix(WithBos()) == [7]
    assert mw.special_prefix(tok) == []  # the tiny tokenizer adds none


def test_warmup_shares_no_block_with_the_measured_requests(tmp_path, text_file, tok_dir):
    w = build_workload(mspec(write_trace(tmp_path / "t.jsonl"), text_file, num_warmup=2), tok_dir, None)
    measured = {tuple(r.prompt[k:k + B]) for r in w.requests for k in range(0, len(r.prompt), B)}
    for r in w.warmup:
        assert r.prompt_tokens == len(r.prompt)
        assert not {tuple(r.prompt[k:k + B]) for k in range(0, len(r.prompt), B)} & measured


# ------------------------------------------------------------------------------ context and lengths


def test_filter_drops_requests_over_the_context_and_names_them(tmp_path, text_file, tok_dir):
    # 8000 + 12 and 9500: 3000 + 5 do not fit 2100; the others (outputs counted) do
    w = build_workload(mspec(write_trace(tmp_path / "t.jsonl"), text_file, num_requests=None,
                             max_model_len=2100), tok_dir, None)
    assert [r.prompt_tokens for r in w.requests] == [1300, 2000, 700, 1024]
    ov = w.provenance["trace"]["overflow"]
    assert ov["mode"] == "filter" and ov["count"] == 2 and ov["trace_lines"] == [5, 6]
    assert w.provenance["trace"]["records_used"] == 4
    assert all(r.prompt_tokens + r.max_tokens <= 2100 for r in w.requests)


def test_cut_shortens_prompts_to_fit_keeping_their_prefix(tmp_path, text_file, tok_dir):
    trace = write_trace(tmp_path / "t.jsonl")
    full = build_workload(mspec(trace, text_file), tok_dir, None)
    cut = build_workload(mspec(trace, text_file, max_model_len=2100, overflow="cut"), tok_dir, None)
    assert [r.prompt_tokens for r in cut.requests] == [1300, 2000, 700, 1024, 2100 - 12, 2100 - 5]
    ov = cut.provenance["trace"]["overflow"]
    assert ov["mode"] == "cut" and ov["count"] == 2 and ov["cut_lines"] == [5, 6]
    for a, b in zip(full.requests, cut.requests, strict=True):
        assert a.prompt[:b.prompt_tokens] == b.prompt  # a cut prompt is the start of the full one
    assert cut.requests[4].target_tokens == 2500 and "cut from 2500" in cut.requests[4].source


def test_too_few_requests_fit_is_a_clear_error(tmp_path, text_file, tok_dir):
    with pytest.raises(ValueError, match=r"only 4 of the 6 requests .*\(2 filtered"):
        build_workload(mspec(write_trace(tmp_path / "t.jsonl"), text_file, max_model_len=2100), tok_dir, None)


def test_output_lengths_come_from_the_trace_capped_and_at_least_one(tmp_path, text_file, tok_dir):
    trace = write_trace(tmp_path / "t.jsonl")
    w = build_workload(mspec(trace, text_file), tok_dir, None)
    assert w.output_lengths() == [40, 7, 1, 300, 12, 5]  # a 0 becomes 1: the server needs max_tokens >= 1
    capped = build_workload(mspec(trace, text_file, output_len=LengthDist("natural", high=10)), tok_dir, None)
    assert capped.output_lengths() == [10, 7, 1, 10, 10, 5]
    ov = capped.provenance["trace"]["overflow"]
    assert ov["outputs_capped"] == 3 and ov["outputs_raised_to_1"] == 1


# ---------------------------------------------------------------------------------------- arrivals


def test_arrivals_are_trace_times_from_the_first_request_scaled(tmp_path, text_file, tok_dir):
    trace = write_trace(tmp_path / "t.jsonl")
    w = build_workload(mspec(trace, text_file, time_scale=0.5), tok_dir, None)
    assert w.arrivals == pytest.approx([0.0, 0.0, 1.0, 3.0, 3.5, 4.25])
    slow = build_workload(mspec(trace, text_file, time_scale=2.0), tok_dir, None)
    assert slow.arrivals == pytest.approx([0.0, 0.0, 4.0, 12.0, 14.0, 17.0])


def test_window_and_first_n(tmp_path, text_file, tok_dir):
    trace = write_trace(tmp_path / "t.jsonl")
    w = build_workload(mspec(trace, text_file, start_s=2.0, duration_s=6.5, num_requests=None), tok_dir, None)
    assert [r.prompt_tokens for r in w.requests] == [700, 1024, 2500]  # t = 3000, 7000, 8000 ms
    assert w.arrivals == pytest.approx([0.0, 4.0, 5.0])
    assert w.provenance["trace"]["lines_used"] == [3, 4, 5]
    first2 = build_workload(mspec(trace, text_file, start_s=2.0, num_requests=2), tok_dir, None)
    assert [r.prompt_tokens for r in first2.requests] == [700, 1024]


def test_trace_records_out_of_order_are_replayed_in_arrival_order(tmp_path, text_file, tok_dir):
    recs = [RECORDS[2], RECORDS[0], RECORDS[1]]  # 3000, 1000, 1000 ms
    trace = write_trace(tmp_path / "t.jsonl", recs)
    w = build_workload(mspec(trace, text_file, num_requests=3), tok_dir, None)
    assert [r.prompt_tokens for r in w.requests] == [1300, 2000, 700]
    assert w.arrivals == pytest.approx([0.0, 0.0, 2.0])
    assert w.provenance["trace"]["lines_used"] == [2, 3, 1]


def test_provenance_records_the_trace_file(tmp_path, text_file, tok_dir):
    import hashlib

    trace = write_trace(tmp_path / "t.jsonl")
    p = build_workload(mspec(trace, text_file), tok_dir, None).provenance
    assert p["trace"]["path"] == str(trace) and p["trace"]["records"] == 6
    assert p["trace"]["sha256"] == hashlib.sha256(trace.read_bytes()).hexdigest()
    assert p["sharegpt"]["path"] == str(text_file) and p["prompts"] == "token ids"


def test_shipped_trace_is_the_default_path() -> None:
    from harness.workload.trace_file import SHIPPED_TRACE

    s = WorkloadSpec(name="m", kind="mooncake", num_requests=1, max_model_len=100)
    assert s.trace_path == SHIPPED_TRACE and SHIPPED_TRACE.is_file()


# -------------------------------------------------------------------------------- configuration errors


def test_a_trace_file_as_the_dataset_makes_a_trace_replay(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl")
    s = WorkloadSpec(name="x", num_requests=2, max_model_len=4096, dataset=str(trace),
                     input_len=LengthDist("uniform", low=10, high=20),
                     output_len=LengthDist("fixed", value=8))
    assert s.kind == "mooncake" and s.path == str(trace) and s.dataset is None
    assert s.input_len == LengthDist("natural") and s.output_len == LengthDist("natural", high=8)


@pytest.mark.parametrize(("kw", "match"), [
    ({"input_len": LengthDist("fixed", value=100)}, "input lengths are its own"),
    ({"input_len": LengthDist("natural", high=100)}, "without bounds"),
    ({"output_len": LengthDist("fixed", value=8)}, "output lengths are its own"),
    ({"overflow": "drop"}, "overflow must be one of"),
    ({"time_scale": 0}, "time_scale must be"),
    ({"start_s": -1}, "start_s must be"),
    ({"duration_s": 0}, "duration_s must be"),
    ({"num_proc": 0}, "num_proc must be"),
    ({"kind": "other"}, "kind must be one of"),
])
def test_bad_trace_specs_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        WorkloadSpec(**{"name": "m", "kind": "mooncake", "num_requests": 2, "max_model_len": 100, **kw})


def test_trace_fields_on_a_sharegpt_workload_are_refused():
    with pytest.raises(ValueError, match="apply to kind mooncake only"):
        WorkloadSpec(name="s", num_requests=1, input_len=LengthDist("fixed", value=10),
                     output_len=LengthDist("fixed", value=2), max_model_len=100, time_scale=2.0)


def test_load_trace_needs_a_trace_workload(tmp_path):
    from harness.config import BenchConfig, ModelConfig, RunConfig, ServerConfig

    sharegpt = WorkloadSpec(name="s", num_requests=1, input_len=LengthDist("fixed", value=10),
                            output_len=LengthDist("fixed", value=2), max_model_len=100)
    with pytest.raises(ValueError, match="load=trace .* needs a trace workload"):
        BenchConfig(ModelConfig("m", str(tmp_path)), ServerConfig(), sharegpt, LoadSpec(mode="trace"),
                    RunConfig(), tmp_path, tmp_path)
    with pytest.raises(ValueError, match="takes no request_rate"):
        LoadSpec(mode="trace", request_rate=1.0)


def test_missing_and_malformed_trace_files_are_clear_errors(tmp_path, text_file, tok_dir):
    from harness.workload.trace_file import TraceFormatError

    with pytest.raises(FileNotFoundError, match="trace file not found"):
        build_workload(mspec(tmp_path / "nope.jsonl", text_file), tok_dir, None)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 1300, "output_length": 4, "hash_ids": [0, 1]}\n')
    with pytest.raises(TraceFormatError, match="line 1"):
        build_workload(mspec(bad, text_file, num_requests=1), tok_dir, None)


# ----------------------------------------------------------------------------------- replay (client)


def test_replay_sends_token_ids_at_the_trace_times_to_the_mock_server(tmp_path, text_file, tok_dir):
    w = build_workload(mspec(write_trace(tmp_path / "t.jsonl"), text_file, time_scale=0.05), tok_dir, None)

    async def go():
        async with MockServer(MockConfig(ttft_s=0.001)) as srv:
            results, _ = await run_requests(srv.url, "mock", w.requests, w.arrivals, timeout_s=30)
            return results, srv.seen

    results, seen = asyncio.run(go())
    assert all(r.success for r in results)
    # the mock server sees the prompt as a JSON list: its length is the token count
    assert sorted(s.prompt_chars for s in seen) == sorted(n for _, n, _, _ in RECORDS)
    assert [r.scheduled_s for r in results] == pytest.approx(w.arrivals)
    assert all(r.sent_s >= r.scheduled_s for r in results)
    assert [r.completion_tokens for r in results] == w.output_lengths()


@pytest.mark.slow
def test_tiny_trace_replay_through_real_servers_hits_the_prefix_cache(tmp_path):
    """A five-request trace through `harness.main` (paged, then tagma): every request completes with the
    trace's lengths, and the paged server reports prefix-cache hits (the shared leading blocks)."""
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    trace = write_trace(tmp_path / "t.jsonl", RECORDS[:5])
    summary = run_harness(
        tmp_path, "mc",
        "run=ci", f"workload.path={trace}",
        "workload.num_requests=5", "workload.num_warmup=1", "workload.time_scale=0.2",
        "workload.output_len={kind: natural, high: 4}", "server.max_model_len=4096",
        "server.kv_cache_space_gib=1",
        config_name="mooncake_cpu",
    )  # fmt: skip
    root = tmp_path / "mc"
    for arm in ("baseline", "candidate"):
        assert summary["arms"][arm]["completed"] == 5 and summary["arms"][arm]["failed"] == 0
    lines = (root / "runs/00-baseline-paged/requests.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["prompt_tokens"] for r in rows] == [n for _, n, _, _ in RECORDS[:5]]  # the server's own count
    assert [r["completion_tokens"] for r in rows] == [4, 4, 1, 4, 4]
    workload = json.loads((root / "workload.json").read_text())
    assert workload["provenance"]["trace"]["sha256"] and workload["provenance"]["trace"]["records_used"] == 5
    assert summary["telemetry"]["00-baseline-paged"]["prefix_cache_hit_rate"] > 0
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before  # no server left behind


def test_pieces_stay_distinct_when_the_text_wraps_around(tok):
    convs = [{"conversations": [{"from": "human", "value": f"short text number {i} " * 60}]}
             for i in range(3)]
    stream = mw.PieceStream(convs, tok, 64, start=1)
    pieces = [stream.next() for _ in range(200)]  # many passes over the three conversations
    assert stream.walked > 3 * 3 and len({tuple(p) for p in pieces}) == 200
    assert all(len(p) == 64 for p in pieces)
    tiny = mw.PieceStream([{"conversations": [{"from": "human", "value": "one two three four"}]}], tok, 4, 0)
    with pytest.raises(ValueError, match="distinct 4-token pieces; more are needed"):
        [tiny.next() for _ in range(100)]
    with pytest.raises(ValueError, match="hold no text"):
        mw.PieceStream([{"conversations": []}], tok, 64, start=0).next()


def test_the_report_states_the_trace_and_what_the_context_limit_did(tmp_path, text_file, tok_dir):
    from harness.report import trace_lines

    w = build_workload(mspec(write_trace(tmp_path / "t.jsonl"), text_file, num_requests=None,
                             max_model_len=2100), tok_dir, None)
    (line,) = trace_lines(w.provenance["trace"])
    assert "4 of 6 records" in line and "2 filtered (trace lines [5, 6])" in line
    assert trace_lines(None) == []
