"""Stateful property tests: random operation sequences drive the engine through the binding and are checked
against the pure-Python reference model (tests/tagma/reference_engine.py) after every step.

Operations: create (with a prompt's worth of blocks), append (small, large, evicting, NO_SPACE-sized and, with
align > 1, misaligned counts; the new blocks optionally cache-marked as prefix caching does), attach a prefix
of another request's blocks or cache-only blocks, release (plain, or after caching a prefix), cache mark,
unmark, evict and clear, and operations the header forbids (each must fail with its status and change
nothing). After every step the engine must equal the model: per-block request/cache reference counts, the
free list as maximal runs of free blocks (coalesced), the LRU order, every live request's blocks and ranges,
the statistics and the ranges histogram; the range slot mapping must equal the paged one and the model's over
random positions (some past the request's end) with padding. append's placement is validated by
ReferenceEngine.check_append.

Each policy runs MAX_EXAMPLES sequences of up to STEPS steps on small engines (16..96 blocks), so that
collisions, fragmentation and eviction are frequent; the align=2 variant (no attach) runs a third as many.
Derandomized, without an example database: CI sees the same sequences every run. STEP_COUNTS tallies what ran.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tagma.engine import (
    TAGMA_E_INVALID_ARG,
    TAGMA_E_NO_SPACE,
    TAGMA_E_NOT_FOUND,
    Policy,
    RangeEngine,
    TagmaError,
    slot_mapping_paged,
    slot_mapping_ranges,
)
from tests.tagma.reference_engine import ModelViolationError, ReferenceEngine, Run

MAX_EXAMPLES = 300
STEPS = 40
MAX_LIVE_REQUESTS = 8

SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    stateful_step_count=STEPS,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

STEP_COUNTS: Counter[str] = Counter()


class EngineMachine(RuleBasedStateMachine):
    POLICY: Policy = Policy.BEST_FIT
    ALIGN: int = 1
    ALLOW_ATTACH: bool = True

    def __init__(self) -> None:
        super().__init__()
        self.eng: RangeEngine | None = None
        self.model = ReferenceEngine(2)
        self.rng = random.Random(0)
        self.block_size = 1
        self.steps = 0
        STEP_COUNTS["sequences"] += 1

    # ------------------------------------------------------------------------------------ helpers

    @property
    def engine(self) -> RangeEngine:
        assert self.eng is not None
        return self.eng

    def live(self) -> list[int]:
        return sorted(self.model.requests)

    def expect(self, call: Callable[[], object], expected: frozenset[int] | None, what: str) -> bool:
        """Run ``call``; it fails with one of ``expected`` statuses, or succeeds when ``expected`` is None."""
        try:
            call()
        except TagmaError as err:
            if expected is None:
                raise ModelViolationError(
                    f"{what}: engine failed with {err} but the model expects success"
                ) from err
            if err.status not in expected:
                raise ModelViolationError(
                    f"{what}: status {err.status} ({err}), expected one of {sorted(expected)}"
                ) from err
            assert err.message, f"{what}: no last-error text"
            return False
        if expected is not None:
            raise ModelViolationError(
                f"{what}: succeeded, the model expects a failure with one of {sorted(expected)}"
            )
        return True

    def teardown(self) -> None:
        if self.eng is not None:
            self.eng.close()

    # -------------------------------------------------------------------------------------- rules

    @initialize(
        num_blocks=st.integers(16, 96), seed=st.integers(0, 2**32 - 1), block_size=st.sampled_from([1, 2, 16])
    )
    def setup(self, num_blocks: int, seed: int, block_size: int) -> None:
        num_blocks -= num_blocks % self.ALIGN
        self.eng = RangeEngine(num_blocks, align=self.ALIGN, policy=self.POLICY)
        self.model = ReferenceEngine(num_blocks, self.ALIGN, self.POLICY)
        self.rng = random.Random(seed)
        self.block_size = block_size
        for _ in range(3):
            self.model.create(self.engine.create_request())

    @precondition(lambda self: len(self.model.requests) < MAX_LIVE_REQUESTS)
    @rule(prompt_blocks=st.integers(0, 4))
    def create(self, prompt_blocks: int) -> None:
        STEP_COUNTS["create"] += 1
        req = self.engine.create_request()
        self.model.create(req)
        count = prompt_blocks * self.ALIGN
        if count and self.model.append_must_succeed(count):
            res = self.engine.append(req, count)
            self.model.check_append(req, count, res.new_blocks.tolist(), res.evicted.tolist())

    @precondition(lambda self: bool(self.model.requests))
    @rule(data=st.data())
    def append(self, data: st.DataObject) -> None:
        STEP_COUNTS["append"] += 1
        req = data.draw(st.sampled_from(self.live()), label="request")
        a = self.ALIGN
        n = self.model.num_blocks
        free, cached = self.model.num_free(), len(self.model.lru)
        counts = [
            st.integers(1, 4).map(lambda k: k * a),  # decode-like growth
            st.integers(1, n // a + 1).map(lambda k: k * a),
            st.just(((free + cached) // a + 1) * a),  # one aligned step past what exists: NO_SPACE
        ]
        if cached:  # more than is free: evicts
            counts.append(st.integers(free // a + 1, (free + cached) // a).map(lambda k: k * a))
        if a > 1:
            counts.append(st.integers(1, 2 * a))  # misaligned too
        count = data.draw(st.one_of(counts), label="count")
        must_fail = self.model.append_must_fail(count)
        try:
            res = self.engine.append(req, count)
        except TagmaError as err:
            assert err.message
            if must_fail is not None:
                assert err.status == must_fail, (
                    f"append({count}): status {err.status} ({err}), expected {must_fail}"
                )
            elif self.model.append_must_succeed(count):
                raise ModelViolationError(
                    f"append({req}, {count}) failed with {err}; free runs "
                    f"{self.model.free_runs()}, lru {self.model.lru_list()}"
                ) from err
            else:
                assert err.status == TAGMA_E_NO_SPACE, f"append({count}): unexpected {err}"
            STEP_COUNTS["append failed"] += 1
            return
        new_blocks = res.new_blocks.tolist()
        self.model.check_append(req, count, new_blocks, res.evicted.tolist())
        STEP_COUNTS["evicting append"] += bool(res.evicted.size)
        if data.draw(st.booleans(), label="cache the new blocks"):  # as prefix caching does with full blocks
            self.engine.cache_mark(new_blocks)
            self.model.mark(new_blocks)

    @precondition(
        lambda self: self.ALLOW_ATTACH and len(self.model.requests) >= 2 and any(self.model.requests.values())
    )
    @rule(data=st.data())
    def attach_shared_prefix(self, data: st.DataObject) -> None:
        STEP_COUNTS["attach prefix"] += 1
        sources = [r for r in self.live() if self.model.requests[r]]
        src = data.draw(st.sampled_from(sources), label="source")
        dst = data.draw(st.sampled_from([r for r in self.live() if r != src]), label="target")
        k = data.draw(st.integers(1, len(self.model.requests[src])), label="prefix")
        ids = self.model.requests[src][:k]
        expected = self.model.expected_attach_error(dst, ids)
        if self.expect(lambda: self.engine.attach(dst, ids), expected, f"attach({dst}, {ids})"):
            self.model.attach(dst, ids)

    @precondition(lambda self: self.ALLOW_ATTACH and bool(self.model.requests) and bool(self.model.lru))
    @rule(data=st.data())
    def attach_cached(self, data: st.DataObject) -> None:
        STEP_COUNTS["attach cached"] += 1
        dst = data.draw(st.sampled_from(self.live()), label="target")
        lru = self.model.lru_list()
        ids = data.draw(
            st.lists(st.sampled_from(lru), min_size=1, max_size=min(6, len(lru)), unique=True)
            | st.integers(0, len(lru) - 1).map(lambda i: sorted(lru[i : i + 4])),
            label="ids",
        )
        expected = self.model.expected_attach_error(dst, ids)
        if self.expect(lambda: self.engine.attach(dst, ids), expected, f"attach({dst}, {ids})"):
            self.model.attach(dst, ids)

    @precondition(lambda self: bool(self.model.requests))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        STEP_COUNTS["release"] += 1
        req = data.draw(st.sampled_from(self.live()), label="request")
        self.engine.release(req)
        self.model.release(req)

    @precondition(lambda self: any(self.model.requests.values()))
    @rule(data=st.data())
    def cache_and_release(self, data: st.DataObject) -> None:
        """The prefix-caching pattern: mark a prefix of the request's blocks cached, then release it."""
        STEP_COUNTS["cache+release"] += 1
        req = data.draw(st.sampled_from([r for r in self.live() if self.model.requests[r]]), label="request")
        blocks = self.model.requests[req]
        k = data.draw(st.integers(1, len(blocks)), label="cached prefix")
        self.engine.cache_mark(blocks[:k])
        self.model.mark(blocks[:k])
        self.engine.release(req)
        self.model.release(req)

    @precondition(lambda self: any(self.model.req_refs) or bool(self.model.lru))
    @rule(data=st.data())
    def cache_mark(self, data: st.DataObject) -> None:
        STEP_COUNTS["cache_mark"] += 1
        candidates = sorted(set(self.model.live_in_use_blocks()) | set(self.model.lru))
        ids = data.draw(
            st.lists(st.sampled_from(candidates), min_size=1, max_size=8, unique=True), label="ids"
        )
        self.engine.cache_mark(ids)
        self.model.mark(ids)

    @precondition(lambda self: any(self.model.cache_refs))
    @rule(data=st.data())
    def cache_unmark(self, data: st.DataObject) -> None:
        STEP_COUNTS["cache_unmark"] += 1
        ids = data.draw(
            st.lists(st.sampled_from(self.model.cached_blocks()), min_size=1, max_size=4, unique=True),
            label="ids",
        )
        self.engine.cache_unmark(ids)
        self.model.unmark(ids)

    @precondition(lambda self: bool(self.model.lru))
    @rule(max_blocks=st.integers(-1, 6))
    def cache_evict(self, max_blocks: int) -> None:
        STEP_COUNTS["cache_evict"] += 1
        if max_blocks <= 0:
            self.expect(
                lambda: self.engine.cache_evict(max_blocks),
                frozenset({TAGMA_E_INVALID_ARG}),
                f"cache_evict({max_blocks})",
            )
            return
        got = self.engine.cache_evict(max_blocks).tolist()
        expected = self.model.evict(max_blocks)
        assert got == expected, f"cache_evict({max_blocks}) gave {got}, LRU order demands {expected}"

    @precondition(lambda self: any(self.model.cache_refs) and self.steps % 5 == 0)  # it empties the LRU
    @rule()
    def cache_clear(self) -> None:
        STEP_COUNTS["cache_clear"] += 1
        assert self.engine.cache_clear() == self.model.clear()

    @precondition(lambda self: self.steps % 3 == 0)  # keeps error paths to about one step in ten
    @rule(
        data=st.data(),
        kind=st.sampled_from(
            [
                "released",
                "free-attach",
                "free-mark",
                "uncached-unmark",
                "null-attach",
                "out-of-range",
                "zero-count",
                "held-attach",
            ]
        ),
    )
    def invalid_operation(self, data: st.DataObject, kind: str) -> None:
        """An operation the header forbids: it fails with the right status and changes nothing."""
        STEP_COUNTS["invalid op"] += 1
        m, eng = self.model, self.engine
        free = [b for r in m.free_runs() for b in range(r.start, r.end)]
        uncached = [b for b in range(1, m.num_blocks) if m.cache_refs[b] == 0]
        live = self.live()
        req = data.draw(st.sampled_from(live), label="request") if live else None
        if kind == "released" and m.released:
            gone = data.draw(st.sampled_from(sorted(m.released)), label="released request")
            self.expect(
                lambda: eng.append(gone, self.ALIGN), frozenset({TAGMA_E_NOT_FOUND}), "append(released)"
            )
            self.expect(lambda: eng.release(gone), frozenset({TAGMA_E_NOT_FOUND}), "release(released)")
        elif kind == "free-attach" and free and req is not None:
            ids = [data.draw(st.sampled_from(free), label="free block")]
            self.expect(lambda: eng.attach(req, ids), m.expected_attach_error(req, ids), "attach(free)")
        elif kind == "held-attach" and req is not None and m.requests[req]:
            ids = [data.draw(st.sampled_from(m.requests[req]), label="held block")]
            self.expect(lambda: eng.attach(req, ids), m.expected_attach_error(req, ids), "attach(held)")
        elif kind == "free-mark" and free:
            ids = [data.draw(st.sampled_from(free), label="free block")]
            self.expect(lambda: eng.cache_mark(ids), m.expected_mark_error(ids), "cache_mark(free)")
        elif kind == "uncached-unmark" and uncached:
            ids = [data.draw(st.sampled_from(uncached), label="uncached block")]
            if m.cached_blocks():
                ids.insert(0, m.cached_blocks()[0])  # all-or-nothing: the valid one must not change
            self.expect(lambda: eng.cache_unmark(ids), m.expected_unmark_error(ids), "cache_unmark(uncached)")
        elif kind == "null-attach" and req is not None:
            self.expect(lambda: eng.attach(req, [0]), m.expected_attach_error(req, [0]), "attach(null)")
        elif kind == "out-of-range" and req is not None:
            ids = [data.draw(st.sampled_from([-1, m.num_blocks, m.num_blocks + 7]), label="id")]
            self.expect(
                lambda: eng.attach(req, ids), m.expected_attach_error(req, ids), "attach(out of range)"
            )
            self.expect(lambda: eng.cache_mark(ids), m.expected_mark_error(ids), "cache_mark(out of range)")
        elif kind == "zero-count" and req is not None:
            self.expect(lambda: eng.append(req, 0), frozenset({TAGMA_E_INVALID_ARG}), "append(0)")

    # ---------------------------------------------------------------------------------- invariants

    @invariant()
    def engine_matches_model(self) -> None:
        if self.eng is None:
            return
        STEP_COUNTS["checked steps"] += 1
        self.steps += 1
        eng, m = self.eng, self.model
        req_refs, cache_refs = eng.block_state()
        assert req_refs.tolist() == m.req_refs, "request reference counts differ"
        assert cache_refs.tolist() == m.cache_refs, "cache reference counts differ"

        runs = m.free_runs()
        free = eng.free_ranges()
        assert free == [(r.start, r.length) for r in runs], "free list differs from the free blocks"
        for (s0, c0), (s1, _) in itertools.pairwise(free):
            assert s0 + c0 < s1, f"free list not coalesced/ordered: {free}"

        assert eng.lru_order().tolist() == m.lru_list(), "LRU order differs"

        ranges_per_req = []
        for req in self.live():
            expected_blocks = m.requests[req]
            assert eng.blocks(req).tolist() == expected_blocks, f"blocks of request {req}"
            assert len(set(expected_blocks)) == len(expected_blocks), f"request {req} holds a block twice"
            arr = eng.ranges_array(req)
            assert [tuple(r) for r in arr.tolist()] == m.request_runs(req), f"ranges of request {req}"
            assert eng.num_blocks_of(req) == len(expected_blocks)
            assert eng.num_ranges(req) == arr.shape[0]
            if expected_blocks:
                i = self.rng.randrange(len(expected_blocks))
                assert eng.block(req, i) == expected_blocks[i]
            if self.ALIGN > 1 and not self.ALLOW_ATTACH:
                assert not (arr[:, :2] % self.ALIGN).any(), f"misaligned ranges {arr.tolist()}"
            ranges_per_req.append(arr)

        self.check_stats(runs, ranges_per_req)
        self.check_slot_mapping(ranges_per_req)

    def check_stats(self, runs: list[Run], ranges_per_req: list[np.ndarray]) -> None:
        m = self.model
        s = self.engine.stats()
        free = sum(r.length for r in runs)
        largest = max((r.length for r in runs), default=0)
        assert s.num_blocks == m.num_blocks
        assert s.usable_blocks == m.usable_blocks
        assert (s.free_blocks, s.cached_only_blocks, s.used_blocks) == (free, len(m.lru), m.num_used())
        assert s.free_blocks + s.cached_only_blocks + s.used_blocks == s.usable_blocks
        assert (s.free_ranges, s.largest_free_range) == (len(runs), largest)
        assert abs(s.external_fragmentation - (1 - largest / free if free else 0.0)) < 1e-12
        nranges = [a.shape[0] for a in ranges_per_req]
        assert s.live_requests == len(m.requests)
        assert s.total_request_ranges == sum(nranges)
        assert s.max_request_ranges == max(nranges, default=0)
        c = m.counters
        assert s.appended_blocks == c.appended_blocks
        assert s.evictions == c.evictions_by_append + c.evictions_by_evict
        if self.ALIGN == 1:
            assert s.in_place_growths == c.in_place_growths
        # Appended ranges that turned out adjacent count as merges, not new ranges.
        assert s.new_ranges <= c.new_ranges <= s.new_ranges + s.merges
        hist = self.engine.ranges_histogram(4).tolist()
        expected = [0, 0, 0, 0]
        for n in nranges:
            expected[min(n, 3)] += 1
        assert hist == expected, f"ranges histogram {hist} != {expected}"

    def check_slot_mapping(self, ranges_per_req: list[np.ndarray]) -> None:
        live = self.live()
        if not live:
            return
        m, rng, bs = self.model, self.rng, self.block_size
        positions: list[int] = []
        qsl = [0]
        for req in live:
            horizon = (len(m.requests[req]) + 1) * bs  # a block past the end too: -1 there
            positions += [rng.randrange(horizon) for _ in range(rng.randrange(6))]
            qsl.append(len(positions))
        out_len = len(positions) + rng.randrange(3)
        offsets = np.cumsum([0] + [a.shape[0] for a in ranges_per_req], dtype=np.int32)
        all_ranges = np.concatenate(ranges_per_req) if ranges_per_req else np.zeros((0, 3), np.int32)
        got = slot_mapping_ranges(all_ranges, offsets, qsl, positions, bs, out_len=out_len).tolist()

        width = max(1, max(len(m.requests[r]) for r in live))
        table = np.zeros((len(live), width), dtype=np.int32)
        for i, req in enumerate(live):
            table[i, : len(m.requests[req])] = m.requests[req]
        paged = slot_mapping_paged(
            table, [len(m.requests[r]) for r in live], qsl, positions, bs, out_len=out_len
        ).tolist()
        expected = [-1] * out_len
        for i, req in enumerate(live):
            for t in range(qsl[i], qsl[i + 1]):
                expected[t] = m.slot(req, positions[t], bs)
        assert paged == expected, "paged slot mapping differs from the model"
        assert got == expected, "range slot mapping differs from the paged reference"


def machine_for(policy: Policy, align: int = 1) -> type[EngineMachine]:
    return type(
        f"EngineMachine_{policy.name}_align{align}",
        (EngineMachine,),
        {"POLICY": policy, "ALIGN": align, "ALLOW_ATTACH": align == 1},
    )


@pytest.mark.parametrize("policy", list(Policy), ids=lambda p: p.name.lower())
def test_engine_matches_reference_model(policy: Policy) -> None:
    run_state_machine_as_test(machine_for(policy), settings=SETTINGS)


@pytest.mark.parametrize("policy", list(Policy), ids=lambda p: p.name.lower())
def test_aligned_engine_keeps_ranges_aligned(policy: Policy) -> None:
    run_state_machine_as_test(
        machine_for(policy, align=2), settings=settings(SETTINGS, max_examples=MAX_EXAMPLES // 3)
    )
