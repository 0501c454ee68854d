"""The write- and read-path Triton kernels (tagma/kernels) against their PyTorch references.

The kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, read when ``@triton.jit`` decorates):
as in tests/tagma/test_write_path_triton.py, the kernel modules are imported afresh with the variable set
and dropped again afterwards, so the two files share a pytest session in either order. Sizes are tiny (the
interpreter runs every program in Python). bf16 is checked only on a GPU: the Triton 3.9 interpreter's
``tl.dot`` multiplies bf16 operands' bit patterns as integers. That every kernel also compiles for a GPU is
checked by lowering it to a cubin for sm_90 in a subprocess (no GPU needed).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from benchmarks.gpu import placement, reference
from benchmarks.gpu.placement import RangeLengths

ROOT = Path(__file__).resolve().parents[2]
KERNEL_MODULES = ("tagma.worker.triton_slot_mapping", "tagma.kernels.write", "tagma.kernels.decode_attention")
SHORT = RangeLengths.from_counts([1, 2, 3], [2, 1, 1], "test: 1-3 blocks")


@pytest.fixture(scope="module")
def kernels() -> Iterator[SimpleNamespace]:
    pytest.importorskip("triton")
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    for name in (*KERNEL_MODULES, "tagma.worker.block_tables_v2"):
        sys.modules.pop(name, None)
    try:
        yield SimpleNamespace(
            write=importlib.import_module("tagma.kernels.write"),
            attn=importlib.import_module("tagma.kernels.decode_attention"),
        )
    finally:
        for name in (*KERNEL_MODULES, "tagma.worker.block_tables_v2"):  # they bound the interpreted kernels
            sys.modules.pop(name, None)
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous


def make_placement(kind: str, blocks_per_req: list[int], seed: int = 0) -> placement.Placement:
    if kind == "contiguous":
        return placement.contiguous(blocks_per_req)
    return placement.fragmented(blocks_per_req, SHORT, seed=seed)


# ------------------------------------------------------------------------------------ placements


@pytest.mark.parametrize("kind", ["contiguous", "fragmented"])
def test_placement_ranges_are_the_run_lengths_of_the_block_table(kind: str) -> None:
    blocks_per_req = [5, 1, 0, 17, 9]
    pl = make_placement(kind, blocks_per_req, seed=3)
    ranges, offsets = pl.ranges()
    table = pl.block_table()
    used = np.concatenate([b for b in pl.blocks if b.size])
    assert sorted(used.tolist()) == list(range(1, pl.num_blocks)), "every block once, never the null block"
    for row, n in enumerate(blocks_per_req):
        mine = ranges[offsets[row] : offsets[row + 1]]
        expanded = [s + i for s, c, _ in mine.tolist() for i in range(c)]
        assert expanded == table[row, :n].tolist() == pl.blocks[row].tolist()
        assert mine[:, 2].tolist() == (np.cumsum(mine[:, 1]) - mine[:, 1]).tolist()  # first logical blocks
    if kind == "contiguous":
        assert pl.ranges_per_request().tolist() == [1, 1, 0, 1, 1]


def test_fragmented_pieces_follow_the_length_distribution() -> None:
    ones = RangeLengths.from_counts([1], [1], "ones")
    pl = placement.fragmented([40, 40], ones, seed=1)
    assert pl.ranges_per_request().mean() > 30  # a few pieces may land adjacent in order and merge
    long = RangeLengths.from_counts([1000], [1], "long")
    assert placement.fragmented([40, 40], long, seed=1).ranges_per_request().tolist() == [1, 1]
    with pytest.raises(ValueError):
        RangeLengths.from_counts([0, 2], [1, 1], "bad")


def test_stored_trace_is_what_the_engine_gives() -> None:
    from benchmarks import fragmentation_sim as fragmentation
    from tagma.engine import EngineNotBuiltError

    stored = fragmentation.load_trace("headroom")
    try:
        fresh = fragmentation.run_trace(fragmentation.TraceConfig(**stored["config"]))
    except EngineNotBuiltError:
        pytest.skip("the engine library is not built")
    assert fresh["range_length_blocks"] == stored["range_length_blocks"]
    lengths = RangeLengths.from_trace(stored)
    assert lengths.lengths.min() >= 1 and abs(lengths.weights.sum() - 1) < 1e-9
    assert set(json.loads(fragmentation.DEFAULT_TRACE_PATH.read_text())["traces"]) == set(
        fragmentation.POLICIES
    )


# ------------------------------------------------------------------------------------ write path


@pytest.mark.parametrize("kind", ["contiguous", "fragmented"])
def test_slot_mappings_paged_and_ranges_match_the_reference(kernels: SimpleNamespace, kind: str) -> None:
    bs, blocks_per_req = 4, [3, 6, 1, 5]
    pl = make_placement(kind, blocks_per_req, seed=7)
    desc = pl.to_device("cpu")
    rng = np.random.default_rng(0)
    lens = [2, 7, 1, 4]
    qsl = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
    max_tokens = int(qsl[-1]) + 5  # a padded tail
    # Batch entry b reads row b, or row idx_mapping[b] (-1: a padding request that owns nothing).
    for idx_mapping in (None, torch.tensor([2, 0, -1, 3], dtype=torch.int32)):
        rows = idx_mapping.tolist() if idx_mapping is not None else list(range(4))
        # Each entry's tokens are a run of consecutive positions inside its row (how vLLM schedules them).
        starts = [rng.integers(0, blocks_per_req[r] * bs - n + 1) for r, n in zip(rows, lens, strict=True)]
        per_entry = [np.arange(s, s + n) for s, n in zip(starts, lens, strict=True)]
        positions = torch.tensor(np.concatenate(per_entry), dtype=torch.int64)
        want = reference.slot_mapping(
            qsl, positions, desc.block_table, bs, max_tokens, torch.tensor(blocks_per_req), idx_mapping
        )
        common = {
            "num_reqs": 4,
            "query_start_loc": qsl,
            "positions": positions,
            "block_size": bs,
            "idx_mapping": idx_mapping,
        }
        paged = torch.full((max_tokens,), 777, dtype=torch.int64)
        kernels.write.slot_mapping_paged(block_table=desc.block_table, slot_mapping=paged, **common)
        ranged = torch.full((max_tokens,), 777, dtype=torch.int64)
        kernels.write.slot_mapping_ranges(
            ranges=desc.ranges,
            range_offsets=desc.range_offsets,
            slot_mapping=ranged,
            num_search_steps=desc.num_search_steps,
            **common,
        )
        assert paged.tolist() == want.tolist()
        assert ranged.tolist() == want.tolist()


@pytest.mark.parametrize("kind", ["contiguous", "fragmented"])
def test_kv_writes_match_the_reference(kernels: SimpleNamespace, kind: str) -> None:
    bs, heads, dim = 4, 2, 8
    blocks_per_req = [3, 5, 2]
    pl = make_placement(kind, blocks_per_req, seed=11)
    desc = pl.to_device("cpu")
    token_rows = torch.tensor([0, 0, 1, 1, 1, -1, 2, 1], dtype=torch.int32)
    positions = torch.tensor([0, 11, 0, 7, 19, 3, 5, 12], dtype=torch.int64)
    key = torch.randn(8, heads, dim)
    value = torch.randn(8, heads, dim)
    slots = torch.tensor(
        [
            int(desc.block_table[r, p // bs]) * bs + p % bs if r >= 0 else -1
            for r, p in zip(token_rows.tolist(), positions.tolist(), strict=True)
        ]
    )
    shape = (pl.num_blocks, bs, heads, dim)
    want_k, want_v = torch.zeros(shape), torch.zeros(shape)
    reference.write_kv(key, value, want_k, want_v, slots)
    for write in (
        lambda k, v: kernels.write.reshape_and_cache(key, value, k, v, slots),
        lambda k, v: kernels.write.write_kv_paged(key, value, k, v, token_rows, positions, desc.block_table),
        lambda k, v: kernels.write.write_kv_ranges(
            key, value, k, v, token_rows, positions, desc.ranges, desc.range_offsets, desc.num_search_steps
        ),
    ):
        got_k, got_v = torch.zeros(shape), torch.zeros(shape)
        write(got_k, got_v)
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


def test_range_write_skips_positions_past_the_ranges(kernels: SimpleNamespace) -> None:
    desc = placement.contiguous([2]).to_device("cpu")
    key = torch.ones(2, 1, 16)
    cache = torch.zeros(3, 4, 1, 16)
    other = torch.zeros_like(cache)
    rows = torch.tensor([0, 0], dtype=torch.int32)
    kernels.write.write_kv_ranges(
        key,
        key,
        cache,
        other,
        rows,
        torch.tensor([8, 5]),
        desc.ranges,
        desc.range_offsets,
        desc.num_search_steps,
    )
    assert cache.sum() == 16 and cache[2, 1].sum() == 16  # position 5 only: block 2 (logical 1), slot 1


# ------------------------------------------------------------------------------------ read path


def make_cache(pl: placement.Placement, bs: int, heads: int, dim: int, dtype: torch.dtype, strided: bool):
    shape = (pl.num_blocks, bs, heads, dim)
    if strided:  # vLLM's Triton backend: one [num_blocks, 2, B, H, D] tensor, K and V interleaved by block
        kv = torch.randn(pl.num_blocks, 2, bs, heads, dim).to(dtype)
        return kv[:, 0], kv[:, 1]
    return torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)


@pytest.mark.parametrize(
    ("kind", "dtype", "num_splits", "strided"),
    [
        ("contiguous", torch.float32, None, False),
        ("contiguous", torch.float16, 3, False),
        ("fragmented", torch.float32, 3, False),
        ("fragmented", torch.float16, None, True),
        ("fragmented", torch.float32, 1, True),
    ],
)
def test_decode_attention_paged_and_ranges_match_the_reference(
    kernels: SimpleNamespace, kind: str, dtype: torch.dtype, num_splits: int | None, strided: bool
) -> None:
    torch.manual_seed(0)
    bs, q_heads, kv_heads, dim = 4, 8, 2, 32
    seq_lens = [37, 1, 130, 64]
    pl = make_placement(kind, [-(-n // bs) for n in seq_lens], seed=5)
    desc = pl.to_device("cpu")
    key_cache, value_cache = make_cache(pl, bs, kv_heads, dim, dtype, strided)
    query = torch.randn(len(seq_lens), q_heads, dim).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    scale = dim**-0.5
    want = reference.decode_attention(
        query.float(), key_cache.float(), value_cache.float(), desc.block_table, lens, scale
    )
    opts = {"num_splits": num_splits, "block_n": 16}
    paged = kernels.attn.decode_attention_paged(
        query, key_cache, value_cache, desc.block_table, lens, max(seq_lens), scale, **opts
    )
    ranged = kernels.attn.decode_attention_ranges(
        query,
        key_cache,
        value_cache,
        desc.ranges,
        desc.range_offsets,
        lens,
        max(seq_lens),
        scale,
        num_search_steps=desc.num_search_steps,
        **opts,
    )
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert paged.dtype == ranged.dtype == dtype
    torch.testing.assert_close(paged.float(), want, atol=tol, rtol=tol)
    torch.testing.assert_close(ranged.float(), want, atol=tol, rtol=tol)


def test_decode_attention_matches_sdpa_on_contiguous_kv(kernels: SimpleNamespace) -> None:
    torch.manual_seed(1)
    bs, q_heads, kv_heads, dim, ctx, batch = 16, 4, 1, 16, 100, 2
    pl = placement.fragmented([-(-ctx // bs)] * batch, SHORT, seed=2)
    desc = pl.to_device("cpu")
    key_cache, value_cache = make_cache(pl, bs, kv_heads, dim, torch.float32, False)
    query = torch.randn(batch, q_heads, dim)
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    gather = lambda cache: torch.stack(  # noqa: E731
        [
            reference.gather_contiguous_kv(cache, desc.block_table, ctx, r).transpose(0, 1)
            for r in range(batch)
        ]
    )
    want = reference.sdpa_decode_contiguous(query, gather(key_cache), gather(value_cache), 0.25)
    got = kernels.attn.decode_attention_ranges(
        query,
        key_cache,
        value_cache,
        desc.ranges,
        desc.range_offsets,
        lens,
        ctx,
        0.25,
        num_search_steps=desc.num_search_steps,
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_decode_attention_request_without_tokens_gives_zeros(kernels: SimpleNamespace) -> None:
    pl = placement.contiguous([0, 2])
    desc = pl.to_device("cpu")
    key_cache, value_cache = make_cache(pl, 4, 1, 16, torch.float32, False)
    query = torch.randn(2, 2, 16)
    lens = torch.tensor([0, 7], dtype=torch.int32)
    want = reference.decode_attention(query, key_cache, value_cache, desc.block_table, lens, 0.25)
    got = kernels.attn.decode_attention_ranges(
        query, key_cache, value_cache, desc.ranges, desc.range_offsets, lens, 7, 0.25,
        num_search_steps=desc.num_search_steps, num_splits=2, block_n=16,
    )  # fmt: skip
    assert (got[0] == 0).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_peak_bandwidth_table_matches_the_most_specific_name() -> None:
    from benchmarks.gpu import machine as bench

    assert bench.peak_gbps("NVIDIA H200") == 4800
    assert bench.peak_gbps("NVIDIA GH200 480GB") == 4000
    assert bench.peak_gbps("NVIDIA H100 80GB HBM3") == 3350
    assert bench.peak_gbps("NVIDIA H100 PCIe") == 2000
    assert bench.peak_gbps("NVIDIA A100-SXM4-80GB") == 2039
    assert bench.peak_gbps("NVIDIA L40S") == 864 and bench.peak_gbps("NVIDIA L4") == 300
    assert bench.peak_gbps("Some Future GPU") is None


def test_decode_attention_splits_plan() -> None:
    from tagma.kernels.decode_attention import BLOCK_N, MIN_SPLIT_TOKENS, plan_splits

    cpu = torch.device("cpu")
    assert plan_splits(100, 64, 8, cpu) == (1, 128)
    splits, split_len = plan_splits(131072, 1, 8, cpu)
    assert splits * split_len >= 131072 and split_len % BLOCK_N == 0 and split_len >= MIN_SPLIT_TOKENS


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="bf16 tl.dot is wrong under the interpreter; GPU only"
)
def test_decode_attention_bf16_on_gpu() -> None:
    from tagma.kernels import decode_attention as attn

    dev = torch.device("cuda")
    bs, seq_lens = 16, [1000, 17, 4096]
    pl = placement.fragmented([-(-n // bs) for n in seq_lens], SHORT, seed=9)
    desc = pl.to_device(dev)
    key_cache = torch.randn(pl.num_blocks, bs, 8, 128, device=dev).bfloat16()
    value_cache = torch.randn_like(key_cache)
    query = torch.randn(3, 32, 128, device=dev).bfloat16()
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
    want = reference.decode_attention(
        query.cpu().float(),
        key_cache.cpu().float(),
        value_cache.cpu().float(),
        desc.block_table.cpu(),
        lens.cpu(),
        0.088,
    )
    for got in (
        attn.decode_attention_paged(query, key_cache, value_cache, desc.block_table, lens, 4096, 0.088),
        attn.decode_attention_ranges(
            query,
            key_cache,
            value_cache,
            desc.ranges,
            desc.range_offsets,
            lens,
            4096,
            0.088,
            num_search_steps=desc.num_search_steps,
        ),
    ):
        torch.testing.assert_close(got.cpu().float(), want, atol=2e-2, rtol=2e-2)


# ------------------------------------------------------------------------------------ packaging


def run_python(
    *args: str, env: dict[str, str] | None = None, timeout: int = 300
) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | (env or {})
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_kernels_compile_for_a_gpu_target() -> None:
    pytest.importorskip("triton")
    done = run_python(
        "-m", "benchmarks.gpu.compile_check", "--arch", "90", env={"TRITON_DEFAULT_FP_FUSION": "1"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 8
    async_copies = {ln.split()[0]: int(ln.split("async_copies=")[1].split()[0]) for ln in lines}
    assert async_copies["kernel=decode_paged"] > 0 and async_copies["kernel=decode_ranges"] > 0  # pipelined


def test_cpu_side_modules_import_no_triton_and_serving_never_imports_kernels() -> None:
    code = (
        "import sys; import tagma.kernels, benchmarks.gpu.placement, benchmarks.gpu.reference, "
        "benchmarks.fragmentation_sim; assert 'triton' not in sys.modules, 'triton imported'"
    )
    done = run_python("-c", code)
    assert done.returncode == 0, done.stderr
    for path in (p for p in (ROOT / "tagma").rglob("*.py") if "kernels" not in p.parts):
        assert "tagma.kernels" not in path.read_text(), f"{path.name} imports the GPU kernels"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_benchmark_refuses_to_run_without_a_gpu(tmp_path: Path) -> None:
    done = run_python("-m", "benchmarks.gpu", "--out-dir", str(tmp_path))
    assert done.returncode != 0 and "no CUDA GPU" in done.stderr and "--dry-run" in done.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_benchmark_dry_run_writes_json_and_plots(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    done = run_python(
        "-m", "benchmarks.gpu", "--dry-run", "--out-dir", str(tmp_path), "--run-id", "smoke"
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = tmp_path / "smoke"
    result = json.loads((out / "kernels.json").read_text())
    assert result["measurement"].startswith("interpreter")
    assert all(c["ok"] for c in result["checks"]) and not result["skipped"]
    cfg = result["config"]
    per_config = len(cfg["contexts"]) * len(cfg["batches"])
    assert len(result["ratios"]) == per_config * len(cfg["placements"]) * 7  # attention + 3 writes x 2 phases
    assert {t["variant"] for t in result["timings"]} == {"paged", "tagma", "sdpa_contiguous"}
    assert {p["placement"] for p in result["placements"]} == set(cfg["placements"])
    assert (out / "ratios.png").stat().st_size > 0 and (out / "bandwidth.png").stat().st_size > 0
