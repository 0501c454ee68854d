"""`make bench-gpu`'s first step without a GPU: every check it can make, then one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from harness import gpu_preflight  # noqa: E402
from tests.tagma.tiny_configs import MAMBA_MODEL, craft_model  # noqa: E402

# Llama-3.1-8B's context and RoPE on the tiny model's shapes (no weights: nothing loads)
LLAMA31_CONTEXT = {
    "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}  # fmt: skip
SMALL = ["workload.num_requests=2", "workload.num_warmup=0"]


def _checkpoint(tmp_path: Path, name: str, **changes: object) -> Path:
    model = craft_model(tmp_path, name, **{**LLAMA31_CONTEXT, **changes})
    tok = json.loads((model / "tokenizer_config.json").read_text())
    tok["model_max_length"] = 131072
    (model / "tokenizer_config.json").write_text(json.dumps(tok))
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("ckpt"), "llama31-shaped")


@pytest.mark.slow
def test_every_check_passes_then_one_line_about_the_gpu_and_exit_2(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    overrides = [*SMALL, f"data_dir={tmp_path / 'data'}"]
    assert gpu_preflight.main([str(checkpoint), *overrides]) == gpu_preflight.EXIT_NO_GPU
    out, err = capsys.readouterr()
    done = [line for line in out.splitlines() if line.startswith("ok  ")]
    assert [line.split(":")[0] for line in done] == [
        "ok  sharegpt_16k config", "ok  sharegpt_16k workload",
        "ok  sharegpt_128k config", "ok  sharegpt_128k workload", "ok  tagma",
    ]  # fmt: skip
    assert "2 prompts" in done[1] and "max_model_len 131072" in done[2]
    assert err.count("\n") == 1 and "stopping here" in err and "no CUDA GPU" in err
    monkeypatch.setattr(gpu_preflight, "gpu_problems", lambda: [])  # what a GPU machine sees
    assert gpu_preflight.main([str(checkpoint), *overrides]) == 0


def test_a_checkpoint_too_short_for_the_workload_fails_its_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short = craft_model(tmp_path, "short", max_position_embeddings=8192)
    assert gpu_preflight.main([str(short), *SMALL]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bench-gpu: check failed: sharegpt_16k:") and err.count("\n") == 1


def test_a_checkpoint_tagma_refuses_fails_before_any_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # an attention-free Mamba checkpoint (no KV cache for tagma to place): refused
    hybrid = _checkpoint(tmp_path, "mamba", **MAMBA_MODEL, rope_scaling=None)
    monkeypatch.setattr(
        gpu_preflight, "check_workload", lambda m, w, o: (gpu_preflight.compose_gpu_run(m, w, o), [])
    )
    assert gpu_preflight.main([str(hybrid)]) == 1
    err = capsys.readouterr().err
    refused = "tagma refuses this checkpoint: attention-free models (Mamba-style state, no KV cache)"
    assert refused in err


def test_no_checkpoint_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_preflight.main([]) == 1
    assert gpu_preflight.main([str(tmp_path)]) == 1
    assert "has no config.json" in capsys.readouterr().err
