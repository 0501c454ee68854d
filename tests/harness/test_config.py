"""Every shipped Hydra config composes into a valid BenchConfig; bad combinations fail with a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness.config import BenchConfig, from_mapping

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _compose(*overrides: str, config_name: str = "bench") -> BenchConfig:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name=config_name, overrides=["repo_dir=/tmp/tagma-repo", *overrides])
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(resolved, dict)
    return from_mapping(resolved)


def test_default_is_the_cpu_16k_ab() -> None:
    cfg = _compose()
    assert cfg.backends == ("paged", "tagma")
    assert cfg.server.device == "cpu" and cfg.server.dtype == "float32"
    assert cfg.workload.input_len.low >= 12288 and cfg.workload.max_model_len == cfg.server.max_model_len
    assert cfg.run.design == "paired" and cfg.load.mode == "closed" and cfg.load.max_concurrency == 1
    assert cfg.run.repeats >= 2 and not cfg.is_aa
    assert cfg.out_dir.parent == Path("/tmp/tagma-repo/results/serve")


@pytest.mark.parametrize("load", ["poisson", "gamma", "closed"])
@pytest.mark.parametrize("workload", ["sharegpt_16k_cpu", "sharegpt_16k", "sharegpt_natural"])
def test_groups_compose(load: str, workload: str) -> None:
    cfg = _compose(f"load={load}", f"workload={workload}", "server=gpu", "run.design=abba")
    assert cfg.load.mode == ("closed" if load == "closed" else "open")
    assert cfg.workload.name == workload


def test_128k_needs_the_128k_server() -> None:
    assert _compose("workload=sharegpt_128k_cpu", "server=cpu_128k").workload.input_len.high > 100_000
    with pytest.raises(ValueError, match="max_model_len"):
        _compose("workload=sharegpt_128k_cpu", "server=cpu", "workload.max_model_len=132096")


def test_gpu_model_needs_a_path() -> None:
    with pytest.raises(Exception, match="model.path"):
        _compose("model=llama31_8b_gpu", "server=gpu")
    cfg = _compose("model=llama31_8b_gpu", "server=gpu", "model.path=/models/llama", "workload=sharegpt_128k")
    assert cfg.model.path == "/models/llama" and not cfg.model.build_tiny


def test_rate_sweep_config_lists_rates() -> None:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="rate_sweep", return_hydra_config=True)
    assert cfg.hydra.sweeper.params["load.request_rate"] == "0.05,0.1,0.2"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("backends=[paged,vattention]", "backends"),
        ("backends=[paged]", "backends"),
        ("run.design=interleaved", "design"),
        ("load=poisson", "paired"),  # the default paired design needs a closed loop
        ("run.repeats=0", "repeats"),
        ("server.device=tpu", "device"),
        ("load.request_rate=-1", "request_rate"),
        ("workload.num_requests=0", "num_requests"),
    ],
)
def test_bad_values_are_refused(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _compose(override)


def test_backends_name_the_arms_and_an_aa_is_allowed() -> None:
    cfg = _compose("backends=[tagma,paged]")
    assert [(a.name, a.backend) for a in cfg.arms] == [("baseline", "tagma"), ("candidate", "paged")]
    assert not cfg.is_aa
    aa = _compose("backends=[paged,paged]")
    assert aa.is_aa and [a.label for a in aa.arms] == ["baseline (paged)", "candidate (paged)"]


def test_paired_design_needs_a_closed_loop() -> None:
    """Paired sends one wave of load.max_concurrency prompts at a time (1 by default); an open loop or a
    trace would keep both live servers busy at once."""
    cfg = _compose("run.design=paired", "load=closed", "load.max_concurrency=1")
    assert cfg.run.design == "paired"
    assert _compose("run.design=paired", "load=closed", "load.max_concurrency=8").load.max_concurrency == 8
    with pytest.raises(ValueError, match="load=closed"):
        _compose("run.design=paired", "load=poisson", "load.request_rate=2")
