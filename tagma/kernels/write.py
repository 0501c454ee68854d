"""The KV write path in Triton: slot mapping and the K/V scatter, from a block table or from ranges.

* :func:`slot_mapping_paged`: vLLM's formulation (Model Runner V2's ``_compute_slot_mappings_kernel`` for
  one KV cache group, no context parallelism): ``slot = block_table[row, pos // B] * B + pos % B``.
* :func:`slot_mapping_ranges`: tagma's serving kernel (``tagma.worker.triton_slot_mapping``): the same slots
  from each request's first position, one range lookup per request, then runs of consecutive slots.
* :func:`reshape_and_cache`: vLLM's ``reshape_and_cache_kernel_flash`` (cache layout
  ``[num_blocks, B, num_kv_heads, head_dim]``, no fp8): token i's K/V rows to slot ``slot_mapping[i]``.
* :func:`write_kv_paged` / :func:`write_kv_ranges`: the scatter with each token's slot found in the same
  kernel (no slot-mapping tensor in between), from the block table or from the ranges (the range lookup is
  ``tagma.worker.triton_slot_mapping.find_range``, shared by every tagma kernel).

Importing this module imports Triton: only GPU code and the interpreter tests import it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tagma.worker.triton_slot_mapping import compute_slot_mapping_ranges, find_range

__all__ = [
    "reshape_and_cache",
    "slot_mapping_paged",
    "slot_mapping_ranges",
    "write_kv_paged",
    "write_kv_ranges",
]

SLOT_BLOCK = 1024  # tokens per program iteration of the slot-mapping kernels


@triton.jit
def _slot_mapping_paged_kernel(
    max_num_tokens,
    idx_mapping_ptr,  # [num_reqs] int32, batch index -> row (HAS_IDX_MAPPING only)
    query_start_loc_ptr,  # [num_reqs + 1] int32
    positions_ptr,  # [num_tokens] int64
    block_table_ptr,  # [max_num_reqs, max_blocks] int32
    block_table_stride,
    slot_mapping_ptr,  # [max_num_tokens] int64
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
    # A negative row marks a dummy / padding request: it owns no blocks (a vector, like the mask it joins).
    is_real = tl.full([TRITON_BLOCK_SIZE], 0, tl.int32) + row >= 0
    start_idx = tl.load(query_start_loc_ptr + batch_idx)
    end_idx = tl.load(query_start_loc_ptr + batch_idx + 1)
    for i in range(start_idx, end_idx, TRITON_BLOCK_SIZE):
        offset = i + tl.arange(0, TRITON_BLOCK_SIZE)
        in_batch = offset < end_idx
        pos = tl.load(positions_ptr + offset, mask=in_batch, other=0)
        block = tl.load(
            block_table_ptr + row * block_table_stride + pos // KV_BLOCK_SIZE,
            mask=in_batch & is_real,
            other=0,
        )
        slot = block.to(tl.int64) * KV_BLOCK_SIZE + pos % KV_BLOCK_SIZE
        tl.store(slot_mapping_ptr + offset, tl.where(is_real, slot, PAD_ID), mask=in_batch)


def slot_mapping_paged(
    *,
    num_reqs: int,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_size: int,
    pad_id: int = -1,
    idx_mapping: torch.Tensor | None = None,
) -> None:
    """vLLM's slot mapping through the dense block table, same arguments as :func:`slot_mapping_ranges`."""
    assert slot_mapping.dim() == 1 and slot_mapping.dtype == torch.int64
    assert block_table.dtype == torch.int32 and block_table.stride(1) == 1
    has_idx = idx_mapping is not None
    _slot_mapping_paged_kernel[(num_reqs + 1,)](
        slot_mapping.shape[0],
        idx_mapping if has_idx else query_start_loc,
        query_start_loc,
        positions,
        block_table,
        block_table.stride(0),
        slot_mapping,
        KV_BLOCK_SIZE=block_size,
        HAS_IDX_MAPPING=has_idx,
        PAD_ID=pad_id,
        TRITON_BLOCK_SIZE=SLOT_BLOCK,
    )


