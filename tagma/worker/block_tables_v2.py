"""The worker-side KV write path for Model Runner V2 (vLLM's GPU default): ``BlockTables`` plus ranges.

:class:`RangeBlockTables` keeps vLLM's staged dense block tables (attention reads them through
``gather_block_tables``) and, per KV cache group and request-state row, the run-length range descriptors of
the same block ids; ``apply_staged_writes`` copies the descriptors to the device when a row changed. Several
groups (gpt-oss's window and full attention, Gemma 3's 5 + 1, a state group beside attention) each get their
own descriptors and block size; a group whose slot mapping vLLM disables gets PAD for every token, as vLLM's
kernel writes.

vLLM's own ``BlockTables.compute_slot_mappings`` stays; the Triton kernel it launches,
``vllm.v1.worker.gpu.block_table._compute_slot_mappings_kernel``, is swapped through vLLM's kernel
dispatcher (``vllm.triton_utils.dispatcher.register_kernels``) for :func:`slot_mappings_from_ranges`,
which finds the launching ``RangeBlockTables`` by its ``block_table_ptrs`` tensor and runs tagma's kernel
(``tagma.worker.triton_slot_mapping``) over its descriptors, into vLLM's ``slot_mappings`` buffer.

Imported only in a tagma worker that runs Model Runner V2 (which itself needs Triton).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from vllm.triton_utils import dispatcher
from vllm.v1.worker.gpu import block_table as v2_block_table
from vllm.v1.worker.gpu import model_runner as v2_model_runner
from vllm.v1.worker.gpu.block_table import BlockTables

from tagma.errors import TagmaUnsupported
from tagma.worker.range_rows import RangeRows
from tagma.worker.triton_slot_mapping import compute_slot_mapping_ranges
from tagma.worker.write_path_counter import counter

__all__ = [
    "KERNEL_NAME",
    "RangeBlockTables",
    "install_v2",
    "installed_v2",
    "slot_mappings_from_ranges",
    "uninstall_v2",
]

KERNEL_NAME = "vllm.v1.worker.gpu.block_table._compute_slot_mappings_kernel"
_STOCK_BLOCK_TABLES = BlockTables

# id(block_table_ptrs) -> the RangeBlockTables that owns that tensor (the kernel's only handle on it).
_TABLES_BY_POINTERS: dict[int, weakref.ref[RangeBlockTables]] = {}


class RangeBlockTables(BlockTables):
    """``BlockTables`` that also keeps per-group, per-row range descriptors for the KV-write slot mappings."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.cp_size != 1:
            raise TagmaUnsupported("context parallelism in the worker write path")
        self.group_rows = [RangeRows(self.max_num_reqs) for _ in range(self.num_kv_cache_groups)]
        self._counter = counter()
        self._register()

    def init_block_table_layout_tensors(self) -> None:
        super().init_block_table_layout_tensors()
        if hasattr(self, "range_rows"):  # re-made after construction: follow the new pointer tensor
            self._register()

    def _register(self) -> None:
        _TABLES_BY_POINTERS[id(self.block_table_ptrs)] = weakref.ref(self)

    def append_block_ids(self, req_index: int, new_block_ids: tuple[list[int], ...], overwrite: bool) -> None:
        if self.redirect_writes_to_null_block:
            raise TagmaUnsupported("writes redirected to the null block (elastic EP)")
        super().append_block_ids(req_index, new_block_ids, overwrite)
        for rows, ids in zip(self.group_rows, new_block_ids, strict=True):
            if overwrite:
                rows.replace(req_index, ids)
            else:
                rows.append(req_index, ids)

    def apply_staged_writes(self) -> None:
        super().apply_staged_writes()
        for rows in self.group_rows:
            rows.on_device(self.device)  # the step's host-to-device copy, when a row of the group changed


def slot_mappings_from_ranges(
    max_num_tokens: int,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    pos: torch.Tensor,
    block_table_ptrs: torch.Tensor,
    block_table_strides: torch.Tensor,
    block_sizes: torch.Tensor,
    slot_mapping_enabled: torch.Tensor,
    dcp_sharded: torch.Tensor,
    slot_mappings_ptr: torch.Tensor,
    slot_mappings_stride: int,
    cp_rank: int,
    CP_SIZE: int = 1,  # noqa: N803 (the stock kernel's parameter names)
    CP_INTERLEAVE: int = 1,  # noqa: N803
    PAD_ID: int = -1,  # noqa: N803
    TRITON_BLOCK_SIZE: int = 1024,  # noqa: N803
) -> None:
    """Stands in for ``_compute_slot_mappings_kernel[grid](...)``: its arguments, ranges for tables."""
    owner = _TABLES_BY_POINTERS.get(id(block_table_ptrs))
    tables = owner() if owner is not None else None
    if tables is None:
        raise RuntimeError("tagma: slot mappings requested for a block table without range descriptors")
    if CP_SIZE != 1:
        raise TagmaUnsupported("context parallelism in the worker write path")
    for g, rows in enumerate(tables.group_rows):
        out = slot_mappings_ptr[g, :max_num_tokens]
        if not tables._slot_mapping_enabled[g]:
            out.fill_(PAD_ID)  # vLLM's kernel: PAD for every token of a group without slot mappings
            continue
        on_device = rows.on_device(tables.device)
        compute_slot_mapping_ranges(
            num_reqs=idx_mapping.shape[0],
            query_start_loc=query_start_loc,
            positions=pos,
            ranges=on_device.ranges,
            range_offsets=on_device.offsets,
            slot_mapping=out,
            block_size=tables.block_sizes[g],
            num_search_steps=on_device.num_search_steps,
            pad_id=PAD_ID,
            idx_mapping=idx_mapping,
        )
        if tables._counter is not None:  # positions passed, CUDA-graph padding included
            tables._counter.add(pos.shape[0], False, tables.block_sizes[g])


def install_v2() -> None:
    """Model Runner V2 builds :class:`RangeBlockTables`; its slot-mapping kernel is tagma's (idempotent)."""
    v2_model_runner.BlockTables = RangeBlockTables  # type: ignore[misc]
    if getattr(v2_block_table._compute_slot_mappings_kernel, "func", None) is not slot_mappings_from_ranges:
        dispatcher.register_kernels({KERNEL_NAME: slot_mappings_from_ranges})


def uninstall_v2() -> None:
    """Undo :func:`install_v2` (tests). The dispatcher's registry keeps the stock kernel; no module global
    here may hold it: the dispatcher rebinds every module attribute that refers to it."""
    v2_model_runner.BlockTables = _STOCK_BLOCK_TABLES  # type: ignore[misc]
    registered = dispatcher._registry.pop(KERNEL_NAME, None)
    if registered is not None:
        v2_block_table._compute_slot_mappings_kernel = registered[0]


def installed_v2() -> bool:
    return v2_model_runner.BlockTables is RangeBlockTables
