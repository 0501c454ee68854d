"""A seeded family of request traces in the Mooncake format, with parametric prefix-reuse patterns.

One trace of the family is drawn from :class:`TraceParams` and a seed, deterministically (a
``numpy.random.Generator`` seeded once; nothing else is random). Its requests mix five kinds of prompt,
each a run of hash ids (one id per ``hash_block_tokens``-token block; equal leading ids are a shared prefix,
as in :mod:`harness.trace_file`):

* ``agent``: one of ``system_prompts`` agent system prompts (Zipf popularity), then one of
  ``tool_sets`` tool definitions of that agent (Zipf), then a fresh task of long-tail length;
* ``chat``: a multi-turn session under one of ``chat_system_prompts`` shared system prompts; every turn's
  prompt is the previous turn's prompt, then fresh ids for the previous answer and the new user message
  (``turns`` per session, a think time of ``think_s`` seconds, exponential, between turns), so a session
  is a chain of growing prefixes whose reuse distance is the think time;
* ``rag``: a shared retrieval system prompt, then one of ``documents`` documents (Zipf; long-tail lengths
  up to ``max_input_tokens``) shared across users, then a fresh question;
* ``unique``: a prompt of long-tail length that shares nothing (one-off traffic that only occupies the cache);
* tenants: every request belongs to one of ``tenants`` tenants (Zipf); each tenant has its own system
  prompts, tool sets, documents and sessions, in a disjoint hash-id space (``tenant * TENANT_STRIDE + id``),
  as vLLM's ``cache_salt`` separates tenants: equal content under two salts never shares a block.
  :mod:`harness.trace_file` has no cache_salt field (it ignores other keys), so the tenant is modelled by
  the disjoint id spaces, and the JSONL records carry an informative ``cache_salt`` key besides.

Lengths: fresh parts are log-normal (median ``median_tokens``, sigma ``length_sigma``), every prompt capped at
``max_input_tokens`` (128K at full scale; the CI family caps far lower), outputs log-normal capped at
``max_output_tokens``. Arrivals: a Poisson process of ``rate_per_s`` whose rate is multiplied by ``burst``
during "on" periods (a two-state on/off modulation, mean period ``burst_period_s``, on ``burst_on`` of the
time); chat sessions start at such arrivals and their later turns follow the think times.

:func:`family` is the fixed list of members the property test and the bench's family mode run: the pure
patterns (agents, chat, RAG, many tenants, long tail, bursts) and seeded random mixtures of them.
:func:`working_set_blocks` is the distinct engine blocks a trace touches (its prompts' distinct prefix blocks
plus each request's own output blocks): pool sizes of the family are factors of it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from harness.workload.trace_file import TraceRecord

__all__ = [
    "KINDS",
    "TENANT_STRIDE",
    "GeneratedTrace",
    "TraceParams",
    "family",
    "generate",
    "working_set_blocks",
    "write_jsonl",
]

KINDS = ("agent", "chat", "rag", "unique")
TENANT_STRIDE = 1 << 24  # hash ids of tenant t: [t * TENANT_STRIDE, (t + 1) * TENANT_STRIDE)


@dataclass(frozen=True)
class TraceParams:
    """The knobs of one trace (see the module's docstring); ``mix`` weighs the request kinds."""

    name: str = "mixed"
    requests: int = 200
    hash_block_tokens: int = 512
    mix: dict[str, float] = field(
        default_factory=lambda: {"agent": 1.0, "chat": 1.0, "rag": 1.0, "unique": 0.5}
    )
    tenants: int = 1
    tenant_zipf: float = 1.0
    system_prompts: int = 4  # agent system prompts per tenant
    system_blocks: tuple[int, int] = (2, 8)  # hash blocks of a system prompt (uniform in [lo, hi])
    tool_sets: int = 3  # tool-definition sets per agent
    tool_blocks: tuple[int, int] = (1, 4)
    chat_system_prompts: int = 2
    turns: tuple[int, int] = (2, 8)
    think_s: float = 20.0
    documents: int = 16
    doc_zipf: float = 1.1
    median_tokens: int = 600  # fresh parts (tasks, messages, questions, documents): log-normal median
    length_sigma: float = 1.0
    max_input_tokens: int = 16384
    median_output: int = 120
    max_output_tokens: int = 512
    rate_per_s: float = 4.0
    burst: float = 1.0  # rate multiplier while "on" (1: plain Poisson)
    burst_on: float = 0.2
    burst_period_s: float = 30.0
    zipf: float = 1.0  # popularity of system prompts and tool sets

    def scaled(self, **changes: Any) -> TraceParams:
        return replace(self, **changes)


@dataclass(frozen=True)
class GeneratedTrace:
    params: TraceParams
    seed: int
    records: tuple[TraceRecord, ...]
    salts: tuple[str, ...]  # the tenant (cache_salt) of each record
    kinds: tuple[str, ...]  # the kind of each record

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.params.name,
            "seed": self.seed,
            "requests": len(self.records),
            "kinds": {k: self.kinds.count(k) for k in KINDS if k in self.kinds},
            "tenants": len(set(self.salts)),
            "max_input_tokens": max(r.input_length for r in self.records),
            "params": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.params).items()},
        }


