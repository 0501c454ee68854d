"""Compile every kernel for a CUDA target without a GPU: ``python -m benchmarks.gpu.compile_check --arch 90``.

The interpreter runs kernels as Python and does not type-check them the way the compiler does (loop-carried
types, ``tl.dot`` shapes, pointer arithmetic); this lowers each kernel through Triton's CUDA backend down to
a cubin with its bundled ptxas, for the shapes the benchmark uses (Llama-3.1-8B: 32 query heads, 8 KV heads,
head_dim 128, block size 16), with the runtime's specialization (pointers and strides divisible by 16).
It prints, per kernel, the shared memory and whether the KV loop was software-pipelined (async copies).
Uses Triton's compiler entry points (``triton.compile(ASTSource(...), target=GPUTarget(...))``), which
change between Triton versions; written against Triton 3.9.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

__all__ = ["compile_all"]

_I64_ARGS = {"block_stride", "stride_cb"}  # may exceed 2**31 elements on a large cache
_F32_ARGS = {"qk_scale"}


def _signature(fn: Any, dtype: str, constexprs: dict[str, Any]) -> tuple[dict[str, str], dict]:
    sig: dict[str, str] = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in ("query_ptr", "key_cache_ptr", "value_cache_ptr", "key_ptr", "value_ptr", "out_ptr"):
            sig[name] = f"*{dtype}"
        elif name.startswith("part_"):
            sig[name] = "*fp32"
        elif name in ("positions_ptr", "slot_mapping_ptr"):
            sig[name] = "*i64"
        elif name.endswith("_ptr"):
            sig[name] = "*i32"
        elif name in _F32_ARGS:
            sig[name] = "fp32"
        else:
            sig[name] = "i64" if name in _I64_ARGS else "i32"
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(fn.arg_names)
        if sig[name] != "constexpr" and (sig[name].startswith("*") or "stride" in name)
    }
    return sig, aligned


def _kernels(dtype: str) -> list[tuple[str, Any, dict[str, Any]]]:
    from tagma.kernels import decode_attention as da
    from tagma.kernels import write
    from tagma.worker import triton_slot_mapping

    attn = {"GROUP": 4, "GROUP_PAD": 16, "HEAD_DIM": 128, "KV_BLOCK_SIZE": 16, "BLOCK_N": da.BLOCK_N}
    rows = {"ROW": 1024, "TILE": 1024, "KV_BLOCK_SIZE": 16}
    slots = {"KV_BLOCK_SIZE": 16, "PAD_ID": -1, "TRITON_BLOCK_SIZE": write.SLOT_BLOCK}
    return [
        ("decode_paged", da._decode_paged_kernel, attn),
        ("decode_ranges", da._decode_ranges_kernel, attn),
        ("merge_splits", da._merge_splits_kernel, {"HEAD_DIM": 128, "SPLITS_PAD": 16}),
        ("reshape_and_cache", write._reshape_and_cache_kernel, rows),
        ("write_kv_paged", write._write_kv_paged_kernel, rows),
        ("write_kv_ranges", write._write_kv_ranges_kernel, rows),
        ("slot_mapping_paged", write._slot_mapping_paged_kernel, {**slots, "HAS_IDX_MAPPING": True}),
        (
            "slot_mapping_ranges",
            triton_slot_mapping._slot_mapping_ranges_kernel,
            {**slots, "HAS_IDX_MAPPING": True},
        ),
    ]


def compile_all(arch: int = 90, dtype: str = "bf16", num_stages: int = 2) -> list[dict[str, Any]]:
    """Compile every kernel for sm_<arch>; returns one record per kernel (raises on a compile error)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("compile_check needs the compiler: unset TRITON_INTERPRET")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    records = []
    for name, fn, constexprs in _kernels(dtype):
        sig, attrs = _signature(fn, dtype, constexprs)
        src = ASTSource(
            fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()}, attrs=attrs
        )
        t0 = time.perf_counter()
        kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_stages": num_stages})
        records.append(
            {
                "kernel": name,
                "arch": arch,
                "dtype": dtype,
                "seconds": round(time.perf_counter() - t0, 2),
                "shared_bytes": kernel.metadata.shared,
                "async_copies": kernel.asm["ttgir"].count("async_copy_global_to_local"),
                "cubin_bytes": len(kernel.asm["cubin"]),
            }
        )
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=lambda s: [int(x) for x in s.split(",")], default=[90])
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    args = parser.parse_args(argv)
    for arch in args.arch:
        for rec in compile_all(arch, args.dtype):
            print(" ".join(f"{k}={v}" for k, v in rec.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
