"""The engine binding's error paths: the missing-library message, policy values, handles, and request,
attach and cache errors (right exception, the engine's message, state unchanged)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tagma.contract import ENV_LIB
from tagma.engine import (
    BlockStateError,
    EngineNotBuiltError,
    InvalidArgumentError,
    InvalidHandleError,
    MisalignedError,
    NoSpaceError,
    OutOfRangeError,
    Policy,
    RangeEngine,
    RequestNotFoundError,
    TagmaError,
    TagmaOverflowError,
    version,
)
from tests.tagma.engine_helpers import EngineFactory, expect_error
from tests.tagma.reference_engine import DUPLICATE_STATUSES, NULL_BLOCK_STATUSES

REPO = Path(__file__).resolve().parents[2]


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
