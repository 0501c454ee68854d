"""The context a model allows, as vLLM derives it, and the checks made before any server starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness.config import from_mapping
from harness.main import resolve_context
from harness.serve.model_context import (
    ContextError,
    context_limit,
    model_context_limit,
    resolve_max_model_len,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# The shape of Llama-3.1-8B's config.json (its checkpoint is not on this machine).
LLAMA31_SHAPE = {
    "model_type": "llama", "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}  # fmt: skip


def test_limit_is_the_smallest_position_key_capped_by_the_tokenizer() -> None:
    assert context_limit({"max_position_embeddings": 4096, "n_positions": 2048}) == 2048
    assert context_limit({"max_position_embeddings": 4096}, {"model_max_length": 1024}) == 1024
    assert context_limit({"text_config": {"max_position_embeddings": 8192}}) == 8192
    assert context_limit({"hidden_size": 8}) is None


def test_rope_factor_applies_except_to_prescaled_types() -> None:
    assert context_limit(LLAMA31_SHAPE) == 131072  # llama3 RoPE: the limit is already scaled
    linear = {"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}
    assert context_limit(linear) == 16384
    yarn = {"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}
    assert context_limit(yarn) == 4096


def test_requested_length_over_the_model_is_refused_with_the_numbers() -> None:
    with pytest.raises(ContextError, match="132096 exceeds .*131072"):
        resolve_max_model_len(132096, 131072, 126992, "m")
    with pytest.raises(ContextError, match="needs 140000 tokens"):
        resolve_max_model_len(None, 131072, 140000, "m")
    assert resolve_max_model_len(None, 131072, 126992, "m") == 131072
    assert resolve_max_model_len(17408, 131072, 16032, "m") == 17408


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="bench", overrides=["repo_dir=/tmp/tagma-repo", *overrides])
    return from_mapping(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))


@pytest.mark.parametrize(
    ("server", "workload"),
    [("cpu", "sharegpt_16k_cpu"), ("cpu", "sharegpt_natural"), ("cpu_128k", "sharegpt_128k_cpu"),
     ("gpu", "sharegpt_16k"), ("gpu", "sharegpt_128k")],
)  # fmt: skip
def test_every_shipped_config_fits_its_model(server: str, workload: str, tmp_path: Path) -> None:
    """CPU configs against the tiny model's limit; GPU configs against Llama-3.1-8B's config shape."""
    from harness.serve.tiny_model import TinyModelSpec

    model = tmp_path / "model"
    model.mkdir()
    tiny = {"max_position_embeddings": TinyModelSpec().max_position_embeddings}
    shape = LLAMA31_SHAPE if server == "gpu" else tiny
    (model / "config.json").write_text(json.dumps(shape))
    cfg = _compose(f"server={server}", f"workload={workload}", f"model.path={model}")
    resolved = resolve_context(cfg)
    assert resolved.server.max_model_len == resolved.workload.max_model_len <= model_context_limit(model)
