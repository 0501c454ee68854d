"""The context length a model allows, read from its checkpoint files as vLLM derives it, checked before any
server starts.

vLLM refuses ``--max-model-len`` above the length it derives from the model (the smallest of the
position-limit keys of ``config.json``, capped by the tokenizer's ``model_max_length``, times a RoPE scaling
factor for the RoPE types whose limit is not already scaled). A benchmark that asks for more fails only
after each server has spent a minute starting; this module lets the harness refuse the config at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The keys vLLM reads for a model's position limit; the smallest present wins.
POSITION_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
    "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
)  # fmt: skip
# RoPE types whose position limit in config.json is already the scaled one (no factor applied again).
PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


class ContextError(ValueError):
    """A requested context does not fit the model; the message says which numbers and where they came from."""


def _rope_parameters(cfg: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if not isinstance(rope, Mapping):
        return []
    if "rope_type" in rope or "type" in rope:
        return [rope]
    return [v for v in rope.values() if isinstance(v, Mapping)]  # per layer type


def context_limit(config: Mapping[str, Any], tokenizer_config: Mapping[str, Any] | None = None) -> int | None:
    """The largest prompt + output length the model allows, or None when its config names no limit.

    Args:
        config: the model's ``config.json`` (its ``text_config`` is used where present).
        tokenizer_config: the ``tokenizer_config.json``, whose ``model_max_length`` caps the limit.
    """
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    limits = [int(text[k]) for k in POSITION_KEYS if isinstance(text.get(k), int | float)]
    if isinstance(text.get("model_max_length"), int | float):  # vLLM lets this key override the others
        limits = [int(text["model_max_length"])]
    if not limits:
        return None
    limit = float(min(limits))
    tokenizer_max = (tokenizer_config or {}).get("model_max_length")
    if isinstance(tokenizer_max, int | float):
        limit = min(limit, float(tokenizer_max))
    if "gemma3" not in str(config.get("model_type", "")):
        factor = 1.0
        for rp in _rope_parameters(text):
            kind = rp.get("rope_type", rp.get("type"))
            if kind not in PRESCALED_ROPE and rp.get("factor") is not None:
                factor = float(rp["factor"])
        limit *= factor
    return int(limit)


def model_context_limit(model_dir: Path) -> int | None:
    """:func:`context_limit` of a checkpoint directory (None when it has no config.json)."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        return None
    tok_path = model_dir / "tokenizer_config.json"
    tokenizer = json.loads(tok_path.read_text()) if tok_path.is_file() else None
    return context_limit(json.loads(config_path.read_text()), tokenizer)


def resolve_max_model_len(requested: int | None, limit: int | None, needed: int | None, model: str) -> int:
    """The server's ``--max-model-len``: ``requested``, else the model's limit; refused when it cannot hold
    the workload (``needed`` = longest prompt + output) or exceeds what the model allows.
    """
    if requested is not None and limit is not None and requested > limit:
        raise ContextError(
            f"server.max_model_len={requested} exceeds the context of model {model} ({limit} tokens, from "
            f"its config.json); set server.max_model_len<={limit} or null to use the model's limit"
        )
    chosen = requested if requested is not None else limit
    if chosen is None:
        raise ContextError(f"model {model} names no context length in config.json; set server.max_model_len")
    if needed is not None and needed > chosen:
        raise ContextError(
            f"the workload needs {needed} tokens of context (longest prompt + output) but the server allows "
            f"{chosen} (model {model} allows {limit}); shorten the workload's lengths"
        )
    return chosen
