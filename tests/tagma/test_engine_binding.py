"""Unit tests of the tagma engine binding: error paths (right exception, engine message, state unchanged),
the missing-library message, and the basic behaviours of the allocator, cache and slot mapping."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tagma.contract import ENV_LIB
from tagma.engine import (
    TAGMA_E_OVERFLOW,
    AppendResult,
    BlockStateError,
    CoordLayout,
    EngineNotBuiltError,
    EngineStats,
    InvalidArgumentError,
    InvalidHandleError,
    MisalignedError,
    NoSpaceError,
    OutOfRangeError,
    Policy,
    Range,
    RangeEngine,
    RequestNotFoundError,
    TagmaError,
    TagmaOverflowError,
    coord_offset,
    slot_mapping_paged,
    slot_mapping_ranges,
    version,
)
from tests.tagma.reference_engine import DUPLICATE_STATUSES, NULL_BLOCK_STATUSES

REPO = Path(__file__).resolve().parents[2]

EngineFactory = Callable[..., RangeEngine]


@pytest.fixture
def make_engine() -> Iterator[EngineFactory]:
    engines: list[RangeEngine] = []

    def factory(num_blocks: int = 32, align: int = 1, policy: Policy | str = Policy.BEST_FIT) -> RangeEngine:
        eng = RangeEngine(num_blocks, align=align, policy=policy)
        engines.append(eng)
        return eng

    yield factory
    for eng in engines:
        eng.close()


@pytest.fixture
def eng(make_engine: EngineFactory) -> RangeEngine:
    return make_engine()


def snapshot(eng: RangeEngine, reqs: list[int]) -> tuple[Any, ...]:
    req_refs, cache_refs = eng.block_state()
    return (
        req_refs.tolist(),
        cache_refs.tolist(),
        eng.free_ranges(),
        eng.lru_order().tolist(),
        eng.stats(),
        {r: eng.ranges(r) for r in reqs},
    )


def expect_error(
    eng: RangeEngine, reqs: list[int], exc: type[TagmaError], call: Callable[[], object]
) -> TagmaError:
    """``call`` raises ``exc`` carrying the engine's message, and leaves the engine's state unchanged."""
    before = snapshot(eng, reqs)
    with pytest.raises(exc) as info:
        call()
    err = info.value
    assert err.message, "the engine gave no last-error text"
    assert err.message in str(err)
    assert snapshot(eng, reqs) == before
    return err


def paged_reference(
    block_lists: list[list[int]],
    query_start_loc: list[int],
    positions: list[int],
    block_size: int,
    out_len: int,
) -> list[int]:
    out = [-1] * out_len
    for r, blocks in enumerate(block_lists):
        for t in range(query_start_loc[r], query_start_loc[r + 1]):
            logical, offset = divmod(positions[t], block_size)
            if logical < len(blocks):
                out[t] = blocks[logical] * block_size + offset
    return out


# ------------------------------------------------------------------------------------------ the library


def test_version_is_a_string() -> None:
    assert isinstance(version(), str)
    assert version()


def test_missing_library_says_make_setup(tmp_path: Path) -> None:
    script = (
        "import tagma\n"  # the package imports without the library
        "import tagma.engine as te\n"
        "from tagma.engine import RangeEngine, EngineNotBuiltError\n"
        "try:\n"
        "    RangeEngine(16)\n"
        "except EngineNotBuiltError as e:\n"
        "    assert isinstance(e, ImportError)\n"
        "    print('MESSAGE:', e)\n"
        "else:\n"
        "    raise SystemExit('no error')\n"
    )
    env = {**os.environ, ENV_LIB: str(tmp_path / "nonexistent" / "libtagma.so"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "make setup" in proc.stdout
    assert "nonexistent" in proc.stdout


def test_unloadable_library_says_make_setup(tmp_path: Path) -> None:
    bogus = tmp_path / "libtagma.so"
    bogus.write_text("not a shared object")
    script = (
        "from tagma.engine import coord_offset, CoordLayout, EngineNotBuiltError\n"
        "try:\n"
        "    coord_offset(CoordLayout(1, 1, 1, 1), 0, 0, 0)\n"
        "except EngineNotBuiltError as e:\n"
        "    print('MESSAGE:', e)\n"
    )
    env = {**os.environ, ENV_LIB: str(bogus), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "make setup" in proc.stdout


def test_engine_not_built_is_an_import_error() -> None:
    assert issubclass(EngineNotBuiltError, ImportError)


# --------------------------------------------------------------------------------------- small values


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("best_fit", Policy.BEST_FIT),
        ("FIRST_FIT", Policy.FIRST_FIT),
        ("headroom", Policy.HEADROOM),
        (" best-fit ", Policy.BEST_FIT),
        (2, Policy.HEADROOM),
    ],
)
def test_policy_parse(text: str | int, policy: Policy) -> None:
    assert Policy.parse(text) is policy


def test_policy_parse_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="first_fit"):
        Policy.parse("worst_fit")


def test_policy_values_match_the_header() -> None:
    assert [int(p) for p in Policy] == [0, 1, 2, 3]
    assert Policy.RESERVE == 3


def test_engine_accepts_a_policy_name(make_engine: EngineFactory) -> None:
    eng = make_engine(policy="first_fit")
    eng.set_policy("headroom")
    eng.set_policy(Policy.BEST_FIT)


# ------------------------------------------------------------------------------------------ handles


def test_closed_engine_raises_invalid_handle_from_the_engine(make_engine: EngineFactory) -> None:
    eng = make_engine(16)
    req = eng.create_request()
    eng.append(req, 2)
    eng.close()
    assert eng.closed
    eng.close()  # idempotent
    calls: list[Callable[[], object]] = [
        eng.stats,
        eng.create_request,
        lambda: eng.release(req),
        lambda: eng.append(req, 1),
        lambda: eng.attach(req, [1]),
        lambda: eng.num_blocks_of(req),
        lambda: eng.num_ranges(req),
        lambda: eng.ranges(req),
        lambda: eng.block(req, 0),
        lambda: eng.blocks(req, 0, 1),
        lambda: eng.cache_mark([1]),
        lambda: eng.cache_unmark([1]),
        lambda: eng.cache_evict(1),
        eng.cache_clear,
        eng.block_state,
        eng.free_ranges,
        eng.lru_order,
        lambda: eng.ranges_histogram(4),
        lambda: eng.set_policy(Policy.FIRST_FIT),
    ]
    for call in calls:
        with pytest.raises(InvalidHandleError) as info:
            call()
        assert info.value.message
        assert info.value.status == 2


def test_context_manager_closes(make_engine: EngineFactory) -> None:
    with RangeEngine(16) as eng:
        eng.create_request()
    assert eng.closed
    with pytest.raises(InvalidHandleError):
        eng.stats()


def test_handles_are_never_reused() -> None:
    handles = set()
    for _ in range(50):
        eng = RangeEngine(4)
        handles.add(eng.handle)
        eng.close()
    assert len(handles) == 50
    eng = RangeEngine(4)
    try:
        assert eng.handle not in handles
    finally:
        eng.close()


@pytest.mark.parametrize(
    ("num_blocks", "align", "policy"),
    [(1, 1, 1), (0, 1, 1), (-5, 1, 1), (16, 0, 1), (16, -2, 1), (16, 1, 4), (16, 1, -1)],
)
def test_create_rejects_bad_arguments(num_blocks: int, align: int, policy: int) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        RangeEngine(num_blocks, align=align, policy=policy)
    assert info.value.message


def test_set_policy_rejects_unknown_policy(eng: RangeEngine) -> None:
    expect_error(eng, [], InvalidArgumentError, lambda: eng.set_policy(7))


def test_requests_are_per_engine(make_engine: EngineFactory) -> None:
    a, b = make_engine(16), make_engine(16)
    req = a.create_request()
    a.append(req, 3)
    # b has no such request (or a different one with nothing): either way a's state is untouched.
    b_req = b.create_request()
    assert b.num_blocks_of(b_req) == 0
    assert a.num_blocks_of(req) == 3


def test_del_destroys_the_engine() -> None:
    import ctypes

    from tagma.engine import TAGMA_E_INVALID_HANDLE, _CStats, _load

    eng = RangeEngine(8)
    handle = eng.handle
    stats = _CStats()
    assert _load().tagma_engine_stats(handle, ctypes.addressof(stats)) == 0
    del eng
    assert _load().tagma_engine_stats(handle, ctypes.addressof(stats)) == TAGMA_E_INVALID_HANDLE


# ---------------------------------------------------------------------------------------- requests


def test_unknown_and_released_requests(eng: RangeEngine) -> None:
    live = eng.create_request()
    eng.append(live, 2)
    gone = eng.create_request()
    eng.append(gone, 3)
    eng.release(gone)
    for req in (gone, 987654321, 2**64 - 1):
        for call in (
            lambda r=req: eng.release(r),
            lambda r=req: eng.append(r, 1),
            lambda r=req: eng.attach(r, [1]),
            lambda r=req: eng.num_blocks_of(r),
            lambda r=req: eng.num_ranges(r),
            lambda r=req: eng.ranges(r),
            lambda r=req: eng.block(r, 0),
            lambda r=req: eng.blocks(r, 0, 1),
        ):
            expect_error(eng, [live], RequestNotFoundError, call)


def test_double_release(eng: RangeEngine) -> None:
    req = eng.create_request()
    eng.append(req, 4)
    eng.release(req)
    expect_error(eng, [], RequestNotFoundError, lambda: eng.release(req))


def test_request_ids_are_never_reused(eng: RangeEngine) -> None:
    seen = set()
    for _ in range(20):
        req = eng.create_request()
        assert req not in seen
        seen.add(req)
        eng.release(req)


@pytest.mark.parametrize("count", [0, -1, -(2**40)])
def test_append_rejects_non_positive_counts(eng: RangeEngine, count: int) -> None:
    req = eng.create_request()
    eng.append(req, 2)
    expect_error(eng, [req], InvalidArgumentError, lambda: eng.append(req, count))


@pytest.mark.parametrize("count", [32, 33, 10**12, 2**63 - 1])
def test_append_more_blocks_than_exist(eng: RangeEngine, count: int) -> None:
    req = eng.create_request()
    eng.append(req, 2)
    expect_error(eng, [req], NoSpaceError, lambda: eng.append(req, count))


def test_append_beyond_int64_is_refused(eng: RangeEngine) -> None:
    req = eng.create_request()
    with pytest.raises(TagmaOverflowError):
        eng.append(req, 2**64 + 1)  # would wrap to 1 through ctypes


def test_append_exactly_fills_then_no_space(make_engine: EngineFactory) -> None:
    eng = make_engine(8)
    a, b = eng.create_request(), eng.create_request()
    assert eng.append(a, 7).new_blocks.tolist() == [1, 2, 3, 4, 5, 6, 7]
    expect_error(eng, [a, b], NoSpaceError, lambda: eng.append(b, 1))


def test_misaligned_count(make_engine: EngineFactory) -> None:
    eng = make_engine(32, align=4)
    req = eng.create_request()
    for count in (1, 3, 6):
        expect_error(eng, [req], MisalignedError, lambda c=count: eng.append(req, c))
    res = eng.append(req, 8)
    assert res.new_blocks.tolist() == list(range(4, 12))  # usable space starts at block `align`
    assert eng.stats().usable_blocks == 28


def test_block_lookup_errors(eng: RangeEngine) -> None:
    req = eng.create_request()
    eng.append(req, 3)
    for logical in (-1, 3, 100):
        expect_error(eng, [req], OutOfRangeError, lambda x=logical: eng.block(req, x))
    expect_error(eng, [req], OutOfRangeError, lambda: eng.blocks(req, 1, 3))
    expect_error(eng, [req], OutOfRangeError, lambda: eng.blocks(req, -1, 2))
    expect_error(eng, [req], OutOfRangeError, lambda: eng.blocks(req, 0, 10**9))
    expect_error(eng, [req], InvalidArgumentError, lambda: eng.blocks(req, 0, 0))
    expect_error(eng, [req], InvalidArgumentError, lambda: eng.blocks(req, 0, -2))
    assert eng.blocks(req, 3).tolist() == []  # the (empty) tail
    empty = eng.create_request()
    assert eng.blocks(empty).tolist() == []
    assert eng.ranges(empty) == []


# ------------------------------------------------------------------------------------------- attach


def test_attach_errors(eng: RangeEngine) -> None:
    a, b = eng.create_request(), eng.create_request()
    eng.append(a, 4)  # blocks 1..4; 5.. free
    eng.attach(b, [2])
    reqs = [a, b]
    expect_error(eng, reqs, BlockStateError, lambda: eng.attach(b, [3, 9]))  # 9 is free
    expect_error(eng, reqs, BlockStateError, lambda: eng.attach(b, [2]))  # already held
    expect_error(eng, reqs, BlockStateError, lambda: eng.attach(a, [1]))  # a owns it
    expect_error(eng, reqs, OutOfRangeError, lambda: eng.attach(b, [3, 32]))
    expect_error(eng, reqs, OutOfRangeError, lambda: eng.attach(b, [-1]))
    expect_error(eng, reqs, InvalidArgumentError, lambda: eng.attach(b, []))
    err = expect_error(eng, reqs, TagmaError, lambda: eng.attach(b, [0]))
    assert err.status in NULL_BLOCK_STATUSES
    err = expect_error(eng, reqs, TagmaError, lambda: eng.attach(b, [3, 4, 3]))
    assert err.status in DUPLICATE_STATUSES
    with pytest.raises(OutOfRangeError):
        eng.attach(b, [2**40])  # refused before it could wrap to a valid int32 id


def test_attach_rejects_non_integer_ids(eng: RangeEngine) -> None:
    req = eng.create_request()
    with pytest.raises(TypeError):
        eng.attach(req, [1.5])


# -------------------------------------------------------------------------------------------- cache


def test_cache_errors_are_all_or_nothing(eng: RangeEngine) -> None:
    req = eng.create_request()
    eng.append(req, 4)
    eng.cache_mark([1, 2])
    reqs = [req]
    expect_error(eng, reqs, BlockStateError, lambda: eng.cache_unmark([1, 3]))  # 3 has no cache reference
    expect_error(eng, reqs, BlockStateError, lambda: eng.cache_mark([3, 10]))  # 10 is free
    expect_error(eng, reqs, OutOfRangeError, lambda: eng.cache_mark([3, 40]))
    expect_error(eng, reqs, OutOfRangeError, lambda: eng.cache_unmark([1, -3]))
    err = expect_error(eng, reqs, TagmaError, lambda: eng.cache_mark([0]))
    assert err.status in NULL_BLOCK_STATUSES
    expect_error(eng, reqs, InvalidArgumentError, lambda: eng.cache_evict(-1))
    assert eng.block_state()[1][:5].tolist() == [0, 1, 1, 0, 0]


def test_unmark_of_uncached_block(eng: RangeEngine) -> None:
    req = eng.create_request()
    eng.append(req, 2)
    expect_error(eng, [req], BlockStateError, lambda: eng.cache_unmark([1]))


# ------------------------------------------------------------------------------------- pure functions


def test_coord_offset_values() -> None:
    layout = CoordLayout(num_layers=4, num_blocks=10, block_size=16, bytes_per_token=256)
    assert coord_offset(layout, 0, 0, 0) == 0
    assert coord_offset(layout, 2, 3, 5) == ((2 * 10 + 3) * 16 + 5) * 256
    assert coord_offset(layout, 3, 9, 15) == (4 * 10 * 16 - 1) * 256


@pytest.mark.parametrize(
    ("layer", "block", "token"), [(4, 0, 0), (-1, 0, 0), (0, 10, 0), (0, -1, 0), (0, 0, 16), (0, 0, -1)]
)
def test_coord_offset_bounds(layer: int, block: int, token: int) -> None:
    layout = CoordLayout(num_layers=4, num_blocks=10, block_size=16, bytes_per_token=256)
    with pytest.raises(OutOfRangeError) as info:
        coord_offset(layout, layer, block, token)
    assert info.value.message


def test_coord_offset_overflow() -> None:
    big = CoordLayout(num_layers=2**20, num_blocks=2**30, block_size=2**10, bytes_per_token=2**10)
    assert coord_offset(big, 0, 1, 0) == 2**20
    with pytest.raises(TagmaOverflowError) as info:
        coord_offset(big, 2**20 - 1, 2**30 - 1, 2**10 - 1)
    assert info.value.message
    assert info.value.status == TAGMA_E_OVERFLOW
    with pytest.raises(TagmaOverflowError):
        coord_offset(big, 2**64, 0, 0)  # would wrap through ctypes


@pytest.mark.parametrize(
    "layout",
    [
        CoordLayout(0, 10, 16, 2),
        CoordLayout(1, 0, 16, 2),
        CoordLayout(1, 10, 0, 2),
        CoordLayout(1, 10, 16, 0),
        CoordLayout(-1, 10, 16, 2),
    ],
)
def test_coord_offset_rejects_bad_layouts(layout: CoordLayout) -> None:
    with pytest.raises(InvalidArgumentError):
        coord_offset(layout, 0, 0, 0)


def test_slot_mapping_ranges_equals_paged_reference() -> None:
    block_size = 4
    lists = [[5, 6, 7, 2, 3], [9], [], [11, 12, 13, 14]]
    ranges = [(5, 3, 0), (2, 2, 3), (9, 1, 0), (11, 4, 0)]
    offsets = [0, 2, 3, 3, 4]
    positions = [0, 3, 4, 11, 12, 19, 20, 0, 3, 4, 0, 1, 15, 16]
    qsl = [0, 7, 10, 11, 14]
    out = slot_mapping_ranges(
        np.array(ranges, dtype=np.int32), offsets, qsl, positions, block_size, out_len=16
    )
    expected = paged_reference(lists, qsl, positions, block_size, 16)
    assert out.tolist() == expected
    table = np.zeros((4, 5), dtype=np.int32)
    for r, blocks in enumerate(lists):
        table[r, : len(blocks)] = blocks
    paged = slot_mapping_paged(table, [len(b) for b in lists], qsl, positions, block_size, out_len=16)
    assert paged.tolist() == expected
    assert out[14:].tolist() == [-1, -1]  # padding


def test_slot_mapping_writes_into_out() -> None:
    out = np.full(6, 99, dtype=np.int64)
    res = slot_mapping_ranges([(3, 2, 0)], [0, 1], [0, 3], [0, 5, 9], 4, out=out)
    assert res is out
    assert out.tolist() == [12, 17, -1, -1, -1, -1]
    with pytest.raises(TypeError):
        slot_mapping_ranges([(3, 2, 0)], [0, 1], [0, 3], [0, 5, 9], 4, out=np.zeros(6, dtype=np.int32))
    with pytest.raises(ValueError, match="out_len"):
        slot_mapping_ranges([(3, 2, 0)], [0, 1], [0, 3], [0, 5, 9], 4, out=out, out_len=7)


def test_slot_mapping_errors() -> None:
    ranges = [(3, 2, 0)]
    with pytest.raises(OutOfRangeError) as info:
        slot_mapping_ranges(ranges, [0, 1], [0, 2], [0, -1], 4)
    assert info.value.message
    with pytest.raises(OutOfRangeError):
        slot_mapping_paged([[3, 4]], [2], [0, 2], [0, -5], 4)
    with pytest.raises(InvalidArgumentError):  # out_len smaller than the number of tokens
        slot_mapping_ranges(ranges, [0, 1], [0, 2], [0, 1], 4, out_len=1)
    with pytest.raises(InvalidArgumentError):
        slot_mapping_ranges(ranges, [0, 1], [0, 2], [0, 1], 0)
    with pytest.raises(InvalidArgumentError):  # query_start_loc not monotone
        slot_mapping_ranges([(3, 2, 0), (7, 1, 0)], [0, 1, 2], [0, 2, 1], [0, 1], 4)
    with pytest.raises(InvalidArgumentError):  # offsets not monotone
        slot_mapping_ranges([(3, 2, 0), (7, 1, 0)], [0, 2, 1], [0, 1, 2], [0, 1], 4)
    with pytest.raises(TagmaError):  # ranges not contiguous from logical block 0
        slot_mapping_ranges([(3, 2, 1)], [0, 1], [0, 1], [0], 4)
    with pytest.raises(TagmaError):  # more valid blocks than the table has columns
        slot_mapping_paged([[3, 4]], [3], [0, 1], [0], 4)
    with pytest.raises(TagmaOverflowError):
        slot_mapping_ranges([(3, 2, 0)], [0, 1], [0, 1], [0], 2**62)
    with pytest.raises(ValueError, match="positions"):
        slot_mapping_ranges(ranges, [0, 1], [0, 5], [0, 1], 4)


# ----------------------------------------------------------------------------------------- behaviour


def test_in_place_growth(eng: RangeEngine) -> None:
    req = eng.create_request()
    first = eng.append(req, 4)
    assert isinstance(first, AppendResult)
    assert first.new_blocks.dtype == np.int32
    assert first.new_blocks.tolist() == [1, 2, 3, 4]
    assert first.evicted.tolist() == []
    assert eng.append(req, 2).new_blocks.tolist() == [5, 6]
    assert eng.ranges(req) == [Range(1, 6, 0)]
    assert eng.num_ranges(req) == 1
    assert eng.num_blocks_of(req) == 6
    stats = eng.stats()
    assert stats.in_place_growths == 1
    assert stats.new_ranges == 1
    assert stats.appended_blocks == 6


def test_new_range_when_the_neighbour_is_taken(eng: RangeEngine) -> None:
    a, b = eng.create_request(), eng.create_request()
    eng.append(a, 2)
    eng.append(b, 2)
    assert eng.append(a, 2).new_blocks.tolist() == [5, 6]
    assert eng.ranges(a) == [Range(1, 2, 0), Range(5, 2, 2)]
    assert eng.ranges_array(a).tolist() == [[1, 2, 0], [5, 2, 2]]
    assert eng.blocks(a).tolist() == [1, 2, 5, 6]
    assert eng.blocks(a, 1, 2).tolist() == [2, 5]
    assert [eng.block(a, i) for i in range(4)] == [1, 2, 5, 6]


def test_partial_growth_then_new_range(eng: RangeEngine) -> None:
    a, b, c = (eng.create_request() for _ in range(3))
    eng.append(a, 2)  # 1-2
    eng.append(b, 3)  # 3-5
    eng.append(c, 2)  # 6-7
    eng.release(b)
    assert eng.free_ranges() == [(3, 3), (8, 24)]
    res = eng.append(a, 5)
    assert res.new_blocks.tolist() == [3, 4, 5, 8, 9]
    assert eng.ranges(a) == [Range(1, 5, 0), Range(8, 2, 5)]


@pytest.mark.parametrize(
    ("policy", "start"), [(Policy.FIRST_FIT, 4), (Policy.BEST_FIT, 9), (Policy.HEADROOM, 21)]
)
def test_policies_place_a_new_range(make_engine: EngineFactory, policy: Policy, start: int) -> None:
    eng = make_engine(32, policy=Policy.FIRST_FIT)  # lays the blocks out left to right
    a, hole1, b, hole2, c = (eng.create_request() for _ in range(5))
    for req, n in ((a, 3), (hole1, 4), (b, 1), (hole2, 2), (c, 1)):
        eng.append(req, n)
    eng.release(hole1)
    eng.release(hole2)
    assert eng.free_ranges() == [(4, 4), (9, 2), (12, 20)]
    eng.set_policy(policy)
    new = eng.create_request()
    assert eng.append(new, 2).new_blocks.tolist() == [start, start + 1]


def test_headroom_at_the_first_usable_block_starts_there(make_engine: EngineFactory) -> None:
    eng = make_engine(32, policy=Policy.HEADROOM)
    req = eng.create_request()
    assert eng.append(req, 3).new_blocks.tolist() == [1, 2, 3]


def test_several_ranges_largest_first(make_engine: EngineFactory) -> None:
    eng = make_engine(16, policy=Policy.BEST_FIT)
    reqs = [eng.create_request() for _ in range(15)]
    for req in reqs:
        eng.append(req, 1)  # block i+1
    for i in (1, 2, 5, 6, 7, 10):  # free blocks 2-3, 6-8, 11
        eng.release(reqs[i])
    assert eng.free_ranges() == [(2, 2), (6, 3), (11, 1)]
    new = eng.create_request()
    assert eng.append(new, 6).new_blocks.tolist() == [6, 7, 8, 2, 3, 11]
    assert eng.free_ranges() == []


def test_sharing_and_release_to_cache(eng: RangeEngine) -> None:
    a, b = eng.create_request(), eng.create_request()
    eng.append(a, 4)
    eng.cache_mark([1, 2, 3, 4])
    eng.attach(b, [1, 2, 3])
    req_refs, cache_refs = eng.block_state()
    assert req_refs[:6].tolist() == [0, 2, 2, 2, 1, 0]
    assert cache_refs[:6].tolist() == [0, 1, 1, 1, 1, 0]
    assert eng.ranges(b) == [Range(1, 3, 0)]
    eng.release(a)
    assert eng.lru_order().tolist() == [4]
    stats = eng.stats()
    assert (stats.used_blocks, stats.cached_only_blocks, stats.free_blocks) == (3, 1, 27)
    eng.attach(b, [4])  # a cache-only block leaves the LRU; adjacent: merges into one range
    assert eng.lru_order().tolist() == []
    assert eng.ranges(b) == [Range(1, 4, 0)]
    eng.release(b)
    assert eng.lru_order().tolist() == [4, 3, 2, 1]  # reverse logical order: last blocks evicted first


def test_lru_eviction_order(eng: RangeEngine) -> None:
    a, b = eng.create_request(), eng.create_request()
    eng.append(a, 3)
    eng.append(b, 2)
    eng.cache_mark([1, 2, 3, 4, 5])
    eng.release(b)
    eng.release(a)
    assert eng.lru_order().tolist() == [5, 4, 3, 2, 1]
    assert eng.cache_evict(2).tolist() == [5, 4]
    assert eng.lru_order().tolist() == [3, 2, 1]
    expect_error(eng, [], InvalidArgumentError, lambda: eng.cache_evict(0))
    assert eng.cache_evict(100).tolist() == [3, 2, 1]
    assert eng.stats().evictions == 5
    assert eng.free_ranges() == [(1, 31)]


def test_append_evicts_exactly_what_it_needs(make_engine: EngineFactory) -> None:
    eng = make_engine(8)
    a = eng.create_request()
    eng.append(a, 7)
    eng.cache_mark(list(range(1, 8)))
    eng.release(a)
    assert eng.lru_order().tolist() == [7, 6, 5, 4, 3, 2, 1]
    b = eng.create_request()
    res = eng.append(b, 3)
    assert res.evicted.tolist() == [7, 6, 5]
    assert sorted(res.new_blocks.tolist()) == [5, 6, 7]
    assert eng.lru_order().tolist() == [4, 3, 2, 1]
    c = eng.create_request()
    expect_error(eng, [b, c], NoSpaceError, lambda: eng.append(c, 5))


def test_cache_clear_and_unmark(eng: RangeEngine) -> None:
    a = eng.create_request()
    eng.append(a, 4)
    eng.cache_mark([1, 2, 3])
    eng.cache_mark([3])
    eng.cache_unmark([3])
    eng.release(a)
    assert eng.lru_order().tolist() == [3, 2, 1]
    eng.cache_unmark([2])  # last reference gone: free again
    assert eng.lru_order().tolist() == [3, 1]
    assert eng.cache_clear() == 2
    assert eng.stats().free_blocks == 31
    assert eng.free_ranges() == [(1, 31)]


def test_many_ranges_and_free_ranges_are_fetched_whole(make_engine: EngineFactory) -> None:
    eng = make_engine(200)
    owner, sharer = eng.create_request(), eng.create_request()
    eng.append(owner, 199)
    odd = list(range(1, 200, 2))
    eng.attach(sharer, odd)
    assert eng.num_ranges(sharer) == 100
    assert eng.ranges_array(sharer)[:, 0].tolist() == odd
    eng.release(owner)
    assert eng.free_ranges() == [(b, 1) for b in range(2, 200, 2)]
    hist = eng.ranges_histogram(4)
    assert hist.tolist() == [0, 0, 0, 1]


def test_ranges_histogram(eng: RangeEngine) -> None:
    a, b, c = (eng.create_request() for _ in range(3))
    eng.append(a, 2)
    eng.append(b, 2)
    eng.append(a, 2)  # a: 2 ranges
    assert eng.ranges_histogram(4).tolist() == [1, 1, 1, 0]  # c has 0 ranges
    assert eng.ranges_histogram(2).tolist() == [1, 2]
    del c


def test_stats_are_consistent(eng: RangeEngine) -> None:
    a, b = eng.create_request(), eng.create_request()
    eng.append(a, 5)
    eng.append(b, 3)
    eng.release(a)
    stats = eng.stats()
    assert isinstance(stats, EngineStats)
    assert stats.num_blocks == 32
    assert stats.usable_blocks == 31
    assert stats.free_blocks + stats.cached_only_blocks + stats.used_blocks == stats.usable_blocks
    assert (stats.free_ranges, stats.largest_free_range, stats.free_blocks) == (2, 23, 28)
    assert stats.external_fragmentation == pytest.approx(1 - 23 / 28)
    assert (stats.live_requests, stats.total_request_ranges, stats.max_request_ranges) == (1, 1, 1)


def test_slot_mapping_through_engine_ranges(eng: RangeEngine) -> None:
    a, b = eng.create_request(), eng.create_request()
    eng.append(a, 2)
    eng.append(b, 3)
    eng.append(a, 3)
    block_size = 16
    rng = np.random.default_rng(0)
    lists = [eng.blocks(a).tolist(), eng.blocks(b).tolist()]
    positions = np.concatenate([rng.integers(0, 6 * block_size, 50), rng.integers(0, 4 * block_size, 30)])
    qsl = [0, 50, 80]
    ranges = np.concatenate([eng.ranges_array(a), eng.ranges_array(b)])
    offsets = [0, eng.num_ranges(a), eng.num_ranges(a) + eng.num_ranges(b)]
    out = slot_mapping_ranges(ranges, offsets, qsl, positions, block_size, out_len=96)
    assert out.tolist() == paged_reference(lists, qsl, positions.tolist(), block_size, 96)
