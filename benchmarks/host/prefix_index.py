"""Section ``prefix_index``: the engine's token-keyed prefix index against vLLM's block hashing and lookup.

For each context C (tokens, block_size b, n = C // b full blocks), token ids drawn from a 128K vocabulary
(distinct Python ints, as a real prompt's list holds):

* ``hash``: vLLM's request block hasher (``get_request_block_hasher`` with the hash function the installed
  vLLM's ``CacheConfig`` defaults to) computing every block hash of a C-token ``Request``, per token. This is
  the work vLLM does for every request when prefix caching is on; tagma's counterpart is ``insert``.
* ``insert_list`` / ``insert_array``: :meth:`PrefixIndex.insert` of a request holding n blocks, from the
  Python list (what vLLM has) and from an int32 numpy array (the C side alone), per token.
* ``lookup_list`` / ``lookup_array``: :meth:`PrefixIndex.lookup` of a fully cached prompt, per token.
* ``convert``: getting a C-token list to int32 memory: ``array.array('i', lst)`` and the binding's C reader
  (``libtagma_pylist.so``), per token.
* ``hit_lookup`` (interleaved): vLLM's ``KVCacheManager.get_computed_blocks`` of a request whose whole
  prompt is cached (its block hashes were computed when the request was built: not timed) against
  :meth:`PrefixIndex.lookup_ids` of the same prompt as int32 tokens (converted once per request, as vLLM
  hashes once: not timed) and, third, from the Python list (the conversion timed); all return the hit's
  block ids. The prompt's int objects are cold after vLLM's side ran, as in a server.
* ``fixed_cost``: a one-block lookup through the binding against a bare ctypes call of the engine
  (``tagma_request_num_ranges``), interleaved: the binding's own cost per call is the difference.
* ``eviction_modes``: what contiguity costs in hit rate. A trace of records with ``hash_ids`` (Mooncake's
  format: each id names a 512-token block, shared ids mean shared prefixes) is replayed through the engine
  alone once per eviction mode, same pool, same order: each request looks up and attaches its cached prefix,
  gets blocks for the rest, indexes its prompt, then decodes ``output_length`` tokens one block per step
  interleaved with the other live requests (``concurrency`` of them; each growth passes the blocks it has
  left as the hint), indexing its decode blocks too (as vLLM caches them), and is released. Reports hit rate
  (hit / prompt tokens), ranges per request (at release) and evictions per mode; LRU is vLLM's exact order.
"""

from __future__ import annotations

import array
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
from vllm.config.cache import CacheConfig
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

from benchmarks.host.manager_ops import admit, build_managers, make_request
from benchmarks.host.timing import interleaved, pair_entry, summarize, timed_ns
from tagma.engine import RangeEngine
from tagma.engine import prefix_index as prefix_module
from tagma.engine.prefix_index import EvictionMode, PrefixIndex

__all__ = ["run"]

VOCAB = 128_000


def _hash_name() -> str:
    return str(CacheConfig.__dataclass_fields__["prefix_caching_hash_algo"].default)


