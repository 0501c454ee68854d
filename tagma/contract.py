"""The contract between the harness and tagma: names both halves spell, in one module that imports nothing.

The harness starts servers and reads what they write; tagma's plugin reads the environment the harness sets.
"""

from __future__ import annotations

from typing import Final

# Backends a server can be asked for (--kv-cache-backend), and where the choice lives in vLLM's config.
PAGED: Final = "paged"
TAGMA: Final = "tagma"
BACKENDS: Final = (PAGED, TAGMA)
CLI_FLAG: Final = "--kv-cache-backend"
CONFIG_KEY: Final = "kv_cache_backend"

# Environment variables the harness sets for a server (all optional).
ENV_TELEMETRY_FILE: Final = "TAGMA_TELEMETRY_FILE"  # placement telemetry, JSON lines
ENV_TELEMETRY_INTERVAL_S: Final = "TAGMA_TELEMETRY_INTERVAL_S"  # seconds between telemetry lines
ENV_HOST_TIME_FILE: Final = "TAGMA_HOST_TIME_FILE"  # in-server CPU time per scheduler step, JSON lines
ENV_PLACEMENT: Final = "TAGMA_PLACEMENT"  # placement policy of the range engine

# File names in a run directory that the server writes.
TELEMETRY_FILE: Final = "tagma_telemetry.jsonl"
HOST_TIME_FILE: Final = "host_time.jsonl"
