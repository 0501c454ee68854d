"""Workload text sources through HF datasets: local JSON and JSONL files, trace files, clear errors, and the
packaged ShareGPT default left as it was."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from harness.workload import datasets_source as ds
from harness.workload import sharegpt as wl
from harness.workload.lengths import LengthDist
from harness.workload.registry import build_workload
from harness.workload.spec import WorkloadSpec

CONVS = [
    {"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"Question {i}: " + "why is the sky blue and the sea green " * (20 + i)},
        {"from": "gpt", "value": f"Answer {i}: " + "light scatters off small particles " * (30 + i)},
    ]}
    for i in range(12)
]


@pytest.fixture
def hf_cache(tmp_path: Path) -> Path:
    return tmp_path / "hf"


def write_json(path: Path, rows=CONVS) -> Path:
    path.write_text(json.dumps(rows))
    return path


def write_jsonl(path: Path, rows=CONVS) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("writer", [write_json, write_jsonl])
def test_local_json_and_jsonl_files_give_the_conversations(tmp_path, hf_cache, writer):
    path = writer(tmp_path / ("c.json" if writer is write_json else "c.jsonl"))
    src = ds.load_conversations(str(path), hf_cache)
    assert src.items == CONVS
    assert src.key == src.provenance["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert src.provenance["conversations"] == 12 and not src.provenance["truncated"]
    assert src.provenance["loader"].startswith("datasets ")
    assert any(hf_cache.iterdir())  # Arrow-cached by datasets


def test_messages_style_rows_and_missing_keys_are_normalized(tmp_path, hf_cache):
    rows = [{"messages": [{"role": "user", "content": "hello there"},
                          {"role": "assistant", "content": "hi"}]},
            {"id": "b", "messages": [{"role": "user", "content": "second"}]}]
    src = ds.load_conversations(str(write_jsonl(tmp_path / "m.jsonl", rows)), hf_cache)
    assert src.items == [
        {"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi"}]},
        {"id": "b", "conversations": [{"from": "human", "value": "second"}]}]  # no None filled in for "id"


def test_a_json_array_cut_mid_element_is_recovered(tmp_path, hf_cache):
    text = json.dumps(CONVS)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index('{"id": "c5"') + 40])
    src = ds.load_conversations(str(path), hf_cache)
    assert src.items == CONVS[:5] and src.provenance["truncated"] and src.provenance["conversations"] == 5


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        ds.load_conversations(str(tmp_path / "nope.jsonl"))


def test_malformed_jsonl_is_a_clear_error(tmp_path, hf_cache):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(CONVS[0]) + "\n{not json\n" + json.dumps(CONVS[1]) + "\n")
    with pytest.raises(ValueError, match="not a readable JSON/JSONL dataset"):
        ds.load_conversations(str(path), hf_cache)


def test_rows_without_conversations_are_a_clear_error(tmp_path, hf_cache):
    path = write_jsonl(tmp_path / "other.jsonl", [{"text": "a"}, {"text": "b"}])
    with pytest.raises(ValueError, match="no 'conversations'"):
        ds.load_conversations(str(path), hf_cache)


def test_unreachable_hub_id_is_a_clear_error(monkeypatch, hf_cache):
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # as on a machine without the network
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ds.DatasetUnavailable, match="could not load hub dataset 'someone/some-chats'.*local"):
        ds.load_conversations("someone/some-chats", hf_cache)


def test_a_name_that_is_neither_file_nor_hub_id_is_refused():
    with pytest.raises(ValueError, match="neither a local"):
        ds.load_conversations("a/b/c d")


def test_trace_files_are_recognized(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n')
    assert ds.is_trace_file(trace) and not ds.is_trace_file(write_jsonl(tmp_path / "c.jsonl"))
    assert not ds.is_trace_file(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="is a trace file"):
        ds.load_conversations(str(trace))


def test_tokenize_with_worker_processes_matches_in_process(tok_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    texts = [c["conversations"][0]["value"] for c in CONVS]
    assert ds.tokenize_texts(texts, tok, num_proc=2) == ds.tokenize_texts(texts, tok) \
        == [list(x) for x in tok(texts, add_special_tokens=False)["input_ids"]]


def test_packed_workload_from_a_jsonl_file(tmp_path, tok_dir):
    path = write_jsonl(tmp_path / "c.jsonl")
    s = WorkloadSpec(name="j", num_requests=3, input_len=LengthDist("fixed", value=300),
                     output_len=LengthDist("fixed", value=4), max_model_len=1024, dataset=str(path))
    w = build_workload(s, tok_dir, tmp_path / "cache")
    assert w.prompt_lengths() == [300] * 3 and "conv[" in w.requests[0].source
    assert w.provenance["sharegpt"]["path"] == str(path)
    again = build_workload(s, tok_dir, tmp_path / "cache")
    assert again.from_cache and again.requests == w.requests


def test_the_default_spec_caches_under_the_same_key_as_before():
    # the packaged copy is the default; the trace-only fields stay out of a sharegpt spec's cache key, so
    # its cached workloads (and the prompts in them) are the ones built before those fields existed
    s = WorkloadSpec(name="d", num_requests=2, input_len=LengthDist("fixed", value=10),
                     output_len=LengthDist("fixed", value=2), max_model_len=100)
    assert set(wl._spec_doc(s)) == {"name", "num_requests", "input_len", "output_len", "max_model_len",
                                    "seed", "num_warmup", "dataset"}
