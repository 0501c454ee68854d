"""Request traces with prefix sharing: JSONL files of Mooncake-format records, read and windowed.

One JSON object per line with ``timestamp`` (arrival, ms from the trace's start), ``input_length`` and
``output_length`` (tokens) and ``hash_ids`` (one id per ``hash_block_tokens``-token block of the prompt;
equal ids at the same position mean equal block content, so a shared leading run of ids is a shared
prefix). Other keys are ignored. The shipped copy is Moonshot AI's FAST'25 conversation trace
(``data/mooncake/``, Apache-2.0; ``PROVENANCE.md`` beside it).

Recovery follows :mod:`harness.workload.sharegpt_file`: a file cut mid-record keeps every complete record
before the cut and says so (``Provenance.truncated`` and the cut line's number). Only the last line can be a
cut: it has no newline after it and does not parse. Anything else that does not parse or does not have the
record's shape raises :class:`TraceFormatError` naming the line; so does a file with no complete record.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

# Tokens per hash block in the Mooncake traces.
DEFAULT_HASH_BLOCK_TOKENS = 512
SHIPPED_TRACE = Path(__file__).resolve().parents[2] / "data" / "mooncake" / "conversation_trace.jsonl"
SHIPPED_SOURCE = "Mooncake FAST'25 conversation trace (Moonshot AI, Apache-2.0); data/mooncake/PROVENANCE.md"


class TraceFormatError(ValueError):
    """A trace file that is not a JSONL file of trace records."""


@dataclass(frozen=True)
class TraceRecord:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class Provenance:
    path: str
    size_bytes: int
    sha256: str
    records: int  # complete records kept
    truncated: bool  # the last line was cut mid-record and dropped
    truncated_line: int | None  # its 1-based line number
    hash_block_tokens: int
    source: str | None  # what the file is, when it is the shipped copy

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size_bytes": self.size_bytes,
            "sha256": self.sha256,
            "records": self.records,
            "truncated": self.truncated,
            "truncated_line": self.truncated_line,
            "hash_block_tokens": self.hash_block_tokens,
            "source": self.source,
        }


@dataclass(frozen=True)
class Trace:
    records: tuple[TraceRecord, ...]
    provenance: Provenance

    @property
    def hash_block_tokens(self) -> int:
        return self.provenance.hash_block_tokens


def _int_field(obj: dict[str, Any], key: str, where: str, minimum: int) -> int:
    if key not in obj:
        raise TraceFormatError(f"{where}: missing field {key!r}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceFormatError(f"{where}: {key!r} must be an integer, got {value!r}")
    if value < minimum:
        raise TraceFormatError(f"{where}: {key!r} must be >= {minimum}, got {value}")
    return value


def parse_record(obj: Any, where: str, hash_block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS) -> TraceRecord:
    """One decoded JSON value as a record; ``where`` names it in errors (e.g. 'trace.jsonl line 7')."""
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    timestamp = _int_field(obj, "timestamp", where, 0)
    input_length = _int_field(obj, "input_length", where, 1)
    output_length = _int_field(obj, "output_length", where, 0)
    if "hash_ids" not in obj:
        raise TraceFormatError(f"{where}: missing field 'hash_ids'")
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise TraceFormatError(f"{where}: 'hash_ids' must be a list of non-negative integers")
    blocks = math.ceil(input_length / hash_block_tokens)
    if len(ids) != blocks:
        raise TraceFormatError(
            f"{where}: {len(ids)} hash_ids for input_length {input_length}; expected {blocks} "
            f"({hash_block_tokens}-token blocks; pass hash_block_tokens if the trace uses another size)"
        )
    return TraceRecord(timestamp, input_length, output_length, tuple(ids))


def parse_lines(
    text: str, name: str = "trace", hash_block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS
) -> tuple[list[TraceRecord], int | None]:
    """The records of JSONL ``text``; returns (records, line number of a cut last line or None)."""
    lines = text.split("\n")
    # A final newline leaves an empty last element; without one, the last line may be a cut record.
    ends_with_newline = lines[-1] == ""
    if ends_with_newline:
        lines.pop()
    records: list[TraceRecord] = []
    cut_line: int | None = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{name} line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines) and not ends_with_newline:
                cut_line = number  # cut mid-record at the end of the file: keep what came before
                break
            raise TraceFormatError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        records.append(parse_record(obj, where, hash_block_tokens))
    return records, cut_line


def load(path: str | Path | None = None, hash_block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS) -> Trace:
    """Every complete record of a trace file (the shipped one by default), in file order, and provenance."""
    if hash_block_tokens < 1:
        raise ValueError(f"hash_block_tokens must be >= 1, got {hash_block_tokens}")
    path = Path(path) if path is not None else SHIPPED_TRACE
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        cut_at_end = b"\n" not in raw[exc.start :]
        if not cut_at_end:
            raise TraceFormatError(f"{path} line {line}: not UTF-8") from None
        text = raw[: exc.start].decode("utf-8") + "\ufffd"  # a cut inside a multi-byte character
    records, cut_line = parse_lines(text, str(path), hash_block_tokens)
    if not records:
        detail = f"line {cut_line} is cut mid-record" if cut_line else "the file is empty"
        raise TraceFormatError(f"{path}: no complete trace record ({detail})")
    sha = hashlib.sha256(raw).hexdigest()
    shipped = path.resolve() == SHIPPED_TRACE and hash_block_tokens == DEFAULT_HASH_BLOCK_TOKENS
    prov = Provenance(
        path=str(path),
        size_bytes=len(raw),
        sha256=sha,
        records=len(records),
        truncated=cut_line is not None,
        truncated_line=cut_line,
        hash_block_tokens=hash_block_tokens,
        source=SHIPPED_SOURCE if shipped else None,
    )
    return Trace(tuple(records), prov)


def arrival_order(records: Iterable[TraceRecord]) -> list[TraceRecord]:
    """Records by timestamp; equal timestamps keep file order."""
    return sorted(records, key=lambda r: r.timestamp_ms)


def window(
    records: Sequence[TraceRecord],
    *,
    start_ms: int = 0,
    duration_ms: int | None = None,
    first: int | None = None,
    time_scale: float = 1.0,
) -> list[TraceRecord]:
    """A slice of the trace in arrival order, its clock restarted at ``start_ms`` and scaled.

    Keeps records with ``start_ms <= timestamp < start_ms + duration_ms`` (no end bound when
    ``duration_ms`` is None), then the first ``first`` of those; each kept timestamp becomes
    ``round((timestamp - start_ms) * time_scale)``: ``time_scale`` 0.5 replays twice as fast, 2 half as fast.
    """
    if start_ms < 0:
        raise ValueError(f"start_ms must be >= 0, got {start_ms}")
    if duration_ms is not None and duration_ms <= 0:
        raise ValueError(f"duration_ms must be > 0, got {duration_ms}")
    if first is not None and first < 0:
        raise ValueError(f"first must be >= 0, got {first}")
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise ValueError(f"time_scale must be a positive finite number, got {time_scale}")
    end = None if duration_ms is None else start_ms + duration_ms
    in_window = [r for r in arrival_order(records) if r.timestamp_ms >= start_ms]
    kept = [r for r in in_window if end is None or r.timestamp_ms < end]
    if first is not None:
        kept = kept[:first]
    return [replace(r, timestamp_ms=round((r.timestamp_ms - start_ms) * time_scale)) for r in kept]


def cap_input_length(
    records: Sequence[TraceRecord],
    max_input_length: int,
    mode: str = "drop",
    hash_block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS,
) -> tuple[list[TraceRecord], int]:
    """Records longer than ``max_input_length`` dropped (``mode='drop'``) or cut to it (``'cut'``: the
    prompt's first tokens, its hash ids shortened to match). Returns (records, how many dropped or cut)."""
    if max_input_length < 1:
        raise ValueError(f"max_input_length must be >= 1, got {max_input_length}")
    if mode not in ("drop", "cut"):
        raise ValueError(f"mode must be 'drop' or 'cut', got {mode!r}")
    out: list[TraceRecord] = []
    affected = 0
    blocks = math.ceil(max_input_length / hash_block_tokens)
    for r in records:
        if r.input_length <= max_input_length:
            out.append(r)
            continue
        affected += 1
        if mode == "cut":
            out.append(replace(r, input_length=max_input_length, hash_ids=r.hash_ids[:blocks]))
    return out, affected
