"""Fixtures of the engine binding's tests: engines that are closed after the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tagma.engine import Policy, RangeEngine
from tests.tagma.engine_helpers import EngineFactory


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
