"""The scheduler section drives vLLM's real Scheduler on both arms through the same steps."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")

from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from benchmarks.host import scheduler_steps as ss  # noqa: E402
from benchmarks.host.timing import ratio_range  # noqa: E402
from tagma.core.scheduler import TagmaScheduler  # noqa: E402
from tagma.probes import host_time_hooks as hooks  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MODEL = str(REPO / "data" / "tiny-llama")
WORKLOAD = {"concurrency": 3, "prompt_tokens": 200, "output_tokens": 5, "num_requests": 5,
            "max_num_batched_tokens": 256}  # fmt: skip
MANAGERS = {
    ("llama", False): "RangeKVCacheManager",
    ("llama", True): "PrefixKVCacheManager",
    ("gpt-oss", False): "GroupRangeKVCacheManager",
    ("gpt-oss", True): "GroupPrefixKVCacheManager",
}


@pytest.fixture(autouse=True, scope="module")
def _wrapped_scheduler() -> None:
    hooks.wrap_scheduler_class(Scheduler, ss.CLOCK)


@pytest.mark.parametrize(("layout", "caching"), list(MANAGERS))
def test_both_arms_finish_every_request_in_the_same_steps(layout: str, caching: bool) -> None:
    shapes = {}
    for side in ss.SIDES:
        scheduler = ss.build_scheduler(side, MODEL, layout, WORKLOAD, 16, caching)
        manager = type(scheduler.kv_cache_manager).__name__
        assert manager == ("KVCacheManager" if side == "paged" else MANAGERS[(layout, caching)])
        assert isinstance(scheduler, TagmaScheduler) == (side == "tagma")
        requests, build_ns = ss.make_requests(WORKLOAD, 16, ss.engine_core_hashes(scheduler), seed=3)
        rows = ss.drive(scheduler, requests, WORKLOAD["concurrency"])
        assert all(r.num_output_tokens == WORKLOAD["output_tokens"] for r in requests)
        assert not scheduler.requests and scheduler.kv_cache_manager.usage == 0.0
        # vLLM's engine core hashes requests with caching on; tagma's prefix managers hash nothing
        hashed = caching and side == "paged"
        assert all(bool(r.block_hashes) == hashed for r in requests)
        step = ss.per_step(rows, overhead_ns=0, build_ns=build_ns)
        assert step["kv_manager"] > 0 and step["schedule_other"] > 0 and step["update_other"] > 0
        assert step["request_build"] > 0
        parts = step["kv_manager"] + step["schedule_other"] + step["update_other"] + step["request_build"]
        assert step["engine_core"] == pytest.approx(parts)
        shapes[side] = step["shape"]
    assert shapes["paged"] == shapes["tagma"]
    least = WORKLOAD["num_requests"] * (WORKLOAD["prompt_tokens"] * 7 // 8)
    assert sum(n for _, n in shapes["paged"]) >= least


def test_a_cell_compares_every_part_per_step_and_says_whether_the_steps_matched() -> None:
    e = ss.measure(MODEL, "gpt-oss", WORKLOAD, 16, True, repeats=2, seed=1)
    assert e["same_steps"] is True and e["steps"] > 0
    assert e["managers"] == {"paged": KVCacheManager.__name__, "tagma": "GroupPrefixKVCacheManager"}
    for part in ss.PARTS:
        assert e[part]["paged"]["repeats"] == e[part]["tagma"]["repeats"] == 2
        lo, hi = ratio_range(e[part])
        assert 0 < lo <= e[part]["ratio_paired"] <= hi
