"""PyTorch references of the kernels: what each one must compute, written the plainest way.

The references read the dense block table only: a range kernel that matches them matches vLLM's
formulation. No Triton here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "decode_attention",
    "gather_contiguous_kv",
    "sdpa_decode_contiguous",
    "slot_mapping",
    "write_kv",
]


def slot_mapping(
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    max_num_tokens: int,
    num_blocks_per_req: torch.Tensor | None = None,
    idx_mapping: torch.Tensor | None = None,
    pad_id: int = -1,
) -> torch.Tensor:
    """slot = block_table[row, pos // B] * B + pos % B per token, PAD past the row's blocks and the batch.

    Batch entry b reads row ``idx_mapping[b]`` (row b without it; a negative row owns nothing).
    ``num_blocks_per_req[row]`` bounds the row (the whole table width without it).
    """
    out = torch.full((max_num_tokens,), pad_id, dtype=torch.int64)
    qsl = query_start_loc.tolist()
    for b in range(len(qsl) - 1):
        row = b if idx_mapping is None else int(idx_mapping[b])
        for i in range(qsl[b], qsl[b + 1]):
            pos = int(positions[i])
            logical = pos // block_size
            limit = (
                block_table.shape[1]
                if num_blocks_per_req is None or row < 0
                else int(num_blocks_per_req[row])
            )
            if row >= 0 and pos >= 0 and logical < limit:
                out[i] = int(block_table[row, logical]) * block_size + pos % block_size
    return out


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """reshape_and_cache: token i's K/V rows [num_kv_heads, head_dim] to slot ``slots[i]`` (< 0: skipped)."""
    block_size = key_cache.shape[1]
    keep = slots >= 0
    s = slots[keep]
    key_cache[s // block_size, s % block_size] = key[keep]
    value_cache[s // block_size, s % block_size] = value[keep]


def gather_contiguous_kv(
    cache: torch.Tensor, block_table: torch.Tensor, seq_len: int, row: int
) -> torch.Tensor:
    """Request ``row``'s first ``seq_len`` tokens of a [num_blocks, B, H, D] cache as [seq_len, H, D]."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    blocks = cache[block_table[row, :num_blocks].long()]
    return blocks.reshape(-1, *cache.shape[2:])[:seq_len]


def decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per request, GQA (query head h reads KV head h // (Hq / Hkv)), in float32."""
    num_q_heads = query.shape[1]
    group = num_q_heads // key_cache.shape[2]
    out = torch.zeros(query.shape, dtype=torch.float32)
    for row, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            continue
        k = gather_contiguous_kv(key_cache, block_table, seq_len, row).float().repeat_interleave(group, dim=1)
        v = (
            gather_contiguous_kv(value_cache, block_table, seq_len, row)
            .float()
            .repeat_interleave(group, dim=1)
        )
        scores = torch.einsum("hd,thd->ht", query[row].float(), k) * scale
        out[row] = torch.einsum("ht,thd->hd", scores.softmax(dim=-1), v)
    return out.to(query.dtype)


def sdpa_decode_contiguous(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float
) -> torch.Tensor:
    """PyTorch SDPA on contiguous KV ``[batch, num_kv_heads, seq_len, head_dim]`` (equal lengths).

    A decode token's GQA group of G query heads attends to one KV head with no mask, so the group is fed
    as G query positions of an ordinary multi-head call: [B, Hkv, G, D] against [B, Hkv, L, D].
    """
    batch, num_q_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    q = query.view(batch, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(q, key, value, scale=scale)
    return out.reshape(batch, num_q_heads, head_dim)
