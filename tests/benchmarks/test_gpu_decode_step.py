"""The GPU decode-step benchmark's pipeline on CPU (tiny geometry): what it writes, and what it times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from benchmarks.gpu.decode_step import ATTENTION, TINY, Point, Step, Weights, main  # noqa: E402


def test_both_attentions_give_the_same_step() -> None:
    """The packed matmul attention is exact: the step's greedy tokens and hidden state match SDPA's."""
    step = Step(Weights(TINY, "cpu", torch.float32), Point(context=96, batch=3), kv_budget_bytes=1 << 30)
    outs = {}
    for attention in ATTENTION:
        step.attention = attention
        outs[attention] = step.forward()
    assert torch.equal(outs["sdpa"], outs["matmul"])


def test_bytes_read_count_every_layers_kv_even_when_layers_share_one_cache() -> None:
    w = Weights(TINY, "cpu", torch.float32)
    apart = Step(w, Point(context=64, batch=2), kv_budget_bytes=1 << 30)
    shared = Step(w, Point(context=64, batch=2), kv_budget_bytes=0)
    assert apart.kv_per_layer and len(apart.kv) == TINY.layers
    assert not shared.kv_per_layer and len(shared.kv) == 1
    assert apart.bytes_read == shared.bytes_read
    kv = TINY.layers * 2 * 64 * TINY.kv_elems_per_token_layer() * 4
    assert apart.bytes_read == TINY.weight_elems() * 4 + kv


def test_dry_run_writes_a_record_that_says_it_is_not_a_gpu_measurement(tmp_path: Path) -> None:
    assert main(["--dry-run", "--points", "1024x1,4096x2", "--out-dir", str(tmp_path), "--run-id", "r"]) == 0
    record = json.loads((tmp_path / "r" / "decode_step.json").read_text())
    assert record["kind"] == "gpu_decode_step" and "NOT a GPU measurement" in record["measurement"]
    assert [(p["context"], p["batch"]) for p in record["points"]] == [(256, 1), (256, 2)]
    for p in record["points"]:
        assert set(p["by_attention"]) == set(ATTENTION) and p["attention"] in ATTENTION
        assert p["median_ms"] == min(v["median_ms"] for v in p["by_attention"].values())


def test_the_device_script_runs_both_benchmarks_in_its_dry_mode(tmp_path: Path) -> None:
    """What a lent GPU runs, end to end on CPU: both JSON files, within what the device tool brings back."""
    from benchmarks.gpu.device_run import main as device_run

    assert device_run(["--out", str(tmp_path), "--dry-run"]) == 0
    files = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert len(files) <= 8 and all(len(f.parts) <= 3 for f in files)
    kinds = {json.loads((tmp_path / f).read_text())["kind"] for f in files if f.suffix == ".json"}
    assert kinds == {"gpu_kernels", "gpu_decode_step"}
