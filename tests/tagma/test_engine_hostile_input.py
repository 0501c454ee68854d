"""Hostile input at the engine's ABI: nothing a caller passes may wrap silently in ctypes or make the engine
read past a buffer. Every refusal is a typed tagma error (a :class:`TagmaError` subclass that keeps the
builtin base Python code would expect: ``TypeError`` for token containers, ``OverflowError`` for token ids
outside int32, ``ValueError`` for unknown enum members), raised before the engine is called, naming the
argument and its value. Each test runs on both token paths of the prefix index where it applies: the C list
reader (``libtagma_pylist.so``) and the ctypes fallback used without it."""

from __future__ import annotations

import array
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from tagma.engine import (
    AppendBatch,
    InvalidArgumentError,
    OutOfRangeError,
    Policy,
    RangeEngine,
    SlotMappingStep,
    TagmaError,
    TagmaOverflowError,
)
from tagma.engine.prefix_index import EvictionMode, PrefixIndex

BS = 4
U64 = 2**64


@pytest.fixture
def eng() -> Iterator[RangeEngine]:
    with RangeEngine(32) as engine:
        yield engine


@pytest.fixture(params=["reader", "fallback"])
def index(request: pytest.FixtureRequest) -> Iterator[PrefixIndex]:
    """A prefix index holding one cached request (tokens 100..123), on the C reader or the fallback."""
    engine = RangeEngine(64)
    idx = PrefixIndex(engine, BS)
    if request.param == "fallback":
        idx._reader = False  # what a build without the Python headers does
    req = engine.create_request()
    engine.append_runs(req, 6)
    idx.insert(0, req, list(range(100, 100 + 6 * BS)))
    yield idx
    engine.close()


def _typed(info: pytest.ExceptionInfo[BaseException], cls: type[TagmaError], *words: str) -> None:
    err = info.value
    assert isinstance(err, cls), f"{type(err).__name__} is not a {cls.__name__}: {err}"
    for word in words:
        assert word in str(err), (word, str(err))


# --------------------------------------------------------------------- the fallback token path's buffer


@pytest.mark.parametrize(
    "given",
    [bytes(16 * BS), bytearray(16 * BS), array.array("q", range(8)), array.array("h", range(8))],
    ids=["bytes", "bytearray", "array_q", "array_h"],
)
def test_token_buffers_that_are_not_int32_are_refused_alike(index: PrefixIndex, given: Any) -> None:
    """bytes went to ``array.array('i', ...)``, which reads them as raw int32s (len / 4 of them), while the
    count passed was len: the engine read 4x past the buffer (ASan: heap-buffer-overflow in find_child)."""
    with pytest.raises(TypeError) as info:
        index.lookup(0, given)
    _typed(info, InvalidArgumentError, "a token buffer must be 1-D native int32, got format")


def test_fallback_insert_of_bytes_indexes_nothing(index: PrefixIndex) -> None:
    """An insert through the old fallback copied out-of-bounds memory into the trie as a block's tokens."""
    engine = index.engine
    req = engine.create_request()
    engine.append_runs(req, 4)
    before = index.stats()
    with pytest.raises(TypeError) as info:
        index.insert(1, req, bytes(4 * BS))
    _typed(info, InvalidArgumentError, "native int32")
    assert index.stats().inserted_blocks == before.inserted_blocks


class _LyingSequence(Sequence[int]):
    """Claims more items than its slices yield."""

    def __init__(self, items: list[int], claimed: int) -> None:
        self._items, self._claimed = items, claimed

    def __len__(self) -> int:
        return self._claimed

    def __getitem__(self, key: Any) -> Any:
        return self._items[key]


def test_fallback_passes_the_length_of_the_array_it_built(index: PrefixIndex) -> None:
    index._reader = False
    seen: list[int] = []
    inner = index._f_lookup

    def spy(h: int, ns: int, ptr: int, count: int, *rest: Any) -> int:
        seen.append(count)
        return int(inner(h, ns, ptr, count, *rest))

    index._f_lookup = spy
    hostile = _LyingSequence(list(range(100, 100 + 2 * BS)), 64 * BS)
    assert index.lookup(0, hostile) == 2
    assert seen == [2 * BS]


