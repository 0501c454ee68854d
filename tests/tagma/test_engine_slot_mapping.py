"""Coordinates and slot mapping through the binding: coord_offset's bounds and overflow, slot_mapping_ranges
against the paged reference and its errors, and slot mapping over an engine's own ranges."""

from __future__ import annotations

import numpy as np
import pytest

from tagma.engine import (
    TAGMA_E_OVERFLOW,
    CoordLayout,
    InvalidArgumentError,
    OutOfRangeError,
    RangeEngine,
    TagmaError,
    TagmaOverflowError,
    coord_offset,
    slot_mapping_paged,
    slot_mapping_ranges,
)
from tests.tagma.engine_helpers import paged_reference

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
