"""What a workload is: its spec (``kind`` and the fields each kind reads), its requests, the built workload.

Kinds (each built by its module, chosen in :mod:`harness.workload.registry`): ``sharegpt``, real ShareGPT text
at controlled prompt lengths (:mod:`harness.workload.sharegpt`); ``mooncake``, a request trace replayed with
real text and its prefix sharing (:mod:`harness.workload.mooncake`). A ``dataset`` that is a trace file
makes a sharegpt spec a ``mooncake`` one over the packaged text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.workload import datasets_source
from harness.workload.lengths import LengthDist

_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
KINDS = ("sharegpt", "mooncake")  # the keys of harness.workload.registry.WORKLOADS (checked there)
OVERFLOW = ("filter", "cut")
# Fields only a trace workload reads, with their defaults (a sharegpt spec must leave them so).
TRACE_DEFAULTS: dict[str, Any] = {"path": None, "start_s": 0.0, "duration_s": None, "time_scale": 1.0,
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
            if set_ := sorted(k for k, v in TRACE_DEFAULTS.items() if getattr(self, k) != v):
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
        if self.overflow not in OVERFLOW:
            raise ValueError(f"overflow must be one of {OVERFLOW}, got {self.overflow!r}")
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
