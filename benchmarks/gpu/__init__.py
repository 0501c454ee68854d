"""Kernel-level benchmark of the KV write and read paths: block table (paged) vs range descriptors (tagma).

For every context length x batch size x KV placement it times, per call (median and spread):

* ``decode_attention``: split-KV decode attention reading KV through the block table (paged) or by range
  arithmetic (tagma), and PyTorch SDPA on a contiguous [batch, kv_heads, seq, dim] copy of the KV (the
  contiguous reference; it does not depend on the placement, so it is timed once per context x batch);
* ``slot_mapping``: slots of the batch's new tokens from the block table vs from the ranges;
* ``kv_write``: vLLM's write path, slot mapping then ``reshape_and_cache``, driven by each;
* ``kv_write_fused``: the scatter with each token's slot found inside the same kernel;

the write kernels for a decode step (one new token per request, at the end of its context) and for a
chunked-prefill step (``--prefill-tokens`` new tokens shared by the batch, at the end of each context).
It reports achieved memory bandwidth (useful bytes: KV read, or new K/V rows read and written, plus
queries/outputs/positions/slots) as a fraction of the device's peak and of a measured device copy, and
the tagma/paged ratio of medians with a bootstrap 95% interval. Placements: ``contiguous`` (each request
one range: tagma's assumption holds) and ``fragmented:<policy>`` (range lengths drawn from the tagma
engine's serving trace under that policy, ``benchmarks/gpu/fragmentation_trace.json``; see
``benchmarks.fragmentation_sim``). Before timing, every configuration checks that paged and tagma agree
and match a float32 SDPA reference on the first requests.

    python -m benchmarks.gpu                 # a CUDA GPU; about 5 min on an H100/H200
    python -m benchmarks.gpu --contexts 16384 --batches 8 --placements contiguous
    python -m benchmarks.gpu --dry-run       # CPU, Triton interpreter, tiny sizes: NOT a measurement

Needs torch and Triton, not vLLM. Writes ``results/gpu/<run-id>/kernels.json`` (config, machine,
versions, commit, placements, checks, every timing and ratio), ``ratios.png`` and ``bandwidth.png``;
exits non-zero when a correctness check failed.
``python -m benchmarks.gpu.plots RUN_DIR`` redraws the figures of a run.

Modules: :mod:`.settings` (the command line), :mod:`.machine` (device, versions, peak bandwidth),
:mod:`.timing` (paired timing, bandwidth, ratio intervals), :mod:`.bench` (every configuration: placements,
correctness checks, timings), :mod:`.plots` (figures); :mod:`.placement` and :mod:`.reference` are the
inputs and references the kernels are checked and timed against, :mod:`.compile_check` compiles every
kernel for a GPU target without one.
"""
