"""Tiny EAGLE and EAGLE-3 drafters for the tiny Llama: one decoder layer on the target's hidden states, random
weights.

An EAGLE checkpoint (vLLM's ``EagleLlamaForCausalLM``) is a Llama config with one layer and the weights of
that layer (without its input norm: EAGLE's first layer reads ``fc``'s output directly) plus ``fc``, which
maps the token's embedding and the target's hidden state (2 x hidden) to hidden. The embedding and the LM
head are the target's (vLLM shares them when the checkpoint has none). Its KV heads and head size are the
target's, so vLLM puts its layer in the target's KV cache group: its KV lives in the request's blocks.

Random weights propose tokens the target rarely accepts; what the drafter exercises is the KV cache side:
lookahead slots every decode step, the drafter's own KV writes and reads through the block-table rows, and,
with prefix caching on, vLLM's EAGLE rule that a hit loses its last block.

An EAGLE-3 checkpoint (vLLM's ``Eagle3LlamaForCausalLM``) differs in what the layer reads: the target returns
auxiliary hidden states from the layers named by ``eagle_aux_hidden_state_layer_ids`` (vLLM's default picks
layers 2, n/2 and n-3, which a 2-layer target has not), ``fc`` maps their concatenation to hidden, and the
layer's q/k/v read the normed embedding and ``hidden_norm``'s output side by side (2 x hidden). Its KV heads
and head size are still the target's: the same KV cache group.

An MTP model carries its drafter: MiMo (vLLM's ``MiMoForCausalLM``, Qwen2 layers) stores
``num_nextn_predict_layers`` extra layers under ``model.mtp_layers.<i>``, each a decoder layer behind norms
of the token's embedding and the last hidden state and an ``input_proj`` (2 x hidden to hidden). vLLM's
``method=mtp`` loads them as the drafter (``MiMoMTP``); the decoder layer's KV is shaped as the target's, so
it joins the target's one full-attention group.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.serve.tiny_families import copy_tokenizer

__all__ = ["build_eagle3_drafter", "build_eagle_drafter", "build_mtp_model"]

RECIPE = 1  # bump when the build changes, so stale builds are redone
MARKER = "tiny_drafter.json"  # written last: its presence means the build completed


def _wanted(out_dir: Path, **build: object) -> str | None:
    """The marker of this build (``build`` and the recipe), or None when ``out_dir`` holds it complete;
    ``out_dir`` exists afterwards."""
    wanted = json.dumps({**build, "recipe": RECIPE}, sort_keys=True)
    marker = out_dir / MARKER
    if marker.exists() and marker.read_text() == wanted:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    return wanted


# The target's sizes a Llama drafter takes when the target is not a Llama (a window family's): its KV heads
# and head size give the drafter's layer a KV page of the target's size, so vLLM can group it with them.
DRAFTER_SIZES = (
    "vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
    "head_dim", "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id", "pad_token_id",
    "initializer_range",
)  # fmt: skip


def _one_layer_config(target_dir: Path, architecture: str) -> Any:
    """The target's config cut to one Llama layer (a Llama target's own config, else a Llama config of the
    target's sizes, full attention): a drafter's, named ``architecture``."""
    from transformers import AutoConfig, LlamaConfig

    config = AutoConfig.from_pretrained(target_dir)  # a Llama target's is its LlamaConfig
    if config.model_type != "llama":
        config = LlamaConfig(**{name: getattr(config, name) for name in DRAFTER_SIZES}, dtype=config.dtype)
    config.num_hidden_layers = 1
    config.architectures = [architecture]
    return config


def build_eagle_drafter(out_dir: Path, target_dir: Path, seed: int = 0) -> Path:
    """Write an EAGLE drafter for the Llama in ``target_dir`` into ``out_dir`` unless a complete build of the
    same recipe is there."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    wanted = _wanted(out_dir, kind="eagle", target=str(target_dir), seed=seed)
    if wanted is None:
        return out_dir
    config = _one_layer_config(target_dir, "LlamaForCausalLM")  # vLLM names it EagleLlamaForCausalLM
    torch.manual_seed(seed)
    layer = LlamaForCausalLM(config).model.layers[0]
    weights = {
        f"layers.0.{name}": tensor.detach().contiguous()
        for name, tensor in layer.state_dict().items()
        if not name.startswith("input_layernorm.")
    }
    hidden = config.hidden_size
    weights["fc.weight"] = torch.randn(hidden, 2 * hidden) * config.initializer_range
    save_file(weights, str(out_dir / "model.safetensors"))
    config.save_pretrained(out_dir)
    (out_dir / MARKER).write_text(wanted)
    return out_dir


