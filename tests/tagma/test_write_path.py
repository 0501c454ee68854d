"""The worker write path: slot mappings from range descriptors equal vLLM's block-table ones.

Reference: vLLM's own CPU op (``torch.ops._C.compute_slot_mapping_kernel_impl`` through
``vllm.utils.cpu_triton_utils``) over the dense table of a stock ``BlockTable`` that went through the same
row operations (on a non-CPU vLLM build, which lacks that op: ``tagma.engine.slot_mapping_paged``).
Padding follows vLLM's slot-mapping kernels: PAD_SLOT_ID (-1) up to ``max_num_batched_tokens`` (the CPU
op itself leaves the tail alone).
The Triton kernel (GPU path) runs here under Triton's interpreter (``TRITON_INTERPRET=1``).
"""

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
from vllm.utils.cpu_triton_utils import _compute_slot_mapping_kernel_impl  # noqa: E402
from vllm.v1.utils import CpuGpuBuffer  # noqa: E402
from vllm.v1.worker import block_table as v1_block_table  # noqa: E402
from vllm.v1.worker.block_table import BlockTable, MultiGroupBlockTable  # noqa: E402

from tagma import engine  # noqa: E402
from tagma.worker import install as write_path  # noqa: E402
from tagma.worker import write_path_counter  # noqa: E402
from tagma.worker.block_table_v1 import RangeBlockTable  # noqa: E402
from tagma.worker.range_rows import RangeRows  # noqa: E402

BLOCK_SIZE = 4
MAX_REQS = 6
MAX_BLOCKS = 24
MAX_TOKENS = 96


@pytest.fixture(scope="module", autouse=True)
def vllm_kernels() -> None:
    current_platform.import_kernels()


def has_vllm_cpu_op() -> bool:
    return hasattr(torch.ops._C, "compute_slot_mapping_kernel_impl")


def test_vllm_cpu_slot_mapping_op_is_the_reference_on_cpu() -> None:
    if not current_platform.is_cpu():
        pytest.skip("only vLLM for CPU has this op; elsewhere tagma's paged function is the reference")
    assert has_vllm_cpu_op()


def make_table(cls: type[BlockTable]) -> BlockTable:
    table = cls(
        block_size=BLOCK_SIZE,
        max_num_reqs=MAX_REQS,
        max_num_blocks_per_req=MAX_BLOCKS,
        max_num_batched_tokens=MAX_TOKENS,
        pin_memory=False,
        device=torch.device("cpu"),
        cp_kv_cache_interleave_size=1,
    )
    # What vLLM's CPU model runner does after building its input batch.
    for value in vars(table).values():
        if isinstance(value, CpuGpuBuffer):
            value.gpu = value.cpu
    return table


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


# ------------------------------------------------- the first-position form through a serving schedule


