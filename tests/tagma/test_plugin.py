"""The plugin: `--kv-cache-backend` and `additional_config` select the backend; paged leaves vLLM alone."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs  # noqa: E402
from vllm.v1.core.sched import scheduler as scheduler_module  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.worker import block_table as v1_block_table  # noqa: E402
from vllm.v1.worker.worker_base import WorkerBase  # noqa: E402

from tagma import plugin  # noqa: E402
from tagma.preflight import serve_parser  # noqa: E402
from tagma.selector import TagmaConfigError  # noqa: E402
from tagma.worker import install as write_path  # noqa: E402
from tests.tagma.tiny_configs import TAGMA, TINY_MODEL, engine_config  # noqa: E402

SCHEDULER = "tagma.core.scheduler.TagmaScheduler"


def parse(*argv: str) -> Any:
    plugin.register()
    return serve_parser().parse_args(["--model", str(TINY_MODEL), *argv])


def config_from_cli(*argv: str) -> Any:
    return AsyncEngineArgs.from_cli_args(parse("--dtype", "float32", *argv)).create_engine_config()


# ---------------------------------------------------------------- selector


def test_cli_flag_parses_and_defaults_to_unset() -> None:
    assert parse("--kv-cache-backend", "tagma").kv_cache_backend == "tagma"
    assert parse("--kv-cache-backend", "paged").kv_cache_backend == "paged"
    assert parse().kv_cache_backend is None


def test_cli_flag_rejects_unknown_backends() -> None:
    with pytest.raises(SystemExit):
        parse("--kv-cache-backend", "vattention")


def test_cli_flag_becomes_additional_config() -> None:
    args = AsyncEngineArgs.from_cli_args(parse("--kv-cache-backend", "tagma"))
    assert args.additional_config == TAGMA


def test_cli_flag_selects_tagma_scheduler() -> None:
    config = config_from_cli("--kv-cache-backend", "tagma")
    assert config.additional_config["kv_cache_backend"] == "tagma"
    assert config.scheduler_config.scheduler_cls == SCHEDULER


def test_additional_config_on_the_cli_selects_tagma() -> None:
    config = config_from_cli("--additional-config", '{"kv_cache_backend": "tagma", "other": 1}')
    assert config.scheduler_config.scheduler_cls == SCHEDULER
    assert config.additional_config == {"kv_cache_backend": "tagma", "other": 1}


def test_additional_config_in_python_selects_tagma() -> None:
    assert engine_config(additional_config=dict(TAGMA)).scheduler_config.scheduler_cls == SCHEDULER


def test_flag_and_additional_config_agreeing_is_fine() -> None:
    both = ("--kv-cache-backend", "tagma", "--additional-config", '{"kv_cache_backend": "tagma"}')
    config = config_from_cli(*both)
    assert config.scheduler_config.scheduler_cls == SCHEDULER


def test_flag_conflicting_with_additional_config_exits_with_one_line() -> None:
    args = parse("--kv-cache-backend", "paged", "--additional-config", '{"kv_cache_backend": "tagma"}')
    with pytest.raises(SystemExit) as info:
        AsyncEngineArgs.from_cli_args(args)
    assert str(info.value.code) == (
        "tagma: conflicting KV cache backends: --kv-cache-backend paged but additional_config "
        "kv_cache_backend='tagma'; give one of them"
    )


def test_unknown_backend_in_additional_config_is_an_error() -> None:
    with pytest.raises(TagmaConfigError, match=r"^tagma: unknown kv_cache_backend 'tagmaa'; expected one of"):
        engine_config(additional_config={"kv_cache_backend": "tagmaa"})


def test_cli_refusal_is_a_one_line_exit_library_refusal_an_exception() -> None:
    with pytest.raises(SystemExit) as info:
        config_from_cli("--kv-cache-backend", "tagma", "--pipeline-parallel-size", "2")
    assert str(info.value.code).startswith("tagma: unsupported: pipeline parallelism")
    with pytest.raises(TagmaConfigError):
        engine_config(additional_config=dict(TAGMA), pipeline_parallel_size=2)


# ---------------------------------------------------------------- paged is stock vLLM


def test_paged_default_changes_nothing() -> None:
    for config in (config_from_cli(), config_from_cli("--kv-cache-backend", "paged"), engine_config()):
        assert config.scheduler_config.scheduler_cls is None
        assert config.additional_config.get("kv_cache_backend", "paged") == "paged"
    assert engine_config().additional_config == {}


def test_paged_worker_installs_nothing() -> None:
    stock = v1_block_table.BlockTable
    plugin.install_worker_write_path(engine_config())
    assert v1_block_table.BlockTable is stock and not write_path.installed()


def test_tagma_worker_installs_the_write_path_before_its_model_runner() -> None:
    config = engine_config(additional_config=dict(TAGMA))
    try:
        WorkerBase(vllm_config=config, local_rank=0, rank=0, distributed_init_method="tcp://127.0.0.1:1")
        assert write_path.installed()
    finally:
        write_path.uninstall()
    assert not write_path.installed()


def test_register_is_idempotent() -> None:
    def hooks() -> tuple[Any, ...]:
        return (EngineArgs.add_cli_args, EngineArgs.from_cli_args, EngineArgs.create_engine_config,
                WorkerBase.__init__)

    plugin.register()
    before = hooks()
    plugin.register()
    plugin._registered = False  # even a second install pass must not wrap twice
    plugin.register()
    assert hooks() == before
    assert not getattr(EngineArgs.create_engine_config.__wrapped__, "_tagma_wrapped", False)
    parser = serve_parser()
    flags = [a for a in parser._actions if "--kv-cache-backend" in a.option_strings]
    assert len(flags) == 1


# ---------------------------------------------------------------- the scheduler factory


def kv_cache_config(num_groups: int = 1, block_size: int = 16) -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float32)
    groups = [KVCacheGroupSpec([f"layer.{i}"], spec) for i in range(num_groups)]
    return KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups)


def build_scheduler(vllm_config: Any, kv_config: KVCacheConfig) -> Any:
    """What the engine core does: resolve scheduler_cls by name and call it with keyword arguments."""
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.structured_output import StructuredOutputManager

    vllm_config.cache_config.num_gpu_blocks = kv_config.num_blocks
    register_all_kvcache_specs(vllm_config)
    block_size = kv_config.kv_cache_groups[0].kv_cache_spec.block_size
    return vllm_config.scheduler_config.get_scheduler_cls()(
        vllm_config=vllm_config,
        kv_cache_config=kv_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        include_finished_set=False,
        log_stats=True,
        block_size=block_size,
        hash_block_size=block_size,
    )


def test_scheduler_qualname_resolves_to_the_factory() -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from tagma.core.scheduler import TagmaScheduler

    assert resolve_obj_by_qualname(SCHEDULER) is TagmaScheduler


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_scheduler_factory_builds_vllm_scheduler_with_tagma_manager(async_scheduling: bool) -> None:
    from tagma.core.manager import TagmaKVCacheManager
    from tagma.core.scheduler import TagmaAsyncScheduler, TagmaScheduler

    config = engine_config(additional_config=dict(TAGMA))
    config.scheduler_config.async_scheduling = async_scheduling
    stock_manager = scheduler_module.KVCacheManager
    scheduler = build_scheduler(config, kv_cache_config())
    assert isinstance(scheduler, Scheduler)
    assert isinstance(scheduler, AsyncScheduler) == async_scheduling
    assert type(scheduler) is (TagmaAsyncScheduler if async_scheduling else TagmaScheduler)
    assert isinstance(scheduler.kv_cache_manager, TagmaKVCacheManager)
    assert scheduler_module.KVCacheManager is stock_manager  # bound only during construction


def test_scheduler_factory_restores_vllm_manager_when_construction_fails() -> None:
    config = engine_config(additional_config=dict(TAGMA))
    stock_manager = scheduler_module.KVCacheManager
    with pytest.raises(ValueError):
        build_scheduler(config, kv_cache_config(num_groups=2))
    assert scheduler_module.KVCacheManager is stock_manager
