"""Section 4: block-table traffic per step, paged block ids versus range descriptors, in steady decode.

R requests of about ``context`` tokens (request i has context - i % block_size prompt tokens) are admitted
and then decode ``steps`` tokens each; the blocks come from the range engine (the manager's placement
policy), and both of vLLM's worker tables are fed through their row API: vLLM's stock ``BlockTable`` (dense
[max_num_reqs, max_num_blocks_per_req] int32 table) and tagma's ``RangeBlockTable`` (the same dense table plus
per-row range descriptors). Per step it counts:

Scheduler -> worker (the block-table part of ``SchedulerOutput``):
* ``sched_paged``: 4 bytes per new block id (``CachedRequestData.new_block_ids``; at admission
  ``NewRequestData.block_ids``), and the pickled size of that field as vLLM builds it (one entry per running
  request: ``None`` or a tuple with the list of new ids).
* ``sched_ranges``: 12 bytes per changed range descriptor (start, count, first_logical): a range that grew
  in place is re-sent, a new range is sent; and the pickled size of the same per-request structure.

Worker host -> device copy for its block table:
* ``worker_mrv1``: Model Runner V1 (``BlockTable.commit_block_table``) copies ``num_reqs`` full rows of the
  dense table every step: num_reqs x width x 4 bytes (width = vLLM's ``get_block_table_width`` of
  max_model_len / block_size).
* ``worker_mrv2``: Model Runner V2 (the GPU default in vLLM 0.33) stages only the writes: 4 bytes per new id
  + 12 bytes (index, start, cu_len) per written row + the num_blocks array (4 x max_num_reqs) every step.
* ``worker_ranges``: the descriptors' flat arrays (12 bytes per range + 4 per row offset), copied by
  ``RangeRows.on_device`` when a row changed in the step.
* ``tagma_plugin_now``: what the current tagma plugin's worker copies: the dense table (attention still
  reads it) plus the descriptors.

The copies themselves are also timed on the host (``torch.Tensor.copy_`` host to host, paged rows versus
descriptor arrays): a lower bound of the host-side part of a host-to-device copy.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import torch
from vllm.v1.worker.block_table import BlockTable, get_block_table_width

from benchmarks.host.timing import calibrate, interleaved, pair_entry, summarize, timed_ns
from benchmarks.host.write_path import prepare_vllm_kernels, worker_table
from tagma.engine import Policy, RangeEngine
from tagma.worker.block_table_v1 import RangeBlockTable

__all__ = ["run"]

METRICS = (
    "sched_paged",
    "sched_paged_pickled",
    "sched_ranges",
    "sched_ranges_pickled",
    "worker_mrv1",
    "worker_mrv2",
    "worker_ranges",
    "tagma_plugin_now",
)


def _pickled(obj: Any) -> int:
    return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def host_copy_time(
    timing: dict[str, Any], stock: BlockTable, tagma: RangeBlockTable, requests: int
) -> dict[str, Any]:
    """Host-side copy time of one step's block-table payload: dense rows vs range descriptors."""
    dense_src = stock.block_table.cpu[:requests]
    dense_dst = torch.empty_like(dense_src)
    flat = tagma.range_rows.flat()
    ranges_src, offsets_src = torch.from_numpy(flat.ranges.copy()), torch.from_numpy(flat.offsets.copy())
    ranges_dst, offsets_dst = torch.empty_like(ranges_src), torch.empty_like(offsets_src)

    def paged_copy(b: int) -> None:
        for _ in range(b):
            dense_dst.copy_(dense_src)

    def ranges_copy(b: int) -> None:
        for _ in range(b):
            ranges_dst.copy_(ranges_src)
            offsets_dst.copy_(offsets_src)

    min_ns, max_batch = int(timing["min_sample_us"]) * 1000, int(timing["max_batch"])
    bp = calibrate(lambda b: timed_ns(lambda: paged_copy(b)), min_ns, max_batch)
    bt = calibrate(lambda b: timed_ns(lambda: ranges_copy(b)), min_ns, max_batch)
    samples = interleaved(
        {
            "paged": lambda: timed_ns(lambda: paged_copy(bp)) / bp,
            "tagma": lambda: timed_ns(lambda: ranges_copy(bt)) / bt,
        },
        int(timing["repeats"]),
        int(timing["warmup"]),
    )
    return pair_entry(
        samples["paged"],
        samples["tagma"],
        "us",
        scale=1e-3,
        op="host_copy_per_step",
        paged_bytes=int(dense_src.nbytes),
        tagma_bytes=int(ranges_src.nbytes + offsets_src.nbytes),
    )


def _ratios(mean: dict[str, float], admission: dict[str, float]) -> dict[str, float | None]:
    """Per-step mean bytes, paged over ranges (None where the ranges side sent none)."""
    return {
        "worker_mrv1/worker_ranges": mean["worker_mrv1"] / mean["worker_ranges"]
        if mean["worker_ranges"]
        else None,
        "worker_mrv2/worker_ranges": mean["worker_mrv2"] / mean["worker_ranges"]
        if mean["worker_ranges"]
        else None,
        "tagma_plugin_now/worker_mrv1": mean["tagma_plugin_now"] / mean["worker_mrv1"],
        "sched_paged/sched_ranges": mean["sched_paged"] / mean["sched_ranges"]
        if mean["sched_ranges"]
        else None,
        "admission sched_paged/sched_ranges": admission["sched_paged"] / admission["sched_ranges"],
    }


