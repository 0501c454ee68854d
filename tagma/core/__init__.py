"""tagma's scheduler side, in the engine-core process: the KV cache manager, its block pool and the scheduler.

Mirrors ``vllm.v1.core``: :mod:`tagma.core.scheduler` makes vLLM's scheduler build the
manager that :mod:`tagma.core.registry` picks (a :class:`~tagma.core.manager.TagmaKVCacheManager`), whose
:class:`~tagma.core.block_pool.TagmaBlockPool` hands out blocks from contiguous ranges of the C++ range
engine (:mod:`tagma.engine`).
"""
