"""Section 3: the KV write path's slot mapping, vLLM's CPU op against tagma's range arithmetic.

Variants, all over the same block maps, measured in one interleaved loop:

* ``vllm_op``: ``vllm.utils.cpu_triton_utils._compute_slot_mapping_kernel_impl`` ->
  ``torch.ops._C.compute_slot_mapping_kernel_impl`` over a dense block table (what vLLM's CPU worker
  runs in place of the Triton kernel).
* ``vllm_worker``: vLLM's ``BlockTable.compute_slot_mapping`` (the worker's call: vLLM's kernel launcher and
  dispatcher, then the op above), with ``max_num_batched_tokens`` = ``worker_max_tokens`` for decode.
* ``tagma_binding``: :class:`tagma.engine.SlotMappingStep` (the binding the worker uses: buffers bound once,
  a call sets the step's four values and makes one ctypes call of ``tagma_slot_mapping_step``, which reads
  each request's first position, validates as it goes and stores runs of consecutive slots).
* ``tagma_raw``: the same C function through one bare ctypes call on a fully prepared argument struct: the
  binding's floor.
* ``tagma_worker``: tagma's ``RangeBlockTable.compute_slot_mapping`` (the binding above, with the pointers of
  vLLM's tensors; pads with -1 up to ``max_num_batched_tokens`` as vLLM's Triton kernel does; vLLM's CPU op
  does not pad, so for decode batches tagma's worker call writes more).
* ``memcpy``: ``numpy.copyto`` of as many int64 as the slot mapping has entries: the physical floor.

Workloads: a prefill of L positions in one request (one range, as the engine places a fresh request), for
every L in ``prefill_lengths``; decode batches of R requests x one token at their last position, where each
request's ranges come from the engine (headroom placement) after a prefill of ``context`` tokens and
interleaved decode growth. Per-position cost and fixed cost per call are the slope and intercept of a
line through the prefill medians (least squares on relative errors). Every variant's output is checked
against vLLM's op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from vllm.platforms import current_platform
from vllm.utils.cpu_triton_utils import _compute_slot_mapping_kernel_impl
from vllm.v1.utils import CpuGpuBuffer
from vllm.v1.worker.block_table import BlockTable, get_block_table_width

from benchmarks.host.timing import calibrate, interleaved, summarize, timed_ns
from tagma.engine import Policy, RangeEngine, SlotMappingStep
from tagma.worker.block_table_v1 import RangeBlockTable

__all__ = ["decode_block_maps", "run"]

VARIANTS = ("vllm_op", "vllm_worker", "tagma_binding", "tagma_raw", "tagma_worker", "memcpy")

_kernels_ready = False


def prepare_vllm_kernels() -> None:
    """What vLLM's CPU worker does at start: load its C++ ops and route its Triton kernels to them."""
    global _kernels_ready
    if not _kernels_ready:
        current_platform.import_kernels()
        current_platform.register_triton_kernel_overrides()
        _kernels_ready = True


def worker_table(
    cls: type[BlockTable], block_size: int, rows: int, width: int, max_tokens: int
) -> BlockTable:
    table = cls(
        block_size=block_size,
        max_num_reqs=rows,
        max_num_blocks_per_req=width,
        max_num_batched_tokens=max_tokens,
        pin_memory=False,
        device=torch.device("cpu"),
        cp_kv_cache_interleave_size=1,
    )
    for value in vars(table).values():  # as vLLM's CPU model runner: the "device" buffer is the host one
        if isinstance(value, CpuGpuBuffer):
            value.gpu = value.cpu
    return table


