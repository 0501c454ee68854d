"""A soak profile (configs/soak/<profile>.yaml), typed."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tagma.contract import BACKENDS

REPO = Path(__file__).resolve().parents[2]
PROFILES_DIR = REPO / "configs" / "soak"


@dataclass(frozen=True)
class SoakConfig:
    """How long, how hard and on what the soak runs; ``traffic`` is :class:`harness.soak.plan.TrafficConfig`'s
    fields (less the two taken from here and the model). ``num_blocks``: the KV pool (small: it preempts)."""

    profile: str
    duration_s: float
    max_requests: int = 1_000_000
    concurrency: int = 4
    seed: int = 0
    backends: tuple[str, str] = BACKENDS
    max_model_len: int = 2048
    num_blocks: int | None = 24
    kv_cache_space_gib: float | None = 1.0
    dtype: str = "float32"
    extra_args: tuple[str, ...] = ("--enable-prefix-caching",)
    startup_timeout_s: float = 900.0
    request_timeout_s: float = 300.0
    drain_timeout_s: float = 120.0
    telemetry_interval_s: float = 0.25
    rss_interval_s: float = 2.0
    rss_warmup_frac: float = 0.3
    rss_max_growth_mib: float = 64.0  # the candidate's fitted growth over the baseline's (rss_bounded)
    tie_tol: float = 1e-3  # logprob gap under which a greedy divergence is a near-tie
    # "each": every arm must preempt; "any": at least one (a short run: which arm crosses the pool first is
    # timing); "none": not checked
    require_preemption: str = "each"
    traffic: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.concurrency < 1 or self.max_requests < 1:
            raise ValueError("duration_s, concurrency and max_requests must be positive")
        if len(self.backends) != 2 or not set(self.backends) <= set(BACKENDS):
            raise ValueError(f"backends must be two of {BACKENDS}, got {self.backends}")
        if self.require_preemption not in ("each", "any", "none"):
            raise ValueError(f"require_preemption must be each, any or none, got {self.require_preemption!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SoakConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown soak config keys {sorted(unknown)}")
        kw = dict(d)
        for key in ("backends", "extra_args"):
            if key in kw:
                kw[key] = tuple(kw[key])
        return cls(**kw)

    @classmethod
    def load(cls, profile_or_path: str, **overrides: Any) -> SoakConfig:
        path = Path(profile_or_path)
        if not path.suffix:
            path = PROFILES_DIR / f"{profile_or_path}.yaml"
        data = yaml.safe_load(path.read_text()) or {}
        data.setdefault("profile", path.stem)
        data.update(overrides)
        return cls.from_dict(data)
