"""Shared by the engine binding's tests: the error-path checks (right exception, engine message, state
unchanged) and the paged slot-mapping reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tagma.engine import RangeEngine, TagmaError

EngineFactory = Callable[..., RangeEngine]


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
