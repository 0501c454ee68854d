"""The ``sharegpt`` workload: real ShareGPT text at controlled prompt lengths (16K, 128K tokens and more).

Prompt and output lengths are drawn from :mod:`harness.workload.lengths`, prompts packed to those lengths by
:mod:`harness.workload.packing` (or first human turns, for natural lengths). The text comes from ``dataset``
(:mod:`harness.workload.datasets_source`: the packaged ShareGPT copy by default, a local JSON/JSONL file or a
hub dataset).

A prepared workload is cached as JSON under cache_dir, keyed by a hash of the spec, the dataset's sha256,
the tokenizer's files and RECIPE; a corrupted cache file is rebuilt with a warning, never used.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from harness.files import write_text_atomic
from harness.workload import datasets_source
from harness.workload import sharegpt_file as sharegpt
from harness.workload.packing import (
    _COUNTS,
    TOLERANCE,
    _Builder,
    _file_sha256,
    _load_dataset,
    _load_tokenizer,
    _Tokenizer,
    _tokenizer_hashes,
)
from harness.workload.spec import TRACE_DEFAULTS, RequestSpec, Workload, WorkloadSpec

RECIPE = 1  # bump whenever the way prompts are built changes: old cache files stop matching


# --------------------------------------------------------------------------------------------- building


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])


_Built = tuple[list[RequestSpec], list[RequestSpec], dict[str, Any]]  # requests, warm-up, length-fit stats


def _build(spec: WorkloadSpec, items: list[dict], tok: _Tokenizer, counts: dict[int, int]) -> _Built:
    b = _Builder(items, tok, counts, start=int(_rng(spec.seed, 4).integers(len(items))))
    groups = []
    for n, stream in ((spec.num_requests, 0), (spec.num_warmup, 2)):  # measured first, then warm-up
        if spec.input_len.kind == "natural":
            nat = b.naturals(
                n, spec.input_len.low or 1, spec.input_len.high, need_reply=spec.output_len.kind == "natural"
            )
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
                raise ValueError(
                    f"workload {spec.name}: request {k} has {pn} prompt + {out} output tokens, "
                    f"over max_model_len {spec.max_model_len}; bound the natural lengths "
                    f"(high) or raise max_model_len"
                )
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
        for k in (*TRACE_DEFAULTS, "kind", "num_proc"):
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
    payload = {
        "spec": _spec_doc(wl.spec),
        "provenance": wl.provenance,
        "warmup": [asdict(r) for r in wl.warmup],
        "requests": [asdict(r) for r in wl.requests],
    }
    doc = {
        "format": "tagma-workload",
        "key": key,
        "payload_sha256": hashlib.sha256(_canonical(payload).encode()).hexdigest(),
        "payload": payload,
    }
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
        warnings.warn(
            f"workload cache {path} is unusable ({type(e).__name__}: {e}); rebuilding it",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def build_workload(spec: WorkloadSpec, tokenizer_dir: Path, cache_dir: Path | None) -> Workload:
    """The workload for spec, from cache_dir when a valid cached copy exists (cache_dir None: no cache)."""
    tokenizer_dir = Path(tokenizer_dir)
    hf_cache = Path(cache_dir) / "datasets" if cache_dir is not None else None
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
    provenance = {
        "sharegpt": text_prov,
        "tokenizer_dir": str(tokenizer_dir.resolve()),
        **tok_hashes,
        "recipe": RECIPE,
        "key": key,
        **fit,
    }
    wl = Workload(spec, warmup, requests, provenance, build_seconds=time.perf_counter() - t0)
    if path is not None:
        _write_cache(path, key, wl)
    return wl
