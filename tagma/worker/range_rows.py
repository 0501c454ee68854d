"""Per-row range descriptors of a worker's block table, kept incrementally as block ids arrive.

A row's blocks are run-length encoded into ranges ``(physical_start, num_blocks, first_logical_block)``:
a new block id that follows the row's last range (``start + count``) extends it, any other id opens a new
range. The descriptors live directly in the flat layout the slot-mapping kernels read: all ranges row
after row in one (R, 3) int32 array, plus ``offsets`` ((num_rows + 1,) int32; row r owns
``ranges[offsets[r]:offsets[r + 1]]``). Extending a row's last range (decode growth) is O(1); a new range,
clear, move or swap shifts the tail of the array (one vectorized copy) and the offsets after the row.
Nothing is ever rebuilt from scratch, and :meth:`RangeRows.on_device` copies the arrays to a device only
after something changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

I32Array = npt.NDArray[np.int32]
BlockIds = Sequence[int] | npt.NDArray[np.integer]

_INITIAL_CAPACITY = 64


@dataclass(frozen=True, slots=True)
class FlatRanges:
    """Views of the descriptors: row r owns ``ranges[offsets[r]:offsets[r + 1]]`` ((R, 3) int32)."""

    ranges: I32Array
    offsets: I32Array
    max_ranges_per_row: int


@dataclass(frozen=True, slots=True)
class DeviceRanges:
    """The descriptors on a device, with the binary-search depth their longest row needs."""

    ranges: torch.Tensor
    offsets: torch.Tensor
    num_search_steps: int


class RangeRows:
    """Range descriptors of ``num_rows`` block-table rows, in flat layout."""

    def __init__(self, num_rows: int) -> None:
        self._ranges = np.zeros((_INITIAL_CAPACITY, 3), dtype=np.int32)
        self._offsets = np.zeros(num_rows + 1, dtype=np.int32)
        self._num_blocks = np.zeros(num_rows, dtype=np.int64)
        self._dirty = True
        self._on_device: DeviceRanges | None = None
        self.storage_version = 0  # bumped when the ranges array is reallocated (its address changes)

    @property
    def num_rows(self) -> int:
        return self._num_blocks.shape[0]

    @property
    def dirty(self) -> bool:
        """Whether some row changed since the last :meth:`on_device` copy."""
        return self._dirty

    def on_device(self, device: torch.device) -> DeviceRanges:
        """The descriptors on ``device`` (always the same one), copied only after a row changed."""
        cached = self._on_device
        if cached is None or self._dirty:
            flat = self.flat()
            # Copies from pageable host memory: the host arrays may change as soon as .to() returns.
            cached = DeviceRanges(
                torch.from_numpy(flat.ranges).to(device, non_blocking=True),
                torch.from_numpy(flat.offsets).to(device, non_blocking=True),
                flat.max_ranges_per_row.bit_length(),
            )
            self._on_device = cached
            self._dirty = False
        return cached

    def host_storage(self) -> tuple[I32Array, I32Array]:
        """The backing arrays themselves: ranges ((capacity, 3) int32, rows past ``offsets[-1]`` unused) and
        offsets ((num_rows + 1,) int32). The offsets array never moves; the ranges array moves when it grows,
        which bumps :attr:`storage_version`."""
        return self._ranges, self._offsets

    def ranges_of(self, row: int) -> list[tuple[int, int, int]]:
        return [(s, c, f) for s, c, f in self._row(row).tolist()]

    def num_blocks_of(self, row: int) -> int:
        return int(self._num_blocks[row])

    def flat(self) -> FlatRanges:
        """The current descriptors (views, valid until the next change)."""
        counts = np.diff(self._offsets)
        return FlatRanges(self._ranges[: self._offsets[-1]], self._offsets, int(counts.max(initial=0)))

    # ---- row operations (the BlockTable row API)

    def append(self, row: int, block_ids: BlockIds) -> None:
        """Append blocks to the row's logical end."""
        count = len(block_ids)
        if count == 0:
            return
        self._dirty = True
        logical = int(self._num_blocks[row])
        self._num_blocks[row] = logical + count
        end = int(self._offsets[row + 1])
        if count == 1:
            block = int(block_ids[0])
            if end > self._offsets[row] and self._ranges[end - 1, 0] + self._ranges[end - 1, 1] == block:
                self._ranges[end - 1, 1] += 1
            else:
                self._insert(row, np.array([[block, 1, logical]], dtype=np.int32))
            return
        ids = np.asarray(block_ids, dtype=np.int64)
        run_starts = np.concatenate(([0], np.flatnonzero(np.diff(ids) != 1) + 1))
        runs = np.empty((run_starts.size, 3), dtype=np.int32)
        runs[:, 0] = ids[run_starts]
        runs[:, 1] = np.diff(np.append(run_starts, count))
        runs[:, 2] = logical + run_starts
        if end > self._offsets[row] and self._ranges[end - 1, 0] + self._ranges[end - 1, 1] == runs[0, 0]:
            self._ranges[end - 1, 1] += runs[0, 1]
            runs = runs[1:]
        if runs.size:
            self._insert(row, runs)

    def replace(self, row: int, block_ids: BlockIds) -> None:
        self.clear(row)
        self.append(row, block_ids)

    def clear(self, row: int) -> None:
        self._num_blocks[row] = 0
        self._set_row(row, None)

    def move(self, src: int, dst: int) -> None:
        """Row ``dst`` takes ``src``'s ranges; ``src`` becomes empty."""
        moved = self._row(src).copy()
        self._num_blocks[dst] = self._num_blocks[src]
        self._num_blocks[src] = 0
        self._set_row(src, None)
        self._set_row(dst, moved)

    def swap(self, a: int, b: int) -> None:
        rows_a, rows_b = self._row(a).copy(), self._row(b).copy()
        self._num_blocks[[a, b]] = self._num_blocks[[b, a]]
        self._set_row(a, rows_b)
        self._set_row(b, rows_a)

    # ---- flat-layout edits

    def _row(self, row: int) -> I32Array:
        return self._ranges[self._offsets[row] : self._offsets[row + 1]]

    def _set_row(self, row: int, ranges: I32Array | None) -> None:
        """Replace the row's ranges (None: none), shifting the rows after it."""
        begin, end = int(self._offsets[row]), int(self._offsets[row + 1])
        new_count = 0 if ranges is None else ranges.shape[0]
        if end == begin and new_count == 0:
            return
        self._dirty = True
        self._shift_tail(end, new_count - (end - begin))
        if new_count:
            self._ranges[begin : begin + new_count] = ranges
        self._offsets[row + 1 :] += new_count - (end - begin)

    def _insert(self, row: int, ranges: I32Array) -> None:
        """Add ranges at the row's end."""
        end = int(self._offsets[row + 1])
        self._shift_tail(end, ranges.shape[0])
        self._ranges[end : end + ranges.shape[0]] = ranges
        self._offsets[row + 1 :] += ranges.shape[0]

    def _shift_tail(self, start: int, delta: int) -> None:
        """Move ``ranges[start:total]`` by ``delta`` rows (numpy copies overlapping slices correctly)."""
        if delta == 0:
            return
        total = int(self._offsets[-1])
        if total + delta > self._ranges.shape[0]:
            grown = np.zeros((max(2 * self._ranges.shape[0], total + delta), 3), dtype=np.int32)
            grown[:total] = self._ranges[:total]
            self._ranges = grown
            self.storage_version += 1
        self._ranges[start + delta : total + delta] = self._ranges[start:total]
