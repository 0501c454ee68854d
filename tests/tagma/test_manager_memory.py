"""tagma's managers keep nothing per finished request: memory after thousands of request lifecycles (shared
prefixes, decode growth, free) is what it was after the first ones, in Python and in the engine's C++ heap."""

from __future__ import annotations

import gc
import random
import tracemalloc

import psutil
import pytest

pytest.importorskip("vllm")

from vllm.v1.request import RequestStatus  # noqa: E402

from tagma.core.registry import build_kv_cache_manager  # noqa: E402
from tests.tagma.twin import make_config, manager_kwargs, tagma_request  # noqa: E402

BLOCK = 16


def _lifecycles(manager, rnd: random.Random, tenants: list[list[int]], first: int, n: int) -> None:
    for i in range(first, first + n):
        tokens = tenants[i % len(tenants)] + [rnd.randrange(3, 8000) for _ in range(rnd.randrange(1, 100))]
        req = tagma_request(f"r{i}", tokens)
        computed, hit, _ = manager.get_computed_blocks(req)
        assert manager.allocate_slots(req, req.num_tokens - hit, hit, computed) is not None
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = req.num_tokens
        for _ in range(rnd.randrange(1, 40)):
            req.append_output_token_ids(rnd.randrange(3, 8000))
            assert manager.allocate_slots(req, 1) is not None
            req.num_computed_tokens += 1
        manager.free(req)


@pytest.mark.parametrize("caching", [False, True], ids=["ranges", "prefix-index"])
def test_finished_requests_leave_no_memory_behind(caching: bool) -> None:
    manager = build_kv_cache_manager(make_config(64, BLOCK), **manager_kwargs(BLOCK, enable_caching=caching))
    rnd = random.Random(0)
    tenants = [[rnd.randrange(3, 8000) for _ in range(64)] for _ in range(8)]
    tracemalloc.start()
    try:
        _lifecycles(manager, rnd, tenants, 0, 500)  # warm: the pool cycles, the index fills
        gc.collect()
        py0, rss0 = tracemalloc.get_traced_memory()[0], psutil.Process().memory_info().rss
        _lifecycles(manager, rnd, tenants, 500, 3000)
        gc.collect()
        py1, rss1 = tracemalloc.get_traced_memory()[0], psutil.Process().memory_info().rss
    finally:
        tracemalloc.stop()
    assert (py1 - py0) / 3000 < 16, f"{(py1 - py0) / 3000:.1f} Python bytes kept per request"
    assert rss1 - rss0 < 4 << 20, f"process RSS grew {(rss1 - rss0) / 2**20:.1f} MiB over 3000 requests"
