"""Slot mapping from range descriptors as a Triton kernel (the GPU write path), and the range lookup that
every tagma Triton kernel shares.

The role of vLLM's ``_compute_slot_mappings_kernel`` (Model Runner V2) and ``ComputeSlotMappingKernel``
(Model Runner V1), with the dense block-table gather replaced by range arithmetic, in the form of the
engine's ``tagma_slot_mapping_step``: one program per request reads the request's FIRST position only
(vLLM schedules a request's tokens at consecutive positions, ``num_computed_tokens + arange``), finds the
range holding it once (:func:`find_range`), then walks the ranges from there, storing per range a run of
consecutive slots ``(physical_start - first_logical_block) * B + pos``. PAD past the request's blocks and for
a padding request (row -1), and the tail ``[query_start_loc[num_reqs], max_num_tokens)`` padded with PAD
for CUDA graphs. No block table is loaded.

Importing this module imports Triton: only GPU code paths (and the interpreter tests) import it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["compute_slot_mapping_ranges", "find_range"]

TRITON_BLOCK_SIZE = 1024


@triton.jit
def find_range(ranges_ptr, lo, hi, logical, num_search_steps, active):
    """Index of the last range in [lo, hi) whose first logical block is <= ``logical`` (lo when none).

    ``ranges_ptr`` points at (physical_start, num_blocks, first_logical_block) int32 triples ordered by
    first logical block. ``lo``, ``hi``, ``logical`` and ``active`` may be scalars or blocks of the same
    shape; inactive lanes keep ``lo``. ``num_search_steps`` must be at least the bit length of the longest
    [lo, hi) span. The one range lookup of tagma's Triton kernels: the write path's slot mapping here, and
    in the GPU kernel package the fused KV writes (``write.py``) and the decode attention's split start
    (``decode_attention.py``).
    """
    for _ in range(num_search_steps):
        step = active & (hi - lo > 1)
        mid = (lo + hi) // 2
        mid_first = tl.load(ranges_ptr + mid * 3 + 2, mask=step, other=0)
        go_right = mid_first <= logical
        lo = tl.where(step & go_right, mid, lo)
        hi = tl.where(step & ~go_right, mid, hi)
    return lo


@triton.jit
def _store_run(slot_mapping_ptr, start, stop, first_value, TRITON_BLOCK_SIZE: tl.constexpr):
    """slot_mapping[start + k] = first_value + k for k in [0, stop - start)."""
    for i in range(start, stop, TRITON_BLOCK_SIZE):
        offset = i + tl.arange(0, TRITON_BLOCK_SIZE)
        tl.store(slot_mapping_ptr + offset, first_value + (offset - start), mask=offset < stop)


@triton.jit
def _store_pad(slot_mapping_ptr, start, stop, PAD_ID: tl.constexpr, TRITON_BLOCK_SIZE: tl.constexpr):
    for i in range(start, stop, TRITON_BLOCK_SIZE):
        offset = i + tl.arange(0, TRITON_BLOCK_SIZE)
        tl.store(slot_mapping_ptr + offset, PAD_ID, mask=offset < stop)


@triton.jit
def _slot_mapping_ranges_kernel(
    max_num_tokens,
    idx_mapping_ptr,  # [num_reqs] int32, batch index -> row (HAS_IDX_MAPPING only)
    query_start_loc_ptr,  # [num_reqs + 1] int32
    positions_ptr,  # [num_tokens] int64: only each request's first position is read
    ranges_ptr,  # [R, 3] int32: physical_start, num_blocks, first_logical_block
    range_offsets_ptr,  # [num_rows + 1] int32: row r owns ranges [off[r], off[r + 1])
    slot_mapping_ptr,  # [max_num_tokens] int64
    num_search_steps,  # ceil(log2(max ranges per row + 1)): binary-search iterations
    KV_BLOCK_SIZE: tl.constexpr,
    HAS_IDX_MAPPING: tl.constexpr,
    PAD_ID: tl.constexpr,
    TRITON_BLOCK_SIZE: tl.constexpr,
):
    batch_idx = tl.program_id(0)
    if batch_idx == tl.num_programs(0) - 1:
        num_tokens = tl.load(query_start_loc_ptr + batch_idx)
        _store_pad(slot_mapping_ptr, num_tokens, max_num_tokens, PAD_ID, TRITON_BLOCK_SIZE)
        return

    if HAS_IDX_MAPPING:  # noqa: SIM108 (a constexpr branch inside the kernel)
        row = tl.load(idx_mapping_ptr + batch_idx)
    else:
        row = batch_idx
    # A negative row marks a dummy / padding request: it owns no ranges.
    is_real = row >= 0
    safe_row = tl.where(is_real, row, 0)
    first_range = tl.load(range_offsets_ptr + safe_row)
    end_range = tl.where(is_real, tl.load(range_offsets_ptr + safe_row + 1), first_range)

    t = tl.load(query_start_loc_ptr + batch_idx).to(tl.int64)
    end_idx = tl.load(query_start_loc_ptr + batch_idx + 1).to(tl.int64)
    p0 = tl.load(positions_ptr + t, mask=t < end_idx, other=0)
    has_ranges = end_range > first_range
    r = find_range(ranges_ptr, first_range, end_range, p0 // KV_BLOCK_SIZE, num_search_steps, has_ranges)
    p = p0
    # Each range the run crosses stores one stretch of consecutive slots: slot = base + position.
    while (t < end_idx) & (r < end_range):
        phys_start = tl.load(ranges_ptr + r * 3).to(tl.int64)
        count = tl.load(ranges_ptr + r * 3 + 1).to(tl.int64)
        first = tl.load(ranges_ptr + r * 3 + 2).to(tl.int64)
        range_end = (first + count) * KV_BLOCK_SIZE  # first position past the range
        stop = t + tl.maximum(tl.minimum(end_idx - t, range_end - p), 0)
        _store_run(slot_mapping_ptr, t, stop, (phys_start - first) * KV_BLOCK_SIZE + p, TRITON_BLOCK_SIZE)
        p += stop - t
        t = stop
        r += 1
    _store_pad(slot_mapping_ptr, t, end_idx, PAD_ID, TRITON_BLOCK_SIZE)  # past the request's blocks


def compute_slot_mapping_ranges(
    *,
    num_reqs: int,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    ranges: torch.Tensor,
    range_offsets: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_size: int,
    num_search_steps: int,
    pad_id: int = -1,
    idx_mapping: torch.Tensor | None = None,
) -> None:
    """Write the slot of every scheduled token into ``slot_mapping`` (1-D, padded to its length).

    Batch entry b reads row ``idx_mapping[b]`` (row b without ``idx_mapping``) of the descriptors; its
    tokens are ``[query_start_loc[b], query_start_loc[b + 1])`` at consecutive positions from
    ``positions[query_start_loc[b]]``. ``num_search_steps`` must be at least
    ``max_ranges_per_row.bit_length()``.
    """
    assert slot_mapping.dim() == 1 and slot_mapping.dtype == torch.int64
    assert ranges.dtype == torch.int32 and range_offsets.dtype == torch.int32
    has_idx = idx_mapping is not None
    _slot_mapping_ranges_kernel[(num_reqs + 1,)](
        slot_mapping.shape[0],
        idx_mapping if has_idx else query_start_loc,
        query_start_loc,
        positions,
        ranges,
        range_offsets,
        slot_mapping,
        num_search_steps,
        KV_BLOCK_SIZE=block_size,
        HAS_IDX_MAPPING=has_idx,
        PAD_ID=pad_id,
        TRITON_BLOCK_SIZE=TRITON_BLOCK_SIZE,
    )
