"""vLLM's scheduler with tagma's KV cache manager: what ``--scheduler-cls`` names when tagma is selected.

vLLM has no option for the KV cache manager: ``Scheduler.__init__`` builds ``KVCacheManager(...)`` by the
name imported into ``vllm.v1.core.sched.scheduler``. These subclasses bind that name to
:class:`tagma.core.manager.TagmaKVCacheManager` for the duration of their own construction only, so any other
scheduler in the process keeps vLLM's manager. The engine core resolves
``scheduler_config.scheduler_cls`` by qualified name and calls it with keyword arguments;
:class:`TagmaScheduler` then picks the async or the sync base exactly as vLLM's ``get_scheduler_cls`` does.
"""

from __future__ import annotations

import threading
from typing import Any

from vllm.v1.core.sched import scheduler as scheduler_module
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from tagma.core.manager import TagmaKVCacheManager
from tagma.selector import SCHEDULER_QUALNAME

__all__ = ["SCHEDULER_QUALNAME", "TagmaAsyncScheduler", "TagmaScheduler"]

_construction_lock = threading.Lock()


def _construct_with_tagma_manager(init: Any, scheduler: Scheduler, args: tuple, kwargs: dict) -> None:
    # NOTE: the module-level name is swapped under a lock and always restored, so a scheduler built
    # concurrently by another thread (or after an exception here) gets vLLM's own KVCacheManager.
    with _construction_lock:
        stock = scheduler_module.KVCacheManager
        scheduler_module.KVCacheManager = TagmaKVCacheManager  # type: ignore[misc]
        try:
            init(scheduler, *args, **kwargs)
        finally:
            scheduler_module.KVCacheManager = stock  # type: ignore[misc]


def _async_scheduling(args: tuple, kwargs: dict) -> bool:
    vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
    return bool(vllm_config.scheduler_config.async_scheduling)


class TagmaAsyncScheduler(AsyncScheduler):
    """``AsyncScheduler`` whose ``kv_cache_manager`` is a ``TagmaKVCacheManager``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Build vLLM's ``AsyncScheduler`` with a tagma KV cache manager.

        Args:
            *args: ``AsyncScheduler.__init__``'s positional arguments, passed through unchanged.
            **kwargs: its keyword arguments (``vllm_config``, ``kv_cache_config``, ...), unchanged.
        """
        _construct_with_tagma_manager(AsyncScheduler.__init__, self, args, kwargs)


class TagmaScheduler(Scheduler):
    """``Scheduler`` whose ``kv_cache_manager`` is a ``TagmaKVCacheManager``.

    Called with an async-scheduling config it returns a :class:`TagmaAsyncScheduler` instead (fully
    built; Python then skips ``__init__``), as vLLM picks ``AsyncScheduler`` over ``Scheduler``.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """Pick the sync or the async scheduler as vLLM's ``get_scheduler_cls`` does.

        Args:
            *args: ``Scheduler.__init__``'s positional arguments (``vllm_config`` first when positional).
            **kwargs: its keyword arguments.

        Returns:
            A fully built :class:`TagmaAsyncScheduler` when ``scheduler_config.async_scheduling`` is set,
            else an uninitialised :class:`TagmaScheduler` that Python then initialises.
        """
        if cls is TagmaScheduler and _async_scheduling(args, kwargs):
            return TagmaAsyncScheduler(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Build vLLM's ``Scheduler`` with a tagma KV cache manager.

        Args:
            *args: ``Scheduler.__init__``'s positional arguments, passed through unchanged.
            **kwargs: its keyword arguments (``vllm_config``, ``kv_cache_config``, ...), unchanged.
        """
        _construct_with_tagma_manager(Scheduler.__init__, self, args, kwargs)
