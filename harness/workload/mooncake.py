"""A trace replayed with real text: Mooncake-format records turned into token-id prompts that share exactly
the prefixes the trace says they share.

Each record names its prompt's ``hash_block_tokens``-token blocks (512 in the Mooncake traces) by hash id;
equal ids mean equal block content. Here every hash id gets its own piece of real ShareGPT text of exactly
``hash_block_tokens`` tokens under the served model's tokenizer: the conversations (every turn, as packed
prompts use them) from a seed-determined one on are tokenized and cut into consecutive pieces, handed out
to hash ids in order of first use, each piece distinct from every other. A prompt is the concatenation of
its blocks' pieces in token space, cut to the record's ``input_length``; its first tokens are replaced by
the special tokens the tokenizer puts before a text (e.g. BOS), so the prompt is what the server would
have built from text and still exactly ``input_length`` tokens long. Prompts are sent as token ids, so no
decoding and re-tokenizing can merge tokens across a block boundary: two prompts whose hash ids agree on
their first k blocks agree on their first ``k * hash_block_tokens`` tokens, and no further block boundary
is shared by chance.

Which records: the trace in arrival order, from ``start_s`` (trace time) for ``duration_s`` (or to the
end), then the first ``num_requests`` that fit the server's context. A record that does not fit
(``input_length + output tokens > max_model_len``) is dropped (``overflow: filter``) or has its prompt cut
to fit (``overflow: cut``, its hash ids shortened with it); the provenance names each one by its line in
the trace file. Arrival offsets are the records' timestamps from the first kept one, times ``time_scale``
(0.5 replays twice as fast). Output lengths are the trace's, capped by ``output_len.high`` when set, and
at least 1 (the server needs ``max_tokens >= 1``).

Warm-up requests get the shapes of the first kept records but pieces of their own, never used by a
measured request, so warm-up leaves nothing in the prefix cache that the replay could hit.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.workload import datasets_source, trace_file
from harness.workload.datasets_source import Source, tokenize_texts
from harness.workload.packing import _conversation_text, _load_tokenizer, _tokenizer_hashes
from harness.workload.spec import RequestSpec, Workload, WorkloadSpec

_BATCH = 64  # conversations tokenized at a time


class PieceStream:
    """Consecutive distinct ``block``-token pieces of the conversations' tokens, from conversation start."""

    def __init__(self, items: list[dict], tokenizer: Any, block: int, start: int,
                 num_proc: int | None = None) -> None:
        if not items:
            raise ValueError("no conversations to build pieces from")
        self.items, self.tok, self.block, self.num_proc = items, tokenizer, block, num_proc
        self.n = len(items)
        self.cursor = start % self.n
        self.walked = 0
        self.texts_this_pass = 0
        self.tokens = 0
        self.pass_tokens: int | None = None  # tokens in one pass over the conversations, once known
        self.buf: list[int] = []
        self.seen: set[bytes] = set()
        self.skipped_duplicates = 0

    def _refill(self) -> None:
        texts: list[str] = []
        while len(texts) < _BATCH:
            text = _conversation_text(self.items[self.cursor])
            self.cursor = (self.cursor + 1) % self.n
            self.walked += 1
            if text:
                texts.append(text)
                self.texts_this_pass += 1
            if self.walked % self.n == 0:  # a wrap: later pieces repeat text; distinctness shifts them
                if not self.texts_this_pass:
                    raise ValueError(f"the {self.n} conversations hold no text to build pieces from")
                self.texts_this_pass = 0
                break
        for ids in tokenize_texts(texts, self.tok, self.num_proc):
            self.buf.extend(ids)
            self.tokens += len(ids)
        if self.walked == self.n:
            self.pass_tokens = self.tokens

    def next(self) -> list[int]:
        shifts = 0
        while True:
            while len(self.buf) < self.block:
                self._refill()
            piece = self.buf[: self.block]
            digest = hashlib.sha1(repr(piece).encode()).digest()
            if digest in self.seen:  # only after a wrap around the data: shift by a token
                self.skipped_duplicates += 1
                shifts += 1
                if self.pass_tokens is not None and shifts > self.pass_tokens + self.block:
                    raise ValueError(f"the conversations' text holds only {len(self.seen)} distinct "
                                     f"{self.block}-token pieces; more are needed")
                del self.buf[0]
                continue
            del self.buf[: self.block]
            self.seen.add(digest)
            return piece


