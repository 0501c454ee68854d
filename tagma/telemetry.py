"""Periodic placement telemetry of a tagma KV cache manager, as JSON lines.

``TAGMA_TELEMETRY_FILE`` names the file (appended to; unset: no file I/O at all) and
``TAGMA_TELEMETRY_INTERVAL_S`` the minimum interval between two lines (default 1.0 s). Between lines the
engine is still looked at every step, so ``peak_ranges_per_request`` and ``peak_live_requests`` (maxima
since start) also cover requests that came and went between two lines.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from tagma.contract import ENV_TELEMETRY_FILE, ENV_TELEMETRY_INTERVAL_S, PlacementRecord
from tagma.engine import EngineStats, RangeEngine

__all__ = ["Telemetry", "engine_snapshot"]

ENV_FILE = ENV_TELEMETRY_FILE
ENV_INTERVAL = ENV_TELEMETRY_INTERVAL_S


def _ranges_per_request(engine: RangeEngine, live: int, total: int, largest: int) -> dict[str, float]:
    if live == 0:
        return {"mean": 0.0, "p99": 0.0, "max": 0}
    # One bucket per possible count up to the max, so no request lands in a clipped last bucket.
    hist = engine.ranges_histogram(largest + 2)
    rank = int(np.ceil(0.99 * live))  # nearest-rank p99
    p99 = int(np.searchsorted(np.cumsum(hist), rank))
    return {"mean": total / live, "p99": float(p99), "max": largest}


def engine_snapshot(engine: RangeEngine, policy: str, stats: EngineStats | None = None) -> dict[str, Any]:
    """One telemetry record of the engine's state now."""
    s = stats if stats is not None else engine.stats()
    return {
        "t": time.time(),
        "ranges_per_request": _ranges_per_request(
            engine, s.live_requests, s.total_request_ranges, s.max_request_ranges
        ),
        "live_requests": s.live_requests,
        "in_place_growths": s.in_place_growths,
        "new_ranges": s.new_ranges,
        "merges": s.merges,
        "evictions": s.evictions,
        "free_blocks": s.free_blocks,
        "cached_only_blocks": s.cached_only_blocks,
        "used_blocks": s.used_blocks,
        "largest_free_range": s.largest_free_range,
        "external_fragmentation": s.external_fragmentation,
        "num_blocks": s.num_blocks,
        "policy": policy,
    }


class Telemetry:
    """Writes :func:`engine_snapshot` lines at most every ``interval_s`` seconds on :meth:`on_step`."""

    def __init__(
        self, engine: RangeEngine, policy: str, path: str | None = None, interval_s: float | None = None
    ) -> None:
        self.engine = engine
        self.policy = policy
        self.path = path if path is not None else (os.environ.get(ENV_FILE) or None)
        self.interval_s = (
            interval_s if interval_s is not None else float(os.environ.get(ENV_INTERVAL, "1.0"))
        )
        self._next = 0.0
        self.peak_ranges_per_request = 0
        self.peak_live_requests = 0

    def snapshot(self, stats: EngineStats | None = None) -> dict[str, Any]:
        record = engine_snapshot(self.engine, self.policy, stats)
        self.peak_ranges_per_request = max(self.peak_ranges_per_request, record["ranges_per_request"]["max"])
        self.peak_live_requests = max(self.peak_live_requests, record["live_requests"])
        record["peak_ranges_per_request"] = self.peak_ranges_per_request
        record["peak_live_requests"] = self.peak_live_requests
        return record

    def on_step(self) -> None:
        """Called every scheduler step: updates the peaks (one stats call), writes a line when one is due."""
        if self.path is None:
            return
        stats = self.engine.stats()
        self.peak_ranges_per_request = max(self.peak_ranges_per_request, stats.max_request_ranges)
        self.peak_live_requests = max(self.peak_live_requests, stats.live_requests)
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.interval_s
        self.write(stats)

    def write(self, stats: EngineStats | None = None) -> None:
        if self.path is None:
            return
        line = PlacementRecord.from_dict(self.snapshot(stats)).to_json()
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
