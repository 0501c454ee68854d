"""Benchmark workloads: real ShareGPT text at controlled prompt lengths (16K, 128K tokens and more), or a
request trace replayed with real text and its prefix sharing (``kind: mooncake``).

A ``sharegpt`` workload is drawn from a spec: prompt and output lengths from :mod:`harness.workload.lengths`,
prompts packed to those lengths by :mod:`harness.workload.packing`. A ``mooncake`` workload takes its
requests, lengths and arrival times from a trace file (:mod:`harness.workload.mooncake`). The text comes from
``dataset`` (:mod:`harness.workload.datasets_source`: the packaged ShareGPT copy by default, a local
JSON/JSONL file or a hub dataset); a ``dataset`` that is a trace file makes the workload a ``mooncake`` one
over the packaged text.

A prepared workload is cached as JSON under cache_dir, keyed by a hash of the spec, the dataset's sha256,
the tokenizer's files and RECIPE; a corrupted cache file is rebuilt with a warning, never used.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.files import write_text_atomic
from harness.workload import datasets_source
from harness.workload import sharegpt_file as sharegpt
from harness.workload.lengths import LengthDist
from harness.workload.packing import (
    _COUNTS,
    TOLERANCE,
    _Builder,
    _file_sha256,
    _load_dataset,
    _load_tokenizer,
    _Tokenizer,
    _tokenizer_hashes,
    clear_caches,
)

__all__ = ["LengthDist", "RequestSpec", "Workload", "WorkloadSpec", "build_workload", "clear_caches"]

DEFAULT_CACHE_DIR = Path(__file__).resolve().parents[2] / "data" / "workloads"
RECIPE = 1  # bump whenever the way prompts are built changes: old cache files stop matching
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
KINDS = ("sharegpt", "mooncake")
_OVERFLOW = ("filter", "cut")
# Fields only a trace workload reads, with their defaults (a sharegpt spec must leave them so).
_TRACE_DEFAULTS: dict[str, Any] = {"path": None, "start_s": 0.0, "duration_s": None, "time_scale": 1.0,
                                   "overflow": "filter", "hash_block_tokens": 512}


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """What to build.

    ``kind: sharegpt``: packed prompts for fixed/uniform/normal input lengths, first human turns for natural.
    ``kind: mooncake``: the first ``num_requests`` records of the trace at ``path`` (None: the shipped
    Mooncake conversation trace) from ``start_s`` for ``duration_s`` seconds of trace time that fit the
    context (``overflow``: ``filter`` drops the others, ``cut`` shortens their prompts); arrivals are the
    trace's times times ``time_scale``; ``input_len`` is ``natural`` (the trace's), ``output_len`` is
    ``natural`` with ``high`` as an optional cap. ``num_proc``: processes tokenizing the text (None: one).
    """

    name: str
    num_requests: int | None  # mooncake: None takes every record of the window that fits
    input_len: LengthDist | None = None  # mooncake: natural (the default there)
    output_len: LengthDist | None = None
    # prompt_tokens + max_tokens must fit, or building fails (no silent capping); None until the harness
    # resolves the server's context from the model (harness.serve.model_context), before any build.
    max_model_len: int | None
    seed: int = 0
    num_warmup: int = 0  # extra requests built the same way, for warm-up; excluded from metrics
    dataset: str | None = None  # a local JSON/JSONL file or hub id; None = the packaged (truncated) ShareGPT
    kind: str = "sharegpt"
    path: str | None = None  # mooncake: the trace file
    start_s: float = 0.0
    duration_s: float | None = None
    time_scale: float = 1.0
    overflow: str = "filter"
    hash_block_tokens: int = 512
    num_proc: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"workload kind must be one of {KINDS}, got {self.kind!r}")
        if self.dataset is not None and self.kind == "sharegpt" \
                and datasets_source.is_trace_file(Path(str(self.dataset)).expanduser()):
            self._become_trace_replay()
        if self.kind == "mooncake":
            self._check_trace_fields()
        else:
            if set_ := sorted(k for k, v in _TRACE_DEFAULTS.items() if getattr(self, k) != v):
                raise ValueError(f"workload {self.name}: {set_} apply to kind mooncake only")
            if self.input_len is None or self.output_len is None:
                raise ValueError(f"workload {self.name}: a sharegpt workload needs input_len and output_len")
        p = self.num_proc
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or p < 1):
            raise ValueError(f"num_proc must be an integer >= 1 or null, got {p!r}")
        if not _NAME.match(self.name):
            raise ValueError(f"workload name must match {_NAME.pattern} (it names a file), got {self.name!r}")
        for name, lo in (("num_requests", 1), ("num_warmup", 0), ("max_model_len", 1)):
            v = getattr(self, name)
            optional = name == "max_model_len" or (name == "num_requests" and self.kind == "mooncake")
            if v is None and optional:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.dataset is not None:
            object.__setattr__(self, "dataset", str(self.dataset))
        for name in ("input_len", "output_len"):
            if not isinstance(getattr(self, name), LengthDist):
                raise TypeError(f"{name} must be a LengthDist (use WorkloadSpec.from_dict for mappings)")
        top_in, top_out = self.input_len.upper, self.output_len.upper
        if self.max_model_len is not None and top_in is not None and top_out is not None \
                and top_in + top_out > self.max_model_len:
            raise ValueError(
                f"workload {self.name}: input up to {top_in} + output up to {top_out} tokens exceeds "
                f"max_model_len {self.max_model_len}; shorten the lengths or raise max_model_len"
            )

    def _become_trace_replay(self) -> None:
        """A trace file given as the dataset: replay it (its lengths), over the packaged ShareGPT text; the
        output length's upper bound, if any, caps the trace's outputs."""
        cap = self.output_len.upper if self.output_len is not None else None
        object.__setattr__(self, "kind", "mooncake")
        object.__setattr__(self, "path", str(self.dataset))
        object.__setattr__(self, "dataset", None)
        object.__setattr__(self, "input_len", LengthDist("natural"))
        object.__setattr__(self, "output_len", LengthDist("natural", high=cap))

    def _check_trace_fields(self) -> None:
        if self.input_len is None:
            object.__setattr__(self, "input_len", LengthDist("natural"))
        if self.output_len is None:
            object.__setattr__(self, "output_len", LengthDist("natural"))
        i = self.input_len
        if i.kind != "natural" or i.low is not None or i.high is not None:
            raise ValueError(f"workload {self.name}: a trace's input lengths are its own: input_len must "
                             f"be {{kind: natural}} without bounds (the context limit filters or cuts)")
        if self.output_len.kind != "natural":
            raise ValueError(f"workload {self.name}: a trace's output lengths are its own: output_len "
                             f"must be {{kind: natural}}, with high as an optional cap")
        if self.overflow not in _OVERFLOW:
            raise ValueError(f"overflow must be one of {_OVERFLOW}, got {self.overflow!r}")
        for name in ("start_s", "time_scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0 \
                    or (name == "time_scale" and v == 0):
                bound = "> 0" if name == "time_scale" else ">= 0"
                raise ValueError(f"{name} must be a finite number {bound}, got {v!r}")
        d = self.duration_s
        if d is not None and (isinstance(d, bool) or not isinstance(d, int | float) or not d > 0):
            raise ValueError(f"duration_s must be > 0 or null, got {d!r}")
        b = self.hash_block_tokens
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"hash_block_tokens must be an integer >= 1, got {b!r}")
        if self.path is not None:
            object.__setattr__(self, "path", str(self.path))

    @property
    def trace_path(self) -> Path:
        from harness.workload.trace_file import SHIPPED_TRACE

        return Path(self.path).expanduser() if self.path else SHIPPED_TRACE

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkloadSpec:
        d = dict(d)
        for name in ("input_len", "output_len"):
            if d.get(name) is None:
                d.pop(name, None)
            elif isinstance(d.get(name), Mapping):
                d[name] = LengthDist(**d[name])
        return cls(**d)


@dataclass(frozen=True)
class RequestSpec:
    index: int  # position in its list (requests or warmup)
    prompt: str | list[int]  # text, or token ids (trace workloads: sent as they are)
    prompt_tokens: int  # counted with the served model's tokenizer, special tokens included
    max_tokens: int
    source: str  # the conversations it was built from
    target_tokens: int  # the drawn length; equals prompt_tokens unless only a cut within TOLERANCE existed


@dataclass(frozen=True)
class Workload:
    spec: WorkloadSpec
    warmup: list[RequestSpec]
    requests: list[RequestSpec]
    provenance: dict[str, Any]
    from_cache: bool = field(default=False, compare=False)
    build_seconds: float = field(default=0.0, compare=False)  # 0 when read from the cache
    arrivals: list[float] | None = None  # trace workloads: each request's send time, s from the run start

    def prompt_lengths(self) -> list[int]:
        return [r.prompt_tokens for r in self.requests]

    def output_lengths(self) -> list[int]:
        return [r.max_tokens for r in self.requests]


# --------------------------------------------------------------------------------------------- building


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])


_Built = tuple[list[RequestSpec], list[RequestSpec], dict[str, Any]]  # requests, warm-up, length-fit stats


def _build(spec: WorkloadSpec, items: list[dict], tok: _Tokenizer, counts: dict[int, int]) -> _Built:
    b = _Builder(items, tok, counts, start=int(_rng(spec.seed, 4).integers(len(items))))
    groups = []
    for n, stream in ((spec.num_requests, 0), (spec.num_warmup, 2)):  # measured first, then warm-up
        if spec.input_len.kind == "natural":
            nat = b.naturals(n, spec.input_len.low or 1, spec.input_len.high,
                             need_reply=spec.output_len.kind == "natural")
            prompts = [(p, pn) for p, pn, _, _ in nat]
            targets = [pn for _, pn, _, _ in nat]
            replies = [rn for _, _, rn, _ in nat]
            sources = [f"sharegpt natural conv[{i}] (id {items[i].get('id', '?')})" for *_, i in nat]
        else:
            targets = spec.input_len.draw(_rng(spec.seed, stream), n)
            spans = b.plan(targets)
            prompts = b.realize(spans) if spans else []
            replies = b.reply_lengths(spans) if spec.output_len.kind == "natural" else []
            sources = [b.source(s) for s in spans]
        if spec.output_len.kind == "natural":
            outs = [spec.output_len.cap(r) for r in replies]
        else:
            outs = spec.output_len.draw(_rng(spec.seed, stream + 1), n)
        group = []
        for k in range(n):
            (prompt, pn), out = prompts[k], outs[k]
            if spec.max_model_len is not None and pn + out > spec.max_model_len:
                raise ValueError(f"workload {spec.name}: request {k} has {pn} prompt + {out} output tokens, "
                                 f"over max_model_len {spec.max_model_len}; bound the natural lengths "
                                 f"(high) or raise max_model_len")
            group.append(RequestSpec(k, prompt, pn, out, sources[k], targets[k]))
        groups.append(group)
    if len({r.prompt for g in groups for r in g}) != spec.num_requests + spec.num_warmup:
        raise RuntimeError("two requests got the same prompt")  # spans start at distinct conversations
    return groups[0], groups[1], {"length_fit": dict(b.fits), "tolerance": TOLERANCE}


def _spec_doc(spec: WorkloadSpec) -> dict[str, Any]:
    """The spec as cached: a sharegpt spec without the trace-only fields (so caches written before those
    fields existed stay valid: the prompts they hold are built the same way)."""
    doc = asdict(spec)
    if spec.kind == "sharegpt":
        for k in (*_TRACE_DEFAULTS, "kind", "num_proc"):
            doc.pop(k)
    return doc


def _key(spec: WorkloadSpec, dataset_sha: str, tok_hashes: dict[str, str]) -> str:
    doc = {"spec": _spec_doc(spec), "dataset_sha256": dataset_sha, "tokenizer": tok_hashes, "recipe": RECIPE}
    return hashlib.sha256(_canonical(doc).encode()).hexdigest()


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def cache_path(spec: WorkloadSpec, key: str, cache_dir: Path) -> Path:
    return cache_dir / f"{spec.name}-{key[:16]}.json"


def _write_cache(path: Path, key: str, wl: Workload) -> None:
    payload = {"spec": _spec_doc(wl.spec), "provenance": wl.provenance,
               "warmup": [asdict(r) for r in wl.warmup], "requests": [asdict(r) for r in wl.requests]}
    doc = {"format": "tagma-workload", "key": key, "payload_sha256": hashlib.sha256(
        _canonical(payload).encode()).hexdigest(), "payload": payload}
    write_text_atomic(path, _canonical(doc))


def _read_cache(path: Path, key: str, spec: WorkloadSpec) -> Workload | None:
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text(encoding="ascii"))
        payload = doc["payload"]
        if doc.get("key") != key:
            raise ValueError("key mismatch")
        if doc.get("payload_sha256") != hashlib.sha256(_canonical(payload).encode()).hexdigest():
            raise ValueError("payload hash mismatch")
        if payload["spec"] != _spec_doc(spec):
            raise ValueError("spec mismatch")
        warmup = [RequestSpec(**r) for r in payload["warmup"]]
        requests = [RequestSpec(**r) for r in payload["requests"]]
        return Workload(spec, warmup, requests, payload["provenance"], from_cache=True)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        warnings.warn(f"workload cache {path} is unusable ({type(e).__name__}: {e}); rebuilding it",
                      RuntimeWarning, stacklevel=3)
        return None


def build_workload(spec: WorkloadSpec, tokenizer_dir: Path, cache_dir: Path | None) -> Workload:
    """The workload for spec, from cache_dir when a valid cached copy exists (cache_dir None: no cache).

    Trace workloads are rebuilt every time (their prompts are token ids; a cache of them would be large)."""
    if spec.max_model_len is None:
        raise ValueError(f"workload {spec.name}: max_model_len is not resolved "
                         f"(see harness.serve.model_context)")
    tokenizer_dir = Path(tokenizer_dir)
    hf_cache = Path(cache_dir) / "datasets" if cache_dir is not None else None
    if spec.kind == "mooncake":
        return _build_trace_workload(spec, tokenizer_dir, hf_cache)
    tok_hashes = _tokenizer_hashes(tokenizer_dir)
    source: datasets_source.Source | None = None
    if spec.dataset is None:  # the packaged copy, read as it always was (and memoized: ~0.4 GB decoded)
        dataset = sharegpt.packaged_path()
        content_key = _file_sha256(dataset)
    elif Path(spec.dataset).expanduser().is_file():
        content_key = _file_sha256(Path(spec.dataset).expanduser())
    else:
        source = datasets_source.load_conversations(spec.dataset, hf_cache)
        content_key = source.key
    key = _key(spec, content_key, tok_hashes)
    path = cache_path(spec, key, Path(cache_dir)) if cache_dir is not None else None
    if path is not None and (cached := _read_cache(path, key, spec)) is not None:
        return cached
    t0 = time.perf_counter()
    if spec.dataset is None:
        items, prov = _load_dataset(dataset)
        text_prov, counts_key = asdict(prov), prov.sha256
    else:
        source = source or datasets_source.load_conversations(spec.dataset, hf_cache)
        items, text_prov, counts_key = source.items, source.provenance, source.key
    tok = _load_tokenizer(tokenizer_dir)
    counts = _COUNTS.setdefault((counts_key, _canonical(tok_hashes)), {})
    requests, warmup, fit = _build(spec, items, tok, counts)
    provenance = {"sharegpt": text_prov, "tokenizer_dir": str(tokenizer_dir.resolve()), **tok_hashes,
                  "recipe": RECIPE, "key": key, **fit}
    wl = Workload(spec, warmup, requests, provenance, build_seconds=time.perf_counter() - t0)
    if path is not None:
        _write_cache(path, key, wl)
    return wl


def _build_trace_workload(spec: WorkloadSpec, tokenizer_dir: Path, hf_cache: Path | None) -> Workload:
    from harness.workload import mooncake as mooncake_workload

    t0 = time.perf_counter()
    tok_hashes = _tokenizer_hashes(tokenizer_dir)
    source = datasets_source.load_conversations(spec.dataset, hf_cache)
    tok = _load_tokenizer(tokenizer_dir).tok
    requests, warmup, arrivals, prov = mooncake_workload.build(spec, source, tok, spec.trace_path)
    provenance = {**prov, "tokenizer_dir": str(tokenizer_dir.resolve()), **tok_hashes}
    return Workload(spec, warmup, requests, provenance, build_seconds=time.perf_counter() - t0,
                    arrivals=arrivals)