def _zipf_pick(rng: np.random.Generator, n: int, s: float) -> int:
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return int(rng.choice(n, p=w / w.sum()))


class _Tenant:
    """One tenant's shared material (lazily drawn) and its id counter, in its own id space."""

    def __init__(self, index: int, p: TraceParams, rng: np.random.Generator) -> None:
        self.base = index * TENANT_STRIDE
        self.next = 0
        self.p = p
        self.rng = rng
        self.system: dict[int, list[int]] = {}
        self.tools: dict[tuple[int, int], list[int]] = {}
        self.chat_system: dict[int, list[int]] = {}
        self.rag_system: list[int] | None = None
        self.docs: dict[int, list[int]] = {}

    def fresh(self, blocks: int) -> list[int]:
        out = list(range(self.base + self.next, self.base + self.next + blocks))
        self.next += blocks
        if self.next >= TENANT_STRIDE:
            raise ValueError("a tenant ran out of hash ids")
        return out

    def blocks_between(self, lo_hi: tuple[int, int]) -> int:
        return int(self.rng.integers(lo_hi[0], lo_hi[1] + 1))

    def shared(self, table: dict[Any, list[int]], key: Any, blocks: int) -> list[int]:
        if key not in table:
            table[key] = self.fresh(blocks)
        return table[key]


def _tokens(rng: np.random.Generator, median: int, sigma: float, cap: int) -> int:
    return int(min(cap, max(1, round(median * math.exp(sigma * rng.standard_normal())))))


def _arrivals(rng: np.random.Generator, p: TraceParams, n: int) -> list[float]:
    """``n`` arrival times (s) of an on/off-modulated Poisson process."""
    out: list[float] = []
    t = 0.0
    on = False
    switch = rng.exponential(p.burst_period_s * (1 - p.burst_on))
    while len(out) < n:
        rate = p.rate_per_s * (p.burst if on else 1.0)
        gap = rng.exponential(1.0 / rate)
        if t + gap > switch:  # the state changes first: memoryless, so redraw from there
            t = switch
            on = not on
            share = p.burst_on if on else 1 - p.burst_on
            switch = t + rng.exponential(p.burst_period_s * share)
            continue
        t += gap
        out.append(t)
    return out


