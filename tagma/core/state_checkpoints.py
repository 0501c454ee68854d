"""State groups with prefix caching on: vLLM's mamba cache mode "align" (state checkpoints), range-native.

A hybrid model's state layers (Qwen3-Next's Gated DeltaNet) keep one state per request, not one KV entry
per token. With prefix caching on, vLLM (``MambaManager``, mode "align") keeps that state in a block at
the logical position of the last computed token's block, so a block at position i that is full holds the
state after (i + 1) x block tokens, and the scheduler cuts prefill chunks at block boundaries so that it
does. A request's row is mostly null blocks: at each step that crosses a block boundary vLLM pads the row
with nulls up to ``cdiv(tokens, block) - 1`` and allocates one block there (the worker copies the last
state into it); the next step frees every block before ``(processed - 1) // block`` (the previous state).

Here a request's live state blocks (two, or three while the processed count lags) are one engine request
used as a FIFO: one block appended at a step that crosses a boundary, the oldest released from the front
with ``tagma_request_free_front``; the manager keeps their logical positions (:class:`StateHeld`). Its
cached blocks sit at the full-attention group's prefix-index nodes as a side group, like a window's: the
hit is vLLM's ``MambaManager`` rule, the window rule with a run of one block (the last cached block at or
below the candidate, null blocks before it), and what is cached is vLLM's ``reachable_block_mask`` for
the state group (by default only the replay boundary's and the shared-prefix junction's states).

vLLM defers a hit on a state cached in the current step (its state is written by this step's forward):
``cached_blocks_this_step``, keyed by block hash, cleared at ``new_step_starts``. Here the key is the
full group's trie node of the same position, which stands for the same prefix.

Scope (the rest is refused by :class:`tagma.core.group_prefix_manager.GroupPrefixKVCacheManager`): a
full-attention group beside the state groups, block-aligned hits (hash block = block), no speculative
state blocks and no prefill checkpoint blocks (Mamba2-style mixers), no EAGLE drafter.
"""

from __future__ import annotations

from typing import Any

import vllm
from vllm.v1.core.single_type_kv_cache_manager import MambaManager
from vllm.v1.kv_cache_interface import MambaSpec
from vllm.v1.request import Request

from tagma.core.group_range_manager import _Held

__all__ = [
    "CACHES_MODE_NONE",
    "REMARKS_PROMPT_TAIL",
    "StateCheckpoints",
    "StateHeld",
    "state_groups",
    "state_refusal",
]

# vLLM 0.32's align mode marks the state at the prompt's last block boundary cached in this step again at
# every step its producer's cached tokens stand there (its partial-tail path re-keys the block); 0.33 skips
# a block already keyed at that boundary, so siblings hitting a state committed earlier are not deferred.
_VLLM = tuple(int(part) for part in vllm.__version__.split(".")[:2])
REMARKS_PROMPT_TAIL = _VLLM < (0, 33)
# vLLM 0.32's manager takes a state group in mode "none" with caching on (its servers pick "align"); 0.33's
# asserts mode "align"
CACHES_MODE_NONE = _VLLM < (0, 33)


