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
