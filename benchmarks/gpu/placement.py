"""Where a batch's KV blocks lie, described both ways: a dense block table and range descriptors.

A request's logical block ``i`` lives in physical block ``block_table[req, i]``; the same placement as
ranges is the run-length encoding of that row: ``(physical_start, num_blocks, first_logical_block)``
triples, row ``req`` owning ``ranges[range_offsets[req]:range_offsets[req + 1]]`` (the flat layout of
``tagma.worker.range_rows`` and of the Triton slot-mapping kernel). Physical block 0 is the null block and is
never used; the placements fill blocks ``[1, num_blocks)``.

* :func:`contiguous`: every request is one range, requests back to back (tagma's assumption holds).
* :func:`fragmented`: every request is cut into pieces whose lengths are drawn from a range-length
  distribution (:class:`RangeLengths`, e.g. the tagma engine's serving trace), and all pieces of the batch
  are laid out in a random order (pieces that land adjacent in logical order merge, as the engine would).

No Triton here: numpy, and torch only to move the descriptors to a device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch

__all__ = ["DeviceDescriptors", "Placement", "RangeLengths", "contiguous", "fragmented", "from_block_lists"]

I32Array = npt.NDArray[np.int32]


@dataclass(frozen=True, slots=True)
class DeviceDescriptors:
    """A placement's descriptors as tensors on one device (what the kernels take)."""

    block_table: torch.Tensor  # [num_reqs, max_blocks] int32, padded with the null block 0
    ranges: torch.Tensor  # [num_ranges, 3] int32
    range_offsets: torch.Tensor  # [num_reqs + 1] int32
    num_search_steps: int  # binary-search iterations that cover the longest range list


@dataclass(frozen=True, slots=True)
class Placement:
    """One batch's KV placement: ``blocks[r]`` are request r's physical blocks in logical order."""

    kind: str
    blocks: tuple[I32Array, ...]
    num_blocks: int  # physical blocks a cache needs for it, the null block included

    @property
    def num_reqs(self) -> int:
        return len(self.blocks)

    def block_table(self) -> I32Array:
        width = max((b.size for b in self.blocks), default=0)
        table = np.zeros((self.num_reqs, max(width, 1)), dtype=np.int32)
        for row, ids in enumerate(self.blocks):
            table[row, : ids.size] = ids
        return table

    def ranges(self) -> tuple[I32Array, I32Array]:
        """(ranges [R, 3], range_offsets [num_reqs + 1]): the run-length encoding of every row."""
        per_row = [_run_lengths(ids) for ids in self.blocks]
        offsets = np.zeros(self.num_reqs + 1, dtype=np.int32)
        offsets[1:] = np.cumsum([r.shape[0] for r in per_row])
        flat = np.concatenate(per_row) if per_row else np.empty((0, 3), dtype=np.int32)
        return flat.astype(np.int32).reshape(-1, 3), offsets

    def ranges_per_request(self) -> I32Array:
        return np.diff(self.ranges()[1]).astype(np.int32)

    def stats(self) -> dict[str, Any]:
        counts = self.ranges_per_request()
        ranges, _ = self.ranges()
        return {
            "kind": self.kind,
            "num_reqs": self.num_reqs,
            "num_blocks": self.num_blocks,
            "ranges_per_request_mean": float(counts.mean()) if counts.size else 0.0,
            "ranges_per_request_max": int(counts.max()) if counts.size else 0,
            "range_blocks_mean": float(ranges[:, 1].mean()) if ranges.size else 0.0,
            "range_blocks_median": float(np.median(ranges[:, 1])) if ranges.size else 0.0,
        }

    def to_device(self, device: torch.device | str) -> DeviceDescriptors:
        import torch

        ranges, offsets = self.ranges()
        max_ranges = int(np.diff(offsets).max()) if self.num_reqs else 0
        return DeviceDescriptors(
            block_table=torch.from_numpy(self.block_table()).to(device),
            ranges=torch.from_numpy(ranges).to(device),
            range_offsets=torch.from_numpy(offsets).to(device),
            num_search_steps=max_ranges.bit_length(),
        )


