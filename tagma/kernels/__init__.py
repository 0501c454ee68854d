"""GPU kernels for the KV write path and the decode read path, in Triton, with PyTorch references.

Modules (only ``write`` and ``decode_attention`` import Triton; nothing on the CPU serving path imports
this package):

* ``placement``: where each request's KV blocks lie, described both ways (dense block table and range
  descriptors ``(physical_start, num_blocks, first_logical_block)``), contiguous or fragmented.
* ``fragmentation``: the range-length distribution of a tagma engine under a concurrent serving trace
  (``python -m benchmarks.fragmentation_sim`` regenerates ``fragmentation_trace.json``).
* ``reference``: PyTorch references of every kernel.
* ``write``: slot mapping (block table vs ranges), reshape_and_cache, and fused KV writes.
* ``decode_attention``: split-KV decode attention reading KV through the block table or by range arithmetic.
"""
