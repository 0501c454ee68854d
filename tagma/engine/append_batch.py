"""Batched appends: many requests' appends in one ABI call (``tagma_append_runs_batch``)."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

from tagma.engine.abi import (
    _I32,
    _I64,
    _U64,
    _VP,
    _CAppendBatch,
)
from tagma.errors import TAGMA_E_OUT_OF_RANGE, OutOfRangeError

__all__ = [
    "AppendBatch",
]
from tagma.engine.loader import _raise, hot_function
from tagma.engine.range_engine import RangeEngine


class AppendBatch:
    """A prepared ``tagma_append_runs_batch`` on one engine: the range manager's one crossing per step.

    The caller writes entry i into ``requests[i]`` (0: create a request; its id is written back) and
    ``counts[i]`` (ctypes arrays of :attr:`capacity` entries; :meth:`reserve` grows them), then calls
    ``batch(n)``: one prebound call with one prefilled-struct argument; the only Python-side check is that
    ``n`` is within the bound arrays (the engine cannot see their size); the engine validates the entries
    and changes nothing on error, raised as a :class:`TagmaError`. The arrays are ctypes arrays, which wrap
    an int outside their type when it is written: the caller writes ids the engine gave and counts it
    computed (block counts, far inside int64). Entry i's
    runs are then the int32 pairs ``runs[2 * offsets[i] : 2 * offsets[i + 1]]``. ``runs`` holds a pair per
    block of the engine, so any batch that fits in the free blocks fits in it. With ``hints=True`` entry i
    also carries the growth hint ``hints[i]`` (RESERVE placement); otherwise none.
    """

    __slots__ = (
        "_arg", "_args", "_capacity", "_engine", "_fn", "_hinted", "_lib",
        "counts", "hints", "offsets", "requests", "runs",
    )  # fmt: skip

    def __init__(self, engine: RangeEngine, capacity: int = 64, hints: bool = False) -> None:
        self._engine = engine
        self._hinted = hints
        self.hints: Any = None
        self._lib = engine._lib
        self._fn = hot_function("tagma_append_runs_batch", _VP)
        self._args = _CAppendBatch(engine=engine.handle)
        self._arg = _VP(ctypes.addressof(self._args))
        self.runs = (_I32 * (2 * engine.num_blocks))()
        self._args.runs_out = ctypes.addressof(self.runs)
        self._args.runs_capacity = engine.num_blocks
        self.requests: Any = None
        self.counts: Any = None
        self.offsets: Any = None
        self._bind(max(1, int(capacity)))

    def _bind(self, capacity: int) -> None:
        requests, counts = (_U64 * capacity)(), (_I64 * capacity)()
        hints = (_I64 * capacity)() if self._hinted else None
        if self.requests is not None:  # keep what is written so far
            n = len(self.requests)
            requests[:n] = self.requests[:]
            counts[:n] = self.counts[:]
            if hints is not None:
                hints[:n] = self.hints[:]
        self.requests, self.counts, self.hints = requests, counts, hints
        self.offsets = (_I64 * (capacity + 1))()
        self._capacity = capacity
        a = self._args
        a.requests = ctypes.addressof(requests)
        a.counts = ctypes.addressof(counts)
        a.hints = ctypes.addressof(hints) if hints is not None else None
        a.run_offsets = ctypes.addressof(self.offsets)

    @property
    def capacity(self) -> int:
        """Entries the bound arrays hold."""
        return self._capacity

    def reserve(self, n: int) -> None:
        """Room for ``n`` entries: rebinds the entry arrays (and ``offsets``), keeping what is written."""
        if n > len(self.requests):
            self._bind(max(n, 2 * len(self.requests)))

    def __call__(self, n: int) -> None:
        """Apply entries ``[0, n)`` in one engine call (``0 <= n <= capacity``)."""
        if not 0 <= n <= self._capacity:
            raise OutOfRangeError(
                TAGMA_E_OUT_OF_RANGE,
                f"n = {n} is outside [0, {self._capacity}]: the batch's arrays hold {self._capacity} entries "
                "(reserve() grows them)",
            )
        self._args.num_requests = n
        status = self._fn(self._arg)
        if status:
            _raise(self._lib, status)
