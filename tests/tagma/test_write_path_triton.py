"""The write path's Triton kernel (the GPU path), run here under Triton's interpreter
(``TRITON_INTERPRET=1``), against tagma's C slot mapping; and vLLM's model runner v2 block tables through
its kernel dispatcher, routed to tagma's."""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from vllm.platforms import current_platform  # noqa: E402

from tagma import engine  # noqa: E402
from tagma.worker import write_path_counter  # noqa: E402
from tagma.worker.range_rows import RangeRows  # noqa: E402
from tests.tagma.write_path_tables import (  # noqa: E402
    BLOCK_SIZE,
    MAX_BLOCKS,
    MAX_REQS,
    MAX_TOKENS,
    BlockIds,
    random_batch,
)


@pytest.fixture(scope="module", autouse=True)
def vllm_kernels() -> None:
    current_platform.import_kernels()


# ------------------------------------------------------------------ Triton kernel (GPU path), interpreted


@pytest.fixture(scope="module")
def interpreted_kernels() -> Iterator[ModuleType]:
    pytest.importorskip("triton")
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"  # read when @triton.jit decorates: import the module afresh
    sys.modules.pop("tagma.worker.triton_slot_mapping", None)
    try:
        yield importlib.import_module("tagma.worker.triton_slot_mapping")
    finally:
        sys.modules.pop("tagma.worker.triton_slot_mapping", None)
        sys.modules.pop("tagma.worker.block_tables_v2", None)  # it bound the interpreted kernel
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous


