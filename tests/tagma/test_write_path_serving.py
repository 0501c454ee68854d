"""The worker write path through a serving schedule: the first-position form equals vLLM's op (its CPU op,
or tagma's paged function on other builds), the worker rebinds after its descriptor array grows, refuses
wrong dtypes, the step binding equals the per-token form, the write-path counter file, and (slow) a real
tagma server writing its KV slots through the range path."""

from __future__ import annotations

import atexit
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from vllm.platforms import current_platform  # noqa: E402
from vllm.utils.cpu_triton_utils import _compute_slot_mapping_kernel_impl  # noqa: E402
from vllm.v1.worker.block_table import BlockTable  # noqa: E402

from tagma import engine  # noqa: E402
from tagma.worker import write_path_counter  # noqa: E402
from tagma.worker.block_table_v1 import RangeBlockTable  # noqa: E402
from tests.tagma.write_path_tables import (  # noqa: E402
    BLOCK_SIZE,
    MAX_BLOCKS,
    MAX_REQS,
    BlockIds,
    has_vllm_cpu_op,
    make_table,
    sized_table,
)


@pytest.fixture(scope="module", autouse=True)
def vllm_kernels() -> None:
    current_platform.import_kernels()


# ------------------------------------------------- the first-position form through a serving schedule


def op_slot_mapping(
    table: BlockTable, qsl: torch.Tensor, positions: torch.Tensor, block_size: int, max_tokens: int
) -> np.ndarray:
    """vLLM's CPU op over a stock table's dense rows (tagma's per-token paged function elsewhere)."""
    out = torch.full((max_tokens,), -1, dtype=torch.int64)
    dense = table.block_table.cpu
    if has_vllm_cpu_op():
        _compute_slot_mapping_kernel_impl(
            positions.shape[0], max_tokens, qsl, positions, dense, dense.stride(0), out, block_size
        )
    else:
        num_reqs = qsl.shape[0] - 1
        engine.slot_mapping_paged(dense.numpy()[:num_reqs], table.num_blocks_per_row[:num_reqs], qsl.numpy(),
                                  positions.numpy(), block_size, out=out.numpy(), out_len=max_tokens)
    return out.numpy()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("block_size", [16, 128])