EAGLE3_AUX_LAYERS = (0, 1)  # the tiny Llama's two layers: the hidden states entering each


def build_eagle3_drafter(out_dir: Path, target_dir: Path, seed: int = 0) -> Path:
    """Write an EAGLE-3 drafter for the Llama in ``target_dir`` into ``out_dir`` unless a complete build of
    the same recipe is there (weights in the layout of published EAGLE-3 checkpoints: ``midlayer.*``)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    wanted = _wanted(out_dir, kind="eagle3", target=str(target_dir), seed=seed)
    if wanted is None:
        return out_dir
    config = _one_layer_config(target_dir, "LlamaForCausalLMEagle3")
    # the target's model runner reads the layer ids, the drafter their count (for fc's input size)
    config.eagle_aux_hidden_state_layer_ids = list(EAGLE3_AUX_LAYERS)
    config.eagle_config = {"eagle_aux_hidden_state_layer_ids": list(EAGLE3_AUX_LAYERS)}
    torch.manual_seed(seed)
    layer = LlamaForCausalLM(config).model.layers[0]
    hidden = config.hidden_size
    scale = config.initializer_range
    weights = {f"midlayer.{name}": t.detach().contiguous() for name, t in layer.state_dict().items()}
    for proj in ("q_proj", "k_proj", "v_proj"):  # read [normed embedding, normed hidden]: 2 x hidden
        out_features = weights[f"midlayer.self_attn.{proj}.weight"].shape[0]
        weights[f"midlayer.self_attn.{proj}.weight"] = torch.randn(out_features, 2 * hidden) * scale
    weights["midlayer.hidden_norm.weight"] = torch.ones(hidden)
    weights["norm.weight"] = torch.ones(hidden)
    weights["fc.weight"] = torch.randn(hidden, len(EAGLE3_AUX_LAYERS) * hidden) * scale
    save_file(weights, str(out_dir / "model.safetensors"))
    config.save_pretrained(out_dir)
    (out_dir / MARKER).write_text(wanted)
    return out_dir


# The tiny Llama's sizes and special tokens the MiMo-shaped model takes (the rest: Qwen2's defaults)
MTP_SIZES = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id",
    "pad_token_id",
)  # fmt: skip


def build_mtp_model(out_dir: Path, llama_dir: Path, seed: int = 0) -> Path:
    """Write a tiny MiMo-shaped model (2 Qwen2 layers and one MTP layer, fp32) with the sizes and tokenizer of
    the tiny Llama in ``llama_dir`` into ``out_dir`` unless a complete build of the same recipe is there."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, Qwen2Config, Qwen2ForCausalLM

    wanted = _wanted(out_dir, kind="mtp", seed=seed)
    if wanted is None:
        return out_dir
    llama = LlamaConfig.from_pretrained(llama_dir)
    config = Qwen2Config(**{name: getattr(llama, name) for name in MTP_SIZES})
    config.architectures = ["MiMoForCausalLM"]
    config.num_nextn_predict_layers = 1
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    weights = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    hidden = config.hidden_size
    mtp = "model.mtp_layers.0."
    block = Qwen2ForCausalLM(config).model.layers[0].state_dict()  # the MTP layer's decoder block
    weights.update({mtp + name: t.detach().contiguous() for name, t in block.items()})
    for norm in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
        weights[f"{mtp}{norm}.weight"] = torch.ones(hidden)
    weights[f"{mtp}input_proj.weight"] = torch.randn(hidden, 2 * hidden) * config.initializer_range
    save_file(weights, str(out_dir / "model.safetensors"))
    config.save_pretrained(out_dir)
    copy_tokenizer(llama_dir, out_dir)
    (out_dir / MARKER).write_text(wanted)
    return out_dir
