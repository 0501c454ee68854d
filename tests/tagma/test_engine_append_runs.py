"""RangeEngine.append_runs: the placement of append, reported as (start, count) runs."""

from __future__ import annotations

import numpy as np
import pytest

from tagma.engine import BlockStateError, InvalidArgumentError, NoSpaceError, RangeEngine


def test_append_runs_matches_append_placement() -> None:
    a = RangeEngine(64, policy="first_fit")
    b = RangeEngine(64, policy="first_fit")
    rng = np.random.default_rng(0)
    live: list[tuple[int, int]] = []
    for _ in range(200):
        if live and (rng.random() < 0.4 or a.stats().free_blocks < 8):
            ra, rb = live.pop(int(rng.integers(len(live))))
            a.release(ra)
            b.release(rb)
            continue
        count = int(rng.integers(1, 8))
        if live and rng.random() < 0.5:
            ra, rb = live[int(rng.integers(len(live)))]
        else:
            ra, rb = a.create_request(), b.create_request()
            live.append((ra, rb))
        ids = a.append(ra, count).new_blocks
        runs = b.append_runs(rb, count)
        assert runs.shape[1] == 2 and int(runs[:, 1].sum()) == count
        assert np.all(runs[1:, 0] != runs[:-1, 0] + runs[:-1, 1]), "runs must be maximal"
        expanded = np.concatenate([np.arange(s, s + c, dtype=np.int32) for s, c in runs])
        np.testing.assert_array_equal(expanded, ids)
    np.testing.assert_array_equal(a.block_state()[0], b.block_state()[0])


def test_append_runs_errors_leave_the_engine_unchanged() -> None:
    eng = RangeEngine(16)
    req = eng.create_request()
    with pytest.raises(InvalidArgumentError):
        eng.append_runs(req, 0)
    with pytest.raises(NoSpaceError):
        eng.append_runs(req, 15 + 1)
    owner = eng.create_request()
    eng.cache_mark(eng.append(owner, 10).new_blocks)
    eng.release(owner)
    before = eng.block_state()
    with pytest.raises(BlockStateError, match="evict"):
        eng.append_runs(req, 8)
    np.testing.assert_array_equal(eng.block_state()[1], before[1])
    assert eng.stats().cached_only_blocks == 10
    assert eng.append_runs(req, 5).tolist() == [[11, 5]]


def test_append_runs_hint_places_where_the_whole_request_fits() -> None:
    eng = RangeEngine(64, policy="first_fit")
    reqs = [eng.create_request() for _ in range(5)]
    for r, n in zip(reqs, (10, 6, 10, 20, 10), strict=True):
        eng.append(r, n)
    eng.release(reqs[1])
    eng.release(reqs[3])
    eng.set_policy("headroom")
    r = eng.create_request()
    assert eng.append_runs(r, 2, hint=7).tolist() == [[57, 2]]  # the smallest free range holding 7
    assert eng.append_runs(r, 5).tolist() == [[59, 5]]  # grows in place
    assert eng.num_ranges(r) == 1
    with pytest.raises(InvalidArgumentError):
        eng.append_runs(r, 1, hint=-1)