def state_groups(kv_cache_config: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The state groups, and those of them in vLLM's mamba cache mode "align"."""
    specs = [(g, group.kv_cache_spec) for g, group in enumerate(kv_cache_config.kv_cache_groups)]
    states = tuple(g for g, spec in specs if isinstance(spec, MambaSpec))
    return states, tuple(g for g in states if specs[g][1].mamba_cache_mode == "align")


class StateHeld(_Held):
    """A request's blocks in a state group: ``held`` live blocks (the engine request's FIFO) at logical
    ``positions`` (ascending), ``dropped`` null blocks, so the row is ``dropped + held`` blocks long."""

    __slots__ = ("positions",)

    def __init__(self) -> None:
        super().__init__()
        self.positions: list[int] = []


class StateCheckpoints:
    """The state groups' caching, and the aligned ones' per-step arithmetic and row views, for the group
    prefix manager. A state group in mode "none" with caching on (vLLM's manager takes it; its servers
    pick "align") keeps the window arithmetic of a window of 2 (its blocks a run after ``dropped``)."""

    def __init__(self, manager: Any, groups: tuple[int, ...], aligned: tuple[int, ...]) -> None:
        self._m = manager
        self.groups = groups
        self.aligned = aligned
        self.this_step: set[int] = set()  # trie nodes whose state was cached in this step

    # ---- the request's blocks

    def free_skipped(self, state: list[Any], processed: int) -> int:
        """vLLM's align-mode ``remove_skipped_blocks``: every live state block before
        ``(processed - 1) // block`` released (front of the FIFO). Returns the blocks released."""
        freed = 0
        if processed <= 0:
            return 0
        engine = self._m.engine
        gt = self._m.group_time  # the in-server host time per group (None: off)
        for g in self.aligned:
            t0 = gt.start() if gt is not None else 0
            held: StateHeld = state[g]
            first = (processed - 1) // self._m._block_sizes[g]
            positions = held.positions
            k = 0
            while k < len(positions) and positions[k] < first:
                k += 1
            if k:
                engine.free_front(held.engine_request, k)
                del positions[:k]
                held.held -= k
                held.dropped += k
                freed += k
            if gt is not None:
                gt.stop(g, t0)
        return freed

    def append(self, held: StateHeld, g: int, main_tokens: int) -> tuple[int, list[int]]:
        """vLLM's align-mode ``allocate_new_blocks``: when the step's tokens (the main model's, no lookahead)
        reach past the row, null blocks up to ``cdiv(tokens, block) - 1`` and one new block there. Returns
        the group's view of the step's new blocks: (null blocks, runs)."""
        required = -(-main_tokens // self._m._block_sizes[g])
        length = held.dropped + held.held
        if required <= length:
            return (0, [])
        if held.engine_request == 0:
            held.engine_request = self._m.engine.create_request()
        runs = self._m.engine.append_runs(held.engine_request, 1).ravel().tolist()
        nulls = required - 1 - length
        held.dropped += nulls
        held.held += 1
        held.positions.append(required - 1)
        self._m.block_pool._num_free -= 1
        return (nulls, runs)

    def attach(self, held: StateHeld, dropped: int, ids: Any) -> None:
        """A new request's hit: its one cached state block after ``dropped`` null blocks."""
        self._m.sides.attach(held.engine_request, ids)
        held.dropped = dropped
        held.held = len(ids)
        held.positions = [dropped + i for i in range(len(ids))]

    def row(self, held: StateHeld) -> list[int]:
        """The request's row: null blocks with the live blocks at their positions."""
        null = self._m.block_pool.null_block.block_id
        ids = [null] * (held.dropped + held.held)
        if held.held:
            for pos, block in zip(held.positions, self._m.engine.blocks(held.engine_request).tolist(),
                                  strict=True):  # fmt: skip
                ids[pos] = block
        return ids

    # ---- caching

    def deferred(self, hits: Any, full: int, hit: int) -> bool:
        """Whether a hit of ``hit`` blocks ends on a state cached in this step (vLLM waits a step).
        ``hits``: the hit's blocks per group; the full group's (``full``) are the trie nodes."""
        return bool(self.this_step) and int(hits.groups[full][1][hit - 1]) in self.this_step

    def cache(
        self,
        request: Request,
        state: list[Any],
        full_request: int,
        start: int,
        full_blocks: int,
        boundaries: list[int],
        retention: int | None,
    ) -> None:
        """vLLM's ``cache_blocks`` for the state groups over [start, full_blocks): each live block the mask
        keeps is inserted at the full group's node of its position and marked cached in this step."""
        m = self._m
        gt = m.group_time
        marked: list[int] = []
        for g in self.groups:
            t0 = gt.start() if gt is not None else 0
            self._insert(state[g], g, full_request, start, full_blocks, boundaries, retention, marked)
            if gt is not None:
                gt.stop(g, t0)
        self._mark(request, marked)

    def _insert(
        self,
        held: Any,
        g: int,
        full_request: int,
        start: int,
        full_blocks: int,
        boundaries: list[int],
        retention: int | None,
        marked: list[int],
    ) -> None:
        """One state group's part of :meth:`cache`: the positions it inserts are appended to ``marked``."""
        m = self._m
        if not held.engine_request:
            return
        first = held.dropped
        positions = held.positions if isinstance(held, StateHeld) else range(first, first + held.held)
        live = [(i, p) for i, p in enumerate(positions) if start <= p < full_blocks]
        if not live:
            return
        single = m._managers[g]
        mask = MambaManager.reachable_block_mask(
            start_block=start,
            end_block=full_blocks,
            alignment_tokens=m._bs,
            kv_cache_spec=single.kv_cache_spec,
            use_eagle=False,
            retention_interval=retention,
            reachable_boundaries=boundaries,
        )
        for i, p in live:
            if mask is None or mask[p - start]:
                m.sides.insert(full_request, m._side[g], held.engine_request, p - i, p, p + 1)
                marked.append(p)

    def remark(self, request: Request, state: list[Any], full_blocks: int) -> None:
        """vLLM 0.32's ``_cache_partial_tail_block`` with block-aligned hashes: while the cached tokens
        stand at the prompt's last block boundary and the request still holds the state block ending there,
        that state is marked cached in this step again (a hit on it waits a step). Not on 0.33."""
        if not REMARKS_PROMPT_TAIL:
            return
        bs = self._m._bs
        boundary = (request.num_prompt_tokens - 1) // bs
        if boundary <= 0 or full_blocks != boundary:
            return
        if any(boundary - 1 in state[g].positions for g in self.aligned):
            self._mark(request, [boundary - 1])

    def _mark(self, request: Request, positions: list[int]) -> None:
        """Mark the trie nodes at ``positions`` of the request's prefix as cached in this step."""
        if not positions:
            return
        m = self._m
        last = max(positions)
        nodes = m.index.lookup_ids(m._ns[request.request_id], request._all_token_ids, last + 1)
        for p in positions:
            if p < len(nodes):
                self.this_step.add(int(nodes[p]))


def state_refusal(states: list[MambaSpec], fulls: int, eagle: bool) -> str | None:
    """What the group prefix manager cannot serve of state groups with prefix caching on, or None."""
    for spec in states:
        if spec.mamba_cache_mode != "align" and not CACHES_MODE_NONE:
            mode = spec.mamba_cache_mode
            return f"state layers in mamba_cache_mode={mode!r} with prefix caching (this vLLM needs 'align')"
        if spec.num_speculative_blocks:
            return "speculative state blocks (MTP, speculative decoding by state layers) with prefix caching"
        if spec.num_prefill_checkpoint_blocks:
            return "state prefill checkpoint blocks (Mamba2-style mixers) with prefix caching"
    if not fulls:
        return (
            "state layers with prefix caching and no full-attention group (tagma keys a state group's cached "
            "blocks at the full group's prefix index)"
        )
    if eagle:
        return "an EAGLE drafter beside state layers with prefix caching"
    return None
