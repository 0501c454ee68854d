"""The vLLM general plugin (entry point ``vllm.general_plugins: tagma``): installs the backend selector.

vLLM calls :func:`register` once in every process it starts (API server, engine core, workers). It wraps
four vLLM functions, each a pass-through unless tagma is selected:

- ``EngineArgs.add_cli_args`` adds ``--kv-cache-backend {paged,tagma}`` (plugins load before vLLM builds
  its parser);
- ``EngineArgs.from_cli_args`` records the flag in ``additional_config["kv_cache_backend"]``;
- ``EngineArgs.create_engine_config`` (API-server process, before any engine core or model exists): when
  tagma is selected, refuses unsupported configurations (:mod:`tagma.fail_closed`) and points
  ``scheduler_config.scheduler_cls`` at :class:`tagma.core.scheduler.TagmaScheduler`;
- ``WorkerBase.__init__`` (worker process, before its model runner exists): when the worker's config
  selects tagma, installs the range write path (:mod:`tagma.worker.install`).

With ``paged`` nothing else of vLLM is touched. A refusal raised for a CLI invocation exits with its
one-line message instead of a traceback.

Measurement hooks, the same for both backends and installed only when the environment asks
(:mod:`tagma.probes.host_time_hooks`): ``TAGMA_HOST_TIME_FILE`` times the scheduler, the KV cache manager and
the worker's input preparation per step; ``TAGMA_TELEMETRY_FILE`` gives vLLM's own KV cache manager the
placement telemetry tagma's manager writes (:mod:`tagma.probes.telemetry`). Unset, they import and wrap
nothing.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from tagma.selector import (
    CLI_DEST,
    SCHEDULER_QUALNAME,
    TagmaConfigError,
    add_cli_flag,
    is_tagma,
    merge_cli_choice,
)

__all__ = ["configure_engine_config", "register"]

# A child of vLLM's logger: vLLM's handlers and level apply to it.
logger = logging.getLogger("vllm.tagma")

_WRAPPED = "_tagma_wrapped"
_FROM_CLI = "_tagma_from_cli"
_registered = False


def register() -> None:
    """Install the selector hooks (idempotent; cheap: the two vLLM modules it imports are loaded in vLLM's
    processes anyway)."""
    global _registered
    if _registered:
        return
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.worker.worker_base import WorkerBase

    _wrap_add_cli_args(EngineArgs)
    _wrap_from_cli_args(EngineArgs)
    _wrap_create_engine_config(EngineArgs)
    _wrap_worker_init(WorkerBase)
    from tagma.probes import host_time_hooks

    host_time_hooks.install_engine_side()
    _registered = True


def configure_engine_config(vllm_config: Any) -> None:
    """Apply the selected backend to a freshly built VllmConfig (no-op for ``paged``)."""
    if not is_tagma(vllm_config):
        return
    from tagma import engine, fail_closed

    fail_closed.check(vllm_config)
    try:
        engine.version()
    except engine.EngineNotBuiltError as err:
        raise TagmaConfigError(f"tagma: the range engine library is not built ({err}); run `make engine`") \
            from None
    vllm_config.scheduler_config.scheduler_cls = SCHEDULER_QUALNAME
    logger.info("tagma: KV cache backend tagma selected; scheduler %s", SCHEDULER_QUALNAME)


def install_worker_write_path(vllm_config: Any) -> None:
    """In a worker whose config selects tagma: route KV-write slot mappings through range descriptors."""
    if not is_tagma(vllm_config):
        return
    from tagma.worker import install as write_path

    use_v2 = bool(vllm_config.use_v2_model_runner)
    write_path.install(use_v2_model_runner=use_v2)
    runner = 2 if use_v2 else 1
    logger.info("tagma: worker KV-write slot mapping from range descriptors (Model Runner V%d)", runner)


# ------------------------------------------------------------------------------------------------ hooks


def _already_wrapped(fn: Any) -> bool:
    return getattr(fn, _WRAPPED, False)


def _wrap_add_cli_args(engine_args_cls: type) -> None:
    original = engine_args_cls.add_cli_args
    if _already_wrapped(original):
        return

    @functools.wraps(original)
    def add_cli_args(parser: Any, *args: Any, **kwargs: Any) -> Any:
        parser = original(parser, *args, **kwargs)
        add_cli_flag(parser)
        return parser

    setattr(add_cli_args, _WRAPPED, True)
    engine_args_cls.add_cli_args = staticmethod(add_cli_args)


def _wrap_from_cli_args(engine_args_cls: type) -> None:
    original = engine_args_cls.from_cli_args.__func__
    if _already_wrapped(original):
        return

    @functools.wraps(original)
    def from_cli_args(cls: type, args: Any) -> Any:
        engine_args = original(cls, args)
        try:
            engine_args.additional_config = merge_cli_choice(
                engine_args.additional_config, getattr(args, CLI_DEST, None)
            )
        except TagmaConfigError as err:
            raise SystemExit(str(err)) from None
        setattr(engine_args, _FROM_CLI, True)
        return engine_args

    setattr(from_cli_args, _WRAPPED, True)
    engine_args_cls.from_cli_args = classmethod(from_cli_args)


def _wrap_create_engine_config(engine_args_cls: type) -> None:
    original = engine_args_cls.create_engine_config
    if _already_wrapped(original):
        return

    @functools.wraps(original)
    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        vllm_config = original(self, *args, **kwargs)
        try:
            configure_engine_config(vllm_config)
        except TagmaConfigError as err:
            if getattr(self, _FROM_CLI, False):
                raise SystemExit(str(err)) from None
            raise
        return vllm_config

    setattr(create_engine_config, _WRAPPED, True)
    engine_args_cls.create_engine_config = create_engine_config


def _wrap_worker_init(worker_base_cls: type) -> None:
    original = worker_base_cls.__init__
    if _already_wrapped(original):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
        install_worker_write_path(vllm_config)
        from tagma.probes import host_time_hooks

        host_time_hooks.install_worker_side()
        original(self, *args, **kwargs)

    setattr(__init__, _WRAPPED, True)
    worker_base_cls.__init__ = __init__