def decode_block_maps(
    requests: int, context: int, block_size: int, growth_blocks: int, policy: str, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray], RangeEngine]:
    """Block ids and ranges of ``requests`` requests after a prefill of about ``context`` tokens each and
    ``growth_blocks`` rounds of interleaved one-block decode growth, placed by the engine."""
    rng = np.random.default_rng(seed)
    n = context // block_size
    eng = RangeEngine(requests * (n + growth_blocks) + 64, policy=Policy.parse(policy))
    reqs = []
    for _ in range(requests):
        r = eng.create_request()
        eng.append(r, max(1, n - growth_blocks - int(rng.integers(0, 2))))
        reqs.append(r)
    for _ in range(growth_blocks):
        for r in reqs:
            eng.append(r, 1)
    return [eng.blocks(r) for r in reqs], [eng.ranges_array(r) for r in reqs], eng


class Case:
    """One workload's inputs for every variant, and the variants as batch runners."""

    def __init__(
        self,
        block_size: int,
        ids: list[np.ndarray],
        ranges: list[np.ndarray],
        lengths: list[int],
        positions: np.ndarray,
        worker_max_tokens: int,
    ) -> None:
        self.block_size = block_size
        num_reqs = len(ids)
        self.num_reqs = num_reqs
        num_tokens = int(positions.size)
        self.num_tokens = num_tokens
        max_blocks = max(int(x.size) for x in ids)
        width = get_block_table_width(max_blocks, block_size)
        # vLLM's op over a dense table
        self.table = torch.zeros((num_reqs, width), dtype=torch.int32)
        for r, row in enumerate(ids):
            self.table[r, : row.size] = torch.from_numpy(row)
        self.qsl_t = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        self.pos_t = torch.from_numpy(positions.astype(np.int64))
        self.out_vllm = torch.full((num_tokens,), -7, dtype=torch.int64)
        # tagma's ranges (flat layout)
        self.ranges = np.ascontiguousarray(np.concatenate(ranges).astype(np.int32))
        self.offsets = np.concatenate([[0], np.cumsum([r.shape[0] for r in ranges])]).astype(np.int32)
        self.qsl = self.qsl_t.numpy()
        self.pos = self.pos_t.numpy()
        self.out_tagma = np.full(num_tokens, -7, dtype=np.int64)
        self.out_raw = np.full(num_tokens, -7, dtype=np.int64)
        self.src = np.arange(num_tokens, dtype=np.int64)
        self.out_copy = np.empty(num_tokens, dtype=np.int64)
        # the workers' tables, filled through their row API
        max_tokens = max(worker_max_tokens, num_tokens)
        self.stock = worker_table(BlockTable, block_size, num_reqs, width, max_tokens)
        self.tagma_table = worker_table(RangeBlockTable, block_size, num_reqs, width, max_tokens)
        for r, row in enumerate(ids):
            self.stock.add_row(row.tolist(), r)
            self.tagma_table.add_row(row.tolist(), r)
        self.worker_max_tokens = max_tokens
        # tagma's binding, bound once as the worker binds it
        self.step = SlotMappingStep(block_size)
        ranges_ptr, offsets_ptr = self.ranges.ctypes.data, self.offsets.ctypes.data
        self.step.bind_ranges(ranges_ptr, self.ranges.shape[0], offsets_ptr, num_reqs)
        self.step.bind_out(self.out_tagma.ctypes.data, num_tokens)
        self.step_args = (num_reqs, self.qsl.ctypes.data, self.pos.ctypes.data, num_tokens)
        # the bare C call on a prepared struct
        raw = SlotMappingStep(block_size)
        raw.bind_ranges(ranges_ptr, self.ranges.shape[0], offsets_ptr, num_reqs)
        raw.bind_out(self.out_raw.ctypes.data, num_tokens)
        raw(*self.step_args)  # sets the per-call fields once
        fn, struct = raw._fn, raw._args_p
        self._raw_keep = raw
        self._raw: Callable[[], int] = lambda: fn(struct)

    # ---- variants: each runs `batch` calls

    def vllm_op(self, batch: int) -> None:
        n, t, q, p, o, bs = (
            self.num_tokens,
            self.table,
            self.qsl_t,
            self.pos_t,
            self.out_vllm,
            self.block_size,
        )
        stride = t.stride(0)
        for _ in range(batch):
            _compute_slot_mapping_kernel_impl(n, n, q, p, t, stride, o, bs)

    def vllm_worker(self, batch: int) -> None:
        table, num_reqs, q, p = self.stock, self.num_reqs, self.qsl_t, self.pos_t
        for _ in range(batch):
            table.compute_slot_mapping(num_reqs, q, p)

    def tagma_binding(self, batch: int) -> None:
        step, (num_reqs, q, p, n) = self.step, self.step_args
        for _ in range(batch):
            step(num_reqs, q, p, n)

    def tagma_raw(self, batch: int) -> None:
        raw = self._raw
        for _ in range(batch):
            raw()

    def tagma_worker(self, batch: int) -> None:
        table, num_reqs, q, p = self.tagma_table, self.num_reqs, self.qsl_t, self.pos_t
        for _ in range(batch):
            table.compute_slot_mapping(num_reqs, q, p)

    def memcpy(self, batch: int) -> None:
        copy, dst, src = np.copyto, self.out_copy, self.src
        for _ in range(batch):
            copy(dst, src)

    def outputs_identical(self) -> dict[str, bool]:
        for name in VARIANTS:
            getattr(self, name)(1)
        n = self.num_tokens
        ref = self.out_vllm.numpy()
        stock = self.stock.slot_mapping.cpu.numpy()
        tagma = self.tagma_table.slot_mapping.cpu.numpy()
        return {
            "tagma_binding": bool(np.array_equal(self.out_tagma, ref)),
            "tagma_raw": bool(np.array_equal(self.out_raw, ref)),
            "vllm_worker": bool(np.array_equal(stock[:n], ref)),
            "tagma_worker": bool(np.array_equal(tagma[:n], ref) and (tagma[n:] == -1).all()),
        }

    def measure(self, timing: dict[str, Any]) -> dict[str, dict[str, Any]]:
        min_ns = int(timing["min_sample_us"]) * 1000
        max_batch = int(timing["max_batch"])
        samplers = {}
        batches = {}
        for name in VARIANTS:
            fn = getattr(self, name)

            def batch_ns(b: int, fn: Callable[[int], None] = fn) -> int:
                return timed_ns(lambda: fn(b))

            batches[name] = calibrate(batch_ns, min_ns, max_batch)
            samplers[name] = lambda fn=fn, b=batches[name]: timed_ns(lambda: fn(b)) / b
        samples = interleaved(samplers, int(timing["repeats"]), int(timing["warmup"]))
        out = {}
        for name in VARIANTS:
            s = summarize(samples[name], "ns")
            s["batch"] = batches[name]
            s["per_position_ns"] = s["median"] / self.num_tokens
            out[name] = s
        return out