def special_prefix(tokenizer: Any) -> list[int]:
    """The token ids the tokenizer puts before a text's own tokens (e.g. [BOS]; [] for none)."""
    with_special = list(tokenizer("x", add_special_tokens=True)["input_ids"])
    plain = list(tokenizer("x", add_special_tokens=False)["input_ids"])
    for k in range(len(with_special) - len(plain) + 1):
        if with_special[k: k + len(plain)] == plain:
            return with_special[:k]
    return []


def prompt_ids(hash_ids: tuple[int, ...] | list[int], length: int, pieces: dict[int, list[int]],
               prefix: list[int]) -> list[int]:
    """The prompt of a record: its blocks' pieces concatenated, cut to length, the special prefix first."""
    ids: list[int] = []
    for h in hash_ids:
        ids.extend(pieces[h])
        if len(ids) >= length:
            break
    if len(ids) < length:
        raise ValueError(f"{len(hash_ids)} blocks give {len(ids)} tokens, fewer than input_length {length}")
    del ids[length:]
    ids[: len(prefix)] = prefix[:length]
    return ids


@dataclass(frozen=True)
class Selected:
    line: int  # 1-based line in the trace file (records are one a line)
    record: trace_file.TraceRecord
    max_tokens: int
    input_length: int  # after a cut
    hash_ids: tuple[int, ...]


def _lines(path: Path) -> list[int]:
    """Line numbers of the non-empty lines (one per record, in file order)."""
    with open(path, "rb") as f:
        return [i for i, raw in enumerate(f, start=1) if raw.strip()]


def select(spec: WorkloadSpec, trace: trace_file.Trace, path: Path) -> tuple[list[Selected], dict[str, Any]]:
    """The records the workload replays, with the overflow record (which records, how many)."""
    lines = _lines(path)[: len(trace.records)]
    order = sorted(range(len(trace.records)), key=lambda i: trace.records[i].timestamp_ms)
    start_ms = round(spec.start_s * 1000)
    end_ms = None if spec.duration_s is None else start_ms + round(spec.duration_s * 1000)
    limit = spec.max_model_len
    assert limit is not None
    block = trace.hash_block_tokens
    chosen: list[Selected] = []
    filtered: list[int] = []
    cut: list[int] = []
    capped = raised = scanned = 0
    for i in order:
        r = trace.records[i]
        if r.timestamp_ms < start_ms:
            continue
        if end_ms is not None and r.timestamp_ms >= end_ms:
            break
        if spec.num_requests is not None and len(chosen) == spec.num_requests:
            break
        scanned += 1
        out = spec.output_len.cap(r.output_length) if r.output_length >= 1 else 1
        capped += out < r.output_length
        raised += r.output_length < 1
        n_in, ids = r.input_length, r.hash_ids
        if n_in + out > limit:
            if spec.overflow == "filter" or limit - out < 1:
                filtered.append(lines[i])
                continue
            n_in = limit - out
            ids = ids[: math.ceil(n_in / block)]
            cut.append(lines[i])
        chosen.append(Selected(lines[i], r, out, n_in, ids))
    wanted = spec.num_requests if spec.num_requests is not None else 1
    if len(chosen) < wanted:
        window = f"from {spec.start_s:g} s"
        window += "" if spec.duration_s is None else f" for {spec.duration_s:g} s"
        raise ValueError(
            f"workload {spec.name}: only {len(chosen)} of the {wanted} requests asked for fit "
            f"max_model_len {limit} in the trace window {window} ({len(filtered)} filtered as too long); "
            f"widen the window, lower num_requests or use overflow=cut")
    affected = filtered if spec.overflow == "filter" else cut
    record = {
        "mode": spec.overflow, "max_model_len": limit, "records_scanned": scanned,
        "count": len(affected), "trace_lines": affected,
        "filtered": len(filtered), "filtered_lines": filtered,  # overflow=cut: prompts with no room left
        "cut": len(cut), "cut_lines": cut,
        "outputs_capped": capped, "outputs_raised_to_1": raised,
    }
    return chosen, record


