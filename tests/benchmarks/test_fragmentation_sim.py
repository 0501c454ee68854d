"""The one fragmentation simulator: the host section and the GPU trace get the same answer from one trace."""

from __future__ import annotations

import pytest

from benchmarks import fragmentation_sim as sim

pytest.importorskip("vllm")


def _engine_or_skip() -> None:
    from tagma.engine import EngineNotBuiltError, RangeEngine

    try:
        RangeEngine(8).close()
    except EngineNotBuiltError:
        pytest.skip("the engine library is not built")


def test_host_section_and_gpu_trace_agree_on_the_same_trace() -> None:
    _engine_or_skip()
    from benchmarks.host import fragmentation as host_section

    cfg = {
        "block_size": 16, "seed": 0,
        "fragmentation": {
            "policies": ["headroom", "best_fit"], "contexts": [512], "requests": 6, "turnovers": 3,
            "prompt_min_frac": 0.5, "output_min": 64, "output_max": 256, "prefill_chunk_tokens": 256,
            "pool_factors": [0.7], "sample_every": 2, "paged_reference_max_blocks": 0,
        },
    }  # fmt: skip
    row = host_section.run(cfg)["traces"][0]
    jobs = sim.fixed_context_jobs(18, 512, 16, 0.5, 64, 256, 512)
    for policy, measured in row["policies"].items():
        # the GPU trace's side records range lengths as well; recording must not change the answer
        side = sim.EngineSide(row["pool_blocks"], policy, record_lengths=True)
        again = sim.simulate(side, jobs, 6, row["pool_blocks"], row["prefill_chunk_blocks"], 2)
        assert side.lengths and sum(side.lengths.values()) >= again["samples"]
        for key in ("ranges_at_completion", "ranges_live_time_avg", "preemptions", "decode_in_place_share"):
            assert again[key] == measured[key], (policy, key)


def test_trace_config_rejects_a_request_that_cannot_fit() -> None:
    with pytest.raises(ValueError, match="cannot fit"):
        sim.TraceConfig(num_blocks=128, prompt_max=4096, output_max=128)
    with pytest.raises(ValueError, match="warmup"):
        sim.TraceConfig(num_requests=10, warmup_requests=10)


def _small_trace(policy: str) -> dict:
    jobs = sim.fixed_context_jobs(24, 512, 16, 0.5, 64, 256, 3)
    pool = int(0.5 * 6 * (512 + 256) / 16) + 1
    side = sim.PagedSide(pool, 16) if policy == "paged" else sim.EngineSide(pool, policy)
    return sim.simulate(side, jobs, 6, pool, 16, 2)


def test_allocators_that_never_decline_make_the_paged_pools_decisions() -> None:
    _engine_or_skip()
    paged = _small_trace("paged")
    assert paged["preemptions"] > 0 and paged["unfinished"] == 0  # the trace saturates the pool
    for policy in ("headroom", "best_fit", "reserve+hint"):
        got = _small_trace(policy)
        for key in ("preemptions", "ticks", "running_mean", "blocks_per_tick"):
            assert got[key] == paged[key], (policy, key)
        assert got["refusals"] == 0


def test_reserve_admission_waits_for_room_instead_of_scattering() -> None:
    _engine_or_skip()
    headroom = _small_trace("headroom")
    whole = _small_trace("reserve+hint+admit100x1")
    assert whole["unfinished"] == 0 and whole["rejected"] == 0
    assert whole["ranges_at_completion"]["max"] == 1 < headroom["ranges_at_completion"]["max"]
    assert whole["refusals"] > 0  # admission declined while blocks were free: requests waited
    assert whole["running_mean"] <= headroom["running_mean"]  # the trade-off: fewer running at a time
    with pytest.raises(ValueError, match="suffix"):
        sim.EngineSide(64, "reserve+hint+sometimes")