def scenario(cfg: dict[str, Any], requests: int, context: int) -> dict[str, Any]:
    block_size = int(cfg["block_size"])
    tcfg = cfg["block_table_traffic"]
    steps = int(tcfg["steps"])
    n = context // block_size
    max_model_len = context + steps + block_size
    width = get_block_table_width(-(-max_model_len // block_size), block_size)
    eng = RangeEngine(
        requests * (n + steps // block_size + 2) + 64, policy=Policy.parse(cfg["manager"]["policy"])
    )
    max_tokens = int(cfg["write_path"]["worker_max_tokens"])
    stock = worker_table(BlockTable, block_size, requests, width, max_tokens)
    tagma = worker_table(RangeBlockTable, block_size, requests, width, max_tokens)
    assert isinstance(tagma, RangeBlockTable)
    cpu = torch.device("cpu")
    reqs = [eng.create_request() for _ in range(requests)]
    tokens = [context - i % block_size for i in range(requests)]

    # ---- admission: every request's whole block list (NewRequestData.block_ids) vs its descriptors
    admission = {"sched_paged": 0, "sched_paged_pickled": 0, "sched_ranges": 0, "sched_ranges_pickled": 0}
    for row, (r, t) in enumerate(zip(reqs, tokens, strict=True)):
        ids = eng.append(r, -(-t // block_size)).new_blocks.tolist()
        stock.add_row(ids, row)
        tagma.add_row(ids, row)
        descriptors = [tuple(x) for x in eng.ranges_array(r).tolist()]
        admission["sched_paged"] += 4 * len(ids)
        admission["sched_paged_pickled"] += _pickled((ids,))
        admission["sched_ranges"] += 12 * len(descriptors)
        admission["sched_ranges_pickled"] += _pickled(descriptors)
    tagma.range_rows.on_device(cpu)
    admission = {k: v / requests for k, v in admission.items()}  # per admitted request

    # ---- steady decode
    per_step: dict[str, list[int]] = {m: [] for m in METRICS}
    num_ranges = [eng.num_ranges(r) for r in reqs]
    for _ in range(steps):
        new_block_ids: list[tuple[list[int]] | None] = []
        changed: list[tuple[tuple[int, int, int], ...] | None] = []
        new_ids = rows_written = changed_ranges = 0
        for row, r in enumerate(reqs):
            tokens[row] += 1
            if -(-tokens[row] // block_size) > eng.num_blocks_of(r):
                ids = eng.append(r, 1).new_blocks.tolist()
                stock.append_row(ids, row)
                tagma.append_row(ids, row)
                new_block_ids.append((ids,))
                new_ids += len(ids)
                rows_written += 1
                k = eng.num_ranges(r)
                last = tuple(eng.ranges_array(r)[-1].tolist())
                # grew in place: the last descriptor is re-sent; a new range: it is sent
                changed.append((last,))
                changed_ranges += 1
                num_ranges[row] = k
            else:
                new_block_ids.append(None)
                changed.append(None)
        dirty = tagma.range_rows.dirty
        flat = tagma.range_rows.flat()
        ranges_bytes = (flat.ranges.nbytes + flat.offsets.nbytes) if dirty else 0
        tagma.range_rows.on_device(cpu)
        mrv1 = stock.block_table.cpu[:requests].nbytes
        per_step["sched_paged"].append(4 * new_ids)
        per_step["sched_paged_pickled"].append(_pickled(new_block_ids))
        per_step["sched_ranges"].append(12 * changed_ranges)
        per_step["sched_ranges_pickled"].append(_pickled(changed))
        per_step["worker_mrv1"].append(mrv1)
        per_step["worker_mrv2"].append(4 * new_ids + 12 * rows_written + 4 * requests)
        per_step["worker_ranges"].append(ranges_bytes)
        per_step["tagma_plugin_now"].append(mrv1 + ranges_bytes)

    # ---- the two tables must map the same slots
    prepare_vllm_kernels()
    qsl = torch.arange(requests + 1, dtype=torch.int32)
    positions = torch.tensor([t - 1 for t in tokens], dtype=torch.int64)
    stock.compute_slot_mapping(requests, qsl, positions)
    tagma.compute_slot_mapping(requests, qsl, positions)
    identical = bool(torch.equal(stock.slot_mapping.cpu[:requests], tagma.slot_mapping.cpu[:requests]))

    copy_time = host_copy_time(cfg["timing"], stock, tagma, requests)
    flat = tagma.range_rows.flat()
    steps_out = {m: summarize(v, "bytes") for m, v in per_step.items()}
    for s in steps_out.values():
        s["mean"] = float(np.mean(s.pop("samples")))
    mean = {m: steps_out[m]["mean"] for m in METRICS}
    ranges_total = int(flat.ranges.shape[0])
    return {
        "requests": requests,
        "context_tokens": context,
        "steps": steps,
        "max_model_len": max_model_len,
        "table_width_blocks": width,
        "ranges_per_request": ranges_total / requests,
        "admission_bytes_per_request": admission,
        "per_step_bytes": steps_out,
        "ratios": _ratios(mean, admission),
        "host_copy_time": copy_time,
        "slot_mappings_identical": identical,
    }


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    tcfg = cfg["block_table_traffic"]
    rows = [scenario(cfg, int(r), int(c)) for r in tcfg["requests"] for c in tcfg["contexts"]]
    return {
        "description": __doc__,
        "block_size": int(cfg["block_size"]),
        "scenarios": rows,
        "all_identical": all(r["slot_mappings_identical"] for r in rows),
    }
