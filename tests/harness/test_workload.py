"""Workloads: exact prompt lengths from real ShareGPT text, determinism, distinct prompts, the cache."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from harness.workload import packing
from harness.workload import sharegpt as wl
from harness.workload import sharegpt_file as sharegpt
from harness.workload.lengths import LengthDist
from harness.workload.registry import build_workload
from harness.workload.spec import WorkloadSpec

FIXED_OUT = LengthDist("fixed", value=32)


@pytest.fixture(scope="module")
def count(tok_dir: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    return lambda prompts: [len(x) for x in tok(prompts, add_special_tokens=True)["input_ids"]]


def spec(**kw) -> WorkloadSpec:
    base = dict(name="w", num_requests=6, input_len=LengthDist("fixed", value=2000), output_len=FIXED_OUT,
                max_model_len=8192, seed=1)
    return WorkloadSpec(**{**base, **kw})


def assert_exact(w: wl.Workload, count) -> None:
    reqs = w.requests + w.warmup
    recounted = count([r.prompt for r in reqs])
    assert recounted == [r.prompt_tokens for r in reqs] == [r.target_tokens for r in reqs]
    fit = w.provenance["length_fit"]
    assert fit["exact"] + fit["adjusted"] == len(reqs) and fit["within_tolerance"] == 0


# ------------------------------------------------------------------------------------------ lengths


def test_fixed_lengths_are_exact(tok_dir: Path, count) -> None:
    w = build_workload(spec(num_requests=8, num_warmup=2, input_len=LengthDist("fixed", value=3000)),
                       tok_dir, None)
    assert len(w.requests) == 8 and len(w.warmup) == 2
    assert w.prompt_lengths() == [3000] * 8 and w.output_lengths() == [32] * 8
    assert_exact(w, count)


@pytest.mark.parametrize("dist", [LengthDist("uniform", low=300, high=3000),
                                  LengthDist("normal", mean=1500, std=600, low=1000, high=2000)])
def test_drawn_lengths_respect_bounds_and_are_exact(tok_dir: Path, count, dist: LengthDist) -> None:
    w = build_workload(spec(num_requests=12, input_len=dist), tok_dir, None)
    lengths = w.prompt_lengths()
    assert all(dist.low <= n <= dist.high for n in lengths) and len(set(lengths)) > 3
    assert_exact(w, count)


def test_distributions_over_many_draws() -> None:
    rng = np.random.default_rng(0)
    u = np.array(LengthDist("uniform", low=10, high=20).draw(rng, 20000))
    assert u.min() == 10 and u.max() == 20 and abs(u.mean() - 15) < 0.1
    n = np.array(LengthDist("normal", mean=100, std=10, low=90, high=130).draw(rng, 20000))
    assert n.min() == 90 and n.max() <= 130 and (n == 90).mean() > 0.1  # clipped, not redrawn
    assert abs(np.median(n) - 100) <= 1
    assert LengthDist("fixed", value=7).draw(rng, 3) == [7, 7, 7]


def test_packed_prompts_are_real_sharegpt_text(tok_dir: Path) -> None:
    w = build_workload(spec(num_requests=2), tok_dir, None)
    items, _ = sharegpt.load()
    for r in w.requests:
        assert r.prompt.startswith(("User: ", "Assistant: ", "System: ")) and "conv[" in r.source
        first = int(r.source.split("conv[")[1].split("..")[0])
        assert r.prompt[:100] in packing._conversation_text(items[first])[:400]  # its start


def test_natural_lengths(tok_dir: Path, count) -> None:
    w = build_workload(spec(num_requests=10, input_len=LengthDist("natural", low=8, high=400),
                            output_len=LengthDist("data", high=1000)), tok_dir, None)
    assert all(8 <= n <= 400 for n in w.prompt_lengths())
    assert all(1 <= n <= 1000 for n in w.output_lengths()) and len(set(w.output_lengths())) > 1
    assert count([r.prompt for r in w.requests]) == w.prompt_lengths()
    assert len({r.prompt for r in w.requests}) == 10


def test_natural_output_for_packed_prompts(tok_dir: Path) -> None:
    w = build_workload(spec(output_len=LengthDist("natural", high=2000)), tok_dir, None)
    assert all(1 <= n <= 2000 for n in w.output_lengths()) and len(set(w.output_lengths())) > 1


def test_impossible_cut_starts_a_word_later_or_settles_within_tolerance(
        tok_dir: Path, count, tmp_path: Path, monkeypatch) -> None:
    # Byte-level BPE: "a\n\nb" is "a", "\n", "\n", "b", but a prompt ending "a\n\n" re-tokenizes as
    # "a", "\n\n"; so with seed 0 here no prefix cut of the text has 102 tokens.
    words = ("apple banana cherry grape lemon mango olive peach pear plum " * 30).split()
    convs = [{"id": f"c{i}", "conversations": [{"from": "human", "value": "\n\n".join(words[7 * i:])}]}
             for i in range(3)]
    path = tmp_path / "blank_lines.json"
    path.write_text(json.dumps(convs))
    s = spec(num_requests=1, seed=0, dataset=path, input_len=LengthDist("fixed", value=102))
    (r,) = build_workload(s, tok_dir, None).requests
    assert r.prompt_tokens == count([r.prompt])[0] == 102 and "characters skipped" in r.source
    monkeypatch.setattr(packing, "_WORD_START", re.compile(r"(?!)"))  # no word to start later at
    w = build_workload(s, tok_dir, None)
    (r,) = w.requests
    assert r.target_tokens == 102 and r.prompt_tokens == count([r.prompt])[0] == 101  # under, within 1%
    fit = {"exact": 0, "adjusted": 0, "within_tolerance": 1, "max_abs_error": 1}
    assert w.provenance["length_fit"] == fit


# -------------------------------------------------------------------------------- determinism and reuse


def test_same_seed_same_workload_other_seed_differs(tok_dir: Path) -> None:
    s = spec(input_len=LengthDist("uniform", low=500, high=1500), num_warmup=1)
    a, b = build_workload(s, tok_dir, None), build_workload(s, tok_dir, None)
    assert a == b
    c = build_workload(spec(input_len=s.input_len, num_warmup=1, seed=2), tok_dir, None)
    assert c.prompt_lengths() != a.prompt_lengths()
    assert not {r.prompt for r in a.requests} & {r.prompt for r in c.requests}


def test_prompts_are_distinct_from_their_first_characters(tok_dir: Path) -> None:
    w = build_workload(spec(num_requests=20, num_warmup=4, input_len=LengthDist("fixed", value=500)),
                       tok_dir, None)
    heads = {r.prompt[: packing._HEAD_CHARS] for r in w.requests + w.warmup}
    assert len(heads) == 24


def test_warmup_does_not_change_measured_requests(tok_dir: Path) -> None:
    a = build_workload(spec(num_warmup=0), tok_dir, None)
    b = build_workload(spec(num_warmup=3), tok_dir, None)
    assert a.requests == b.requests and len(b.warmup) == 3


def test_cache_is_reused_without_tokenizing(tok_dir: Path, tmp_path: Path, monkeypatch) -> None:
    s = spec()
    first = build_workload(s, tok_dir, tmp_path)
    files = list(tmp_path.glob("w-*.json"))
    assert not first.from_cache and len(files) == 1 and not list(tmp_path.glob(".*tmp"))

    def boom(*_a, **_k):
        raise AssertionError("the cache was not used")

    monkeypatch.setattr(wl, "_load_tokenizer", boom)
    monkeypatch.setattr(wl, "_load_dataset", boom)
    again = build_workload(s, tok_dir, tmp_path)
    assert again.from_cache and again == first
    assert again.provenance["sharegpt"]["conversations"] == 17671


@pytest.mark.parametrize("damage", ["truncate", "tamper", "garbage"])
def test_corrupted_cache_is_rebuilt_with_a_warning(tok_dir: Path, tmp_path: Path, damage: str) -> None:
    s = spec()
    first = build_workload(s, tok_dir, tmp_path)
    (path,) = tmp_path.glob("w-*.json")
    text = path.read_text()
    if damage == "truncate":
        path.write_text(text[: len(text) // 2])
    elif damage == "tamper":
        doc = json.loads(text)
        doc["payload"]["requests"][0]["prompt_tokens"] += 1
        path.write_text(json.dumps(doc))
    else:
        path.write_bytes(b"\xff\xfe not json")
    with pytest.warns(RuntimeWarning, match="rebuilding"):
        rebuilt = build_workload(s, tok_dir, tmp_path)
    assert not rebuilt.from_cache and rebuilt == first
    assert build_workload(s, tok_dir, tmp_path).from_cache  # the rebuilt file is valid again


def test_cache_key_follows_the_spec(tok_dir: Path, tmp_path: Path) -> None:
    build_workload(spec(seed=1), tok_dir, tmp_path)
    assert not build_workload(spec(seed=2), tok_dir, tmp_path).from_cache
    assert len(list(tmp_path.glob("w-*.json"))) == 2


# ----------------------------------------------------------------------------------- datasets and errors


def test_truncated_user_file_is_recovered(tok_dir: Path, tmp_path: Path) -> None:
    items, _ = sharegpt.load()
    text = json.dumps(items[100:106])
    path = tmp_path / "mine.json"
    path.write_text(text[: text.rindex('{"id"') + 30])  # cut inside the sixth conversation
    w = build_workload(spec(num_requests=3, input_len=LengthDist("fixed", value=200), dataset=path),
                       tok_dir, None)
    prov = w.provenance["sharegpt"]
    assert prov["conversations"] == 5 and prov["truncated"] and prov["path"] == str(path)


def test_file_without_a_complete_conversation_is_an_error(tok_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "empty.json"
    path.write_text('[{"id": "x", "conversations": [{"from": "human", "val')
    with pytest.raises(ValueError, match="no complete conversation"):
        build_workload(spec(dataset=path), tok_dir, None)


def test_lengths_over_max_model_len_are_refused() -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        spec(input_len=LengthDist("fixed", value=8000), output_len=LengthDist("fixed", value=193))
    with pytest.raises(ValueError, match="max_model_len"):
        spec(input_len=LengthDist("uniform", low=10, high=8190), max_model_len=8192)


def test_natural_lengths_over_max_model_len_fail_the_build(tok_dir: Path) -> None:
    s = spec(input_len=LengthDist("natural", low=200), output_len=LengthDist("natural"), max_model_len=300)
    with pytest.raises(ValueError, match="max_model_len"):
        build_workload(s, tok_dir, None)


@pytest.mark.parametrize(("kw", "match"), [
    (dict(kind="zipf"), "kind"),
    (dict(kind="fixed"), "needs"),
    (dict(kind="fixed", value=5, high=9), "takes only"),
    (dict(kind="uniform", low=9, high=5), "exceed"),
    (dict(kind="uniform", low=0, high=5), ">= 1"),
    (dict(kind="fixed", value=2.5), "integer"),
    (dict(kind="normal", mean=50, std=5, low=60, high=70), "outside"),
    (dict(kind="normal", mean=65, std=-1, low=60, high=70), "std"),
])
def test_length_dist_validation(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LengthDist(**kw)


def test_spec_validation_and_from_dict() -> None:
    with pytest.raises(ValueError, match="name"):
        spec(name="a/b")
    with pytest.raises(ValueError, match="num_requests"):
        spec(num_requests=0)
    s = WorkloadSpec.from_dict({"name": "x", "num_requests": 2, "max_model_len": 100,
                                "input_len": {"kind": "fixed", "value": 50},
                                "output_len": {"kind": "data", "high": 10}})
    assert s.output_len.kind == "natural" and s.input_len.value == 50


# ------------------------------------------------------------------------------------------ long prompts


@pytest.mark.slow
@pytest.mark.parametrize(("target", "n", "limit_s"), [(16384, 64, 120), (131072, 4, 60)])
def test_long_prompts_are_exact_and_fast(tok_dir: Path, count, target: int, n: int, limit_s: float) -> None:
    t0 = time.perf_counter()
    w = build_workload(spec(num_requests=n, seed=5, input_len=LengthDist("fixed", value=target),
                            max_model_len=target + 32), tok_dir, None)
    assert time.perf_counter() - t0 < limit_s
    assert_exact(w, count)
