"""The range manager's batched crossing: a scheduler step's appends reach the engine in one call.

``allocate_slots`` queues; the queue is applied (one ``tagma_append_runs_batch``) when block ids or engine
state are first needed. These tests check that the placement is exactly the per-request path's (a manager
whose ids are read right after every ``allocate_slots`` crosses once per request), that preemption and
frees of requests with queued appends are right, which calls apply the queue, and the error path.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import numpy as np
import pytest
from vllm.v1.request import Request, RequestStatus

from tagma.core.range_manager import RangeBlocks, RangeKVCacheManager
from tagma.core.registry import build_kv_cache_manager
from tagma.engine import NoSpaceError
from tests.tagma.twin import (
    CountingBatch,
    assert_no_leak,
    check_range_state,
    make_config,
    make_request,
    manager_kwargs,
)


def range_manager(num_blocks: int, policy: str = "headroom") -> RangeKVCacheManager:
    manager = build_kv_cache_manager(
        make_config(num_blocks), placement_policy=policy, **manager_kwargs(enable_caching=False)
    )
    assert isinstance(manager, RangeKVCacheManager)
    manager._batch = CountingBatch(manager._batch)  # type: ignore[assignment]
    return manager


def engine_state(manager: RangeKVCacheManager) -> tuple[Any, ...]:
    engine = manager.engine
    req_refs, _ = engine.block_state()
    pool = manager.block_pool
    ranges = {rid: engine.ranges_array(eng).tolist() for rid, eng in pool._engine_reqs.items()}
    return engine.free_ranges(), req_refs.tolist(), ranges, dict(manager._held), pool.get_num_free_blocks()


def drive(manager: RangeKVCacheManager, seed: int, read_at_once: bool, steps: int = 80) -> dict[str, Any]:
    """A scheduler-like loop: running requests decode (or prefill a chunk), the last running request is
    preempted when an allocation fails (it may have blocks queued in this step), waiting requests are
    admitted, then the step's new block ids are read (the scheduler output), and some requests finish.

    ``read_at_once``: read each allocation's ids right after ``allocate_slots`` (one crossing per request,
    the per-request path); otherwise only when the step's output is built (one crossing per step)."""
    rng = random.Random(seed)
    waiting: deque[Request] = deque(
        make_request(f"r{i}", [rng.randrange(1000) for _ in range(rng.randrange(1, 40))]) for i in range(40)
    )
    running: list[Request] = []
    outputs: list[list[tuple[str, list[int]]]] = []
    calls_per_step: list[int] = []
    preempted_per_step: list[int] = []
    allocations_per_step: list[int] = []
    batch = manager._batch
    chunk = 12
    for _ in range(steps):
        calls_before = len(batch.calls)
        new_blocks: dict[str, Any] = {}
        preempted = 0
        allocations = 0

        def got(req: Request, blocks: Any, new_blocks: dict[str, Any] = new_blocks) -> None:
            nonlocal allocations
            if isinstance(blocks, RangeBlocks):
                allocations += 1
            new_blocks[req.request_id] = blocks
            if read_at_once:
                blocks.get_block_ids()

        scheduled: list[Request] = []
        i = 0
        while i < len(running):
            req = running[i]
            todo = min(chunk, req.num_tokens - req.num_computed_tokens) or 1
            blocks = manager.allocate_slots(req, todo)
            if blocks is None:
                victim = running.pop()  # vLLM preempts the last running request, maybe one scheduled now
                manager.free(victim)
                victim.status = RequestStatus.PREEMPTED
                victim.num_computed_tokens = 0
                new_blocks.pop(victim.request_id, None)
                if victim in scheduled:
                    scheduled.remove(victim)
                waiting.appendleft(victim)
                preempted += 1
                continue  # retry the same request (or stop when it was the victim)
            got(req, blocks)
            scheduled.append(req)
            i += 1
        while waiting and len(running) < 6:
            req = waiting[0]
            todo = min(chunk, req.num_tokens - req.num_computed_tokens)
            blocks = manager.allocate_slots(req, todo)
            if blocks is None:
                break
            waiting.popleft()
            req.status = RequestStatus.RUNNING
            running.append(req)
            scheduled.append(req)
            got(req, blocks)
        # The scheduler output: every new block id of the step.
        outputs.append(sorted((rid, b.get_block_ids()[0]) for rid, b in new_blocks.items()))
        calls_per_step.append(len(batch.calls) - calls_before)
        preempted_per_step.append(preempted)
        allocations_per_step.append(allocations)
        # update_from_output: tokens computed, a token sampled once the prompt is done, some finish.
        for req in scheduled:
            todo = min(chunk, req.num_tokens - req.num_computed_tokens) or 1
            req.num_computed_tokens += todo
            if req.num_computed_tokens >= req.num_tokens:
                req.append_output_token_ids(rng.randrange(1000))
        for req in list(running):
            if req.num_computed_tokens >= req.num_prompt_tokens and rng.random() < 0.08:
                running.remove(req)
                manager.free(req)
        check_range_state(manager)
    for req in running:
        manager.free(req)
    return {
        "outputs": outputs,
        "calls": calls_per_step,
        "preempted": preempted_per_step,
        "allocations": allocations_per_step,
    }