def op_slot_mapping(
    table: BlockTable, qsl: torch.Tensor, positions: torch.Tensor, block_size: int, max_tokens: int
) -> np.ndarray:
    """vLLM's CPU op over a stock table's dense rows (tagma's per-token paged function elsewhere)."""
    out = torch.full((max_tokens,), -1, dtype=torch.int64)
    dense = table.block_table.cpu
    if has_vllm_cpu_op():
        _compute_slot_mapping_kernel_impl(
            positions.shape[0], max_tokens, qsl, positions, dense, dense.stride(0), out, block_size
        )
    else:
        num_reqs = qsl.shape[0] - 1
        engine.slot_mapping_paged(dense.numpy()[:num_reqs], table.num_blocks_per_row[:num_reqs], qsl.numpy(),
                                  positions.numpy(), block_size, out=out.numpy(), out_len=max_tokens)
    return out.numpy()


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
    for value in vars(table).values():
        if isinstance(value, CpuGpuBuffer):
            value.gpu = value.cpu
    return table


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("block_size", [16, 128])
def test_first_position_form_matches_vllm_op_through_a_serving_schedule(block_size: int, seed: int) -> None:
    """Admission, chunked prefill under a token budget, decode, preemption (row cleared, blocks dropped) and
    resumption (recomputed from position 0 with new blocks), rows condensed by move_row as MRV1's
    input batch does: every step's slot mapping equals vLLM's op, padded to max_num_batched_tokens."""
    rng = np.random.default_rng(1000 + seed)
    rows, budget, max_tokens = 6, 700, 1024
    width = -(-4000 // block_size)
    stock = sized_table(BlockTable, block_size, rows, width, max_tokens)
    ranged = sized_table(RangeBlockTable, block_size, rows, width, max_tokens)
    tables = [stock, ranged]
    ids = BlockIds(rng)
    running: list[dict[str, int]] = []  # index = row; computed tokens, target length, blocks held
    waiting: list[dict[str, int]] = []
    saw = {"chunked": 0, "preempted": 0, "resumed": 0, "decode": 0, "multi_block_runs": 0}

    def remove(row: int) -> dict[str, int]:
        """The row is cleared; the last row moves into the hole (MRV1's condense)."""
        req, last = running[row], len(running) - 1
        for t in tables:
            t.clear_row(row)
        if row != last:
            for t in tables:
                t.move_row(last, row)
            running[row] = running[last]
        running.pop()
        return req

    for _ in range(80):
        # preempt: the row is cleared and its blocks are gone; the request restarts from position 0
        if running and rng.random() < 0.1:
            req = remove(int(rng.integers(0, len(running))))
            waiting.append({"computed": 0, "target": req["target"], "blocks": 0, "resumed": 1})
            saw["preempted"] += 1
        # finish
        for i in reversed(range(len(running))):
            if running[i]["computed"] >= running[i]["target"]:
                remove(i)
        # admit (new requests, or preempted ones resuming first)
        while len(running) < rows and (waiting or rng.random() < 0.4):
            req = waiting.pop(0) if waiting else {
                "computed": 0, "target": int(rng.integers(1, 3000)), "blocks": 0, "resumed": 0
            }
            saw["resumed"] += req.pop("resumed", 0)
            req["added"] = 0
            running.append(req)
        # schedule under the token budget: decodes 1 token, prefills a chunk
        left, lengths, positions = budget, [], []
        for row, req in enumerate(running):
            n = min(req["target"] - req["computed"], left)
            n = max(n, 0)
            need = -(-(req["computed"] + n) // block_size)
            if need > req["blocks"]:
                new = ids.take(need - req["blocks"])
                for t in tables:
                    if req["added"]:
                        t.append_row(new, row)
                    else:
                        t.add_row(new, row)
                req["blocks"] = need
            req["added"] = 1
            if n and n < req["target"] - req["computed"]:
                saw["chunked"] += 1
            if n == 1 and req["computed"] > 0:
                saw["decode"] += 1
            if n and (req["computed"] + n - 1) // block_size > req["computed"] // block_size:
                saw["multi_block_runs"] += 1
            lengths.append(n)
            positions.extend(range(req["computed"], req["computed"] + n))
            req["computed"] += n
            left -= n
        num_reqs = len(running)
        qsl = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
        pos = torch.tensor(positions, dtype=torch.int64)
        ranged.slot_mapping.gpu.fill_(4242)
        ranged.compute_slot_mapping(num_reqs, qsl, pos)
        got = ranged.slot_mapping.gpu.numpy()
        want = op_slot_mapping(stock, qsl, pos, block_size, max_tokens)
        n = pos.shape[0]
        np.testing.assert_array_equal(got[:n], want[:n])
        assert (got[n:] == -1).all()
        # the requests' targets grow while decoding: one more token each, sometimes
        for req in running:
            if req["computed"] >= req["target"] and rng.random() < 0.7:
                req["target"] += 1
    assert all(saw.values()), f"the schedule missed a case: {saw}"


def test_worker_rebinds_after_the_descriptor_array_grows() -> None:
    table = make_table(RangeBlockTable)
    table.add_row([2], 0)
    qsl = torch.tensor([0, 1], dtype=torch.int32)
    table.compute_slot_mapping(1, qsl, torch.tensor([1], dtype=torch.int64))  # binds the first array
    storage = table.range_rows.host_storage()[0]
    # one-block ranges in every row: 144 in all, past the flat array's initial capacity of 64
    for k in range(1, MAX_BLOCKS):
        table.append_row([2 + 2 * k], 0)
    for row in range(1, MAX_REQS):
        table.add_row([500 + 3 * i + 100 * row for i in range(MAX_BLOCKS)], row)
    assert table.range_rows.host_storage()[0] is not storage, "the array should have been reallocated"
    positions = torch.arange(BLOCK_SIZE * MAX_BLOCKS - 5, BLOCK_SIZE * MAX_BLOCKS, dtype=torch.int64)
    qsl = torch.tensor([0, 5], dtype=torch.int32)
    table.compute_slot_mapping(1, qsl, positions)
    want = [(2 + 2 * (p // BLOCK_SIZE)) * BLOCK_SIZE + p % BLOCK_SIZE for p in positions.tolist()]
    assert table.slot_mapping.gpu[:5].tolist() == want


def test_worker_refuses_wrong_dtypes_and_reports_engine_errors() -> None:
    table = make_table(RangeBlockTable)
    table.add_row([5, 6], 0)
    qsl = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(TypeError, match="int32 query_start_loc and int64 positions"):
        table.compute_slot_mapping(1, qsl, torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(TypeError, match="int32 query_start_loc"):
        table.compute_slot_mapping(1, qsl.long(), torch.tensor([0, 1], dtype=torch.int64))
    table.compute_slot_mapping(1, qsl, torch.tensor([0, 1], dtype=torch.int64))  # bound now
    with pytest.raises(engine.InvalidArgumentError, match="positions of request 0 are not consecutive"):
        table.compute_slot_mapping(1, qsl, torch.tensor([0, 2], dtype=torch.int64))
    with pytest.raises(engine.InvalidArgumentError, match="num_reqs 7 is outside"):
        table.compute_slot_mapping(7, torch.zeros(8, dtype=torch.int32), torch.zeros(0, dtype=torch.int64))
    with pytest.raises(engine.InvalidArgumentError, match="exceeds positions_capacity"):
        table.compute_slot_mapping(1, qsl, torch.tensor([0], dtype=torch.int64))
    with pytest.raises(engine.OutOfRangeError, match="is negative"):
        table.compute_slot_mapping(1, qsl, torch.tensor([-2, -1], dtype=torch.int64))


def test_slot_mapping_step_binding_matches_the_per_token_form() -> None:
    ranges = np.array([[10, 2, 0], [3, 1, 2], [20, 3, 0]], dtype=np.int32)
    offsets = np.array([0, 2, 2, 3], dtype=np.int32)
    qsl = np.array([0, 9, 11, 12], dtype=np.int32)
    positions = np.array([*range(2, 11), 0, 1, 11], dtype=np.int64)
    step = engine.slot_mapping_step(ranges, offsets, qsl, positions, 4, out_len=14)
    per_token = engine.slot_mapping_ranges(ranges, offsets, qsl, positions, 4, out_len=14)
    np.testing.assert_array_equal(step, per_token)
    assert step.tolist() == [42, 43, 44, 45, 46, 47, 12, 13, 14, -1, -1, 91, -1, -1]


def test_write_path_counter_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "wp-{pid}.json"
    monkeypatch.setenv(write_path_counter.ENV_COUNTER_FILE, str(target))
    monkeypatch.setenv(write_path_counter.ENV_COUNTER_INTERVAL, "0")
    monkeypatch.setattr(write_path_counter, "_counter", None)
    monkeypatch.setattr(write_path_counter, "_counter_read", False)
    table = make_table(RangeBlockTable)
    table.add_row([5, 6, 7], 0)
    for n in (3, 1):
        qsl = torch.tensor([0, n], dtype=torch.int32)
        table.compute_slot_mapping(1, qsl, torch.arange(n, dtype=torch.int64))
    record = json.loads((tmp_path / f"wp-{os.getpid()}.json").read_text())
    assert record["calls"] == 2 and record["positions"] == 4 and record["host_calls"] == 2
    assert record["device_calls"] == 0 and record["block_size"] == BLOCK_SIZE and record["pid"] == os.getpid()


def test_no_counter_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(write_path_counter.ENV_COUNTER_FILE, raising=False)
    monkeypatch.setattr(write_path_counter, "_counter", None)
    monkeypatch.setattr(write_path_counter, "_counter_read", False)
    assert make_table(RangeBlockTable)._counter is None


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
        tables.range_rows = RangeRows(MAX_REQS)
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


# --------------------------------------------------------------------------- a real server uses the path


@pytest.mark.slow
def test_a_tagma_server_writes_its_kv_slots_through_the_range_write_path(tmp_path: Path) -> None:
    """A tagma server on the tiny model: its worker's slot mappings go through tagma's engine call.

    The worker's counter file (``TAGMA_WRITE_PATH_FILE``, written only by tagma's RangeBlockTable) must
    count at least the prompt and the decoded tokens of one request after it completed: a server that fell
    back to vLLM's stock block table writes no file and fails here.
    """
    import urllib.request

    from harness.serve.launcher import Server, ServerSpec

    model = Path(__file__).resolve().parents[2] / "data" / "tiny-llama"
    if not (model / "config.json").exists():
        pytest.skip("tiny model missing: python -m harness.serve.tiny_model")
    pattern = "write-path-{pid}.json"
    spec = ServerSpec(
        model=str(model),
        backend="tagma",
        dtype="float32",
        max_model_len=2048,
        num_gpu_blocks_override=128,
        kv_cache_space_gib=1,
        extra_args=("--block-size", "32", "--max-num-seqs", "4", "--seed", "0"),
        env={
            write_path_counter.ENV_COUNTER_FILE: str(tmp_path / pattern),
            write_path_counter.ENV_COUNTER_INTERVAL: "0",
        },
    )

    def records() -> list[dict[str, int]]:
        return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("write-path-*.json"))]

    prompt, max_tokens = [0, *range(10, 609)], 8
    with Server(spec, tmp_path / "server.log") as server:
        before = sum(r["positions"] for r in records())
        body = {
            "model": str(model), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True,
        }  # fmt: skip
        request = urllib.request.Request(
            f"{server.base_url}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=600) as response:
            payload = json.loads(response.read())
        assert payload["usage"]["completion_tokens"] == max_tokens
        after = records()
        log = server.log_text()
    assert after, "no worker wrote the write-path counter: the range write path was not installed or used"
    assert "tagma: RangeBlockTable(" in log
    written = sum(r["positions"] for r in after) - before
    # The prompt's KV, then one new token's KV per decode step (the last sampled token's is never written).
    assert written >= len(prompt) + max_tokens - 1, after
    assert all(r["device_calls"] == 0 and r["block_size"] == 32 for r in after), after