def engine_reference(
    rows: RangeRows, batch_rows: list[int], qsl: torch.Tensor, positions: torch.Tensor
) -> np.ndarray:
    """tagma's C slot mapping over the batch's rows (a row of -1 owns nothing), padded to MAX_TOKENS."""
    ranges = [rows.ranges_of(r) if r >= 0 else [] for r in batch_rows]
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in ranges])]).astype(np.int32)
    flat = np.array([rng for per_row in ranges for rng in per_row], dtype=np.int32).reshape(-1, 3)
    return engine.slot_mapping_ranges(
        flat, offsets, qsl.numpy(), positions.numpy(), BLOCK_SIZE, out_len=MAX_TOKENS
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("with_idx_mapping", [False, True])
def test_triton_kernel_matches_engine_reference(
    interpreted_kernels: ModuleType, seed: int, with_idx_mapping: bool
) -> None:
    rng = np.random.default_rng(100 + seed)
    ids = BlockIds(rng)
    rows = RangeRows(MAX_REQS)
    for row in range(MAX_REQS):
        for _ in range(int(rng.integers(0, 6))):
            rows.append(row, ids.take(int(rng.integers(1, 5))))
    num_reqs = int(rng.integers(1, MAX_REQS + 1))
    if with_idx_mapping:  # MRV2: batch entry -> request-state row; -1 marks a padding request
        batch_rows = [int(r) for r in rng.permutation(MAX_REQS)[:num_reqs]]
        batch_rows[-1] = -1 if num_reqs > 1 else batch_rows[-1]
    else:
        batch_rows = list(range(num_reqs))
    sizes = [rows.num_blocks_of(r) if r >= 0 else 1 for r in batch_rows]
    qsl, positions = random_batch(rng, sizes)
    positions[int(qsl[-2]) :] += BLOCK_SIZE * MAX_BLOCKS  # the last entry's run lies past its blocks: PAD
    flat = rows.flat()
    out = torch.full((MAX_TOKENS,), 777, dtype=torch.int64)
    interpreted_kernels.compute_slot_mapping_ranges(
        num_reqs=num_reqs,
        query_start_loc=qsl,
        positions=positions,
        ranges=torch.from_numpy(flat.ranges),
        range_offsets=torch.from_numpy(flat.offsets),
        slot_mapping=out,
        block_size=BLOCK_SIZE,
        num_search_steps=flat.max_ranges_per_row.bit_length(),
        idx_mapping=torch.tensor(batch_rows, dtype=torch.int32) if with_idx_mapping else None,
    )
    np.testing.assert_array_equal(out.numpy(), engine_reference(rows, batch_rows, qsl, positions))


def test_triton_kernel_with_no_ranges_pads_everything(interpreted_kernels: ModuleType) -> None:
    rows = RangeRows(2)
    flat = rows.flat()
    out = torch.full((MAX_TOKENS,), 777, dtype=torch.int64)
    interpreted_kernels.compute_slot_mapping_ranges(
        num_reqs=2,
        query_start_loc=torch.tensor([0, 1, 3], dtype=torch.int32),
        positions=torch.tensor([0, 1, 2], dtype=torch.int64),
        ranges=torch.from_numpy(flat.ranges),
        range_offsets=torch.from_numpy(flat.offsets),
        slot_mapping=out,
        block_size=BLOCK_SIZE,
        num_search_steps=0,
    )
    assert (out == -1).all()


def test_triton_kernel_binary_search_over_many_ranges(interpreted_kernels: ModuleType) -> None:
    rows = RangeRows(2)
    rows.append(0, list(range(2, 2 * 37 + 2, 2)))  # 37 one-block ranges: every id jumps
    rows.append(1, [500, 501, 502])
    flat = rows.flat()
    positions = torch.arange(37 * BLOCK_SIZE + 2, dtype=torch.int64)[:MAX_TOKENS]
    qsl = torch.tensor([0, positions.shape[0] - 3, positions.shape[0]], dtype=torch.int32)
    out = torch.empty(MAX_TOKENS, dtype=torch.int64)
    interpreted_kernels.compute_slot_mapping_ranges(
        num_reqs=2, query_start_loc=qsl, positions=positions, ranges=torch.from_numpy(flat.ranges),
        range_offsets=torch.from_numpy(flat.offsets), slot_mapping=out, block_size=BLOCK_SIZE,
        num_search_steps=flat.max_ranges_per_row.bit_length(),
    )
    np.testing.assert_array_equal(out.numpy(), engine_reference(rows, [0, 1], qsl, positions))


def test_model_runner_v2_block_tables_through_vllm_kernel_dispatcher(
    interpreted_kernels: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """vLLM's own BlockTables.compute_slot_mappings launches its kernel; the dispatcher routes it to tagma's.

    vLLM's GPU staging (UVA buffers, CUDA-only) is stubbed out: RangeBlockTables gets the attributes that
    compute_slot_mappings reads, built by hand on the CPU.
    """
    from vllm.v1.worker.gpu import block_table as v2_block_table
    from vllm.v1.worker.gpu import model_runner as v2_model_runner
    from vllm.v1.worker.gpu.block_table import BlockTables

    from tagma.worker import block_tables_v2 as gpu_block_tables

    monkeypatch.setattr(BlockTables, "append_block_ids", lambda self, *args: None)
    monkeypatch.setattr(BlockTables, "apply_staged_writes", lambda self: None)
    stock_kernel = v2_block_table._compute_slot_mappings_kernel
    try:
        gpu_block_tables.install_v2()
        gpu_block_tables.install_v2()  # idempotent
        assert v2_model_runner.BlockTables is gpu_block_tables.RangeBlockTables
        assert v2_block_table._compute_slot_mappings_kernel.func is gpu_block_tables.slot_mappings_from_ranges

        tables = object.__new__(gpu_block_tables.RangeBlockTables)
        tables.redirect_writes_to_null_block = False
        tables.num_kv_cache_groups = 1
        tables.block_sizes = [BLOCK_SIZE]
        tables.device = torch.device("cpu")
        tables.cp_size, tables.cp_rank, tables.cp_interleave = 1, 0, 1
        tables.block_table_ptrs = torch.zeros(1, dtype=torch.uint64)
        tables.block_table_strides = torch.zeros(1, dtype=torch.int64)
        tables.block_sizes_tensor = torch.tensor([BLOCK_SIZE], dtype=torch.int32)
        tables.slot_mapping_enabled = torch.tensor([True])
        tables.dcp_sharded = torch.tensor([True])
        tables.slot_mappings = torch.full((1, MAX_TOKENS), 777, dtype=torch.int64)
        tables._slot_mapping_enabled = [True]
        tables.group_rows = [RangeRows(MAX_REQS)]
        tables._counter = write_path_counter.WritePathCounter(str(tmp_path / "wp.json"), 0.0)
        tables._register()

        tables.append_block_ids(3, ([7, 8],), overwrite=True)
        tables.append_block_ids(3, ([9, 20],), overwrite=False)
        tables.append_block_ids(1, ([40],), overwrite=True)
        tables.append_block_ids(1, ([50],), overwrite=True)  # a resumed request's list replaces its row
        tables.apply_staged_writes()
        qsl = torch.tensor([0, 3, 4, 5], dtype=torch.int32)
        positions = torch.tensor([11, 12, 13, 2, 0], dtype=torch.int64)  # consecutive per request
        idx_mapping = torch.tensor([3, 1, -1], dtype=torch.int32)  # -1: a padding request
        result = tables.compute_slot_mappings(idx_mapping, qsl, positions, num_tokens_padded=8)
        assert result.shape == (1, 8)
        assert tables.slot_mappings[0, :5].tolist() == [39, 80, 81, 202, -1]  # 11 -> block 9, 12 -> 20
        assert (tables.slot_mappings[0, 5:] == -1).all()
        record = json.loads((tmp_path / "wp.json").read_text())
        assert record["device_calls"] == 1 and record["host_calls"] == 0 and record["positions"] == 5
    finally:
        gpu_block_tables.uninstall_v2()
    assert v2_block_table._compute_slot_mappings_kernel is stock_kernel
    assert v2_model_runner.BlockTables is BlockTables