def _fit(lengths: list[int], medians: list[float]) -> dict[str, float] | None:
    """time_ns = fixed + per_position * L, least squares on relative errors (weights 1 / time), so the short
    calls pin the fixed cost and the long ones the slope."""
    if len(lengths) < 2:
        return None
    y = np.asarray(medians, float)
    slope, intercept = np.polyfit(np.asarray(lengths, float), y, 1, w=1.0 / y)
    return {"per_position_ns": float(slope), "fixed_us": float(intercept) / 1e3}


def _ratios(variants: dict[str, dict[str, Any]]) -> dict[str, float]:
    v, t, m = variants["vllm_op"]["median"], variants["tagma_binding"]["median"], variants["memcpy"]["median"]
    return {
        "tagma_binding/vllm_op": t / v,
        "tagma_worker/vllm_worker": variants["tagma_worker"]["median"] / variants["vllm_worker"]["median"],
        "tagma_binding/memcpy": t / m,
        "vllm_op/memcpy": v / m,
    }


def run(cfg: dict[str, Any], native: dict[str, Any] | None) -> dict[str, Any]:
    prepare_vllm_kernels()
    block_size = int(cfg["block_size"])
    wcfg = cfg["write_path"]
    timing = cfg["timing"]
    identical: list[dict[str, Any]] = []
    prefill = []
    for length in wcfg["prefill_lengths"]:
        length = int(length)
        n = -(-length // block_size)
        eng = RangeEngine(n + 64, policy=Policy.parse(cfg["manager"]["policy"]))
        r = eng.create_request()
        eng.append(r, n)
        case = Case(
            block_size,
            [eng.blocks(r)],
            [eng.ranges_array(r)],
            [length],
            np.arange(length, dtype=np.int64),
            length,
        )
        checks = case.outputs_identical()
        identical.append({"workload": "prefill", "positions": length, **checks})
        variants = case.measure(timing)
        prefill.append(
            {
                "positions": length,
                "requests": 1,
                "ranges": int(case.ranges.shape[0]),
                "variants": variants,
                "ratios": _ratios(variants),
            }
        )
        del case, eng
    fits = {
        name: _fit([p["positions"] for p in prefill], [p["variants"][name]["median"] for p in prefill])
        for name in VARIANTS
    }
    # Per position at the longest prefill (the targets' "at 128K"): median time / positions.
    longest = max(prefill, key=lambda p: p["positions"]) if prefill else None
    per_position_at_longest = (
        {
            "positions": longest["positions"],
            **{name: longest["variants"][name]["per_position_ns"] for name in VARIANTS},
        }
        if longest
        else None
    )
    decode = []
    for requests in wcfg["decode_requests"]:
        for context in wcfg["decode_contexts"]:
            ids, ranges, eng = decode_block_maps(
                int(requests),
                int(context),
                block_size,
                int(wcfg["decode_growth_blocks"]),
                cfg["manager"]["policy"],
                int(cfg["seed"]),
            )
            positions = np.array([x.size * block_size - 1 for x in ids], dtype=np.int64)
            case = Case(block_size, ids, ranges, [1] * len(ids), positions, int(wcfg["worker_max_tokens"]))
            checks = case.outputs_identical()
            identical.append(
                {"workload": "decode", "requests": int(requests), "context_tokens": int(context), **checks}
            )
            variants = case.measure(timing)
            decode.append(
                {
                    "requests": int(requests),
                    "context_tokens": int(context),
                    "positions": int(requests),
                    "ranges": int(case.ranges.shape[0]),
                    "worker_max_tokens": case.worker_max_tokens,
                    "variants": variants,
                    "ratios": _ratios(variants),
                }
            )
            del case, eng
    native_rows = [r for r in (native or {}).get("results", []) if "layout" in r]
    native_out = []
    for r in native_rows:
        s = summarize(r["ns_per_op"], "ns")
        native_out.append(
            {
                "variant": r["op"],
                "layout": r["layout"],
                "context_tokens": r["context_tokens"],
                "positions": r["positions"],
                "requests": r["requests"],
                "batch": r["batch"],
                "time": s,
                "per_position_ns": s["median"] / r["positions"],
            }
        )
    native_fits = {}
    for variant in ("slot_mapping_step", "slot_mapping_ranges", "slot_mapping_paged", "memcpy"):
        rows = [r for r in native_out if r["variant"] == variant and r["layout"] == "one_range"]
        native_fits[variant] = _fit([r["positions"] for r in rows], [r["time"]["median"] for r in rows])
    return {
        "description": __doc__,
        "block_size": block_size,
        "prefill": prefill,
        "prefill_fit": fits,
        "per_position_at_longest_prefill_ns": per_position_at_longest,
        "decode": decode,
        "native": native_out,
        "native_fit": native_fits,
        "native_note": (
            "tagma_bench: slot_mapping_step is the worker's C function (first position per request, runs of "
            "consecutive slots, validation fused); slot_mapping_ranges / slot_mapping_paged are the "
            "per-token C functions (both validate every input before writing; the paged one checks every "
            "valid table entry, so its decode rows scale with the table, not the batch); memcpy is "
            "std::memcpy of the same output bytes."
        ),
        "identical": identical,
        "all_identical": all(all(v for k, v in c.items() if isinstance(v, bool)) for c in identical),
    }
