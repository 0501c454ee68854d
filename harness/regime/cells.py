"""The regime map's cells: which load, prompt length and server options each A/B cell measures.

A *group* is a set of cells that share a server configuration (prefix caching on or off, the context, the
KV pool): one server lifetime per arm serves every cell of its group in turn, so the cost of starting a
server (a minute or more here) is paid per lifetime, not per cell. Lifetimes alternate between the arms in
ABBA order, ``repeats`` per arm; a cell's runs are its segments of those lifetimes, so run-to-run variance
(the server lifetime) is in every cell's interval, as in the plain ABBA design.

A *cell* is one workload under one load: closed loop at a concurrency, open loop at a rate derived from a
closed cell's measured throughput (near the knee, where TTFT starts to climb), or a trace at its own times.
Cells are run in the order listed; an open cell must come after the closed cell it takes its rate from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CellSpec", "GroupSpec", "MapSpec", "cell_name", "expand_grid"]

LOADS = ("closed", "open", "trace")
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def cell_name(
    load: str,
    prompt_tokens: int | None,
    concurrency: int | None = None,
    knee_fraction: float | None = None,
    label: str | None = None,
) -> str:
    """A cell's name (it names a folder): ``c8-p4096``, ``open0.8-p1024``, or the trace's label."""
    if load == "closed":
        return f"c{concurrency}-p{prompt_tokens}"
    if load == "open":
        return f"open{knee_fraction:g}-p{prompt_tokens}"
    return label or "trace"


@dataclass(frozen=True, kw_only=True)
class CellSpec:
    """One A/B cell.

    ``closed``: ``concurrency`` requests in flight, ``num_requests`` prompts of ``prompt_tokens`` tokens
    (drawn uniformly from [``prompt_low_fraction`` x, 1 x] of it), ``output_tokens`` outputs each.
    ``open``: Poisson arrivals at ``knee_fraction`` x the baseline arm's measured request throughput in the
    closed cell ``rate_from`` (first lifetime), same prompt shape. ``trace``: the workload ``trace`` (a
    mapping of :class:`harness.workload.WorkloadSpec` fields) at its own times.
    """

    name: str
    load: str
    prompt_tokens: int | None = None
    output_tokens: int = 128
    num_requests: int = 8
    concurrency: int | None = None
    knee_fraction: float | None = None
    rate_from: str | None = None
    prompt_low_fraction: float = 0.875
    seed: int = 0
    trace: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"cell name must match {_NAME.pattern}, got {self.name!r}")
        if self.load not in LOADS:
            raise ValueError(f"cell {self.name}: load must be one of {LOADS}, got {self.load!r}")
        if self.num_requests < 1 or self.output_tokens < 1:
            raise ValueError(f"cell {self.name}: num_requests and output_tokens must be >= 1")
        if self.load == "trace":
            if not self.trace:
                raise ValueError(f"cell {self.name}: a trace cell needs its trace workload")
            return
        if self.prompt_tokens is None or self.prompt_tokens < 2:
            raise ValueError(f"cell {self.name}: prompt_tokens must be >= 2")
        if not 0 < self.prompt_low_fraction <= 1:
            raise ValueError(f"cell {self.name}: prompt_low_fraction must be in (0, 1]")
        if self.load == "closed" and (self.concurrency is None or self.concurrency < 1):
            raise ValueError(f"cell {self.name}: a closed cell needs concurrency >= 1")
        if self.load == "open" and (
            self.rate_from is None or not self.knee_fraction or self.knee_fraction <= 0
        ):
            raise ValueError(
                f"cell {self.name}: an open cell needs rate_from (a closed cell) and knee_fraction > 0"
            )

    @property
    def max_tokens_needed(self) -> int:
        """Prompt + output tokens the server's context must hold (trace cells: their own cap)."""
        if self.load == "trace":
            return 0
        assert self.prompt_tokens is not None
        return self.prompt_tokens + self.output_tokens

    @property
    def prompt_low(self) -> int:
        assert self.prompt_tokens is not None
        return max(1, int(self.prompt_tokens * self.prompt_low_fraction))

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class GroupSpec:
    """Cells that share one server configuration; ``prefix_caching`` is the group's server option."""

    name: str
    prefix_caching: bool
    cells: tuple[CellSpec, ...]
    max_model_len: int
    kv_cache_space_gib: float
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"group name must match {_NAME.pattern}, got {self.name!r}")
        names = [c.name for c in self.cells]
        if len(set(names)) != len(names):
            raise ValueError(f"group {self.name}: cell names repeat: {names}")
        seen: set[str] = set()
        for c in self.cells:
            if c.load == "open" and c.rate_from not in seen:
                raise ValueError(
                    f"group {self.name}: open cell {c.name} takes its rate from {c.rate_from!r}, "
                    f"which must be a closed cell listed before it"
                )
            if c.max_tokens_needed > self.max_model_len:
                raise ValueError(
                    f"group {self.name}: cell {c.name} needs {c.max_tokens_needed} tokens of "
                    f"context, the group's server allows {self.max_model_len}"
                )
            seen.add(c.name)
        if not self.cells:
            raise ValueError(f"group {self.name} has no cell")

    def server_args(self) -> tuple[str, ...]:
        """The vLLM flags this group adds to the server config's own."""
        args = [
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching",
            "--max-num-seqs",
            str(self.max_num_seqs),
        ]
        if self.max_num_batched_tokens:
            args += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        return (*args, *self.extra_args)