@pytest.mark.parametrize("policy", ["first_fit", "best_fit", "headroom"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_crossing_per_step_places_as_one_per_request(policy: str, seed: int) -> None:
    batched, single = range_manager(48, policy), range_manager(48, policy)
    got = drive(batched, seed, read_at_once=False)
    ref = drive(single, seed, read_at_once=True)
    assert got["outputs"] == ref["outputs"]  # the same block ids for every request at every step
    assert got["preempted"] == ref["preempted"] and sum(got["preempted"]) > 0  # preemption was exercised
    assert engine_state(batched) == engine_state(single)
    # The per-request path crosses once per allocation that needs blocks; the batched one once per step
    # (plus once per preemption that had to apply the step's queue before releasing).
    assert ref["calls"] == ref["allocations"]
    for calls, allocations, preempted in zip(got["calls"], got["allocations"], got["preempted"], strict=True):
        assert calls <= min(allocations, 1 + preempted)
    assert sum(got["calls"]) < sum(ref["calls"])
    assert max(got["allocations"]) > 1
    assert_no_leak(batched)
    assert_no_leak(single)


def admit_two(manager: RangeKVCacheManager) -> tuple[Request, Request, Any, Any]:
    a = make_request("a", list(range(10)))  # 3 blocks
    b = make_request("b", list(range(100, 121)))  # 6 blocks
    va = manager.allocate_slots(a, a.num_tokens)
    vb = manager.allocate_slots(b, b.num_tokens)
    assert isinstance(va, RangeBlocks) and isinstance(vb, RangeBlocks) and va.pending and vb.pending
    assert manager.block_pool.get_num_free_blocks() == 31 - 9  # the free count is kept at allocate time
    assert manager.engine.stats().used_blocks == 0 and manager._batch.calls == []  # nothing crossed yet
    return a, b, va, vb


@pytest.mark.parametrize("how", ["free", "pop_blocks_for_free"])
def test_freeing_a_request_with_queued_blocks_applies_the_queue_first(how: str) -> None:
    manager, ref = range_manager(32), range_manager(32)
    a, b, va, vb = admit_two(manager)
    ra = make_request("a", list(range(10)))
    rb = make_request("b", list(range(100, 121)))
    ids_a = ref.allocate_slots(ra, ra.num_tokens).get_block_ids()[0]  # type: ignore[union-attr]
    ids_b = ref.allocate_slots(rb, rb.num_tokens).get_block_ids()[0]  # type: ignore[union-attr]
    if how == "free":
        manager.free(a)
        ref.free(ra)
    else:
        release = manager.pop_blocks_for_free(a)
        assert len(release) == 3
        assert manager.engine.stats().used_blocks == 9  # applied, still held until freed
        manager.block_pool.free_blocks(release)
        ref.block_pool.free_blocks(ref.pop_blocks_for_free(ra))
    assert manager._batch.calls == [[3, 6]]  # one crossing for both appends, before the release
    assert not vb.pending and vb.get_block_ids()[0] == ids_b
    assert va.get_block_ids()[0] == ids_a  # the freed request's view still says what it was given
    assert engine_state(manager) == engine_state(ref)
    check_range_state(manager)
    # The freed request is readmitted with a new engine request; the queue starts again.
    again = manager.allocate_slots(a, a.num_tokens)
    assert isinstance(again, RangeBlocks) and again.pending
    manager.free(b)
    manager.free(a)
    assert manager._batch.calls == [[3, 6], [3]]
    assert_no_leak(manager)


def zeroing(manager: RangeKVCacheManager, rid: str) -> None:
    manager._zeroing = True  # without zeroing the call reads nothing
    try:
        manager.record_blocks_for_zeroing(rid, 0)
    finally:
        manager._zeroing = False


def test_every_reader_of_engine_state_applies_the_queue() -> None:
    manager = range_manager(64)
    readers = {
        "get_block_ids": lambda rid: manager.get_block_ids(rid),
        "get_blocks": lambda rid: manager.get_blocks(rid).get_block_ids(),
        "engine_block_ids": lambda rid: manager.engine_block_ids(rid),
        "ranges_per_request_counts": lambda rid: manager.ranges_per_request_counts(),
        "telemetry_snapshot": lambda rid: manager.telemetry_snapshot(),
        "take_new_block_ids": lambda rid: manager.take_new_block_ids(),
        "record_blocks_for_zeroing": lambda rid: zeroing(manager, rid),
        "blocks": lambda rid: None,  # the view's own accessors, below
    }
    for i, (name, read) in enumerate(readers.items()):
        req = make_request(f"q{i}", list(range(9)))
        view = manager.allocate_slots(req, req.num_tokens)
        assert isinstance(view, RangeBlocks) and view.pending, name
        before = len(manager._batch.calls)
        read(req.request_id)
        if name == "blocks":
            assert len(view.blocks[0]) == 3
        assert not view.pending and len(manager._batch.calls) == before + 1, name
        assert len(manager.get_block_ids(req.request_id)[0]) == 3
    assert manager.telemetry_snapshot()["live_requests"] == len(readers)
    check_range_state(manager)


def test_views_resolve_on_every_accessor_and_len_needs_no_crossing() -> None:
    manager = range_manager(64)
    for accessor in ("get_block_ids", "get_unhashed_block_ids", "runs", "blocks", "add", "group_ids"):
        req = make_request(f"v-{accessor}", list(range(13)))
        view = manager.allocate_slots(req, req.num_tokens)
        assert isinstance(view, RangeBlocks)
        assert len(view) == 4 and view.pending and "pending" in repr(view)
        expected = manager.engine  # resolved below through the accessor under test
        if accessor == "get_block_ids":
            (ids,) = view.get_block_ids()
        elif accessor == "get_unhashed_block_ids":
            ids = view.get_unhashed_block_ids()
        elif accessor == "runs":
            ids = [b for start, count in view.runs for b in range(start, start + count)]
        elif accessor == "blocks":
            ids = [block.block_id for block in view.blocks[0]]
        elif accessor == "add":
            (ids,) = (manager.empty_kv_cache_blocks + view).get_block_ids()
        else:
            (ids,) = view.get_block_ids(group_ids=[0])  # type: ignore[misc]
        assert not view.pending
        assert ids == expected.blocks(manager.block_pool.engine_request(req.request_id)).tolist()
        manager.free(req)
    assert_no_leak(manager)


def test_a_second_allocation_of_a_request_still_queued_for_creation() -> None:
    manager, ref = range_manager(64), range_manager(64)
    outs = []
    for m, read in ((manager, False), (ref, True)):
        req = make_request("c", list(range(30)))
        first = m.allocate_slots(req, 12)  # a first prefill chunk; nobody reads its ids yet
        if read:
            first.get_block_ids()  # type: ignore[union-attr]
        req.num_computed_tokens = 12
        second = m.allocate_slots(req, 12)
        outs.append((first.get_block_ids()[0], second.get_block_ids()[0]))  # type: ignore[union-attr]
    assert outs[0] == outs[1]
    assert manager._batch.calls == [[3], [3]]  # the second call applied the queue to learn the request
    assert engine_state(manager) == engine_state(ref)


def test_zeroing_records_queued_blocks_in_allocation_order() -> None:
    manager = range_manager(64)
    manager._zeroing = True  # as with a KV cache spec whose new blocks must be zeroed
    views = []
    for i, n in enumerate((5, 9, 2)):
        req = make_request(f"z{i}", list(range(n)))
        views.append(manager.allocate_slots(req, req.num_tokens))
    ids = manager.take_new_block_ids()
    assert manager._batch.calls == [[2, 3, 1]]
    assert ids == [b for v in views for b in v.get_block_ids()[0]]
    assert manager.take_new_block_ids() == []


def test_an_engine_error_at_the_crossing_changes_nothing() -> None:
    manager = range_manager(16)
    pool = manager.block_pool
    held = make_request("h", list(range(20)))  # 5 blocks, applied
    assert manager.allocate_slots(held, held.num_tokens).get_block_ids()  # type: ignore[union-attr]
    before = engine_state(manager)
    pool._num_free += 100  # a wrong free count: the engine must refuse what the count would allow
    a = make_request("a", list(range(24)))  # 6 blocks
    b = make_request("b", list(range(24)))
    c = make_request("c", list(range(4)))
    va = manager.allocate_slots(a, a.num_tokens)
    vb = manager.allocate_slots(b, b.num_tokens)  # 12 queued: only 10 are free
    held.num_computed_tokens = held.num_tokens
    held.append_output_token_ids(7)
    vh = manager.allocate_slots(held, 1)  # a queued growth of a request the engine knows
    with pytest.raises(NoSpaceError, match="tagma_append_runs_batch"):
        manager.get_block_ids("a")
    pool._num_free -= 100
    assert engine_state(manager) == before  # no request created, nothing appended, counts restored
    for view in (va, vb, vh):
        assert isinstance(view, RangeBlocks)
        with pytest.raises(RuntimeError, match="append of these blocks failed"):
            view.get_block_ids()
    # The manager goes on: a fitting allocation works.
    vc = manager.allocate_slots(c, c.num_tokens)
    assert vc is not None and len(vc.get_block_ids()[0]) == 1
    check_range_state(manager)
    manager.free(c)
    manager.free(held)
    manager.free(a)  # nothing held: a no-op
    assert_no_leak(manager)


def test_batched_crossing_counts_new_requests_and_growth_in_one_call() -> None:
    manager = range_manager(256)
    reqs = [make_request(f"s{i}", list(range(4 * (i + 1)))) for i in range(8)]
    views = [manager.allocate_slots(r, r.num_tokens) for r in reqs]
    assert manager._batch.calls == []
    first = [v.get_block_ids()[0] for v in views]  # type: ignore[union-attr]
    assert manager._batch.calls == [[1, 2, 3, 4, 5, 6, 7, 8]]
    # A decode step in which every request crosses a block boundary: one crossing for all eight.
    grown = []
    for r in reqs:
        r.num_computed_tokens = r.num_tokens
        r.status = RequestStatus.RUNNING
        r.append_output_token_ids(1)
        grown.append(manager.allocate_slots(r, 1))
    ids = [g.get_block_ids()[0] for g in grown]  # type: ignore[union-attr]
    assert manager._batch.calls[1:] == [[1] * 8]
    for r, before, new in zip(reqs, first, ids, strict=True):
        assert manager.get_block_ids(r.request_id)[0] == before + new
    assert np.unique(np.concatenate([np.array(x) for x in first + ids])).size == sum(range(1, 9)) + 8
    for r in reqs:
        manager.free(r)
    assert_no_leak(manager)


def test_engine_batch_binding_matches_append_runs_and_refuses_bad_input() -> None:
    from tagma.engine import InvalidArgumentError, RangeEngine, RequestNotFoundError

    rng = np.random.default_rng(5)
    a, b = RangeEngine(300, policy="headroom"), RangeEngine(300, policy="headroom")
    live: list[int] = []
    for _ in range(30):
        entries = [(0 if not live or rng.random() < 0.3 else int(rng.choice(live)), int(rng.integers(1, 6)))
                   for _ in range(int(rng.integers(0, 5)))]  # fmt: skip
        if sum(c for _, c in entries) > a.stats().free_blocks:
            break
        ids, runs = a.append_runs_batch([r for r, _ in entries], [c for _, c in entries])
        for (req, count), got_id, got_runs in zip(entries, ids, runs, strict=True):
            if req == 0:
                req = b.create_request()
                live.append(req)
            assert got_id == req
            assert got_runs.tolist() == b.append_runs(req, count).tolist()
        if live and rng.random() < 0.3:
            gone = live.pop(int(rng.integers(len(live))))
            a.release(gone)
            b.release(gone)
    assert a.free_ranges() == b.free_ranges()
    before = a.free_ranges()
    with pytest.raises(RequestNotFoundError, match="entry 1"):
        a.append_runs_batch([0, 10_000], [1, 1])
    with pytest.raises(InvalidArgumentError, match="entry 0: count 0"):
        a.append_runs_batch([0], [0])
    with pytest.raises(ValueError, match="one entry per request"):
        a.append_runs_batch([0, 0], [1])
    assert a.free_ranges() == before and a.stats().live_requests == len(live)
    assert a.append_runs_batch([], []) == ([], [])


def test_get_blocks_after_admission_crosses_nothing_until_the_output_reads_ids() -> None:
    """vLLM's scheduler asks get_blocks(request_id) right after admitting a request."""
    manager = range_manager(64)
    reqs = [make_request(f"n{i}", list(range(5 + 4 * i))) for i in range(3)]
    views = [manager.allocate_slots(r, r.num_tokens) for r in reqs]
    got = [manager.get_blocks(r.request_id) for r in reqs]
    assert all(g is v for g, v in zip(got, views, strict=True)) and manager._batch.calls == []
    ids = [g.get_block_ids()[0] for g in got]
    assert manager._batch.calls == [[2, 3, 4]]
    assert ids == [manager.get_block_ids(r.request_id)[0] for r in reqs]
    # A request with blocks from before: its whole list needs the engine (the queue is applied first).
    r = reqs[0]
    r.num_computed_tokens = r.num_tokens
    r.append_output_token_ids(3)
    r.append_output_token_ids(4)
    r.append_output_token_ids(5)
    r.append_output_token_ids(6)
    grown = manager.allocate_slots(r, 4)
    assert isinstance(grown, RangeBlocks) and grown.pending
    whole = manager.get_blocks(r.request_id)
    assert whole is not grown and not grown.pending
    assert whole.get_block_ids()[0] == ids[0] + grown.get_block_ids()[0]
    for q in reqs:
        manager.free(q)
    assert_no_leak(manager)


def test_batched_hints_place_as_append_runs_and_first_hinted_entries_wait_for_admission() -> None:
    from tagma.engine import Policy, RangeEngine, TagmaError

    one, batched = (RangeEngine(num_blocks=200, policy=Policy.RESERVE) for _ in range(2))
    reqs = [one.create_request() for _ in range(3)]
    for r in reqs:  # admitted one by one (hinted first appends), then grown through the batch
        one.append_runs(r, 2, 40)
    ids, _ = batched.append_runs_batch([0, 0, 0], [2, 2, 2], [40, 40, 40])
    one_runs = [one.append_runs(r, 3, 38) for r in reqs]
    _, batch_runs = batched.append_runs_batch(ids, [3, 3, 3], [38, 38, 38])
    for a, b in zip(one_runs, batch_runs, strict=True):
        np.testing.assert_array_equal(a, b)  # same placement: each grows into its own reservation
    batched.set_admission(100, 4)
    before = batched.stats()
    with pytest.raises(TagmaError, match="RESERVE admission"):
        batched.append_runs_batch([ids[0], 0], [1, 2], [0, 40])  # a new hinted request may be declined
    assert batched.stats() == before  # all or nothing
