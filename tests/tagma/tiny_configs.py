"""VllmConfigs of the tiny local model and of model directories crafted from it (config.json edits, no
weights): enough for config-level tests, never enough to load a model."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

for _name, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}.items():
    os.environ.setdefault(_name, _value)

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = REPO / "data" / "tiny-llama"
TAGMA = {"kv_cache_backend": "tagma"}


def craft_model(root: Path, name: str, drop: tuple[str, ...] = (), **changes: Any) -> Path:
    """A copy of the tiny model's config and tokenizer (no weights) with ``config.json`` edited."""
    target = root / name
    target.mkdir(parents=True, exist_ok=True)
    for item in TINY_MODEL.iterdir():
        if item.is_file() and item.suffix != ".safetensors":
            shutil.copy(item, target / item.name)
    config = json.loads((TINY_MODEL / "config.json").read_text())
    for key in drop:
        config.pop(key, None)
    config.update(changes)
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return target


def engine_config(model: Path | str = TINY_MODEL, **engine_kwargs: Any) -> Any:
    """``EngineArgs(...).create_engine_config()`` for a model, fp32 (this CPU), tagma hooks active."""
    from tagma.serve import install_version_alias

    install_version_alias()
    from vllm.engine.arg_utils import EngineArgs

    from tagma.plugin import register

    register()
    return EngineArgs(model=str(model), dtype="float32", **engine_kwargs).create_engine_config()


# config.json edits that make the tiny llama another architecture (config-level only: no weights exist).
SLIDING_WINDOW_MODEL = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "sliding_window": 64,
}
MLA_MODEL = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "kv_lora_rank": 64,
    "q_lora_rank": None,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 2,
    "moe_intermediate_size": 128,
}
MAMBA_MODEL = {
    "architectures": ["MambaForCausalLM"],
    "model_type": "mamba",
    "state_size": 16,
    "expand": 2,
    "conv_kernel": 4,
    "time_step_rank": 16,
}
HYBRID_MODEL = {
    "architectures": ["JambaForCausalLM"],
    "model_type": "jamba",
    "attn_layer_period": 2,
    "attn_layer_offset": 1,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "num_experts": 1,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_dt_rank": 16,
}