def _samples(fn: Any, repeats: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    return [float(fn()) for _ in range(repeats)]


def per_token(cfg: dict[str, Any], context: int) -> dict[str, Any]:
    """Per-token costs at one context (ns/token)."""
    bs = int(cfg["block_size"])
    timing = cfg["timing"]
    repeats, warmup = int(timing["repeats"]), int(timing["warmup"])
    n = context // bs
    rng = np.random.default_rng(int(cfg["seed"]) + context)
    tokens: list[int] = rng.integers(0, VOCAB, size=n * bs).tolist()
    arr = np.array(tokens, dtype=np.int32)

    hash_fn = get_hash_fn_by_name(_hash_name())
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(bs, hash_fn)
    req = make_request("hash", tokens, bs, caching=False)  # no hasher: block_hashes stays empty
    assert len(hasher(req)) == n

    engine = RangeEngine(n + 64)
    index = PrefixIndex(engine, bs)

    def insert_ns(source: Any) -> int:
        r = engine.create_request()
        engine.append_runs(r, n)
        ns = timed_ns(lambda: index.insert(0, r, source))
        engine.release(r)
        index.clear()
        return ns

    out: dict[str, Any] = {"context_tokens": context, "blocks": n, "hash_function": _hash_name()}
    scale = 1.0 / (n * bs)
    out["hash"] = summarize(
        _samples(lambda: timed_ns(lambda: hasher(req)), repeats, warmup), "ns/token", scale
    )
    out["insert_list"] = summarize(_samples(lambda: insert_ns(tokens), repeats, warmup), "ns/token", scale)
    out["insert_array"] = summarize(_samples(lambda: insert_ns(arr), repeats, warmup), "ns/token", scale)
    r = engine.create_request()
    engine.append_runs(r, n)
    index.insert(0, r, tokens)
    engine.release(r)  # cached, cache-only
    assert index.lookup(0, tokens) == n
    out["lookup_list"] = summarize(
        _samples(lambda: timed_ns(lambda: index.lookup(0, tokens)), repeats, warmup), "ns/token", scale
    )
    out["lookup_array"] = summarize(
        _samples(lambda: timed_ns(lambda: index.lookup(0, arr)), repeats, warmup), "ns/token", scale
    )
    out["convert_array_array"] = summarize(
        _samples(lambda: timed_ns(lambda: array.array("i", tokens)), repeats, warmup), "ns/token", scale
    )
    out["c_list_reader"] = prefix_module.pylist_available()
    engine.close()
    for key in ("insert", "lookup"):
        out[f"{key}_list"]["median_minus_array"] = (
            out[f"{key}_list"]["median"] - out[f"{key}_array"]["median"]
        )
    out["index_array_ns_per_token"] = out["insert_array"]["median"] + out["lookup_array"]["median"]
    out["index_list_ns_per_token"] = out["insert_list"]["median"] + out["lookup_list"]["median"]
    return out


def hit_lookup(cfg: dict[str, Any], context: int) -> dict[str, Any]:
    """vLLM's get_computed_blocks vs the index's lookup_ids on a fully cached prompt (us per call)."""
    bs = int(cfg["block_size"])
    timing = cfg["timing"]
    n = context // bs
    rng = np.random.default_rng(int(cfg["seed"]) + 7 * context)
    prompt: list[int] = rng.integers(0, VOCAB, size=n * bs + 1).tolist()  # n full blocks hit, one token left
    init_none_hash(get_hash_fn_by_name(_hash_name()))
    manager = build_managers(n + 64, bs, context + bs, True, cfg["manager"]["policy"])["paged"]
    owner = make_request("owner", prompt, bs, True)
    admit(manager, owner)
    manager.free(owner)
    query = make_request("query", prompt, bs, True)
    assert manager.get_computed_blocks(query)[1] == n * bs

    engine = RangeEngine(n + 64)
    index = PrefixIndex(engine, bs)
    r = engine.create_request()
    engine.append_runs(r, n + 1)
    index.insert(0, r, prompt)
    engine.release(r)
    max_blocks = (len(prompt) - 1) // bs
    assert len(index.lookup_ids(0, prompt, max_blocks)) == n

    arr = np.array(prompt, dtype=np.int32)
    samples = interleaved(
        {
            "paged": lambda: timed_ns(lambda: manager.get_computed_blocks(query)[0].get_block_ids()),
            "tagma": lambda: timed_ns(lambda: index.lookup_ids(0, arr, max_blocks)),
            "tagma_list": lambda: timed_ns(lambda: index.lookup_ids(0, prompt, max_blocks)),
        },
        int(timing["repeats"]),
        int(timing["warmup"]),
    )
    entry = pair_entry(
        samples["paged"],
        samples["tagma"],
        "us",
        scale=1e-3,
        op="prefix_hit_lookup_engine",
        context_tokens=context,
        blocks=n,
        hit_blocks=n,
        paged_side="KVCacheManager.get_computed_blocks(req) + get_block_ids() "
        "(block hashes computed when the request was built: not timed)",
        tagma_side="PrefixIndex.lookup_ids(ns, int32 tokens, max_blocks) (tokens converted once per request, "
        "as vLLM hashes once: not timed)",
    )
    entry["tagma_from_list"] = summarize(samples["tagma_list"], "us", 1e-3)
    entry["speedup_from_list"] = entry["paged"]["median"] / entry["tagma_from_list"]["median"]
    engine.close()
    return entry


def fixed_cost(cfg: dict[str, Any]) -> dict[str, Any]:
    """ns per call: a one-block lookup through the binding vs a bare ctypes call of the engine."""
    bs = int(cfg["block_size"])
    timing = cfg["timing"]
    batch = 2000
    engine = RangeEngine(64)
    index = PrefixIndex(engine, bs)
    r = engine.create_request()
    engine.append_runs(r, 1)
    tokens = list(range(1000, 1000 + bs))
    index.insert(0, r, tokens)
    bare, handle, out = engine._f_num_ranges, engine.handle, engine._i64_p  # noqa: SLF001 - the floor

    def bare_batch() -> float:
        def body() -> None:
            for _ in range(batch):
                bare(handle, r, out)

        return timed_ns(body) / batch

    def lookup_batch() -> float:
        def body() -> None:
            for _ in range(batch):
                index.lookup(0, tokens)

        return timed_ns(body) / batch

    samples = interleaved({"paged": bare_batch, "tagma": lookup_batch}, int(timing["repeats"]), 1)
    entry = pair_entry(
        samples["paged"],
        samples["tagma"],
        "ns",
        op="prefix_binding_fixed",
        block_size=bs,
        paged_side="bare ctypes call tagma_request_num_ranges (the floor of any crossing)",
        tagma_side=f"PrefixIndex.lookup of one {bs}-token block from a list",
    )
    entry["binding_cost_ns"] = entry["tagma"]["median"] - entry["paged"]["median"]
    engine.close()
    return entry


# ------------------------------------------------------------------------------- eviction modes on a trace

HASH_BLOCK_TOKENS = 512  # tokens named by one hash id in Mooncake's traces


def load_trace(path: Path, max_requests: int, max_input: int) -> list[dict[str, Any]]:
    """The first ``max_requests`` records with ``input_length <= max_input`` (input_length, output_length,
    hash_ids)."""
    records: list[dict[str, Any]] = []
    with path.open() as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            if int(rec["input_length"]) <= max_input:
                records.append(rec)
                if len(records) == max_requests:
                    break
    return records


def _prompt(rec: dict[str, Any]) -> np.ndarray:
    """Token ids of a record: hash id h's block is h * 512 + [0, 512) (distinct ids share no token block)."""
    ids = np.asarray(rec["hash_ids"], dtype=np.int64)
    base = (ids * HASH_BLOCK_TOKENS)[:, None] + np.arange(HASH_BLOCK_TOKENS, dtype=np.int64)[None, :]
    tokens = (base.reshape(-1) % (2**31 - 1)).astype(np.int32)
    return tokens[: int(rec["input_length"])]


def replay(
    records: list[dict[str, Any]], mode: EvictionMode, pool_blocks: int, bs: int, concurrency: int
) -> dict:
    engine = RangeEngine(pool_blocks + 1)
    index = PrefixIndex(engine, bs, mode)
    rng = np.random.default_rng(0)
    live: list[dict[str, Any]] = []
    prompt_tokens = hit_tokens = rejected = 0
    ranges: list[int] = []
    pending = list(records)

    def admit(rec: dict[str, Any]) -> bool:
        nonlocal prompt_tokens, hit_tokens, rejected
        tokens = _prompt(rec)
        out_blocks = -(-int(rec["output_length"]) // bs)
        total = -(-(tokens.size + out_blocks * bs) // bs)
        s = engine.stats()
        if total > s.free_blocks + s.cached_only_blocks:
            rejected += 1
            return False
        req = engine.create_request()
        hit = index.lookup_attach(0, req, tokens, max(tokens.size - 1, 0) // bs)
        need = -(-tokens.size // bs) - hit
        if need > 0:
            engine.append_runs(req, need, hint=need + out_blocks)
        index.insert(0, req, tokens)
        prompt_tokens += int(tokens.size)
        hit_tokens += hit * bs
        decode = rng.integers(0, 128_000, size=out_blocks * bs, dtype=np.int32)
        live.append(
            {"req": req, "tokens": np.concatenate([tokens, decode]), "left": out_blocks, "at": tokens.size}
        )
        return True

    while pending or live:
        while pending and len(live) < concurrency:
            admit(pending.pop(0))
        for item in list(live):  # one decode block per live request per step
            if item["left"] > 0:
                req = item["req"]
                have = engine.num_blocks_of(req) * bs
                item["at"] += bs
                if item["at"] > have:
                    engine.append_runs(req, 1, hint=item["left"])
                indexed = index.insert(0, req, item["tokens"][: item["at"]])
                del indexed
                item["left"] -= 1
            if item["left"] <= 0:
                ranges.append(engine.num_ranges(item["req"]))
                engine.release(item["req"])
                live.remove(item)
    stats = index.stats()
    engine_stats = engine.stats()
    engine.close()
    arr = np.asarray(ranges or [0])
    return {
        "mode": mode.name.lower(),
        "requests": len(ranges),
        "rejected": rejected,
        "hit_rate": hit_tokens / prompt_tokens if prompt_tokens else 0.0,
        "hit_tokens": hit_tokens,
        "prompt_tokens": prompt_tokens,
        "ranges_mean": float(arr.mean()),
        "ranges_p99": float(np.percentile(arr, 99)),
        "ranges_max": int(arr.max()),
        "evicted_blocks": stats.evicted_blocks,
        "subtree_blocks": stats.subtree_blocks,
        "in_place_evictions": stats.in_place_evictions,
        "window_evictions": stats.window_evictions,
        "in_place_growths": engine_stats.in_place_growths,
    }


def eviction_modes(cfg: dict[str, Any]) -> dict[str, Any]:
    tcfg = cfg["prefix_index"]["trace"]
    path = Path(str(tcfg["path"])) if tcfg.get("path") else None
    if path is None or not path.is_file():
        return {"skipped": f"no trace file at {path}"}
    records = load_trace(path, int(tcfg["max_requests"]), int(tcfg["max_input"]))
    bs = int(cfg["block_size"])
    out: dict[str, Any] = {
        "trace": str(path),
        "records": len(records),
        "max_input": int(tcfg["max_input"]),
        "concurrency": int(tcfg["concurrency"]),
        "block_size": bs,
        "pools": [],
    }
    for pool in (int(p) for p in tcfg["pool_blocks"]):
        modes = [replay(records, mode, pool, bs, int(tcfg["concurrency"])) for mode in EvictionMode]
        lru = modes[0]["hit_rate"]
        for m in modes:
            m["hit_rate_points_vs_lru"] = 100.0 * (m["hit_rate"] - lru)
        out["pools"].append({"pool_blocks": pool, "modes": modes})
    return out


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    contexts = [int(c) for c in cfg["prefix_index"]["contexts"]]
    return {
        "per_token": [per_token(cfg, c) for c in contexts],
        "hit_lookup": [hit_lookup(cfg, c) for c in contexts],
        "fixed_cost": fixed_cost(cfg),
        "eviction_modes": eviction_modes(cfg),
        "c_list_reader": prefix_module.pylist_available(),
        "hash_function": _hash_name(),
        "stats_fields": [f.name for f in dataclasses.fields(prefix_module.PrefixStats)],
    }
