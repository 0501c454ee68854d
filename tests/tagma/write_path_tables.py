"""The tables and ids the write-path tests share: a small stock or range block table on the CPU, vLLM's
CPU slot-mapping op where this vLLM build has it, and fresh physical ids in runs with jumps."""

from __future__ import annotations

import numpy as np
import torch
from vllm.v1.utils import CpuGpuBuffer
from vllm.v1.worker.block_table import BlockTable

BLOCK_SIZE = 4
MAX_REQS = 6
MAX_BLOCKS = 24
MAX_TOKENS = 96


def has_vllm_cpu_op() -> bool:
    return hasattr(torch.ops._C, "compute_slot_mapping_kernel_impl")


def sized_table(cls: type[BlockTable], block_size: int, rows: int, width: int, max_tokens: int) -> BlockTable:
    table = cls(
        block_size=block_size,
        max_num_reqs=rows,
        max_num_blocks_per_req=width,
        max_num_batched_tokens=max_tokens,
        pin_memory=False,
        device=torch.device("cpu"),
        cp_kv_cache_interleave_size=1,
    )
    # What vLLM's CPU model runner does after building its input batch.
    for value in vars(table).values():
        if isinstance(value, CpuGpuBuffer):
            value.gpu = value.cpu
    return table


def make_table(cls: type[BlockTable]) -> BlockTable:
    return sized_table(cls, BLOCK_SIZE, MAX_REQS, MAX_BLOCKS, MAX_TOKENS)


class BlockIds:
    """Fresh physical ids, consecutive runs mixed with jumps (what a range allocator hands out)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.next = 1

    def take(self, count: int) -> list[int]:
        ids = []
        for _ in range(count):
            if self.rng.random() < 0.3:
                self.next += int(self.rng.integers(1, 5))
            ids.append(self.next)
            self.next += 1
        return ids


def random_batch(rng: np.random.Generator, num_blocks: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions inside each row's blocks; rows [0, len(num_blocks)) are the batch (MRV1 condenses them)."""
    lengths, positions = [], []
    for blocks in num_blocks:
        capacity = blocks * BLOCK_SIZE
        count = int(rng.integers(0, min(capacity, 9) + 1)) if capacity else 0
        start = int(rng.integers(0, capacity - count + 1)) if capacity else 0
        lengths.append(count)
        positions.extend(range(start, start + count))
    qsl = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    return qsl, torch.tensor(positions, dtype=torch.int64)