def generate(params: TraceParams, seed: int) -> GeneratedTrace:
    """The trace of ``params`` and ``seed`` (same arguments, same records)."""
    p = params
    if p.requests < 1 or p.hash_block_tokens < 1 or p.max_input_tokens < 1:
        raise ValueError("requests, hash_block_tokens and max_input_tokens must be positive")
    rng = np.random.default_rng(seed)
    hb = p.hash_block_tokens
    tenants = [_Tenant(t, p, rng) for t in range(max(1, p.tenants))]
    kinds = [k for k in KINDS if p.mix.get(k, 0.0) > 0]
    if not kinds:
        raise ValueError("mix weighs no request kind")
    weights = np.array([p.mix[k] for k in kinds], dtype=np.float64)
    weights /= weights.sum()
    max_blocks = math.ceil(p.max_input_tokens / hb)

    # (time s, tenant, kind, hash ids, input tokens, output tokens)
    items: list[tuple[float, int, str, list[int], int, int]] = []

    def emit(t: float, tenant: int, kind: str, ids: list[int], fresh_tokens: int) -> tuple[list[int], int]:
        shared_tokens = len(ids) * hb
        ids = list(ids)
        tokens = shared_tokens + fresh_tokens
        ids += tenants[tenant].fresh(math.ceil(fresh_tokens / hb))
        if tokens > p.max_input_tokens:  # cap: the prompt's first tokens
            tokens = p.max_input_tokens
            ids = ids[:max_blocks]
        out = _tokens(rng, p.median_output, p.length_sigma, p.max_output_tokens)
        items.append((t, tenant, kind, ids, tokens, out))
        return ids, tokens

    for t in _arrivals(rng, p, p.requests):
        if len(items) >= p.requests:
            break
        tenant = _zipf_pick(rng, len(tenants), p.tenant_zipf)
        ten = tenants[tenant]
        kind = kinds[int(rng.choice(len(kinds), p=weights))]
        fresh = _tokens(rng, p.median_tokens, p.length_sigma, p.max_input_tokens)
        if kind == "agent":
            a = _zipf_pick(rng, p.system_prompts, p.zipf)
            system = ten.shared(ten.system, a, ten.blocks_between(p.system_blocks))
            tools = ten.shared(
                ten.tools, (a, _zipf_pick(rng, p.tool_sets, p.zipf)), ten.blocks_between(p.tool_blocks)
            )
            emit(t, tenant, kind, system + tools, fresh)
        elif kind == "rag":
            if ten.rag_system is None:
                ten.rag_system = ten.fresh(ten.blocks_between(p.system_blocks))
            d = _zipf_pick(rng, p.documents, p.doc_zipf)
            if d not in ten.docs:
                doc_tokens = _tokens(rng, 4 * p.median_tokens, p.length_sigma, p.max_input_tokens)
                ten.docs[d] = ten.fresh(math.ceil(doc_tokens / hb))
            emit(t, tenant, kind, ten.rag_system + ten.docs[d], fresh)
        elif kind == "chat":
            c = _zipf_pick(rng, p.chat_system_prompts, p.zipf)
            ids = ten.shared(ten.chat_system, c, ten.blocks_between(p.system_blocks))
            turn_t = t
            turns = int(rng.integers(p.turns[0], p.turns[1] + 1))
            for turn in range(turns):
                if turn:
                    turn_t += rng.exponential(p.think_s)
                    fresh = _tokens(rng, p.median_tokens, p.length_sigma, p.max_input_tokens)
                ids, tokens = emit(turn_t, tenant, kind, ids, fresh)
                if tokens >= p.max_input_tokens or tokens % hb:  # a partial last block ends the chain
                    # the next turn extends the full blocks only: drop a partial last block's id
                    ids = ids[: tokens // hb]
                if tokens >= p.max_input_tokens:
                    break
        else:
            emit(t, tenant, kind, [], fresh)
    items.sort(key=lambda it: it[0])
    items = items[: p.requests]
    t0 = items[0][0]
    records = tuple(
        TraceRecord(round((t - t0) * 1000), tokens, out, tuple(ids)) for t, _, _, ids, tokens, out in items
    )
    return GeneratedTrace(
        p,
        seed,
        records,
        tuple(f"tenant-{ten}" for _, ten, *_ in items),
        tuple(kind for _, _, kind, *_ in items),
    )


def working_set_blocks(records: Iterable[TraceRecord], block_size: int, hash_block_tokens: int) -> int:
    """Distinct engine blocks the trace touches: its prompts' distinct prefix blocks (a hash-id prefix's
    longest seen extent) plus every request's own output blocks (outputs are never shared)."""
    extent: dict[tuple[int, ...], int] = {}
    out_blocks = 0
    for r in records:
        prefix: tuple[int, ...] = ()
        left = r.input_length
        for h in r.hash_ids:
            n = min(hash_block_tokens, left)
            left -= n
            prefix = (*prefix, h)
            if n > extent.get(prefix, 0):
                extent[prefix] = n
        out_blocks += math.ceil((r.input_length + r.output_length) / block_size) - math.ceil(
            r.input_length / block_size
        )
    return sum(math.ceil(n / block_size) for n in extent.values()) + out_blocks


def write_jsonl(trace: GeneratedTrace, path: str | Path) -> Path:
    """The trace as a Mooncake JSONL file (readable by :func:`harness.trace_file.load` with the trace's
    ``hash_block_tokens``); each record also carries its tenant as ``cache_salt`` (ignored by the reader)."""
    path = Path(path)
    with path.open("w") as f:
        for r, salt in zip(trace.records, trace.salts, strict=True):
            f.write(
                json.dumps(
                    {
                        "timestamp": r.timestamp_ms,
                        "input_length": r.input_length,
                        "output_length": r.output_length,
                        "hash_ids": list(r.hash_ids),
                        "cache_salt": salt,
                    }
                )
                + "\n"
            )
    return path


def family(scale: str = "ci", mixtures: int = 6) -> list[tuple[TraceParams, int]]:
    """The family's members as (params, seed): six pure patterns, then ``mixtures`` seeded random mixtures.

    ``scale``: ``ci`` (small: 64-token hash blocks, prompts up to 4K tokens, 120 requests; about a second
    a replay), ``bench`` (prompts up to 32K, 600 requests) or ``full`` (up to 128K, 2,000 requests).
    """
    if scale == "ci":
        base = TraceParams(
            requests=120,
            hash_block_tokens=64,
            median_tokens=160,
            max_input_tokens=4096,
            median_output=24,
            max_output_tokens=96,
            rate_per_s=8.0,
            think_s=4.0,
            system_blocks=(2, 10),
            tool_blocks=(1, 4),
            burst_period_s=1.0,
        )
    elif scale == "bench":
        base = TraceParams(
            requests=600,
            hash_block_tokens=512,
            median_tokens=500,
            max_input_tokens=32768,
            median_output=100,
            max_output_tokens=400,
            rate_per_s=6.0,
            think_s=15.0,
            burst_period_s=6.0,
        )
    elif scale == "full":
        base = TraceParams(
            requests=2000,
            hash_block_tokens=512,
            median_tokens=800,
            max_input_tokens=131072,
            median_output=200,
            max_output_tokens=1024,
            rate_per_s=6.0,
            think_s=30.0,
            burst_period_s=12.0,
        )
    else:
        raise ValueError(f"scale must be ci, bench or full, got {scale!r}")
    pure = [
        base.scaled(name="agents", mix={"agent": 1.0, "unique": 0.2}, system_prompts=6, tool_sets=4),
        base.scaled(name="chat", mix={"chat": 1.0}, chat_system_prompts=3),
        base.scaled(name="rag", mix={"rag": 1.0, "unique": 0.2}, documents=24),
        base.scaled(name="tenants", tenants=12, tenant_zipf=0.6),
        base.scaled(
            name="longtail", mix={"agent": 1.0, "chat": 1.0, "rag": 1.0, "unique": 1.0}, length_sigma=1.8
        ),
        base.scaled(
            name="bursty",
            mix={"agent": 1.0, "rag": 1.0, "chat": 0.2, "unique": 0.5},
            burst=12.0,
            burst_on=0.15,
        ),
    ]
    members = [(p, 1000 + i) for i, p in enumerate(pure)]
    for i in range(mixtures):
        rng = np.random.default_rng(7919 + i)
        mix = {k: float(rng.choice([0.0, 0.3, 1.0, 2.0])) for k in KINDS}
        if not any(mix[k] for k in KINDS if k != "unique"):  # every member shares something
            mix["chat"] = 1.0
        p = base.scaled(
            name=f"mix{i}",
            mix=mix,
            tenants=int(rng.choice([1, 2, 4, 16])),
            tenant_zipf=float(rng.uniform(0.3, 1.5)),
            system_prompts=int(rng.integers(1, 9)),
            tool_sets=int(rng.integers(1, 6)),
            chat_system_prompts=int(rng.integers(1, 5)),
            documents=int(rng.integers(2, 40)),
            length_sigma=float(rng.uniform(0.5, 1.8)),
            burst=float(rng.choice([1.0, 4.0, 16.0])),
            zipf=float(rng.uniform(0.5, 1.5)),
            doc_zipf=float(rng.uniform(0.5, 1.5)),
            think_s=base.think_s * float(rng.choice([0.25, 1.0, 4.0])),
        )
        members.append((p, 2000 + i))
    return members


def members_by_name(members: Sequence[tuple[TraceParams, int]]) -> dict[str, tuple[TraceParams, int]]:
    return {p.name: (p, s) for p, s in members}
