"""Fail closed: the configurations tagma refuses, checked on the VllmConfig before any model loads.

tagma serves one full-attention or MLA KV cache group (prefix caching on or off), full-attention,
sliding-window, chunked local and state (Mamba/GDN) groups with prefix caching off, and sliding-window
groups (beside one full-attention group or alone) and chunked local groups (beside one) with prefix caching
on, written through plain
token-to-slot mappings; speculative decoding by ngram, a draft model, an EAGLE / EAGLE-3 drafter or a
model's MTP layer beside one full-attention group, and an EAGLE / EAGLE-3 drafter beside sliding-window
groups (and chunked local groups with caching off). Everything else is refused with one line naming the
feature. The KV cache manager
(``tagma.core.manager``) repeats the group/spec checks on the real ``KVCacheConfig`` in the engine core as a
backstop for what only model loading reveals. What the model's config already tells about the KV cache
groups (layer types, sliding windows, chunked attention, per-layer KV shapes) is refused here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tagma.contract import ENV_RANGE_MANAGER
from tagma.errors import TagmaUnsupported
from tagma.selector import CLI_FLAG, PAGED, SCHEDULER_QUALNAME, range_manager_enabled

__all__ = ["check", "unsupported_features"]

Check = Callable[[Any], str | None]


def _block_object_manager(kind: str) -> str | None:
    """The refusal of several KV cache groups when ``$TAGMA_RANGE_MANAGER`` = 0 (one group only)."""
    if not range_manager_enabled():
        return f"{kind} with {ENV_RANGE_MANAGER}=0 (the block-object manager serves one group)"
    return None


def _mla(c: Any) -> str | None:
    # Dense MLA (DeepSeek-V2/V3) is one latent KV group: served (the managers see full attention; the MLA
    # cache op writes through tagma's slot mapping). Sparse MLA adds an indexer KV cache: a second group.
    mc = c.model_config
    if mc.use_mla and getattr(mc.hf_text_config, "index_topk", None) is not None:
        return "sparse MLA (an indexer KV cache beside the latent one: >1 KV cache group)"
    return None


def _attention_free(c: Any) -> str | None:
    if c.model_config.is_attention_free:
        return "attention-free models (Mamba-style state, no KV cache)"
    return None


def _hybrid(c: Any) -> str | None:
    # State layers (Mamba, Gated DeltaNet) beside attention: the group managers, prefix caching off (vLLM's
    # cache mode "none": one state block per request) or on (mode "align": state checkpoints at block
    # boundaries, tagma.core.state_checkpoints). Speculative decoding beside them with caching on (speculative
    # state blocks) is refused here; Mamba2-style prefill checkpoint blocks, a spec field, when the KV cache
    # manager is built.
    if not c.model_config.is_hybrid:
        return None
    cache = c.cache_config
    if cache.enable_prefix_caching:
        mode = getattr(cache, "mamba_cache_mode", "align")
        if mode != "align":
            return f"Mamba/hybrid models with prefix caching on in mamba_cache_mode={mode!r}"
        if c.speculative_config is not None and not getattr(cache, "use_replayssm", False):
            return (
                "speculative decoding beside state layers with prefix caching on (speculative state blocks; "
                "tagma serves it with --no-enable-prefix-caching)"
            )
    return _block_object_manager("Mamba/hybrid models")


# Layer kinds that are plain full attention in HF configs' ``layer_types``; anything else (linear, mamba,
# conv, chunked, ...) gives vLLM a second KV cache spec, hence a second KV cache group.
_FULL_ATTENTION_LAYER_TYPES = frozenset({"full_attention", "attention", "global_attention", "global"})
# The window kinds of ``layer_types`` the group managers serve: sliding windows (named by _sliding_window) and
# Llama 4's chunked local attention (by _chunked_local).
_WINDOW_LAYER_TYPES = frozenset({"sliding_attention", "chunked_attention"})


def _sliding_window(c: Any) -> str | None:
    # Sliding-window groups (alone or beside full attention): the range-native group managers, prefix caching
    # off (tagma.core.group_range_manager) or on (tagma.core.group_prefix_manager: the windows' cached blocks
    # keyed by the full-attention group's prefix index, or by content keys where every layer slides). R-SWA
    # (a window over the prompt's middle): never.
    mc = c.model_config
    if getattr(mc, "rswa_window", None) is not None:
        return f"R-SWA sliding-window attention (rswa_window={mc.rswa_window})"
    window = mc.get_sliding_window()
    layer_types = getattr(mc.hf_text_config, "layer_types", None) or ()
    if window is None and "sliding_attention" not in layer_types:
        return None
    return _block_object_manager("sliding-window attention")


def _chunked_local(c: Any) -> str | None:
    # Chunked local attention groups (Llama 4's RoPE layers beside global NoPE layers): the range-native group
    # managers, a window whose start jumps chunk by chunk, prefix caching off (tagma.core.group_range_manager)
    # or on (tagma.core.group_prefix_manager: the chunked group's cached blocks kept at the full group's
    # prefix index; a layout with no full group is refused at construction).
    chunk = getattr(c.model_config, "attention_chunk_size", None)
    if chunk is None:
        return None
    return _block_object_manager(f"chunked local attention (attention_chunk_size={chunk})")


def _layer_types(c: Any) -> str | None:
    if c.model_config.is_attention_free or c.model_config.is_hybrid:
        return None  # named more precisely by _attention_free / _hybrid
    layer_types = getattr(c.model_config.hf_text_config, "layer_types", None) or ()
    other = sorted({str(t) for t in layer_types} - _FULL_ATTENTION_LAYER_TYPES - _WINDOW_LAYER_TYPES)
    if other:
        kinds = ", ".join(other)
        return f"layer types other than full attention (layer_types has {kinds}: >1 KV cache group)"
    return None


def _per_layer_kv_shape(c: Any) -> str | None:
    # Per-layer KV head counts or head sizes give layers different KV page sizes: several KV cache groups.
    text = c.model_config.hf_text_config
    for name in ("num_key_value_heads", "head_dim"):
        value = getattr(text, name, None)
        if isinstance(value, (list, tuple)) and len(set(value)) > 1:
            return f"per-layer KV shapes ({name} differs between layers: >1 KV cache group)"
    return None


def _encoder_decoder(c: Any) -> str | None:
    return "encoder-decoder models (cross-attention)" if c.model_config.is_encoder_decoder else None


def _pooling(c: Any) -> str | None:
    runner = c.model_config.runner_type
    return f"pooling models (runner={runner})" if runner == "pooling" else None


def _diffusion(c: Any) -> str | None:
    if getattr(c, "diffusion_config", None) is not None or getattr(c.model_config, "is_diffusion", False):
        return "diffusion language models (they bring their own scheduler)"
    return None


# Speculative methods tagma serves. ngram's proposer holds no KV cache: the manager sees only lookahead
# tokens (allocated with the step's tokens; a rejected token's slot is rewritten next step). A draft model's
# layers join the target's KV cache group(s) (vLLM groups layers by spec), so its KV lives in the request's
# blocks: the manager sees the same lookahead slots (num_speculative_tokens) and no EAGLE block drop, and the
# drafter's slot kernels read the block-table rows tagma materializes. An EAGLE drafter (one decoder layer on
# the target's hidden states, KV shaped as the target's) joins the target's one full-attention group too:
# besides the lookahead slots, a prefix-cache hit loses its last block (use_eagle), as in vLLM. An EAGLE-3
# drafter reads the target's auxiliary hidden states (several layers' outputs, through its fc) where EAGLE
# reads the last one: a difference inside the model runner, none for the KV cache (its layer's KV is shaped
# as the target's, the same group, the same use_eagle hit rule). MTP (the target's own extra decoder layers,
# vLLM's EAGLE path with the target's layers as the drafter) is the same for the KV cache where its layers'
# KV joins the target's one group and each drafter reads one prefill token ahead; multi-module MTP (a
# module per speculative token, each reading one token further) and the block drafters: refused. Beside a
# target's sliding-window groups the drafter's layer takes the target's model-level window (vLLM's Attention
# falls back to cache_config.sliding_window) and joins a window group of vLLM's grouping; beside chunked
# local groups it is a full-attention layer (the target's full group or one of its own). With prefix caching
# off the group range manager serves both, lookahead slots in every group as vLLM's managers take them
# (use_eagle changes only hit rules); with caching on beside sliding windows the group prefix manager serves
# it (vLLM marks no group for an EAGLE drafter, so every group takes vLLM's EAGLE hit rule); beside chunked
# groups caching on is refused (vLLM's chunked hit rule asserts no EAGLE drop).
SERVED_SPECULATIVE_METHODS = ("ngram", "draft_model")
EAGLE_METHODS = ("eagle", "eagle3", "mtp")


def _kv_shape(config: Any) -> tuple[Any, Any]:
    heads = getattr(config, "num_key_value_heads", None) or getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads if getattr(config, "hidden_size", None) else None
    )
    return heads, head_dim


def _eagle_outside_one_group(c: Any) -> str | None:
    """Why an EAGLE drafter would not be served beside the target's KV cache groups, or None: served beside
    one full-attention group, beside sliding-window groups and beside chunked local groups with prefix
    caching off."""
    mc = c.model_config
    layer_types = set(getattr(mc.hf_text_config, "layer_types", None) or ())
    if mc.is_hybrid or mc.use_mla or (layer_types - _FULL_ATTENTION_LAYER_TYPES - _WINDOW_LAYER_TYPES):
        return "a target with state layers, MLA or layer types other than attention"
    draft = getattr(c.speculative_config.draft_model_config, "hf_text_config", None)
    if draft is not None and _kv_shape(draft) != _kv_shape(mc.hf_text_config):
        return "a drafter whose KV shape differs from the target's (a KV cache group of its own)"
    if getattr(mc, "attention_chunk_size", None) is not None and c.cache_config.enable_prefix_caching:
        return (
            "prefix caching on beside chunked local attention groups (vLLM's chunked hit rule has no EAGLE "
            "drop; tagma serves it with --no-enable-prefix-caching)"
        )
    return None


def lookahead_hashes() -> bool:
    """Whether the installed vLLM hashes blocks with lookahead for EAGLE-family drafters with caching on
    (vLLM 0.33: a block's hash covers the next tokens; the prefix index keys a block by its own)."""
    from tagma.core.manager import SIGNATURE  # KVCacheManager.__init__'s, read once

    return "num_hash_lookahead_tokens" in SIGNATURE.parameters


def _prefill_lookahead(c: Any) -> int:
    """Prefill tokens the drafter reads ahead: vLLM's own count where it has one (0.32), else its rule (one
    for the EAGLE family; multi-module MTP, a module per speculative token, that many)."""
    value = getattr(c, "num_prefill_lookahead_tokens", None)
    if value is not None:
        return int(value)
    spec = c.speculative_config
    layers = getattr(spec.draft_model_config.hf_config, "num_nextn_predict_layers", None) or 1
    tokens = spec.num_speculative_tokens
    return tokens if spec.method == "mtp" and min(layers, tokens) > 1 else 1


def _speculative(c: Any) -> str | None:
    spec = c.speculative_config
    if spec is None or spec.method in SERVED_SPECULATIVE_METHODS:
        return None
    method = spec.method
    if method in EAGLE_METHODS:
        reason = _eagle_outside_one_group(c)
        lookahead = _prefill_lookahead(c)
        if reason is None and lookahead > 1:
            reason = f"a module per speculative token (multi-module MTP: {lookahead} prefill tokens ahead)"
        if reason is None and _prefix_index(c) and lookahead_hashes():
            reason = "prefix caching on this vLLM's lookahead block hashes (tagma keys a block by its tokens)"
        if reason is None:
            return None
        kind = "an MTP drafter" if method == "mtp" else "an EAGLE drafter"
        return f"{kind} with {reason} (--speculative-config method={method})"
    return (f"speculative decoding with a drafter on the target's hidden states (--speculative-config "
            f"method={method}; served: ngram, draft_model, eagle, eagle3, mtp)")


def _kv_connector(c: Any) -> str | None:
    if c.cache_config.kv_offloading_size is not None:
        return "KV cache offloading (--kv-offloading-size)"
    if c.kv_transfer_config is not None:
        connector = getattr(c.kv_transfer_config, "kv_connector", None)
        return f"KV connectors (--kv-transfer-config, kv_connector={connector})"
    return None


def _context_parallel(c: Any) -> str | None:
    pc = c.parallel_config
    if pc.decode_context_parallel_size > 1:
        size = pc.decode_context_parallel_size
        return f"decode context parallelism (--decode-context-parallel-size {size})"
    if pc.prefill_context_parallel_size > 1:
        size = pc.prefill_context_parallel_size
        return f"prefill context parallelism (--prefill-context-parallel-size {size})"
    return None


def _pipeline_parallel(c: Any) -> str | None:
    size = c.parallel_config.pipeline_parallel_size
    return f"pipeline parallelism (--pipeline-parallel-size {size}; untested)" if size > 1 else None


def _elastic_ep(c: Any) -> str | None:
    # Elastic EP swaps the workers' block tables out and back by copy, bypassing the row updates that
    # keep tagma's range descriptors, and redirects KV writes to the null block during its warm-up.
    if getattr(c.parallel_config, "enable_elastic_ep", False):
        return "elastic expert parallelism (--enable-elastic-ep)"
    return None


def _custom_scheduler(c: Any) -> str | None:
    cls = c.scheduler_config.scheduler_cls
    if cls is None or cls == SCHEDULER_QUALNAME or _diffusion(c) is not None:
        return None
    name = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
    return f"a custom scheduler class (--scheduler-cls {name}); tagma installs its own"


def _hisparse(c: Any) -> str | None:
    hisparse = getattr(getattr(c, "attention_config", None), "hisparse_config", None)
    return "HiSparse attention (host-resident KV cache groups)" if hisparse is not None else None


def _prefix_match_unit(c: Any) -> str | None:
    unit = getattr(c.cache_config, "prefix_match_unit", None)
    block = c.cache_config.block_size
    if unit is not None and unit != block:
        return f"prefix-cache hits inside a block (prefix_match_unit={unit} != block_size={block})"
    return None


def _per_layer_kv_dtype(c: Any) -> str | None:
    skipped = getattr(c.cache_config, "kv_cache_dtype_skip_layers", None)
    if skipped and c.cache_config.cache_dtype != "auto":
        return f"per-layer KV cache dtypes (kv_cache_dtype_skip_layers={list(skipped)})"
    return None


def _prefix_index(c: Any) -> bool:
    """Whether the engine core will serve prefix caching with tagma's token-keyed prefix index (caching on,
    range manager not switched off): the index keys blocks by token ids, cache salt and LoRA adapter only."""
    return bool(c.cache_config.enable_prefix_caching) and range_manager_enabled()


def _prefix_cache_keys(c: Any) -> str | None:
    # vLLM's block hashes also key multimodal inputs and prompt embeddings; the prefix index cannot.
    if not _prefix_index(c):
        return None
    if c.model_config.is_multimodal_model:
        return "multimodal models with prefix caching (the prefix index keys token ids only)"
    if getattr(c.model_config, "enable_prompt_embeds", False):
        return "prompt embeddings with prefix caching (--enable-prompt-embeds; the index keys token ids)"
    return None


def _kv_events(c: Any) -> str | None:
    events = c.kv_events_config
    if events is not None and events.enable_kv_cache_events and _prefix_index(c):
        return "KV cache events with prefix caching (tagma's prefix index has no block hashes to publish)"
    return None


def _returned_routed_experts(c: Any) -> str | None:
    # vLLM 0.33 keeps each cached block's routed experts by its block hash, which the prefix index has not.
    aux = getattr(c, "aux_output_config", None)
    if aux is not None and aux.enabled and _prefix_index(c):
        return "returned routed experts with prefix caching (--enable-return-routed-experts; keyed by hash)"
    return None


CHECKS: tuple[Check, ...] = (
    _mla,
    _attention_free,
    _hybrid,
    _sliding_window,
    _chunked_local,
    _layer_types,
    _per_layer_kv_shape,
    _encoder_decoder,
    _pooling,
    _diffusion,
    _speculative,
    _kv_connector,
    _context_parallel,
    _pipeline_parallel,
    _elastic_ep,
    _custom_scheduler,
    _hisparse,
    _prefix_match_unit,
    _per_layer_kv_dtype,
    _prefix_cache_keys,
    _kv_events,
    _returned_routed_experts,
)


def unsupported_features(vllm_config: Any) -> list[str]:
    """Every feature of ``vllm_config`` that tagma refuses, in a fixed order."""
    return [feature for check_one in CHECKS if (feature := check_one(vllm_config)) is not None]


def check(vllm_config: Any) -> None:
    """Raise :class:`~tagma.errors.TagmaUnsupported` (one line) naming everything tagma refuses."""
    features = unsupported_features(vllm_config)
    if features:
        raise TagmaUnsupported(f"{'; '.join(features)}. Use {CLI_FLAG} {PAGED} for this configuration.")
