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
        _construct_with_tagma_manager(AsyncScheduler.__init__, self, args, kwargs)


class TagmaScheduler(Scheduler):
    """``Scheduler`` whose ``kv_cache_manager`` is a ``TagmaKVCacheManager``.

    Called with an async-scheduling config it returns a :class:`TagmaAsyncScheduler` instead (fully
    built; Python then skips ``__init__``), as vLLM picks ``AsyncScheduler`` over ``Scheduler``.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is TagmaScheduler and _async_scheduling(args, kwargs):
            return TagmaAsyncScheduler(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _construct_with_tagma_manager(Scheduler.__init__, self, args, kwargs)
