"""The worker write path: slot mappings from range descriptors equal vLLM's block-table ones under random
row operations; descriptors as run lengths of the dense rows, kept in a flat layout; install and uninstall.

Reference: vLLM's own CPU op (``torch.ops._C.compute_slot_mapping_kernel_impl`` through
``vllm.utils.cpu_triton_utils``) over the dense table of a stock ``BlockTable`` that went through the same
row operations (on a non-CPU vLLM build, which lacks that op: ``tagma.engine.slot_mapping_paged``).
Padding follows vLLM's slot-mapping kernels: PAD_SLOT_ID (-1) up to ``max_num_batched_tokens`` (the CPU
op itself leaves the tail alone).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from vllm.platforms import current_platform  # noqa: E402
from vllm.utils.cpu_triton_utils import _compute_slot_mapping_kernel_impl  # noqa: E402
from vllm.v1.worker import block_table as v1_block_table  # noqa: E402
from vllm.v1.worker.block_table import BlockTable, MultiGroupBlockTable  # noqa: E402

from tagma import engine  # noqa: E402
from tagma.worker import install as write_path  # noqa: E402
from tagma.worker.block_table_v1 import RangeBlockTable  # noqa: E402
from tagma.worker.range_rows import RangeRows  # noqa: E402
from tests.tagma.write_path_tables import (  # noqa: E402
    BLOCK_SIZE,
    MAX_BLOCKS,
    MAX_REQS,
    MAX_TOKENS,
    BlockIds,
    has_vllm_cpu_op,
    make_table,
    random_batch,
)


@pytest.fixture(scope="module", autouse=True)
def vllm_kernels() -> None:
    current_platform.import_kernels()


def test_vllm_cpu_slot_mapping_op_is_the_reference_on_cpu() -> None:
    if not current_platform.is_cpu():
        pytest.skip("only vLLM for CPU has this op; elsewhere tagma's paged function is the reference")
    assert has_vllm_cpu_op()


def vllm_slot_mapping(table: BlockTable, qsl: torch.Tensor, positions: torch.Tensor) -> np.ndarray:
    """vLLM's CPU op over the stock table (tagma's paged function where vLLM is not the CPU build)."""
    out = torch.full((MAX_TOKENS,), -1, dtype=torch.int64)
    dense = table.block_table.cpu
    if has_vllm_cpu_op():
        _compute_slot_mapping_kernel_impl(
            positions.shape[0], MAX_TOKENS, qsl, positions, dense, dense.stride(0), out, BLOCK_SIZE
        )
    else:
        num_reqs = qsl.shape[0] - 1
        engine.slot_mapping_paged(dense.numpy()[:num_reqs], table.num_blocks_per_row[:num_reqs], qsl.numpy(),
                                  positions.numpy(), BLOCK_SIZE, out=out.numpy(), out_len=MAX_TOKENS)
    return out.numpy()


def apply_random_op(
    rng: np.random.Generator, tables: list[BlockTable], ids: BlockIds, sizes: list[int]
) -> None:
    op = rng.choice(["add", "append", "append", "append", "clear", "move", "swap"])
    row = int(rng.integers(0, MAX_REQS))
    other = int(rng.integers(0, MAX_REQS))
    if op == "add":
        count = int(rng.integers(0, 8))
        new = ids.take(count)
        for table in tables:
            table.add_row(new, row)
        sizes[row] = count
    elif op == "append":
        count = int(rng.integers(0, min(4, MAX_BLOCKS - sizes[row]) + 1))
        new = ids.take(count)
        for table in tables:
            table.append_row(new, row)
        sizes[row] += count
    elif op == "clear":
        for table in tables:
            table.clear_row(row)
        sizes[row] = 0
    elif op == "move" and row != other:
        for table in tables:
            table.move_row(row, other)
        sizes[other], sizes[row] = sizes[row], 0
    elif op == "swap" and row != other:
        for table in tables:
            table.swap_row(row, other)
        sizes[row], sizes[other] = sizes[other], sizes[row]


@pytest.mark.parametrize("seed", range(16))
def test_slot_mapping_matches_vllm_op_under_random_row_operations(seed: int) -> None:
    rng = np.random.default_rng(seed)
    stock, ranged = make_table(BlockTable), make_table(RangeBlockTable)
    ids = BlockIds(rng)
    sizes = [0] * MAX_REQS
    for _ in range(60):
        apply_random_op(rng, [stock, ranged], ids, sizes)
        np.testing.assert_array_equal(ranged.block_table.np, stock.block_table.np)  # read path untouched
        for row in range(MAX_REQS):
            expanded = [s + i for s, c, _ in ranged.range_rows.ranges_of(row) for i in range(c)]
            assert expanded == stock.block_table.np[row, : stock.num_blocks_per_row[row]].tolist()
        num_reqs = int(rng.integers(0, MAX_REQS + 1))
        qsl, positions = random_batch(rng, sizes[:num_reqs])
        num_tokens = positions.shape[0]
        ranged.slot_mapping.gpu.fill_(12345)  # stale values from an earlier step must not survive
        ranged.compute_slot_mapping(num_reqs, qsl, positions)
        got = ranged.slot_mapping.gpu.numpy()
        want = vllm_slot_mapping(stock, qsl, positions)
        np.testing.assert_array_equal(got[:num_tokens], want[:num_tokens])
        assert (got[num_tokens:] == -1).all(), "padding must be PAD_SLOT_ID up to max_num_batched_tokens"


def test_descriptors_are_run_lengths_of_the_dense_row() -> None:
    table = make_table(RangeBlockTable)
    table.add_row([5, 6, 7, 20], 0)
    table.append_row([8], 0)  # 8 does not follow 20: a new range
    table.append_row([21, 22], 0)
    table.append_row([9], 0)
    assert table.range_rows.ranges_of(0) == [(5, 3, 0), (20, 1, 3), (8, 1, 4), (21, 2, 5), (9, 1, 7)]
    table.add_row([30, 31], 1)
    table.append_row([32, 33, 40], 1)  # extends (30, 2) to (30, 4), then opens (40, 1)
    assert table.range_rows.ranges_of(1) == [(30, 4, 0), (40, 1, 4)]
    for row in (0, 1):
        dense = table.block_table.np[row, : table.num_blocks_per_row[row]].tolist()
        expanded = [s + i for s, c, _ in table.range_rows.ranges_of(row) for i in range(c)]
        assert expanded == dense


def test_row_moves_swaps_and_clears_carry_descriptors() -> None:
    rows = RangeRows(4)
    rows.append(0, [3, 4])
    rows.append(1, [10])
    rows.swap(0, 1)
    assert rows.ranges_of(0) == [(10, 1, 0)] and rows.ranges_of(1) == [(3, 2, 0)]
    rows.move(1, 3)
    assert rows.ranges_of(1) == [] and rows.ranges_of(3) == [(3, 2, 0)] and rows.num_blocks_of(3) == 2
    rows.clear(3)
    assert rows.ranges_of(3) == [] and rows.num_blocks_of(3) == 0
    rows.replace(2, [7, 8, 9])
    rows.replace(2, [1])
    assert rows.ranges_of(2) == [(1, 1, 0)]


def test_descriptors_are_kept_in_flat_layout_without_rebuilds() -> None:
    rows = RangeRows(3)
    rows.append(0, [5, 6])
    rows.append(2, [40])
    rows.append(1, [20, 21, 22])
    flat = rows.flat()
    np.testing.assert_array_equal(flat.ranges, [[5, 2, 0], [20, 3, 0], [40, 1, 0]])
    np.testing.assert_array_equal(flat.offsets, [0, 1, 2, 3])
    copied = rows.on_device(torch.device("cpu"))
    assert not rows.dirty and rows.on_device(torch.device("cpu")) is copied  # no change: no new copy
    rows.append(0, [])  # nothing appended: still clean
    assert not rows.dirty
    storage = rows.flat().ranges
    rows.append(0, [7])  # decode growth in place: one count changes, in the same storage
    assert rows.dirty and np.shares_memory(rows.flat().ranges, storage)
    assert rows.on_device(torch.device("cpu")) is not copied
    np.testing.assert_array_equal(rows.flat().ranges[0], [5, 3, 0])
    rows.append(0, [9])  # a new range: the rows after row 0 shift
    np.testing.assert_array_equal(rows.flat().ranges, [[5, 3, 0], [9, 1, 3], [20, 3, 0], [40, 1, 0]])
    np.testing.assert_array_equal(rows.flat().offsets, [0, 2, 3, 4])
    assert rows.flat().max_ranges_per_row == 2


def test_flat_layout_grows_past_its_initial_capacity() -> None:
    rows = RangeRows(4)
    for k in range(200):  # 800 one-block ranges, interleaved across rows
        for row in range(4):
            rows.append(row, [1 + 2 * (4 * k + row)])
    for row in range(4):
        assert rows.ranges_of(row) == [(1 + 2 * (4 * k + row), 1, k) for k in range(200)]
    np.testing.assert_array_equal(rows.flat().offsets, [0, 200, 400, 600, 800])


def test_unused_positions_map_to_pad() -> None:
    table = make_table(RangeBlockTable)
    table.add_row([5], 0)
    qsl = torch.tensor([0, 2], dtype=torch.int32)
    table.compute_slot_mapping(1, qsl, torch.tensor([3, BLOCK_SIZE], dtype=torch.int64))
    assert table.slot_mapping.gpu[:3].tolist() == [5 * BLOCK_SIZE + 3, -1, -1]


def test_clear_of_all_rows_is_refused() -> None:
    with pytest.raises(NotImplementedError, match="tagma: unsupported"):
        make_table(RangeBlockTable).clear()


def test_install_swaps_the_class_multigroup_tables_build_and_uninstall_restores() -> None:
    stock = v1_block_table.BlockTable
    try:
        write_path.install(use_v2_model_runner=False)
        write_path.install(use_v2_model_runner=False)  # idempotent
        assert write_path.installed()
        tables = MultiGroupBlockTable(MAX_REQS, MAX_TOKENS, False, torch.device("cpu"), [BLOCK_SIZE], [8])
        assert isinstance(tables[0], RangeBlockTable) and isinstance(tables[0], BlockTable)
    finally:
        write_path.uninstall()
    assert v1_block_table.BlockTable is stock and not write_path.installed()
