"""The engine's free-front operation (a sliding window's start advancing): the first k blocks of a request
are released, its ranges cut, the rest renumbered from logical 0; bad input changes nothing."""

from __future__ import annotations

import random

import pytest

from tagma.engine import (
    BlockStateError,
    InvalidArgumentError,
    Policy,
    Range,
    RangeEngine,
    RequestNotFoundError,
)
from tagma.engine.prefix_index import PrefixIndex
from tests.tagma.engine_helpers import EngineFactory, expect_error


def test_free_front_cuts_the_first_range_and_renumbers(eng: RangeEngine) -> None:
    req = eng.create_request()
    eng.append(req, 6)  # [1, 7)
    eng.free_front(req, 4)
    assert eng.ranges(req) == [Range(5, 2, 0)]
    assert eng.blocks(req).tolist() == [5, 6]
    assert eng.num_blocks_of(req) == 2
    assert eng.free_ranges() == [(1, 4), (7, eng.num_blocks - 7)]
    assert eng.stats().used_blocks == 2
    # Growth continues in place after the cut range.
    assert eng.append(req, 2).new_blocks.tolist() == [7, 8]
    assert eng.ranges(req) == [Range(5, 4, 0)]


def test_free_front_drops_whole_ranges_then_cuts(make_engine: EngineFactory) -> None:
    eng = make_engine(32, policy=Policy.FIRST_FIT)
    a, b = eng.create_request(), eng.create_request()
    eng.append(a, 3)  # [1, 4)
    eng.append(b, 2)  # [4, 6): a's next blocks go elsewhere
    eng.append(a, 3)  # [6, 9)
    eng.append(b, 1)  # 9
    eng.append(a, 2)  # [10, 12)
    assert [r.count for r in eng.ranges(a)] == [3, 3, 2]
    eng.free_front(a, 4)  # the first range and one block of the second
    assert eng.ranges(a) == [Range(7, 2, 0), Range(10, 2, 2)]
    assert eng.blocks(a).tolist() == [7, 8, 10, 11]
    eng.free_front(a, 4)  # all of it: the request stays, empty
    assert eng.ranges(a) == [] and eng.num_blocks_of(a) == 0
    assert eng.stats().used_blocks == 3
    eng.release(a)
    eng.release(b)
    assert eng.stats().used_blocks == 0
    assert eng.free_ranges() == [(1, eng.num_blocks - 1)]


def test_free_front_zero_is_a_no_op(eng: RangeEngine) -> None:
    req = eng.create_request()
    eng.append(req, 3)
    before = eng.ranges(req)
    eng.free_front(req, 0)
    assert eng.ranges(req) == before


def test_free_front_keeps_shared_blocks_for_their_other_holder(eng: RangeEngine) -> None:
    a, b = eng.create_request(), eng.create_request()
    ids = eng.append(a, 4).new_blocks
    eng.attach(b, ids[:2])
    eng.free_front(a, 3)
    req_refs, _ = eng.block_state()
    assert req_refs[ids].tolist() == [1, 1, 0, 1]  # b still holds the first two
    assert eng.blocks(a).tolist() == [int(ids[3])]


def test_free_front_refuses_bad_input_and_changes_nothing(eng: RangeEngine) -> None:
    req = eng.create_request()
    eng.append(req, 3)
    err = expect_error(eng, [req], InvalidArgumentError, lambda: eng.free_front(req, 4))
    assert "outside [0, 3]" in err.message
    expect_error(eng, [req], InvalidArgumentError, lambda: eng.free_front(req, -1))
    expect_error(eng, [req], InvalidArgumentError, lambda: eng.free_front(req, 1 << 40))
    expect_error(eng, [req], RequestNotFoundError, lambda: eng.free_front(req + 999, 1))


def test_free_front_is_refused_for_a_request_in_the_prefix_index(eng: RangeEngine) -> None:
    index = PrefixIndex(eng, 4)
    req = eng.create_request()
    eng.append(req, 2)
    index.insert(0, req, list(range(8)))
    err = expect_error(eng, [req], BlockStateError, lambda: eng.free_front(req, 1))
    assert "prefix index" in err.message


def test_free_front_with_the_prefix_index_frees_a_side_request_s_blocks(eng: RangeEngine) -> None:
    """A request the index does not know (a window group's) drops its front as without the index; its
    blocks count as unused again for placement."""
    PrefixIndex(eng, 4)
    req = eng.create_request()
    eng.append(req, 3)
    free = eng.stats().free_blocks
    eng.free_front(req, 2)
    assert eng.stats().free_blocks == free + 2
    assert eng.blocks(req).size == 1


@pytest.mark.parametrize("seed", range(4))
def test_free_front_random_windows_match_a_list_model(make_engine: EngineFactory, seed: int) -> None:
    """Requests that append and drop their front at random hold exactly what a list model says, and the
    engine's free count and block references agree with it at every step."""
    rng = random.Random(seed)
    eng = make_engine(64, policy=rng.choice(list(Policy)))
    model: dict[int, list[int]] = {}
    for _ in range(400):
        live = list(model)
        op = rng.random()
        if not live or (op < 0.45 and eng.stats().free_blocks > 4):
            req = rng.choice(live) if live and rng.random() < 0.7 else eng.create_request()
            model.setdefault(req, [])
            count = rng.randint(1, min(4, eng.stats().free_blocks))
            model[req] += eng.append(req, count).new_blocks.tolist()
        elif op < 0.85:
            req = rng.choice(live)
            k = rng.randint(0, len(model[req]))
            eng.free_front(req, k)
            del model[req][:k]
        else:
            req = rng.choice(live)
            eng.release(req)
            del model[req]
        for req, ids in model.items():
            assert eng.blocks(req).tolist() == ids
        held = [i for ids in model.values() for i in ids]
        assert len(set(held)) == len(held)
        req_refs, _ = eng.block_state()
        assert sorted(int(i) for i in req_refs.nonzero()[0]) == sorted(held)
        assert eng.stats().free_blocks == eng.num_blocks - 1 - len(held)
