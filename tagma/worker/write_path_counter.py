"""The worker's write-path counter: how often tagma's range write path ran in this process.

Shared by Model Runner V1 (:mod:`tagma.worker.block_table_v1`) and V2 (:mod:`tagma.worker.block_tables_v2`).
"""

from __future__ import annotations

import atexit
import json
import os
import time
from pathlib import Path
from typing import Any

from tagma.contract import DEFAULT_WRITE_PATH_INTERVAL_S, ENV_WRITE_PATH_FILE, ENV_WRITE_PATH_INTERVAL_S

__all__ = ["ENV_COUNTER_FILE", "ENV_COUNTER_INTERVAL", "WritePathCounter", "counter"]

ENV_COUNTER_FILE = ENV_WRITE_PATH_FILE
ENV_COUNTER_INTERVAL = ENV_WRITE_PATH_INTERVAL_S


class WritePathCounter:
    """Slot-mapping calls and positions that went through tagma's write path in this process.

    With ``TAGMA_WRITE_PATH_FILE`` set, the worker rewrites that file (atomically, one JSON object) on its
    first call and then at most every ``TAGMA_WRITE_PATH_INTERVAL_S`` seconds (default 1.0; 0: every call),
    and once more at exit: a server whose file stays absent or at zero never used the range write path.
    ``{pid}`` in the path is replaced by the process id (one file per worker).
    """

    def __init__(self, path: str, interval_s: float) -> None:
        self.path = Path(path.replace("{pid}", str(os.getpid())))
        self.interval_s = interval_s
        self.calls = 0
        self.positions = 0
        self.host_calls = 0
        self.device_calls = 0
        self.block_size = 0
        self._next = 0.0

    @classmethod
    def from_env(cls) -> WritePathCounter | None:
        path = os.environ.get(ENV_COUNTER_FILE)
        if not path:
            return None
        return cls(path, float(os.environ.get(ENV_COUNTER_INTERVAL, DEFAULT_WRITE_PATH_INTERVAL_S)))

    def add(self, positions: int, on_host: bool, block_size: int) -> None:
        self.calls += 1
        self.positions += positions
        if on_host:
            self.host_calls += 1
        else:
            self.device_calls += 1
        self.block_size = block_size
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.interval_s
            self.write()

    def record(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "t": time.time(),
            "calls": self.calls,
            "positions": self.positions,
            "host_calls": self.host_calls,
            "device_calls": self.device_calls,
            "block_size": self.block_size,
        }

    def write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.record()), encoding="utf-8")
        os.replace(tmp, self.path)


_counter: WritePathCounter | None = None
_counter_read = False


def counter() -> WritePathCounter | None:
    """This process's counter (None unless ``TAGMA_WRITE_PATH_FILE`` is set), made on first use."""
    global _counter, _counter_read
    if not _counter_read:
        _counter_read = True
        _counter = WritePathCounter.from_env()
        if _counter is not None:
            atexit.register(_counter.write)
    return _counter
