"""GPU kernels for the KV write path and the decode read path, in Triton.

* ``write``: slot mapping (block table vs ranges), reshape_and_cache, and fused KV writes.
* ``decode_attention``: split-KV decode attention reading KV through the block table or by range arithmetic.

Nothing on the CPU serving path imports this package. Their PyTorch references, the placements they run on
and the benchmark that times them are in ``benchmarks/gpu``.
"""
