"""tagma.engine.prefix_keyed: window blocks cached under chained content keys, through the binding."""

from __future__ import annotations

import numpy as np
import pytest

from tagma.engine import BlockStateError, InvalidArgumentError, RangeEngine
from tagma.engine.prefix_index import PrefixIndex
from tagma.engine.prefix_keyed import PrefixKeyedGroups
from tagma.engine.prefix_side import PrefixSideGroups

BS = 4


def _setup(num_blocks: int = 64, groups: int = 1) -> tuple[RangeEngine, PrefixIndex, PrefixKeyedGroups]:
    engine = RangeEngine(num_blocks)
    index = PrefixIndex(engine, BS)
    return engine, index, PrefixKeyedGroups(index, groups)


def _tokens(index: PrefixIndex, values: list[int]) -> np.ndarray:
    return index.tokens_array(values)


def test_keys_chain_from_the_namespace_or_the_block_before() -> None:
    _, index, keyed = _setup()
    tokens = _tokens(index, list(range(100, 100 + 5 * BS)))
    keys = keyed.keys(0, tokens)
    assert keys.shape == (5, 2) and keys.dtype == np.uint64
    assert np.array_equal(keyed.keys(0, tokens[: 2 * BS]), keys[:2])
    assert np.array_equal(keyed.keys(0, tokens[2 * BS :], keys[1]), keys[2:])  # the chain goes on
    assert not np.array_equal(keyed.keys(0, tokens[2 * BS :]), keys[2:])  # from the start: other keys
    assert (keyed.keys(1, tokens) != keys).all()  # another namespace
    assert keyed.keys(0, tokens[: BS - 1]).shape == (0, 2)  # no full block
    with pytest.raises(ValueError, match="int32"):
        keyed.keys(0, tokens.astype(np.int64))
    with pytest.raises(ValueError, match="one key"):
        keyed.keys(0, tokens, np.zeros(3, dtype=np.uint64))


def test_blocks_are_found_by_key_and_tokens_and_attach_to_a_new_request() -> None:
    engine, index, keyed = _setup()
    tokens = _tokens(index, list(range(1000, 1000 + 6 * BS)))
    keys = keyed.keys(0, tokens)
    window = engine.create_request()
    engine.append_runs(window, 6)
    ids = engine.blocks(window).tolist()
    assert keyed.insert_keyed(0, window, 0, 0, keys, tokens) == 6
    assert keyed.insert_keyed(0, window, 0, 0, keys, tokens) == 0  # cached already
    assert keyed.lookup_keyed(0, keys, tokens).tolist() == ids
    other = tokens.copy()
    other[5 * BS] += 1  # the last block's tokens differ under the same keys: no hit there
    assert keyed.lookup_keyed(0, keys, other).tolist() == ids[:5] + [-1]
    engine.free_front(window, 4)
    engine.release(window)
    assert engine.stats().cached_only_blocks == 6
    again = engine.create_request()
    keyed.attach(again, ids[4:])  # a window of 2 blocks takes the last 2
    assert engine.blocks(again).tolist() == ids[4:]
    assert keyed.stats().cached_blocks == 6 and keyed.stats().inserted_blocks == 6
    with pytest.raises(BlockStateError):
        keyed.attach(engine.create_request(), [ids[4], ids[4]])
    engine.release(again)
    assert index.clear() == 6
    assert keyed.lookup_keyed(0, keys, tokens).tolist() == [-1] * 6


def test_masks_groups_and_a_windows_dropped_blocks() -> None:
    engine, index, keyed = _setup(groups=2)
    tokens = _tokens(index, list(range(7, 7 + 4 * BS)))
    keys = keyed.keys(3, tokens)
    g0, g1 = engine.create_request(), engine.create_request()
    engine.append_runs(g0, 4)
    engine.append_runs(g1, 2)  # logical 2 and 3: its first two blocks were dropped
    mask = np.array([True, False, True, True])
    assert keyed.insert_keyed(0, g0, 0, 0, keys, tokens, mask) == 3
    assert keyed.insert_keyed(1, g1, 2, 0, keys, tokens) == 2
    b0, b1 = engine.blocks(g0).tolist(), engine.blocks(g1).tolist()
    assert keyed.lookup_keyed(0, keys, tokens).tolist() == [b0[0], -1, b0[2], b0[3]]
    assert keyed.lookup_keyed(1, keys, tokens).tolist() == [-1, -1, *b1]
    # positions [2, 4) alone: the keys and tokens of those positions
    assert keyed.insert_keyed(0, g0, 0, 2, keys[2:], tokens[2 * BS :]) == 0
    with pytest.raises(ValueError, match="mask"):
        keyed.insert_keyed(0, g0, 0, 0, keys, tokens, mask[:2])
    with pytest.raises(ValueError, match="keys"):
        keyed.lookup_keyed(0, keys, tokens[:BS])
    with pytest.raises(InvalidArgumentError):
        keyed.lookup_keyed(2, keys, tokens)


def test_keyed_and_node_side_groups_exclude_each_other() -> None:
    engine = RangeEngine(32)
    index = PrefixIndex(engine, BS)
    PrefixKeyedGroups(index, 1)
    with pytest.raises(BlockStateError):
        PrefixSideGroups(index, 1)
    with pytest.raises(BlockStateError):
        PrefixKeyedGroups(index, 1)
    plain = PrefixIndex(RangeEngine(32), BS)
    with pytest.raises(InvalidArgumentError):
        PrefixKeyedGroups(plain, 0)
