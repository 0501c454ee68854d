"""vLLM with xxhash (--prefix-caching-hash-algo xxhash) as a bench side: the hashes it makes serve vLLM's
manager exactly as sha256's do, each algorithm chains onto its own NONE_HASH, and the report carries the
extra column and target row. Structure only, no timing values."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytest.importorskip("xxhash")

from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402

from benchmarks.host import hashing  # noqa: E402
from benchmarks.host.main import fast_hash_identical  # noqa: E402
from benchmarks.host.manager_ops import Tokens, admit, make_request, vllm_manager  # noqa: E402
from benchmarks.host.report import prefix_ops as prefix_report  # noqa: E402
from benchmarks.host.report import trace_replay as trace_report  # noqa: E402
from benchmarks.host.report.table import TARGETS, summary_table  # noqa: E402
from benchmarks.host.trace_jobs import ReplayConfig, jobs_from_records  # noqa: E402
from benchmarks.host.trace_replay import replay  # noqa: E402
from harness.workload.trace_file import TraceRecord  # noqa: E402

BS = 16


def test_algorithms_by_name() -> None:
    assert hashing.available("sha256") is None and hashing.available("xxhash") is None
    assert "Unsupported" in (hashing.available("md5") or "")
    assert hashing.side_name("sha256") == "paged" and hashing.side_name("xxhash") == "paged_xxhash"


def test_each_algorithm_has_its_own_none_hash_and_use_restores_the_global() -> None:
    before = kv_cache_utils.NONE_HASH
    sha, xx = hashing.none_hash("sha256"), hashing.none_hash("xxhash")
    assert before == kv_cache_utils.NONE_HASH  # deriving does not move the global
    assert len(sha) == 32 and len(xx) == 16  # sha256 digest vs xxh3_128 digest
    if hashing.seed_source("sha256") == kv_cache_utils.DEFAULT_NONE_HASH_SEED:
        assert sha == get_hash_fn_by_name("sha256")(kv_cache_utils.DEFAULT_NONE_HASH_SEED)
    assert hashing.none_hash("xxhash") == xx  # once per process, as vLLM's engine core
    with hashing.use("xxhash"):
        assert xx == kv_cache_utils.NONE_HASH
        req = make_request("x", list(range(3 * BS)), BS, caching=True, hash_algo="xxhash")
        first = get_hash_fn_by_name("xxhash")((xx, tuple(range(BS)), None))
        assert req.block_hashes[0] == first  # the first block chains onto xxhash's NONE_HASH
    assert before == kv_cache_utils.NONE_HASH


def _hits(algo: str) -> list[int]:
    """A shared-prefix sequence through vLLM's manager with requests hashed by ``algo``."""
    tokens = Tokens(5)
    base = tokens(8 * BS)
    shared = base[: 5 * BS] + tokens(3 * BS + 7)
    prompts = [base, shared, base + tokens(2 * BS), tokens(4 * BS), base[: BS + 3]]
    manager = vllm_manager(64, BS, 16 * BS, True)
    hits = []
    with hashing.use(algo):
        for i, prompt in enumerate(prompts):
            req = make_request(f"r{i}", prompt, BS, caching=True, hash_algo=algo)
            hit, blocks = admit(manager, req)
            assert blocks is not None
            hits.append(hit)
            manager.free(req)
    return hits


def test_xxhash_block_hashes_give_the_managers_sha256_hits() -> None:
    sha = _hits("sha256")
    assert sha == [0, 5 * BS, 8 * BS, 0, BS]
    assert _hits("xxhash") == sha