def _run_lengths(ids: I32Array) -> I32Array:
    if ids.size == 0:
        return np.empty((0, 3), dtype=np.int32)
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    firsts = np.concatenate([[0], breaks])
    counts = np.diff(np.concatenate([firsts, [ids.size]]))
    return np.stack([ids[firsts], counts, firsts], axis=1).astype(np.int32)


def from_block_lists(kind: str, blocks: Sequence[Sequence[int]], num_blocks: int | None = None) -> Placement:
    arrays = tuple(np.asarray(b, dtype=np.int32) for b in blocks)
    top = max((int(a.max()) for a in arrays if a.size), default=0)
    return Placement(kind, arrays, num_blocks if num_blocks is not None else top + 1)


def contiguous(blocks_per_request: Sequence[int]) -> Placement:
    """Every request one range; request r starts right after request r - 1 (the first at block 1)."""
    starts = 1 + np.concatenate([[0], np.cumsum(blocks_per_request)])
    blocks = tuple(
        np.arange(s, s + n, dtype=np.int32) for s, n in zip(starts, blocks_per_request, strict=False)
    )
    return Placement("contiguous", blocks, int(starts[-1]))


@dataclass(frozen=True, slots=True)
class RangeLengths:
    """A distribution of range lengths in blocks (one weight per length: the share of RANGES that long)."""

    lengths: I32Array
    weights: npt.NDArray[np.float64]
    source: str

    @classmethod
    def from_counts(cls, lengths: Sequence[int], counts: Sequence[float], source: str) -> RangeLengths:
        lens = np.asarray(lengths, dtype=np.int32)
        w = np.asarray(counts, dtype=np.float64)
        if lens.size == 0 or lens.size != w.size or (lens < 1).any() or (w < 0).any() or w.sum() <= 0:
            raise ValueError("range lengths need positive lengths and non-negative counts, not all zero")
        return cls(lens, w / w.sum(), source)

    @classmethod
    def from_trace(cls, trace: dict[str, Any]) -> RangeLengths:
        hist = trace["range_length_blocks"]
        return cls.from_counts(hist["lengths"], hist["counts"], trace.get("source", "trace"))

    def mean(self) -> float:
        return float((self.lengths * self.weights).sum())

    def sample(self, rng: np.random.Generator, size: int) -> I32Array:
        return rng.choice(self.lengths, size=size, p=self.weights).astype(np.int32)


def _cut(rng: np.random.Generator, total: int, lengths: RangeLengths) -> I32Array:
    """Piece lengths drawn i.i.d. from ``lengths`` until they cover ``total`` blocks (the last clipped)."""
    pieces: list[I32Array] = []
    covered = 0
    while covered < total:
        draw = lengths.sample(rng, max(8, int(1.5 * (total - covered) / lengths.mean()) + 1))
        pieces.append(draw)
        covered += int(draw.sum())
    cut = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int32)
    ends = np.cumsum(cut)
    n = int(np.searchsorted(ends, total)) + 1 if total else 0
    cut = cut[:n].copy()
    if n:
        cut[-1] -= int(ends[n - 1]) - total
    return cut


def fragmented(blocks_per_request: Sequence[int], lengths: RangeLengths, seed: int = 0) -> Placement:
    """Requests cut into pieces drawn from ``lengths``; all pieces of the batch placed in a random order."""
    rng = np.random.default_rng(seed)
    cuts = [_cut(rng, int(n), lengths) for n in blocks_per_request]
    sizes = np.concatenate(cuts) if cuts else np.empty(0, dtype=np.int32)
    order = rng.permutation(len(sizes))
    phys_start = np.empty(len(sizes), dtype=np.int64)
    if len(sizes):
        phys_start[order] = 1 + np.concatenate([[0], np.cumsum(sizes[order])[:-1]])
    blocks = []
    first_piece = 0
    for c in cuts:
        pieces = range(first_piece, first_piece + c.size)
        ids = [np.arange(phys_start[p], phys_start[p] + sizes[p], dtype=np.int32) for p in pieces]
        blocks.append(np.concatenate(ids) if ids else np.empty(0, dtype=np.int32))
        first_piece += c.size
    return Placement("fragmented", tuple(blocks), 1 + int(sizes.sum()))
