"""Slot mapping from range descriptors as a Triton kernel (the GPU write path).

The role of vLLM's ``_compute_slot_mappings_kernel`` (Model Runner V2) and ``ComputeSlotMappingKernel``
(Model Runner V1), with the dense block-table gather replaced by a binary search over the request's
ranges ``(physical_start, num_blocks, first_logical_block)``:
``slot = (physical_start + pos // B - first_logical_block) * B + pos % B``, PAD past the request's blocks,
and the tail ``[query_start_loc[num_reqs], max_num_tokens)`` padded with PAD for CUDA graphs.

Importing this module imports Triton: only GPU code paths (and the interpreter tests) import it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["compute_slot_mapping_ranges"]

TRITON_BLOCK_SIZE = 1024


@triton.jit
def _slot_mapping_ranges_kernel(
    max_num_tokens,
    idx_mapping_ptr,  # [num_reqs] int32, batch index -> row (HAS_IDX_MAPPING only)
    query_start_loc_ptr,  # [num_reqs + 1] int32
    positions_ptr,  # [num_tokens] int64
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
        for i in range(num_tokens, max_num_tokens, TRITON_BLOCK_SIZE):
            offset = i + tl.arange(0, TRITON_BLOCK_SIZE)
            tl.store(slot_mapping_ptr + offset, PAD_ID, mask=offset < max_num_tokens)
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

    start_idx = tl.load(query_start_loc_ptr + batch_idx)
    end_idx = tl.load(query_start_loc_ptr + batch_idx + 1)
    for i in range(start_idx, end_idx, TRITON_BLOCK_SIZE):
        offset = i + tl.arange(0, TRITON_BLOCK_SIZE)
        in_batch = offset < end_idx
        pos = tl.load(positions_ptr + offset, mask=in_batch, other=0)
        logical = pos // KV_BLOCK_SIZE
        # The last range whose first logical block is <= logical, searched in [lo, hi).
        lo = tl.full([TRITON_BLOCK_SIZE], 0, tl.int32) + first_range
        hi = tl.full([TRITON_BLOCK_SIZE], 0, tl.int32) + end_range
        for _ in range(num_search_steps):
            active = in_batch & (hi - lo > 1)
            mid = (lo + hi) // 2
            mid_first = tl.load(ranges_ptr + mid * 3 + 2, mask=active, other=0)
            go_right = mid_first <= logical
            lo = tl.where(active & go_right, mid, lo)
            hi = tl.where(active & ~go_right, mid, hi)
        has_range = in_batch & (hi > lo)
        phys_start = tl.load(ranges_ptr + lo * 3, mask=has_range, other=0).to(tl.int64)
        count = tl.load(ranges_ptr + lo * 3 + 1, mask=has_range, other=0).to(tl.int64)
        first = tl.load(ranges_ptr + lo * 3 + 2, mask=has_range, other=0).to(tl.int64)
        inside = has_range & (logical >= first) & (logical < first + count) & (pos >= 0)
        slot = (phys_start + logical - first) * KV_BLOCK_SIZE + (pos - logical * KV_BLOCK_SIZE)
        tl.store(slot_mapping_ptr + offset, tl.where(inside, slot, PAD_ID), mask=in_batch)


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

    Batch entry b reads row ``idx_mapping[b]`` (row b without ``idx_mapping``) of the descriptors.
    ``num_search_steps`` must be at least ``max_ranges_per_row.bit_length()``.
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