@dataclass(frozen=True, kw_only=True)
class MapSpec:
    """A whole map: its groups, the lifetimes per arm, and which groups also run as an A/A."""

    profile: str
    groups: tuple[GroupSpec, ...]
    repeats: int = 2
    aa_groups: tuple[str, ...] = ()
    primary_metrics: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    # lifetimes started, loaded and stopped unmeasured before each job's first measured one (harness.regime
    # .driver): the first lifetime of a job ran slower than the rest (FINDINGS.md, the A/A order check)
    warmup_lifetimes: int = 1

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.warmup_lifetimes < 0:
            raise ValueError(f"warmup_lifetimes must be >= 0, got {self.warmup_lifetimes}")
        names = {g.name for g in self.groups}
        if unknown := sorted(set(self.aa_groups) - names):
            raise ValueError(f"aa_groups names no group: {unknown}")

    def group(self, name: str) -> GroupSpec:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(
            f"no group {name!r} in profile {self.profile} (groups: {[g.name for g in self.groups]})"
        )


def _requests(sizing: dict[str, Any], concurrency: int, prompt_tokens: int) -> int:
    """Requests of a closed cell: ``waves`` full waves of its concurrency, at least ``min_requests``, and no
    more prompt tokens than ``max_prompt_tokens`` allows (never fewer than one wave)."""
    n = max(int(sizing.get("min_requests", 1)), int(sizing.get("waves", 1)) * concurrency)
    cap = sizing.get("max_prompt_tokens")
    if cap:
        n = min(n, max(concurrency, int(cap) // prompt_tokens))
    return n


def expand_grid(grid: dict[str, Any], seed: int = 0) -> tuple[CellSpec, ...]:
    """Closed cells over ``concurrency`` x ``prompt_tokens``, then open cells (``knee_fractions`` of the
    closed cell at ``knee_concurrency``) per prompt length, sized by ``sizing``; ``skip`` names cells left
    out."""
    skip = set(grid.get("skip") or ())
    out: list[CellSpec] = []
    sizing = dict(grid.get("sizing") or {})
    output = int(grid.get("output_tokens", 128))
    k = seed
    for p in grid.get("prompt_tokens") or ():
        for c in grid.get("concurrency") or ():
            name = cell_name("closed", p, c)
            if name in skip:
                continue
            k += 1
            out.append(
                CellSpec(
                    name=name,
                    load="closed",
                    prompt_tokens=int(p),
                    output_tokens=output,
                    concurrency=int(c),
                    num_requests=_requests(sizing, int(c), int(p)),
                    seed=k,
                )
            )
        knee_c = grid.get("knee_concurrency")
        for f in grid.get("knee_fractions") or ():
            name = cell_name("open", p, knee_fraction=float(f))
            source = cell_name("closed", p, knee_c)
            if name in skip or source in skip:
                continue
            k += 1
            n = int(grid.get("open_requests") or _requests(sizing, int(knee_c), int(p)))
            out.append(
                CellSpec(
                    name=name,
                    load="open",
                    prompt_tokens=int(p),
                    output_tokens=output,
                    knee_fraction=float(f),
                    rate_from=source,
                    num_requests=n,
                    seed=k,
                )
            )
    for t in grid.get("traces") or ():
        t = dict(t)
        k += 1
        out.append(
            CellSpec(
                name=str(t.pop("cell")),
                load="trace",
                num_requests=int(t.get("num_requests", 1)),
                output_tokens=int(t.pop("output_tokens", 64)),
                seed=k,
                trace=t,
            )
        )
    return tuple(out)