def slot_mapping_ranges(
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
    """tagma's slot mapping from range descriptors (``tagma.worker.triton_slot_mapping``)."""
    compute_slot_mapping_ranges(
        num_reqs=num_reqs,
        query_start_loc=query_start_loc,
        positions=positions,
        ranges=ranges,
        range_offsets=range_offsets,
        slot_mapping=slot_mapping,
        block_size=block_size,
        num_search_steps=num_search_steps,
        pad_id=pad_id,
        idx_mapping=idx_mapping,
    )


@triton.jit
def _store_rows(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    token,
    slot,
    key_stride,
    value_stride,
    block_stride,
    page_stride,
    ROW: tl.constexpr,
    TILE: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
):
    """Copy token ``token``'s K/V rows (ROW = num_kv_heads * head_dim elements, contiguous) to ``slot``."""
    offs = tl.program_id(1) * TILE + tl.arange(0, TILE)
    mask = offs < ROW
    dst = (slot // KV_BLOCK_SIZE) * block_stride + (slot % KV_BLOCK_SIZE) * page_stride + offs
    key = tl.load(key_ptr + token * key_stride + offs, mask=mask)
    value = tl.load(value_ptr + token * value_stride + offs, mask=mask)
    tl.store(key_cache_ptr + dst, key, mask=mask)
    tl.store(value_cache_ptr + dst, value, mask=mask)


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    key_stride,
    value_stride,
    block_stride,
    page_stride,
    ROW: tl.constexpr,
    TILE: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    if slot >= 0:
        _store_rows(
            key_ptr,
            value_ptr,
            key_cache_ptr,
            value_cache_ptr,
            token,
            slot,
            key_stride,
            value_stride,
            block_stride,
            page_stride,
            ROW,
            TILE,
            KV_BLOCK_SIZE,
        )


@triton.jit
def _write_kv_paged_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    token_rows_ptr,
    positions_ptr,
    block_table_ptr,
    block_table_stride,
    key_stride,
    value_stride,
    block_stride,
    page_stride,
    ROW: tl.constexpr,
    TILE: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    row = tl.load(token_rows_ptr + token)
    if row >= 0:
        pos = tl.load(positions_ptr + token)
        block = tl.load(block_table_ptr + row * block_table_stride + pos // KV_BLOCK_SIZE).to(tl.int64)
        slot = block * KV_BLOCK_SIZE + pos % KV_BLOCK_SIZE
        _store_rows(
            key_ptr,
            value_ptr,
            key_cache_ptr,
            value_cache_ptr,
            token,
            slot,
            key_stride,
            value_stride,
            block_stride,
            page_stride,
            ROW,
            TILE,
            KV_BLOCK_SIZE,
        )


@triton.jit
def _write_kv_ranges_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    token_rows_ptr,
    positions_ptr,
    ranges_ptr,
    range_offsets_ptr,
    num_search_steps,
    key_stride,
    value_stride,
    block_stride,
    page_stride,
    ROW: tl.constexpr,
    TILE: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    row = tl.load(token_rows_ptr + token)
    if row >= 0:
        pos = tl.load(positions_ptr + token)
        logical = pos // KV_BLOCK_SIZE
        lo = tl.load(range_offsets_ptr + row)
        hi = tl.load(range_offsets_ptr + row + 1)
        r = find_range(ranges_ptr, lo, hi, logical, num_search_steps, hi > lo)
        start = tl.load(ranges_ptr + r * 3, mask=hi > lo, other=0).to(tl.int64)
        count = tl.load(ranges_ptr + r * 3 + 1, mask=hi > lo, other=0)
        first = tl.load(ranges_ptr + r * 3 + 2, mask=hi > lo, other=0)
        if (logical >= first) & (logical < first + count) & (pos >= 0):
            slot = (start + logical - first) * KV_BLOCK_SIZE + pos % KV_BLOCK_SIZE
            _store_rows(
                key_ptr,
                value_ptr,
                key_cache_ptr,
                value_cache_ptr,
                token,
                slot,
                key_stride,
                value_stride,
                block_stride,
                page_stride,
                ROW,
                TILE,
                KV_BLOCK_SIZE,
            )


def _geometry(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor):
    assert key.shape == value.shape and key.dim() == 3, "key/value: [num_tokens, num_kv_heads, head_dim]"
    assert key_cache.shape == value_cache.shape and key_cache.stride() == value_cache.stride()
    assert key_cache.shape[2:] == key.shape[1:], "cache: [num_blocks, block_size, num_kv_heads, head_dim]"
    assert key_cache.stride(3) == 1 and key_cache.stride(2) == key_cache.shape[3], "heads x dims contiguous"
    assert key.stride(2) == 1 and key.stride(1) == key.shape[2] and value.stride()[1:] == key.stride()[1:]
    row = key.shape[1] * key.shape[2]
    tile = min(2048, triton.next_power_of_2(row))
    grid = (key.shape[0], triton.cdiv(row, tile))
    strides = (key.stride(0), value.stride(0), key_cache.stride(0), key_cache.stride(1))
    return grid, strides, {"ROW": row, "TILE": tile, "KV_BLOCK_SIZE": key_cache.shape[1]}


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Token i's K/V rows to slot ``slot_mapping[i]`` (< 0: skipped); vLLM's kernel, native dtypes only."""
    grid, strides, meta = _geometry(key, value, key_cache, value_cache)
    if grid[0]:
        _reshape_and_cache_kernel[grid](key, value, key_cache, value_cache, slot_mapping, *strides, **meta)


def write_kv_paged(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    token_rows: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
) -> None:
    """Token i (of row ``token_rows[i]``, < 0: skipped) to ``block_table[row, pos // B] * B + pos % B``."""
    grid, strides, meta = _geometry(key, value, key_cache, value_cache)
    assert block_table.dtype == torch.int32 and block_table.stride(1) == 1
    if grid[0]:
        _write_kv_paged_kernel[grid](
            key,
            value,
            key_cache,
            value_cache,
            token_rows,
            positions,
            block_table,
            block_table.stride(0),
            *strides,
            **meta,
        )


def write_kv_ranges(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    token_rows: torch.Tensor,
    positions: torch.Tensor,
    ranges: torch.Tensor,
    range_offsets: torch.Tensor,
    num_search_steps: int,
) -> None:
    """Token i (of row ``token_rows[i]``, < 0: skipped) to its slot by range arithmetic.

    A position past the row's ranges is skipped (the paged kernel would write through the table's padding).
    """
    grid, strides, meta = _geometry(key, value, key_cache, value_cache)
    assert ranges.dtype == torch.int32 and range_offsets.dtype == torch.int32
    if grid[0]:
        _write_kv_ranges_kernel[grid](
            key,
            value,
            key_cache,
            value_cache,
            token_rows,
            positions,
            ranges,
            range_offsets,
            num_search_steps,
            *strides,
            **meta,
        )
