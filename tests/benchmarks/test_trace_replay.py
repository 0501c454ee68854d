"""benchmarks.host.trace_replay: tiny synthetic traces through vLLM's KV cache manager and tagma's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from benchmarks.host import trace_family_replay, trace_replay  # noqa: E402
from benchmarks.host.report import trace_replay as trace_report  # noqa: E402
from benchmarks.host.report.table import TARGETS  # noqa: E402
from benchmarks.host.trace_jobs import (  # noqa: E402
    ReplayConfig,
    infinite_pool_hit_tokens,
    jobs_from_records,
    prompt_tokens,
    reuse_bound,
)
from benchmarks.host.trace_replay import eviction_cost, replay, runs_of_ids  # noqa: E402
from harness.workload.trace_file import TraceRecord  # noqa: E402

HB = 512


def rec(ts: int, n: int, out: int, ids: tuple[int, ...]) -> TraceRecord:
    assert len(ids) == -(-n // HB)
    return TraceRecord(ts, n, out, ids)


def test_prompt_tokens_follow_hash_ids() -> None:
    a = prompt_tokens(rec(0, 1024, 1, (7, 8)))
    b = prompt_tokens(rec(0, 1300, 1, (7, 8, 9)))
    c = prompt_tokens(rec(0, 1024, 1, (7, 5)))
    d = prompt_tokens(rec(0, 700, 1, (7, 8)))
    assert len(a) == 1024 and len(b) == 1300 and len(d) == 700
    assert b[:1024] == a  # equal leading ids: equal leading tokens
    assert c[:512] == a[:512] and c[512:] != a[512:]
    assert d == a[:700]  # a partial last block is the first tokens of the id's block
    assert prompt_tokens(rec(0, 1024, 1, (8, 7)))[:512] != a[:512]


def test_requests_are_hashed_only_for_managers_that_read_hashes() -> None:
    class Hashless:
        uses_block_hashes = False

    assert not trace_replay.uses_block_hashes(Hashless())  # type: ignore[arg-type]
    assert trace_replay.uses_block_hashes(object())  # type: ignore[arg-type]
    cfg = ReplayConfig(pool_blocks=64)
    jobs, _ = jobs_from_records([rec(0, 600, 1, (1, 2))], cfg)
    side = trace_replay.Side("x", Hashless(), cfg, jobs)  # type: ignore[arg-type]
    live = trace_replay.Live(jobs[0])
    assert side._build(live).block_hashes == []
    hashed = trace_replay.Side("y", object(), cfg, jobs)  # type: ignore[arg-type]
    assert len(hashed._build(live).block_hashes) == 600 // 16


def test_runs_of_ids() -> None:
    assert runs_of_ids([]) == 0
    assert runs_of_ids([4, 5, 6]) == 1
    assert runs_of_ids([4, 5, 9, 10, 3]) == 3


def test_infinite_pool_reference() -> None:
    cfg = ReplayConfig(pool_blocks=1024)
    jobs, _ = jobs_from_records(
        [rec(0, 1024, 1, (1, 2)), rec(1, 1536, 1, (1, 2, 3)), rec(2, 1000, 1, (1, 4)), rec(3, 300, 1, (1,))],
        cfg,
    )
    hit, prompt = infinite_pool_hit_tokens(jobs, 16, HB)
    assert prompt == 1024 + 1536 + 1000 + 300
    # 2nd: both blocks of the 1st (1024); 3rd: block 1 (512); 4th: 288 of block 1, capped at 299 -> 288
    assert reuse_bound(jobs, 16, HB) == [0, 1024, 512, 288]
    assert hit == 1024 + 512 + 288


def _sharing_trace() -> list[TraceRecord]:
    return [
        rec(0, 1024, 8, (1, 2)),
        rec(10_000, 1536, 8, (1, 2, 3)),  # after the first finished: its blocks are cached
        rec(20_000, 700, 4, (1, 9)),
    ]


def test_shared_prefixes_hit_on_both_sides() -> None:
    cfg = ReplayConfig(pool_blocks=1024, max_num_batched_tokens=2048)
    jobs, too_large = jobs_from_records(_sharing_trace(), cfg)
    assert too_large == 0
    out = replay(jobs, cfg)
    for side in ("paged", "tagma"):
        s = out["sides"][side]
        assert s["finished"] == s["admitted"] == 3
        assert s["hit_tokens"] == 1024 + 512
        assert s["hit_rate"] == pytest.approx((1024 + 512) / (1024 + 1536 + 700))
        assert s["preemptions"] == 0 and s["ranges_per_request"]["count"] == 3
        assert s["hits_over_reuse_bound"] == 0
        assert s["admission_us"]["count"] == 3 and s["admission_ns_per_prompt_token"] > 0
    assert out["sides"]["paged"]["request_block_hashes"]
    assert out["sides"]["tagma"]["manager_class"] != "KVCacheManager"
    assert out["same_hits_per_request"] and out["hit_rate_points_tagma_minus_paged"] == 0
    assert out["infinite_pool_hit_rate"] == pytest.approx(out["sides"]["paged"]["hit_rate"])


def test_a_small_pool_evicts_what_a_large_one_keeps() -> None:
    records = [
        rec(0, 2048, 2, (1, 2, 3, 4)),  # 129 blocks with its first decode step
        rec(5_000, 2048, 2, (5, 6, 7, 8)),  # needs 129 too: evicts most of the first request's blocks
        rec(10_000, 2048, 2, (1, 2, 3, 4)),
    ]
    hits = {}
    for pool in (131, 140, 1024):
        cfg = ReplayConfig(pool_blocks=pool)
        jobs, too_large = jobs_from_records(records, cfg)
        assert too_large == 0
        out = replay(jobs, cfg)
        hits[pool] = {side: out["sides"][side]["hit_tokens"] for side in ("paged", "tagma")}
    # vLLM's exact LRU evicts a freed request's tail first: what is left of the first request is its
    # prefix, as many blocks as the pool had never used: 130 - 129 = 1 of 131, 139 - 129 = 10 of 140.
    assert [hits[p]["paged"] for p in (131, 140, 1024)] == [16, 160, 2032]
    assert hits[131]["tagma"] <= hits[140]["tagma"] < hits[1024]["tagma"] == 2032


def test_preemption_under_a_full_pool_and_every_request_finishes() -> None:
    # Four long decodes that together outgrow the pool: the last admitted are preempted and come back.
    records = [rec(0, 1024, 600, (10 * i, 10 * i + 1)) for i in range(4)]
    cfg = ReplayConfig(pool_blocks=4 * 64 + 40, max_num_batched_tokens=4096)
    jobs, too_large = jobs_from_records(records, cfg)
    assert too_large == 0
    out = replay(jobs, cfg)
    for side in ("paged", "tagma"):
        s = out["sides"][side]
        assert s["finished"] == 4
        assert s["preemptions"] > 0 and s["readmissions"] == s["preemptions"]
        assert s["hits_over_reuse_bound"] == 0
        # a preempted request finds its own prompt (and outputs) still cached
        assert s["readmission_hit_rate"] > 0.5


def test_tagma_variants_run_as_more_sides_or_are_skipped() -> None:
    cfg = ReplayConfig(pool_blocks=1024, max_num_batched_tokens=2048)
    jobs, _ = jobs_from_records(_sharing_trace(), cfg)
    variants = {"no_watermark": {"watermark": 0.0}, "bogus": {"no_such_argument": 1}}
    out = replay(jobs, cfg, variants=variants)
    assert list(out["sides"]) == ["paged", "tagma", "no_watermark"]
    assert "no_such_argument" in out["variants_skipped"]["bogus"]
    assert out["sides"]["no_watermark"]["hit_tokens"] == out["sides"]["paged"]["hit_tokens"] == 1024 + 512
    assert out["same_hits_per_request_vs_paged"] == {"tagma": True, "no_watermark": True}
    with pytest.raises(ValueError, match="taken"):
        replay(jobs, cfg, variants={"tagma": {}})


def test_eviction_cost_needs_a_default_and_an_lru_side() -> None:
    side = {"hit_rate": 0.40, "prefix_eviction": "contiguous"}
    lru = {"hit_rate": 0.43, "prefix_eviction": "lru"}
    cost = eviction_cost({"paged": {"hit_rate": 0.43}, "tagma": side, "tagma_lru": lru})
    assert cost is not None and cost["lru_side"] == "tagma_lru" and cost["default"] == "contiguous"
    assert cost["points_below_lru"] == pytest.approx(3.0)
    assert eviction_cost({"paged": {}, "tagma": side}) is None
    assert eviction_cost({"paged": {}, "tagma": {"hit_rate": 0.4}, "x": lru}) is None  # no modes here
    # exact LRU the default, contiguous a variant: the variant's cost against the default
    cost = eviction_cost({"paged": {"hit_rate": 0.43}, "tagma": lru, "tagma_contiguous": side})
    assert cost is not None and cost["default"] == "lru" and cost["side"] == "tagma_contiguous"
    assert cost["lru_side"] == "tagma" and cost["points_below_lru"] == pytest.approx(3.0)


def test_requests_larger_than_the_pool_are_left_out() -> None:
    cfg = ReplayConfig(pool_blocks=64)
    jobs, too_large = jobs_from_records([rec(0, 512, 10, (1,)), rec(1, 2048, 10, (1, 2, 3, 4))], cfg)
    assert too_large == 1 and [j.record.input_length for j in jobs] == [512]
    with pytest.raises(ValueError, match="no request"):
        replay([], cfg)
    with pytest.raises(ValueError, match="block_size"):
        ReplayConfig(pool_blocks=64, block_size=48)


def test_section_run_on_a_trace_file_and_its_headline(tmp_path: Path) -> None:
    path = tmp_path / "mini.jsonl"
    lines = [
        {"timestamp": r.timestamp_ms, "input_length": r.input_length, "output_length": r.output_length,
         "hash_ids": list(r.hash_ids)}
        for r in [*_sharing_trace(), rec(30_000, 5000, 4, tuple(range(100, 110)))]
    ]  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cfg = {
        "trace": str(path),
        "block_size": 16,
        "manager": {"policy": "headroom"},
        "trace_replay": {
            "pool_blocks": 1024, "hash_block_tokens": 512, "start_ms": 0, "duration_ms": None, "first": None,
            "time_scale": 0.5, "max_input_length": 4096, "cap_mode": "drop", "max_output_tokens": 4,
            "decode_tokens_per_step": None, "step_ms": 50, "max_num_seqs": 8, "max_num_batched_tokens": 2048,
            "policy": None,
        },
    }  # fmt: skip
    section = trace_replay.run(cfg)
    assert section["trace"]["records"] == 4 and section["trace"]["path"] == str(path)
    assert section["selection"]["over_max_input_length"] == 1 and section["requests"] == 3
    rows = trace_report.headline_rows(section, [])
    target = rows[0]
    assert target["target"] == TARGETS["trace_hit_rate"].text and target["met"] is True
    assert target["paged"] == pytest.approx(100 * (1024 + 512) / (1024 + 1536 + 700))
    assert [r["unit"] for r in rows] == ["%", "us", "us", "ranges", "count"]
    out = trace_report.plot(section, tmp_path / "trace_replay.png")
    assert out.stat().st_size > 1000


@pytest.mark.parametrize(
    ("paged", "tagma", "met"), [(50.0, 49.2, True), (50.0, 48.9, False), (50.0, 60.0, True)]
)
def test_hit_rate_target_allows_one_point_below(paged: float, tagma: float, met: bool) -> None:
    assert TARGETS["trace_hit_rate"].met(paged, tagma) is met
    if not met:
        assert "points below vLLM" in TARGETS["trace_hit_rate"].left(paged, tagma, "%")


def test_section_family_mode_reports_the_worst_case_with_met(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.host.trace_jobs import ReplayConfig as RC
    from tagma.contract import ENV_PREFIX_EVICTION

    monkeypatch.delenv(ENV_PREFIX_EVICTION, raising=False)
    fcfg = {"enabled": True, "scale": "ci", "mixtures": 0, "members": ["agents"], "pool_factors": [0.25, 1.5],
            "max_num_seqs": 32, "max_num_batched_tokens": 2048}  # fmt: skip
    variants = {"tagma_contiguous": {"prefix_eviction": "contiguous"}}
    family = trace_family_replay.run_family_section(fcfg, RC(pool_blocks=64), variants, lambda *a: None)
    assert [m["name"] for m in family["members"]] == ["agents"] and len(family["points"]) == 2
    assert set(family["worst"]) == {"tagma", "tagma_contiguous"}
    assert family["worst"]["tagma"]["prefix_eviction"] == "lru"
    rows = trace_report.family_rows(family)
    assert len(rows) == 6
    head, missed = rows[0], rows[1]
    assert head["target"] == missed["target"] == trace_report.FAMILY_TARGET
    assert head["met"] is True and missed["met"] is True  # exact LRU by default
    assert head["paged"] == pytest.approx(head["tagma"])
    assert all(r["met"] is None for r in rows[2:])  # the variant's rows report, no target