def test_first_position_form_matches_vllm_op_through_a_serving_schedule(block_size: int, seed: int) -> None:
    """Admission, chunked prefill under a token budget, decode, preemption (row cleared, blocks dropped) and
    resumption (recomputed from position 0 with new blocks), rows condensed by move_row as MRV1's
    input batch does: every step's slot mapping equals vLLM's op, padded to max_num_batched_tokens."""
    rng = np.random.default_rng(1000 + seed)
    rows, budget, max_tokens = 6, 700, 1024
    width = -(-4000 // block_size)
    stock = sized_table(BlockTable, block_size, rows, width, max_tokens)
    ranged = sized_table(RangeBlockTable, block_size, rows, width, max_tokens)
    tables = [stock, ranged]
    ids = BlockIds(rng)
    running: list[dict[str, int]] = []  # index = row; computed tokens, target length, blocks held
    waiting: list[dict[str, int]] = []
    saw = {"chunked": 0, "preempted": 0, "resumed": 0, "decode": 0, "multi_block_runs": 0}

    def remove(row: int) -> dict[str, int]:
        """The row is cleared; the last row moves into the hole (MRV1's condense)."""
        req, last = running[row], len(running) - 1
        for t in tables:
            t.clear_row(row)
        if row != last:
            for t in tables:
                t.move_row(last, row)
            running[row] = running[last]
        running.pop()
        return req

    for _ in range(80):
        # preempt: the row is cleared and its blocks are gone; the request restarts from position 0
        if running and rng.random() < 0.1:
            req = remove(int(rng.integers(0, len(running))))
            waiting.append({"computed": 0, "target": req["target"], "blocks": 0, "resumed": 1})
            saw["preempted"] += 1
        # finish
        for i in reversed(range(len(running))):
            if running[i]["computed"] >= running[i]["target"]:
                remove(i)
        # admit (new requests, or preempted ones resuming first)
        while len(running) < rows and (waiting or rng.random() < 0.4):
            req = waiting.pop(0) if waiting else {
                "computed": 0, "target": int(rng.integers(1, 3000)), "blocks": 0, "resumed": 0
            }
            saw["resumed"] += req.pop("resumed", 0)
            req["added"] = 0
            running.append(req)
        # schedule under the token budget: decodes 1 token, prefills a chunk
        left, lengths, positions = budget, [], []
        for row, req in enumerate(running):
            n = min(req["target"] - req["computed"], left)
            n = max(n, 0)
            need = -(-(req["computed"] + n) // block_size)
            if need > req["blocks"]:
                new = ids.take(need - req["blocks"])
                for t in tables:
                    if req["added"]:
                        t.append_row(new, row)
                    else:
                        t.add_row(new, row)
                req["blocks"] = need
            req["added"] = 1
            if n and n < req["target"] - req["computed"]:
                saw["chunked"] += 1
            if n == 1 and req["computed"] > 0:
                saw["decode"] += 1
            if n and (req["computed"] + n - 1) // block_size > req["computed"] // block_size:
                saw["multi_block_runs"] += 1
            lengths.append(n)
            positions.extend(range(req["computed"], req["computed"] + n))
            req["computed"] += n
            left -= n
        num_reqs = len(running)
        qsl = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
        pos = torch.tensor(positions, dtype=torch.int64)
        ranged.slot_mapping.gpu.fill_(4242)
        ranged.compute_slot_mapping(num_reqs, qsl, pos)
        got = ranged.slot_mapping.gpu.numpy()
        want = op_slot_mapping(stock, qsl, pos, block_size, max_tokens)
        n = pos.shape[0]
        np.testing.assert_array_equal(got[:n], want[:n])
        assert (got[n:] == -1).all()
        # the requests' targets grow while decoding: one more token each, sometimes
        for req in running:
            if req["computed"] >= req["target"] and rng.random() < 0.7:
                req["target"] += 1
    assert all(saw.values()), f"the schedule missed a case: {saw}"


def test_worker_rebinds_after_the_descriptor_array_grows() -> None:
    table = make_table(RangeBlockTable)
    table.add_row([2], 0)
    qsl = torch.tensor([0, 1], dtype=torch.int32)
    table.compute_slot_mapping(1, qsl, torch.tensor([1], dtype=torch.int64))  # binds the first array
    storage = table.range_rows.host_storage()[0]
    # one-block ranges in every row: 144 in all, past the flat array's initial capacity of 64
    for k in range(1, MAX_BLOCKS):
        table.append_row([2 + 2 * k], 0)
    for row in range(1, MAX_REQS):
        table.add_row([500 + 3 * i + 100 * row for i in range(MAX_BLOCKS)], row)
    assert table.range_rows.host_storage()[0] is not storage, "the array should have been reallocated"
    positions = torch.arange(BLOCK_SIZE * MAX_BLOCKS - 5, BLOCK_SIZE * MAX_BLOCKS, dtype=torch.int64)
    qsl = torch.tensor([0, 5], dtype=torch.int32)
    table.compute_slot_mapping(1, qsl, positions)
    want = [(2 + 2 * (p // BLOCK_SIZE)) * BLOCK_SIZE + p % BLOCK_SIZE for p in positions.tolist()]
    assert table.slot_mapping.gpu[:5].tolist() == want


def test_worker_refuses_wrong_dtypes_and_reports_engine_errors() -> None:
    table = make_table(RangeBlockTable)
    table.add_row([5, 6], 0)
    qsl = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(TypeError, match="int32 query_start_loc and int64 positions"):
        table.compute_slot_mapping(1, qsl, torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(TypeError, match="int32 query_start_loc"):
        table.compute_slot_mapping(1, qsl.long(), torch.tensor([0, 1], dtype=torch.int64))
    table.compute_slot_mapping(1, qsl, torch.tensor([0, 1], dtype=torch.int64))  # bound now
    with pytest.raises(engine.InvalidArgumentError, match="positions of request 0 are not consecutive"):
        table.compute_slot_mapping(1, qsl, torch.tensor([0, 2], dtype=torch.int64))
    with pytest.raises(engine.InvalidArgumentError, match="num_reqs 7 is outside"):
        table.compute_slot_mapping(7, torch.zeros(8, dtype=torch.int32), torch.zeros(0, dtype=torch.int64))
    with pytest.raises(engine.InvalidArgumentError, match="exceeds positions_capacity"):
        table.compute_slot_mapping(1, qsl, torch.tensor([0], dtype=torch.int64))
    with pytest.raises(engine.OutOfRangeError, match="is negative"):
        table.compute_slot_mapping(1, qsl, torch.tensor([-2, -1], dtype=torch.int64))


def test_slot_mapping_step_binding_matches_the_per_token_form() -> None:
    ranges = np.array([[10, 2, 0], [3, 1, 2], [20, 3, 0]], dtype=np.int32)
    offsets = np.array([0, 2, 2, 3], dtype=np.int32)
    qsl = np.array([0, 9, 11, 12], dtype=np.int32)
    positions = np.array([*range(2, 11), 0, 1, 11], dtype=np.int64)
    step = engine.slot_mapping_step(ranges, offsets, qsl, positions, 4, out_len=14)
    per_token = engine.slot_mapping_ranges(ranges, offsets, qsl, positions, 4, out_len=14)
    np.testing.assert_array_equal(step, per_token)
    assert step.tolist() == [42, 43, 44, 45, 46, 47, 12, 13, 14, -1, -1, 91, -1, -1]


def test_write_path_counter_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "wp-{pid}.json"
    monkeypatch.setenv(write_path_counter.ENV_COUNTER_FILE, str(target))
    monkeypatch.setenv(write_path_counter.ENV_COUNTER_INTERVAL, "0")
    monkeypatch.setattr(write_path_counter, "_counter", None)
    monkeypatch.setattr(write_path_counter, "_counter_read", False)
    table = make_table(RangeBlockTable)
    table.add_row([5, 6, 7], 0)
    for n in (3, 1):
        qsl = torch.tensor([0, n], dtype=torch.int32)
        table.compute_slot_mapping(1, qsl, torch.arange(n, dtype=torch.int64))
    # The counter also writes at process exit; a passing test's tmp_path is gone by then (pytest removes it).
    atexit.unregister(write_path_counter.counter().write)
    record = json.loads((tmp_path / f"wp-{os.getpid()}.json").read_text())
    assert record["calls"] == 2 and record["positions"] == 4 and record["host_calls"] == 2
    assert record["device_calls"] == 0 and record["block_size"] == BLOCK_SIZE and record["pid"] == os.getpid()


def test_no_counter_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(write_path_counter.ENV_COUNTER_FILE, raising=False)
    monkeypatch.setattr(write_path_counter, "_counter", None)
    monkeypatch.setattr(write_path_counter, "_counter_read", False)
    assert make_table(RangeBlockTable)._counter is None


# --------------------------------------------------------------------------- a real server uses the path


@pytest.mark.slow
def test_a_tagma_server_writes_its_kv_slots_through_the_range_write_path(tmp_path: Path) -> None:
    """A tagma server on the tiny model: its worker's slot mappings go through tagma's engine call.

    The worker's counter file (``TAGMA_WRITE_PATH_FILE``, written only by tagma's RangeBlockTable) must
    count at least the prompt and the decoded tokens of one request after it completed: a server that fell
    back to vLLM's stock block table writes no file and fails here.
    """
    import urllib.request

    from harness.serve.launcher import Server, ServerSpec

    model = Path(__file__).resolve().parents[2] / "data" / "tiny-llama"
    if not (model / "config.json").exists():
        pytest.skip("tiny model missing: python -m harness.serve.tiny_model")
    pattern = "write-path-{pid}.json"
    spec = ServerSpec(
        model=str(model),
        backend="tagma",
        dtype="float32",
        max_model_len=2048,
        num_gpu_blocks_override=128,
        kv_cache_space_gib=1,
        extra_args=("--block-size", "32", "--max-num-seqs", "4", "--seed", "0"),
        env={
            write_path_counter.ENV_COUNTER_FILE: str(tmp_path / pattern),
            write_path_counter.ENV_COUNTER_INTERVAL: "0",
        },
    )

    def records() -> list[dict[str, int]]:
        return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("write-path-*.json"))]

    prompt, max_tokens = [0, *range(10, 609)], 8
    with Server(spec, tmp_path / "server.log") as server:
        before = sum(r["positions"] for r in records())
        body = {
            "model": str(model), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True,
        }  # fmt: skip
        request = urllib.request.Request(
            f"{server.base_url}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=600) as response:
            payload = json.loads(response.read())
        assert payload["usage"]["completion_tokens"] == max_tokens
        after = records()
        log = server.log_text()
    assert after, "no worker wrote the write-path counter: the range write path was not installed or used"
    assert "tagma: RangeBlockTable(" in log
    written = sum(r["positions"] for r in after) - before
    # The prompt's KV, then one new token's KV per decode step (the last sampled token's is never written).
    assert written >= len(prompt) + max_tokens - 1, after
    assert all(r["device_calls"] == 0 and r["block_size"] == 32 for r in after), after