def test_trace_replay_xxhash_side_hits_as_sha256() -> None:
    records = [
        TraceRecord(0, 1024, 8, (1, 2)),
        TraceRecord(10_000, 1536, 8, (1, 2, 3)),
        TraceRecord(20_000, 700, 4, (1, 9)),
    ]
    cfg = ReplayConfig(pool_blocks=1024, max_num_batched_tokens=2048)
    jobs, _ = jobs_from_records(records, cfg)
    out = replay(jobs, cfg, hash_sides={"paged_xxhash": "xxhash"})
    fast = out["sides"]["paged_xxhash"]
    assert fast["hash_algo"] == "xxhash" and out["sides"]["paged"]["hash_algo"] == "sha256"
    assert fast["hit_tokens"] == out["sides"]["paged"]["hit_tokens"] > 0
    assert out["same_hits_per_request_vs_paged"]["paged_xxhash"] is True
    info = out["fast_hash"]["paged_xxhash"]
    assert info["algo"] == "xxhash" and info["same_hits_as_sha256"] is True
    assert set(info["admission_with_build_us_mean"]) == {"paged", "tagma", "paged_xxhash"}
    assert info["tagma/fast_admission_with_build"] > 0
    rows = trace_report.headline_rows({**out, "trace": {"path": "t.jsonl"}, "selection": {
        "too_large_for_pool": 0, "over_max_input_length": 0, "cap_mode": "drop"}}, [])  # fmt: skip
    hashed = [r for r in rows if r.get("paged_fast") is not None]
    assert [r["metric"] for r in hashed] == ["trace admission + request hashing per request"]
    assert hashed[0]["fast_hash"] == "xxhash" and hashed[0]["tagma/paged_fast"] > 0
    (side_row,) = [r for r in rows if r["metric"].startswith("prefix hit rate, paged_xxhash")]
    assert "same hit per request as paged: yes" in side_row["note"]
    assert fast_hash_identical({"trace_replay": out}) is True


def _summary(median: float) -> dict[str, float]:
    return {"median": median}


def _prefix_section(fast: bool) -> dict[str, object]:
    entries = []
    for c, (paged, tagma, xx) in ((256, (0.2, 0.05, 0.18)), (1024, (0.8, 0.05, 0.7))):
        e: dict[str, object] = {"context_tokens": c, "paged": _summary(paged), "tagma": _summary(tagma)}
        if fast:
            e |= {"paged_xxhash": _summary(xx), "ratio_paired_vs_fast_hash": tagma / xx,
                  "fast_hash/paged": xx / paged,
                  "fast_hash": {"algo": "xxhash", "side": "paged_xxhash"}}  # fmt: skip
        entries.append(e)
    lookups = [{"context_tokens": c, "paged": _summary(0.01), "tagma": _summary(0.001)} for c in (256, 1024)]
    return {"admission_free_hashed": entries, "prefix_hit_lookup": lookups, "outcomes_identical": True,
            "fast_hash_outcomes_identical": True if fast else None}  # fmt: skip


def test_prefix_ops_rows_gain_the_xxhash_column_and_target_row() -> None:
    rows = prefix_report.headline_rows(_prefix_section(True), [256, 1024])
    hashed = [r for r in rows if r["metric"].startswith("admission+free")]
    assert len(hashed) == 3  # 256, 1024 (sha256 target), 1024 against xxhash (its own target)
    sha_top, fast_top = hashed[1], hashed[2]
    assert sha_top["target"] == TARGETS["admission_free_prefix_hashed"].text and sha_top["paged"] == 0.8
    assert sha_top["paged_fast"] == 0.7 and sha_top["tagma/paged_fast"] == pytest.approx(0.05 / 0.7)
    assert "xxhash" in fast_top["metric"] and fast_top["paged"] == 0.7 and fast_top["context_tokens"] == 1024
    assert fast_top["target"] == TARGETS["admission_free_prefix_hashed_xxhash"].text
    assert fast_top["met"] is False and "missed" in fast_top["note"]  # 14x of 20x
    assert sha_top["met"] is False  # 16x of 20x
    assert all(r.get("paged_fast") is None for r in rows if r["metric"].startswith("prefix-hit"))
    table = summary_table(rows)
    head = table.splitlines()[0].split()
    assert head[5:9] == ["tagma/paged", "paged", "xxhash", "tagma/xxhash"]  # after the sha256 ratio
    assert fast_hash_identical({"prefix_ops": _prefix_section(True)}) is True


def test_without_the_fast_side_the_report_is_as_before() -> None:
    rows = prefix_report.headline_rows(_prefix_section(False), [256, 1024])
    assert len(rows) == 4 and all("paged_fast" not in r for r in rows)
    assert "xxhash" not in summary_table(rows)
    assert fast_hash_identical({"prefix_ops": _prefix_section(False)}) is None
