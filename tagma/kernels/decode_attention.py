"""Decode attention over vLLM's paged KV cache: through the block table, or by range arithmetic (tagma).

One query token per request, GQA, the cache in vLLM's layout ``[num_blocks, block_size, num_kv_heads,
head_dim]`` (separate K and V tensors with equal strides), fp16/bf16 (fp32 also works), fp32 accumulation.

Split-KV ("flash decoding"): the grid is (request, KV head, split); a program runs an online softmax over
its split's tokens, in tiles of ``BLOCK_N`` tokens, for the G query heads that share its KV head (one
``tl.dot`` with the group padded to 16 rows), and writes an unnormalized partial (acc, max, sum); a second
kernel merges the splits. Both variants share everything except how a KV token's address is found:

* paged: per tile, ``block_table[req, t // B]`` is loaded for each token (what vLLM's Triton attention
  kernels do): a dependent load in front of every K/V load.
* ranges: the split's first range is found once (``tagma.worker.triton_slot_mapping.find_range``, the range
  lookup every tagma kernel shares); then the program walks the ranges that overlap the split, and within
  each range tiles of consecutive tokens at
  physical slot ``(start - first_logical) * B + t``: affine in t, no per-block load. A tile never crosses
  a range boundary, so a short range costs a partly masked tile (the price of fragmentation).

The interfaces follow vLLM's ``unified_attention`` (query, key_cache, value_cache, seq lens, max seq len,
scale) with the block table or the range descriptors. Importing this module imports Triton.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tagma.worker.triton_slot_mapping import find_range

__all__ = ["Workspace", "decode_attention_paged", "decode_attention_ranges", "plan_splits"]

LOG2E = 1.4426950408889634
BLOCK_N = 64  # KV tokens per tile (default; a power of two >= 16)
MIN_SPLIT_TOKENS = 256  # fewer tokens than this per split is not worth a partial


# tl.max / tl.sum are @jit functions of triton.language.standard, which Triton's interpreter cannot call when
# Triton was imported before TRITON_INTERPRET was set (vLLM imports it at test collection). tl.reduce with
# their combine functions is what they lower to for float32 (same code on a GPU), and the interpreter
# recognizes these two combine functions and reduces with numpy.
_MAX = tl.standard._elementwise_max
_SUM = tl.standard._sum_combine


@triton.jit
def _attend_tile(q, key_cache_ptr, value_cache_ptr, row_off, tok_mask, offs_d, acc, m_i, l_i, qk_scale):
    """Online-softmax update with one tile: ``row_off`` [BLOCK_N] is each token's K/V row offset."""
    kv_idx = row_off[:, None] + offs_d[None, :]
    k = tl.load(key_cache_ptr + kv_idx, mask=tok_mask[:, None], other=0.0)
    qk = tl.dot(q, tl.trans(k)) * qk_scale  # log2 domain
    qk = tl.where(tok_mask[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.reduce(qk, 1, _MAX))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.reduce(p, 1, _SUM)
    v = tl.load(value_cache_ptr + kv_idx, mask=tok_mask[:, None], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _load_group(
    query_ptr,
    req,
    kv_head,
    stride_qt,
    stride_qh,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + offs_g
    ptrs = query_ptr + req * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    return tl.load(ptrs, mask=(offs_g < GROUP)[:, None], other=0.0), offs_g, offs_d


@triton.jit
def _store_partial(
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    acc,
    m_i,
    l_i,
    req,
    kv_head,
    split,
    offs_g,
    offs_d,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    num_q_heads = tl.num_programs(1) * GROUP
    row = ((req * num_q_heads + kv_head * GROUP + offs_g) * tl.num_programs(2) + split).to(tl.int64)
    gmask = offs_g < GROUP
    tl.store(part_m_ptr + row, m_i, mask=gmask)
    tl.store(part_l_ptr + row, l_i, mask=gmask)
    tl.store(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=gmask[:, None])


@triton.jit
def _decode_paged_kernel(
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    qk_scale,
    block_table_stride,
    split_len,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_ct,
    stride_ch,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q, offs_g, offs_d = _load_group(query_ptr, req, kv_head, stride_qt, stride_qh, GROUP, GROUP_PAD, HEAD_DIM)
    acc = tl.full([GROUP_PAD, HEAD_DIM], 0.0, tl.float32)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.full([GROUP_PAD], 0.0, tl.float32)
    seq_len = tl.load(seq_lens_ptr + req)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    table_row = block_table_ptr + req.to(tl.int64) * block_table_stride
    head_off = kv_head * stride_ch
    for t0 in range(start, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        tok_mask = t < end
        block = tl.load(table_row + t // KV_BLOCK_SIZE, mask=tok_mask, other=0)
        row_off = block.to(tl.int64) * stride_cb + (t % KV_BLOCK_SIZE) * stride_ct + head_off
        acc, m_i, l_i = _attend_tile(
            q, key_cache_ptr, value_cache_ptr, row_off, tok_mask, offs_d, acc, m_i, l_i, qk_scale
        )
    _store_partial(
        part_acc_ptr,
        part_m_ptr,
        part_l_ptr,
        acc,
        m_i,
        l_i,
        req,
        kv_head,
        split,
        offs_g,
        offs_d,
        GROUP,
        HEAD_DIM,
    )


@triton.jit
def _decode_ranges_kernel(
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    ranges_ptr,
    range_offsets_ptr,
    seq_lens_ptr,
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    qk_scale,
    num_search_steps,
    split_len,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_ct,
    stride_ch,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q, offs_g, offs_d = _load_group(query_ptr, req, kv_head, stride_qt, stride_qh, GROUP, GROUP_PAD, HEAD_DIM)
    acc = tl.full([GROUP_PAD, HEAD_DIM], 0.0, tl.float32)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.full([GROUP_PAD], 0.0, tl.float32)
    seq_len = tl.load(seq_lens_ptr + req)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    head_off = kv_head * stride_ch
    # The range holding the split's first token: the last one whose first logical block is <= its block.
    first_range = tl.load(range_offsets_ptr + req)
    end_range = tl.load(range_offsets_ptr + req + 1)
    r = find_range(
        ranges_ptr, first_range, end_range, start // KV_BLOCK_SIZE, num_search_steps, end_range > first_range
    )
    t_lo = start
    while (t_lo < end) & (r < end_range):
        phys_start = tl.load(ranges_ptr + r * 3)
        count = tl.load(ranges_ptr + r * 3 + 1)
        first = tl.load(ranges_ptr + r * 3 + 2)
        r_end = tl.minimum((first + count) * KV_BLOCK_SIZE, end)
        base = (phys_start - first).to(tl.int64) * KV_BLOCK_SIZE  # physical slot = base + logical token
        for t0 in range(t_lo, r_end, BLOCK_N):
            t = t0 + tl.arange(0, BLOCK_N)
            tok_mask = t < r_end
            slot = base + t
            row_off = (slot // KV_BLOCK_SIZE) * stride_cb + (slot % KV_BLOCK_SIZE) * stride_ct + head_off
            acc, m_i, l_i = _attend_tile(
                q, key_cache_ptr, value_cache_ptr, row_off, tok_mask, offs_d, acc, m_i, l_i, qk_scale
            )
        t_lo = r_end
        r += 1
    _store_partial(
        part_acc_ptr,
        part_m_ptr,
        part_l_ptr,
        acc,
        m_i,
        l_i,
        req,
        kv_head,
        split,
        offs_g,
        offs_d,
        GROUP,
        HEAD_DIM,
    )


@triton.jit
def _merge_splits_kernel(
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    num_splits,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    smask = offs_s < num_splits
    rows = ((req * tl.num_programs(1) + head) * num_splits + offs_s).to(tl.int64)
    m = tl.load(part_m_ptr + rows, mask=smask, other=float("-inf"))
    l_s = tl.load(part_l_ptr + rows, mask=smask, other=0.0)
    m_max = tl.reduce(m, 0, _MAX)
    m_max = tl.where(m_max > float("-inf"), m_max, 0.0)  # no token at all: every weight 0
    w = tl.exp2(m - m_max)
    acc = tl.load(part_acc_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=smask[:, None], other=0.0)
    num = tl.reduce(acc * w[:, None], 0, _SUM)
    den = tl.reduce(l_s * w, 0, _SUM)
    out = num / tl.where(den > 0, den, 1.0)
    tl.store(
        out_ptr + req.to(tl.int64) * stride_ot + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty)
    )


def plan_splits(
    max_seq_len: int, batch: int, num_kv_heads: int, device: torch.device, block_n: int = BLOCK_N
) -> tuple[int, int]:
    """(num_splits, split_len): enough programs for about two per SM, at least MIN_SPLIT_TOKENS per split."""
    if device.type == "cuda":
        target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        target = 8
    want = -(-target // max(1, batch * num_kv_heads))
    num_splits = max(1, min(want, -(-max_seq_len // MIN_SPLIT_TOKENS)))
    split_len = _split_len(max_seq_len, num_splits, block_n)
    return -(-max(1, max_seq_len) // split_len), split_len


def _split_len(max_seq_len: int, num_splits: int, block_n: int) -> int:
    """Tokens per split: the sequence cut in ``num_splits``, rounded up to whole tiles."""
    per_split = -(-max(1, max_seq_len) // num_splits)
    return -(-per_split // block_n) * block_n


@dataclass(slots=True)
class Workspace:
    """Partials of the split kernels; reuse one across calls of the same shape to keep allocations out."""

    acc: torch.Tensor  # [batch, num_q_heads, num_splits, head_dim] float32
    m: torch.Tensor  # [batch, num_q_heads, num_splits] float32 (log2 domain)
    l: torch.Tensor  # [batch, num_q_heads, num_splits] float32  # noqa: E741 (the softmax sum's name)

    @classmethod
    def allocate(cls, batch: int, num_q_heads: int, num_splits: int, head_dim: int, device: torch.device):
        shape = (batch, num_q_heads, num_splits)
        f32 = torch.float32
        return cls(
            torch.empty(*shape, head_dim, dtype=f32, device=device),
            torch.empty(shape, dtype=f32, device=device),
            torch.empty(shape, dtype=f32, device=device),
        )


def _prepare(query, key_cache, value_cache, seq_lens, max_seq_len, num_splits, workspace, out, block_n):
    batch, num_q_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, cache_dim = key_cache.shape
    assert key_cache.shape == value_cache.shape and key_cache.stride() == value_cache.stride()
    assert cache_dim == head_dim and key_cache.stride(3) == 1 and query.stride(2) == 1
    assert num_q_heads % num_kv_heads == 0 and head_dim == triton.next_power_of_2(head_dim)
    assert seq_lens.dtype == torch.int32 and seq_lens.shape[0] == batch
    if num_splits is None:
        num_splits, split_len = plan_splits(max_seq_len, batch, num_kv_heads, query.device, block_n)
    else:
        split_len = _split_len(max_seq_len, num_splits, block_n)
    if workspace is None or workspace.m.shape != (batch, num_q_heads, num_splits):
        workspace = Workspace.allocate(batch, num_q_heads, num_splits, head_dim, query.device)
    out = torch.empty_like(query) if out is None else out
    group = num_q_heads // num_kv_heads
    grid = (batch, num_kv_heads, num_splits)
    meta = {
        "GROUP": group,
        "GROUP_PAD": max(16, triton.next_power_of_2(group)),
        "HEAD_DIM": head_dim,
        "KV_BLOCK_SIZE": block_size,
        "BLOCK_N": block_n,
    }
    strides = (
        query.stride(0),
        query.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
    )
    return grid, meta, strides, split_len, workspace, out


def _merge(workspace: Workspace, out: torch.Tensor) -> torch.Tensor:
    batch, num_q_heads, num_splits = workspace.m.shape
    _merge_splits_kernel[(batch, num_q_heads)](
        workspace.acc,
        workspace.m,
        workspace.l,
        out,
        out.stride(0),
        out.stride(1),
        num_splits,
        HEAD_DIM=out.shape[2],
        SPLITS_PAD=triton.next_power_of_2(num_splits),
    )
    return out


def decode_attention_paged(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
    *,
    num_splits: int | None = None,
    workspace: Workspace | None = None,
    out: torch.Tensor | None = None,
    block_n: int = BLOCK_N,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Attention of ``query`` [batch, num_q_heads, head_dim] over each request's first ``seq_lens[i]`` KV
    tokens, found through ``block_table`` [batch, max_blocks] (int32)."""
    grid, meta, strides, split_len, ws, out = _prepare(
        query, key_cache, value_cache, seq_lens, max_seq_len, num_splits, workspace, out, block_n
    )
    assert block_table.dtype == torch.int32 and block_table.stride(1) == 1
    _decode_paged_kernel[grid](
        query,
        key_cache,
        value_cache,
        block_table,
        seq_lens,
        ws.acc,
        ws.m,
        ws.l,
        scale * LOG2E,
        block_table.stride(0),
        split_len,
        *strides,
        **meta,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return _merge(ws, out)


def decode_attention_ranges(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    ranges: torch.Tensor,
    range_offsets: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
    *,
    num_search_steps: int,
    num_splits: int | None = None,
    workspace: Workspace | None = None,
    out: torch.Tensor | None = None,
    block_n: int = BLOCK_N,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """As :func:`decode_attention_paged`, with request i's KV found by range arithmetic over
    ``ranges[range_offsets[i]:range_offsets[i + 1]]`` ((physical_start, num_blocks, first_logical) int32
    rows in logical order, covering its ``seq_lens[i]`` tokens). ``num_search_steps`` must be at least
    ``max_ranges_per_request.bit_length()``."""
    grid, meta, strides, split_len, ws, out = _prepare(
        query, key_cache, value_cache, seq_lens, max_seq_len, num_splits, workspace, out, block_n
    )
    assert ranges.dtype == torch.int32 and range_offsets.dtype == torch.int32
    _decode_ranges_kernel[grid](
        query,
        key_cache,
        value_cache,
        ranges,
        range_offsets,
        seq_lens,
        ws.acc,
        ws.m,
        ws.l,
        scale * LOG2E,
        num_search_steps,
        split_len,
        *strides,
        **meta,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return _merge(ws, out)
