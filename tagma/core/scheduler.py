"""vLLM's scheduler with tagma's KV cache manager: what ``--scheduler-cls`` names when tagma is selected.

vLLM has no option for the KV cache manager: ``Scheduler.__init__`` builds ``KVCacheManager(...)`` by the
name imported into ``vllm.v1.core.sched.scheduler``. These subclasses bind that name to
:func:`tagma.core.registry.build_kv_cache_manager` (which picks the tagma manager class) for the
duration of their own construction only, so any other scheduler in the process keeps vLLM's manager. The
engine core resolves ``scheduler_config.scheduler_cls`` by qualified name and calls it with keyword arguments;
:class:`TagmaScheduler` then picks the async or the sync base exactly as vLLM's ``get_scheduler_cls`` does.

Request hashing: the engine core builds its per-request block hasher (``request_block_hasher``, a sha256
chain over every full block of every request) right after it has built the scheduler, through the name
``get_request_block_hasher`` of ``vllm.v1.engine.core``. Building a tagma scheduler wraps that name (once per
process): when the engine core asking is the one whose scheduler's KV cache manager declares
``uses_block_hashes = False`` (the prefix-index manager) and no KV connector needs hashes, the engine core
gets ``None``, so its requests are built without block hashes and never hashed.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

from vllm.v1.core.sched import scheduler as scheduler_module
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from tagma.core.registry import build_kv_cache_manager
from tagma.selector import SCHEDULER_QUALNAME

__all__ = [
    "SCHEDULER_QUALNAME",
    "TagmaAsyncScheduler",
    "TagmaScheduler",
    "hashing_needed",
    "install_hashless_hook",
]

logger = logging.getLogger("vllm.tagma")
HASHING_OFF_MESSAGE = "tagma: prefix caching by the engine's prefix index; vLLM's request hashing is off"

_construction_lock = threading.Lock()
_ENGINE_CORE_MODULE = "vllm.v1.engine.core"
_HASHER_NAME = "get_request_block_hasher"
_WRAPPED = "_tagma_hashless"


def hashing_needed(owner: Any) -> bool:
    """Whether an engine core (``owner``: anything with a ``scheduler``) needs vLLM's request block hashes.

    False only when its scheduler's KV cache manager declares ``uses_block_hashes = False`` and the
    scheduler has no KV connector (connectors read ``request.block_hashes``).
    """
    scheduler = getattr(owner, "scheduler", None)
    manager = getattr(scheduler, "kv_cache_manager", None)
    if getattr(manager, "uses_block_hashes", True) is not False:
        return True
    return getattr(scheduler, "connector", None) is not None


def install_hashless_hook() -> bool:
    """Wrap the engine core's ``get_request_block_hasher`` (idempotent). Returns whether it is wrapped: the
    engine-core module must already be imported (it is whenever an engine core builds the scheduler)."""
    module = sys.modules.get(_ENGINE_CORE_MODULE)
    if module is None:
        return False
    original = getattr(module, _HASHER_NAME, None)
    if original is None:
        return False
    if getattr(original, _WRAPPED, False):
        return True

    def get_request_block_hasher(*args: Any, **kwargs: Any) -> Any:
        # The caller is EngineCore.__init__, which has just built self.scheduler.
        owner = sys._getframe(1).f_locals.get("self")
        if owner is not None and not hashing_needed(owner):
            logger.info(HASHING_OFF_MESSAGE)
            return None
        return original(*args, **kwargs)

    setattr(get_request_block_hasher, _WRAPPED, True)
    get_request_block_hasher.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(module, _HASHER_NAME, get_request_block_hasher)
    return True


def _construct_with_tagma_manager(init: Any, scheduler: Scheduler, args: tuple, kwargs: dict) -> None:
    # NOTE: the module-level name is swapped under a lock and always restored, so a scheduler built
    # concurrently by another thread (or after an exception here) gets vLLM's own KVCacheManager.
    with _construction_lock:
        stock = scheduler_module.KVCacheManager
        scheduler_module.KVCacheManager = build_kv_cache_manager  # type: ignore[misc]
        try:
            init(scheduler, *args, **kwargs)
        finally:
            scheduler_module.KVCacheManager = stock  # type: ignore[misc]
    install_hashless_hook()


def _async_scheduling(args: tuple, kwargs: dict) -> bool:
    vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
    return bool(vllm_config.scheduler_config.async_scheduling)


class TagmaAsyncScheduler(AsyncScheduler):
    """``AsyncScheduler`` whose ``kv_cache_manager`` is a tagma one (:mod:`tagma.core.registry`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Build vLLM's ``AsyncScheduler`` with a tagma KV cache manager.

        Args:
            *args: ``AsyncScheduler.__init__``'s positional arguments, passed through unchanged.
            **kwargs: its keyword arguments (``vllm_config``, ``kv_cache_config``, ...), unchanged.
        """
        _construct_with_tagma_manager(AsyncScheduler.__init__, self, args, kwargs)


class TagmaScheduler(Scheduler):
    """``Scheduler`` whose ``kv_cache_manager`` is a tagma one (:mod:`tagma.core.registry`).

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
