"""Periodic placement telemetry of a KV cache manager, as JSON lines: the same code on both backends.

``TAGMA_TELEMETRY_FILE`` names the file (appended to; unset: no file I/O and no per-step work beyond one
attribute test) and ``TAGMA_TELEMETRY_INTERVAL_S`` the minimum interval between two lines (default 1.0 s).
Tagma's manager keeps a :class:`Telemetry`; for vLLM's own manager the plugin attaches one (policy
``paged``) when the file is asked for, so both arms pay the same cost: per step one clock read; per line one
walk over the blocks each live request gained since the previous line.

Contiguity is measured the same way on both arms: ``ranges_per_request`` counts, per live request and KV
cache group, the runs of consecutive physical block ids in logical order (a request whose blocks are 7, 8, 9,
3 has two), after a sliding-window group's leading null blocks; for vLLM's manager from its per-group block
lists (``coordinator.single_type_managers[g].req_to_blocks``), for tagma's from its ranges. ``live_requests``
counts requests (not request-group pairs): the manager's own count, or vLLM's first-group block lists.
``free_blocks`` and ``num_blocks`` come from the block pool (``get_num_free_blocks`` counts evictable
prefix-cache blocks as free, as vLLM does). ``peak_ranges_per_request`` is a maximum over the lines written so
far; ``peak_live_requests`` over every step start as well (one ``len`` per step while a file is asked for),
and a rise of it writes a line at once (at most one line per new peak), so requests that begin and end between
two due lines still count, and the file says so even when no step follows them. Tagma's lines
add its range engine's counters and free-space shape (``in_place_growths``, ``new_ranges``, ``merges``,
``evictions``, ``cached_only_blocks``, ``used_blocks``, ``largest_free_range``, ``external_fragmentation``).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tagma.contract import (
    DEFAULT_TELEMETRY_INTERVAL_S,
    ENV_TELEMETRY_FILE,
    ENV_TELEMETRY_INTERVAL_S,
    PlacementRecord,
)

__all__ = ["BlockRuns", "Telemetry", "runs_summary"]

ENV_FILE = ENV_TELEMETRY_FILE
ENV_INTERVAL = ENV_TELEMETRY_INTERVAL_S


class BlockRuns:
    """Runs of consecutive block ids per request, updated incrementally.

    A running request's block list only grows at its end, so each :meth:`update` walks only the blocks a
    request gained since the previous one; a list that shrank or whose first or last known block changed
    (freed and allocated again) is walked from the start.
    """

    def __init__(self) -> None:
        # request id -> (blocks seen, first block id, last block id, runs)
        self._seen: dict[str, tuple[int, int, int, int]] = {}

    def update(self, req_to_blocks: Mapping[str, Sequence[Any]]) -> list[int]:
        """Runs per live request (requests holding no block are not live)."""
        seen = self._seen
        now: dict[str, tuple[int, int, int, int]] = {}
        counts: list[int] = []
        for req_id, listed in req_to_blocks.items():
            blocks = _live_blocks(listed)
            n = len(blocks)
            if n == 0:
                continue
            first = blocks[0].block_id
            prev = seen.get(req_id)
            if (
                prev is not None and prev[0] <= n and prev[1] == first
                and blocks[prev[0] - 1].block_id == prev[2]
            ):  # fmt: skip
                start, last, runs = prev[0], prev[2], prev[3]
            else:
                start, last, runs = 1, first, 1
            for i in range(start, n):
                block_id = blocks[i].block_id
                if block_id != last + 1:
                    runs += 1
                last = block_id
            now[req_id] = (n, first, last, runs)
            counts.append(runs)
        self._seen = now
        return counts


def _live_blocks(blocks: Sequence[Any]) -> Sequence[Any]:
    """A block list without its leading null blocks (a sliding-window group's dropped blocks)."""
    skip = 0
    while skip < len(blocks) and blocks[skip].is_null:
        skip += 1
    return blocks[skip:] if skip else blocks


def runs_summary(counts: Sequence[int]) -> dict[str, float]:
    """Mean, nearest-rank p99 and max of per-request run counts (zeros when no request is live)."""
    if not counts:
        return {"mean": 0.0, "p99": 0.0, "max": 0}
    ordered = sorted(counts)
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]
    return {"mean": sum(ordered) / len(ordered), "p99": float(p99), "max": ordered[-1]}