def test_non_contiguous_memoryview_is_a_typed_error(index: PrefixIndex) -> None:
    strided = memoryview(np.arange(100, 100 + 8 * BS, dtype=np.int32))[::2]
    with pytest.raises(TypeError) as info:
        index.lookup(0, strided)
    _typed(info, InvalidArgumentError, "C-contiguous")


def test_int32_buffers_are_read_on_both_paths(index: PrefixIndex) -> None:
    tokens = np.arange(100, 100 + 6 * BS, dtype=np.int32)
    assert index.lookup(0, memoryview(tokens)) == 6
    assert index.lookup(0, array.array("i", tokens.tolist())) == 6
    assert index.lookup(0, memoryview(tokens.tobytes()).cast("i")) == 6
    assert index.lookup(0, tokens[4:]) == 0  # a slice: read where it starts


def test_token_ids_outside_int32_are_one_typed_error(index: PrefixIndex) -> None:
    with pytest.raises(OverflowError) as info:
        index.lookup(0, [1, 2, 3, 2**40])
    _typed(info, OutOfRangeError, "token id at index 3 does not fit int32")
    with pytest.raises(TypeError) as info:
        index.lookup(0, [1, 2, "x", 4])
    _typed(info, InvalidArgumentError, "token id at index 2 is a str, not an int")


def test_tokens_array_refuses_int64_values_outside_int32(index: PrefixIndex) -> None:
    """``np.array(int64_tokens, dtype=np.int32)`` wrapped 2**33 + 5 to 5."""
    with pytest.raises(OverflowError) as info:
        index.tokens_array(np.array([1, 2**33 + 5], dtype=np.int64))
    _typed(info, OutOfRangeError, "token_ids", str(2**33 + 5))
    assert index.tokens_array(np.array([1, 2, 3], dtype=np.int64)).tolist() == [1, 2, 3]


# ---------------------------------------------------------------------- scalars that ctypes would wrap


def test_namespace_and_request_outside_uint64_do_not_wrap(index: PrefixIndex) -> None:
    tokens = list(range(100, 100 + 6 * BS))
    for ns in (U64, -1):
        with pytest.raises(OutOfRangeError) as info:
            index.lookup(ns, tokens)
        _typed(info, OutOfRangeError, "ns", str(ns))
    req = index.engine.create_request()
    with pytest.raises(OutOfRangeError) as info:
        index.lookup_attach(0, req + U64, tokens)
    _typed(info, OutOfRangeError, "request", str(req + U64))
    assert index.engine.num_blocks_of(req) == 0


def test_max_blocks_outside_int64_does_not_wrap(index: PrefixIndex) -> None:
    tokens = list(range(100, 100 + 6 * BS))
    with pytest.raises(TagmaOverflowError) as info:
        index.lookup(0, tokens, max_blocks=U64 + 1)
    _typed(info, TagmaOverflowError, "max_blocks", str(U64 + 1))


def test_eviction_mode_outside_int32_does_not_wrap(index: PrefixIndex) -> None:
    """``set_eviction_mode(2**32 + 1)`` set CONTIGUOUS."""
    with pytest.raises(InvalidArgumentError) as info:
        index.set_eviction_mode(2**32 + 1)
    _typed(info, InvalidArgumentError, "eviction mode", str(2**32 + 1))
    assert index.stats().eviction_mode == EvictionMode.LRU
    with pytest.raises(InvalidArgumentError):
        PrefixIndex(RangeEngine(8), BS, 2**32 + 1)


@pytest.mark.parametrize(
    "call",
    [
        "release",
        "append",
        "append_runs",
        "attach",
        "num_blocks_of",
        "num_ranges",
        "ranges",
        "block",
        "blocks",
    ],
)
def test_request_ids_outside_uint64_do_not_wrap(eng: RangeEngine, call: str) -> None:
    """``release(r + 2**64)`` released request r."""
    req = eng.create_request()
    eng.append(req, 2)
    other = eng.create_request()
    eng.append(other, 1)
    args: dict[str, tuple[Any, ...]] = {
        "append": (1,), "append_runs": (1,), "attach": ([int(eng.block(other, 0))],), "block": (0,),
    }  # fmt: skip
    for bad in (req + U64, req - U64):
        with pytest.raises(OutOfRangeError) as info:
            getattr(eng, call)(bad, *args.get(call, ()))
        _typed(info, OutOfRangeError, "request", str(bad))
    assert eng.num_blocks_of(req) == 2


