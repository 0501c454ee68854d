"""Token-length distributions of a workload's prompts and outputs (fixed, uniform, normal, natural)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["KINDS", "LengthDist"]

KINDS = ("fixed", "uniform", "normal", "natural")
_ALLOWED = {
    "fixed": ({"value"}, {"value"}),  # kind: (fields it takes, fields it needs)
    "uniform": ({"low", "high"}, {"low", "high"}),
    "normal": ({"mean", "std", "low", "high"}, {"mean", "std", "low", "high"}),
    "natural": ({"low", "high"}, set()),
}


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution.

    fixed: `value`. uniform: integers in [low, high]. normal: N(mean, std) rounded and clipped to [low, high].
    natural: ShareGPT's own lengths; as an input length, conversations whose first human turn falls outside
    [low, high] are skipped (never cut); as an output length, the reply's length is clipped to [low, high]
    (`high` is the cap). kind "data" is accepted as another name for "natural".
    """

    kind: str
    value: int | None = None
    low: int | None = None
    high: int | None = None
    mean: float | None = None
    std: float | None = None

    def __post_init__(self) -> None:
        if self.kind == "data":
            object.__setattr__(self, "kind", "natural")
        if self.kind not in KINDS:
            raise ValueError(f"length kind must be one of {KINDS} (or 'data'), got {self.kind!r}")
        takes, needs = _ALLOWED[self.kind]
        given = {f for f in ("value", "low", "high", "mean", "std") if getattr(self, f) is not None}
        if extra := sorted(given - takes):
            raise ValueError(f"a {self.kind} length takes only {sorted(takes)}; remove {extra}")
        if missing := sorted(needs - given):
            raise ValueError(f"a {self.kind} length needs {sorted(needs)}; missing {missing}")
        for name in ("value", "low", "high"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"length {name} must be an integer >= 1, got {v!r}")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"length low ({self.low}) must not exceed high ({self.high})")
        if self.kind == "normal":
            if not (math.isfinite(self.mean) and math.isfinite(self.std) and self.std >= 0):
                raise ValueError(f"normal length needs a finite mean and std >= 0: {self.mean}, {self.std}")
            if not self.low <= self.mean <= self.high:
                raise ValueError(f"normal mean {self.mean} outside [low, high] = [{self.low}, {self.high}]")

    @property
    def upper(self) -> int | None:
        """The largest length this distribution can give (None: unbounded natural)."""
        return self.value if self.kind == "fixed" else self.high

    def draw(self, rng: np.random.Generator, n: int) -> list[int]:
        if self.kind == "fixed":
            return [int(self.value)] * n
        if self.kind == "uniform":
            return [int(x) for x in rng.integers(self.low, self.high + 1, size=n)]
        if self.kind == "normal":
            x = np.clip(np.rint(rng.normal(self.mean, self.std, size=n)), self.low, self.high)
            return [int(v) for v in x]
        raise ValueError("natural lengths come from the data, not from a draw")

    def cap(self, n: int) -> int:
        """A natural output length clipped to [low, high]."""
        return max(self.low or 1, min(n, self.high or n))
