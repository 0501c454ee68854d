"""The jobs a trace replay runs: a trace's records as prompts of deterministic token ids, in arrival order.

Every hash id ``h`` of a Mooncake record stands for 512 deterministic token ids (the first is ``2**20 + h``,
so ids that differ give blocks that differ; the rest are small ids derived from ``h``); a prompt is its hash
ids' tokens in order, cut at ``input_length``. :func:`reuse_bound` is the hit a pool that never evicts would
give each job. :mod:`benchmarks.host.trace_replay` steps these jobs through vLLM's and tagma's managers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.workload import trace_file
from harness.workload.trace_file import TraceRecord

__all__ = [
    "HASH_ID_TOKEN_BASE",
    "OUTPUT_TOKEN_BASE",
    "Job",
    "ReplayConfig",
    "hash_block_tokens",
    "infinite_pool_hit_tokens",
    "jobs_from_records",
    "prompt_tokens",
    "reuse_bound",
    "select_records",
]

HASH_ID_TOKEN_BASE = 1 << 20  # first token of a hash id's block: 2**20 + hash id
OUTPUT_TOKEN_BASE = 1 << 30  # output tokens: 2**30 + request index (never shared)
FILLER_MOD = 251  # the other tokens: small ids (CPython shares them; a 128K prompt stays about 1 MB)


@dataclass(frozen=True)
class ReplayConfig:
    pool_blocks: int
    block_size: int = 16
    hash_block_tokens: int = trace_file.DEFAULT_HASH_BLOCK_TOKENS
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    decode_tokens_per_step: int | None = None  # None: block_size
    step_ms: float = 50.0
    max_output_tokens: int | None = None
    policy: str = "headroom"
    gc_every_steps: int = 64

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.hash_block_tokens % self.block_size:
            raise ValueError(
                f"block_size {self.block_size} must divide the trace's hash block ({self.hash_block_tokens})"
            )
        if self.pool_blocks < 2:
            raise ValueError(f"pool_blocks must be >= 2, got {self.pool_blocks}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.step_ms <= 0:
            raise ValueError("max_num_seqs, max_num_batched_tokens and step_ms must be positive")
        if self.decode_tokens_per_step is not None and self.decode_tokens_per_step < 1:
            raise ValueError("decode_tokens_per_step must be >= 1")
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise ValueError("max_output_tokens must be >= 1")

    @property
    def decode_tokens(self) -> int:
        return self.decode_tokens_per_step or self.block_size


@dataclass(frozen=True)
class Job:
    index: int
    arrival_ms: float
    record: TraceRecord
    output_tokens: int  # min(output_length, max_output_tokens), at least 1


def jobs_from_records(records: Sequence[TraceRecord], cfg: ReplayConfig) -> tuple[list[Job], int]:
    """Jobs in arrival order; those that cannot fit the pool alone are left out (returns how many)."""
    jobs: list[Job] = []
    too_large = 0
    usable = cfg.pool_blocks - 1  # block 0 is vLLM's null block
    for r in trace_file.arrival_order(records):
        out = max(1, min(r.output_length, cfg.max_output_tokens or r.output_length))
        if math.ceil((r.input_length + out + cfg.decode_tokens) / cfg.block_size) > usable:
            too_large += 1
            continue
        jobs.append(Job(len(jobs), float(r.timestamp_ms), r, out))
    return jobs, too_large


def hash_block_tokens(hash_id: int, count: int) -> list[int]:
    """The token ids a hash id stands for (its first ``count`` of them)."""
    base = hash_id * 31
    return [HASH_ID_TOKEN_BASE + hash_id] + [(base + j) % FILLER_MOD for j in range(1, count)]


def prompt_tokens(record: TraceRecord, hash_block: int = trace_file.DEFAULT_HASH_BLOCK_TOKENS) -> list[int]:
    """The prompt of a record: its hash ids' tokens in order, ``input_length`` of them."""
    out: list[int] = []
    left = record.input_length
    for h in record.hash_ids:
        n = min(hash_block, left)
        out += hash_block_tokens(h, n)
        left -= n
    return out


def reuse_bound(jobs: Sequence[Job], block_size: int, hash_block: int) -> list[int]:
    """Per job, in order: the tokens of its prompt that an earlier request's prompt blocks cover.

    That is its longest prefix of full engine blocks some earlier request held, capped at
    ``input_length - 1`` (the last token is always recomputed, as vLLM does): the hit a pool that never
    evicts would give, and an upper bound for any manager's hit (outputs are never shared here).
    """
    covered: dict[tuple[int, ...], int] = {}  # hash-id prefix -> tokens of its last block seen so far
    bounds: list[int] = []
    for job in jobs:
        r = job.record
        hit = 0
        left = r.input_length
        prefix: tuple[int, ...] = ()
        matching = True
        for h in r.hash_ids:
            n = min(hash_block, left)
            left -= n
            prefix = (*prefix, h)
            seen = covered.get(prefix, 0)
            if matching:
                hit += min(seen, n) // block_size * block_size
                matching = seen >= n and n == hash_block
            if n > seen:
                covered[prefix] = n
        bounds.append(min(hit, (r.input_length - 1) // block_size * block_size))
    return bounds


def infinite_pool_hit_tokens(jobs: Sequence[Job], block_size: int, hash_block: int) -> tuple[int, int]:
    """(tokens an earlier request's blocks cover, prompt tokens) over ``jobs`` (see :func:`reuse_bound`)."""
    return sum(reuse_bound(jobs, block_size, hash_block)), sum(j.record.input_length for j in jobs)


def select_records(trace: trace_file.Trace, tcfg: dict[str, Any]) -> tuple[list[TraceRecord], dict[str, Any]]:
    """The configured window of the trace and what it kept."""
    records = trace_file.window(
        trace.records,
        start_ms=int(tcfg.get("start_ms") or 0),
        duration_ms=tcfg.get("duration_ms"),
        first=tcfg.get("first"),
        time_scale=float(tcfg.get("time_scale") or 1.0),
    )
    in_window = len(records)
    capped = 0
    mode = str(tcfg.get("cap_mode") or "drop")
    if tcfg.get("max_input_length"):
        records, capped = trace_file.cap_input_length(
            records, int(tcfg["max_input_length"]), mode, trace.hash_block_tokens
        )
    return records, {
        "in_window": in_window,
        "max_input_length": tcfg.get("max_input_length"),
        "cap_mode": mode,
        "over_max_input_length": capped,
    }