def build(spec: WorkloadSpec, source: Source, tokenizer: Any, trace_path: Path
          ) -> tuple[list[RequestSpec], list[RequestSpec], list[float], dict[str, Any]]:
    """(requests, warm-up, arrival offsets in seconds, provenance) of a trace workload."""
    trace = trace_file.load(trace_path, spec.hash_block_tokens)
    chosen, overflow = select(spec, trace, trace_path)
    block = trace.hash_block_tokens
    start = int(np.random.default_rng([spec.seed, 4]).integers(len(source.items)))
    stream = PieceStream(source.items, tokenizer, block, start, spec.num_proc)
    prefix = special_prefix(tokenizer)
    pieces: dict[int, list[int]] = {}
    for s in chosen:
        for h in s.hash_ids:
            if h not in pieces:
                pieces[h] = stream.next()
    requests = []
    for k, s in enumerate(chosen):
        ids = prompt_ids(s.hash_ids, s.input_length, pieces, prefix)
        cut = f", cut from {s.record.input_length}" if s.input_length < s.record.input_length else ""
        requests.append(RequestSpec(k, ids, len(ids), s.max_tokens,
                                    f"trace line {s.line} (t={s.record.timestamp_ms} ms, "
                                    f"{len(s.hash_ids)} blocks{cut})", s.record.input_length))
    warmup = []
    for k in range(spec.num_warmup):
        s = chosen[k % len(chosen)]
        own = {j: stream.next() for j in range(len(s.hash_ids))}  # pieces no measured request uses
        ids = prompt_ids(list(range(len(s.hash_ids))), s.input_length, own, prefix)
        warmup.append(RequestSpec(k, ids, len(ids), s.max_tokens, f"warm-up shaped as trace line {s.line}",
                                  s.input_length))
    t0 = chosen[0].record.timestamp_ms
    arrivals = [(s.record.timestamp_ms - t0) / 1000.0 * spec.time_scale for s in chosen]
    used_ids = [h for s in chosen for h in s.hash_ids]
    provenance = {
        "trace": {
            **trace.provenance.as_dict(),
            "records_used": len(chosen),
            "lines_used": [s.line for s in chosen],
            "window": {"start_s": spec.start_s, "duration_s": spec.duration_s, "time_scale": spec.time_scale,
                       "first_timestamp_ms": t0, "last_timestamp_ms": chosen[-1].record.timestamp_ms},
            "overflow": overflow,
            "blocks": len(used_ids), "distinct_blocks": len(pieces),
            "block_reuse": 1 - len(pieces) / len(used_ids),
        },
        "sharegpt": {**source.provenance, "piece_tokens": block, "start_conversation": start,
                 "special_prefix": prefix, "duplicate_shifts": stream.skipped_duplicates},
        "prompts": "token ids",
    }
    return requests, warmup, arrivals, provenance


def build_workload(spec: WorkloadSpec, tokenizer_dir: Path, cache_dir: Path | None) -> Workload:
    """The trace workload for spec; rebuilt every time (its prompts are token ids: a cache would be large)."""
    t0 = time.perf_counter()
    tokenizer_dir = Path(tokenizer_dir)
    hf_cache = Path(cache_dir) / "datasets" if cache_dir is not None else None
    tok_hashes = _tokenizer_hashes(tokenizer_dir)
    source = datasets_source.load_conversations(spec.dataset, hf_cache)
    tok = _load_tokenizer(tokenizer_dir).tok
    requests, warmup, arrivals, prov = build(spec, source, tok, spec.trace_path)
    provenance = {**prov, "tokenizer_dir": str(tokenizer_dir.resolve()), **tok_hashes}
    return Workload(spec, warmup, requests, provenance, build_seconds=time.perf_counter() - t0,
                    arrivals=arrivals)