class Telemetry:
    """Writes :meth:`snapshot` lines at most every ``interval_s`` seconds on :meth:`on_step`.

    ``manager`` is a ``KVCacheManager`` (vLLM's or tagma's); ``engine`` tagma's range engine, for its
    extra counters.
    """

    def __init__(
        self,
        policy: str,
        manager: Any,
        engine: Any = None,
        path: str | None = None,
        interval_s: float | None = None,
    ) -> None:
        self.policy = policy
        self.manager = manager
        self.engine = engine
        self.path = path if path is not None else (os.environ.get(ENV_FILE) or None)
        if interval_s is None:
            interval_s = float(os.environ.get(ENV_INTERVAL, DEFAULT_TELEMETRY_INTERVAL_S))
        self.interval_s = interval_s
        self._next = 0.0
        self._runs: list[BlockRuns] = []  # one per KV cache group
        self.peak_ranges_per_request = 0
        self.peak_live_requests = 0

    def snapshot(self) -> dict[str, Any]:
        """One telemetry record of the manager's state now."""
        manager = self.manager
        pool = manager.block_pool
        counter = getattr(manager, "ranges_per_request_counts", None)  # a manager without block lists
        if counter is not None:
            counts = counter()
        else:
            counts = self._paged_runs(manager.coordinator.single_type_managers)
        ranges = runs_summary(counts)
        live = self.live_requests_now()
        self.peak_ranges_per_request = max(self.peak_ranges_per_request, ranges["max"])
        self.peak_live_requests = max(self.peak_live_requests, live)
        record: dict[str, Any] = {
            "t": time.time(),
            "ranges_per_request": ranges,
            "live_requests": live,
            "free_blocks": pool.get_num_free_blocks(),
            "num_blocks": pool.num_gpu_blocks,
            "policy": self.policy,
            "peak_ranges_per_request": self.peak_ranges_per_request,
            "peak_live_requests": self.peak_live_requests,
        }
        if self.engine is not None:
            s = self.engine.stats()
            record.update(
                in_place_growths=s.in_place_growths,
                new_ranges=s.new_ranges,
                merges=s.merges,
                evictions=s.evictions,
                cached_only_blocks=s.cached_only_blocks,
                used_blocks=s.used_blocks,
                largest_free_range=s.largest_free_range,
                external_fragmentation=s.external_fragmentation,
            )
        return record

    def _paged_runs(self, managers: Sequence[Any]) -> list[int]:
        """Runs per live (request, group) from vLLM's per-group block lists (null blocks skipped)."""
        while len(self._runs) < len(managers):
            self._runs.append(BlockRuns())
        pairs = zip(self._runs, managers, strict=False)
        return [c for runs, m in pairs for c in runs.update(m.req_to_blocks)]

    def live_requests_now(self) -> int:
        """Requests holding KV cache now, in O(1): the manager's own count where it keeps no block lists,
        else the entries of vLLM's first-group block lists (one per request from allocation to free)."""
        count = getattr(self.manager, "live_request_count", None)
        if count is not None:
            return count()
        return len(self.manager.coordinator.single_type_managers[0].req_to_blocks)

    def on_step(self) -> None:
        """Called every scheduler step: updates the live-request peak; writes a line when one is due or the
        peak rose."""
        if self.path is None:
            return
        live = self.live_requests_now()
        rose = live > self.peak_live_requests
        if rose:
            self.peak_live_requests = live
        now = time.monotonic()
        if now < self._next and not rose:
            return
        self._next = now + self.interval_s
        self.write()

    def write(self) -> None:
        if self.path is None:
            return
        line = PlacementRecord.from_dict(self.snapshot()).to_json()
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