def test_block_index_outside_int64_does_not_wrap(eng: RangeEngine) -> None:
    """``block(r, 2**64)`` returned the request's block 0."""
    req = eng.create_request()
    eng.append(req, 2)
    with pytest.raises(TagmaOverflowError) as info:
        eng.block(req, U64)
    _typed(info, TagmaOverflowError, "logical", str(U64))
    with pytest.raises(TagmaOverflowError):
        eng.blocks(req, U64, 1)
    with pytest.raises(TagmaOverflowError):
        eng.blocks(req, 0, U64 + 1)


def test_cache_evict_max_blocks_outside_int64_does_not_wrap(eng: RangeEngine) -> None:
    req = eng.create_request()
    eng.append(req, 3)
    eng.cache_mark(eng.blocks(req))
    eng.release(req)
    with pytest.raises(TagmaOverflowError):
        eng.cache_evict(U64 + 1)
    assert eng.stats().cached_only_blocks == 3


def test_policy_and_admission_outside_int32_do_not_wrap(eng: RangeEngine) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        eng.set_policy(2**32 + int(Policy.FIRST_FIT))
    _typed(info, InvalidArgumentError, "policy", str(2**32))
    with pytest.raises(InvalidArgumentError):
        RangeEngine(16, policy=2**32 + 1)
    with pytest.raises(InvalidArgumentError) as info:
        eng.set_admission(2**32 + 50, 1)
    _typed(info, InvalidArgumentError, "percent", str(2**32 + 50))
    with pytest.raises(InvalidArgumentError):
        eng.set_admission(50, 2**32 + 1)


def test_unknown_enum_members_are_typed_value_errors() -> None:
    with pytest.raises(ValueError) as info:
        Policy.parse("worst_fit")
    _typed(info, InvalidArgumentError, "first_fit")
    with pytest.raises(ValueError) as info:
        EvictionMode.parse(7)
    _typed(info, InvalidArgumentError, "eviction mode", "7")


def test_append_batch_refuses_more_entries_than_it_holds(eng: RangeEngine) -> None:
    """``batch(n)`` with n past its arrays made the engine read past them."""
    batch = AppendBatch(eng, capacity=2)
    for n in (batch.capacity + 1, -1, U64 + 1):
        with pytest.raises(OutOfRangeError) as info:
            batch(n)
        _typed(info, OutOfRangeError, f"n = {n}")
    batch.counts[0] = 1
    batch(1)
    assert batch.requests[0] != 0


def test_slot_mapping_step_counts_outside_int64_do_not_wrap() -> None:
    ranges = np.array([[1, 4, 0]], dtype=np.int32)
    offsets = np.array([0, 1], dtype=np.int32)
    qsl = np.array([0, 2], dtype=np.int32)
    positions = np.array([0, 1], dtype=np.int64)
    out = np.full(4, 7, dtype=np.int64)
    step = SlotMappingStep(BS)
    step.bind_ranges(ranges.ctypes.data, 1, offsets.ctypes.data, 1)
    step.bind_out(out.ctypes.data, out.size)
    with pytest.raises(TagmaOverflowError) as info:
        step(U64 + 1, qsl.ctypes.data, positions.ctypes.data, 2)
    _typed(info, TagmaOverflowError, "num_reqs", str(U64 + 1))
    with pytest.raises(TagmaOverflowError):
        step(1, qsl.ctypes.data, positions.ctypes.data, U64 + 2)
    with pytest.raises(TagmaOverflowError):
        step.bind_out(out.ctypes.data, U64 + 4)
    with pytest.raises(TagmaOverflowError):
        step.bind_ranges(ranges.ctypes.data, U64 + 1, offsets.ctypes.data, 1)
    assert out.tolist() == [7] * 4
    step(1, qsl.ctypes.data, positions.ctypes.data, 2)
    assert out.tolist() == [4, 5, -1, -1]
