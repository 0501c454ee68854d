"""When each request is sent: open-loop arrival processes and the closed-loop (fixed concurrency) mode.

Open loop: inter-arrival gaps are gamma-distributed with shape k = burstiness and scale 1 / (rate * k), so the
mean rate is `rate` for every k; k = 1 is a Poisson process, k < 1 is burstier, k > 1 smoother. The first
request goes at t = 0 and request i at the sum of the first i gaps, so n requests span n - 1 gaps. A rate of
inf sends everything at t = 0. Latency is to be measured from these scheduled times, so client-side queueing
is not hidden.

For one seed the gaps at rate r are the gaps at rate 1 divided by r (the same random numbers), so a rate
sweep compares the same arrival pattern at different speeds.

Closed loop: every request is ready at t = 0 and the client keeps max_concurrency of them in flight.

Trace: each request is sent at the time its trace record gives (the workload's ``arrivals``, see
:mod:`harness.workload.mooncake`), open loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

MODES = ("open", "closed", "trace")
ARRIVALS = ("poisson", "gamma")


@dataclass(frozen=True, kw_only=True)
class LoadSpec:
    mode: str = "open"
    request_rate: float | None = None  # open: requests per second, > 0; inf = all at t = 0
    arrival: str = "poisson"  # open: "poisson" or "gamma"
    burstiness: float = 1.0  # open: the gamma shape k (1.0 = poisson)
    seed: int = 0
    max_concurrency: int | None = None  # closed: requests in flight, >= 1

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"load mode must be one of {MODES}, got {self.mode!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.mode == "trace":
            if self.request_rate is not None or self.max_concurrency is not None:
                raise ValueError("trace mode takes no request_rate or max_concurrency (the trace's times "
                                 "set the pace; scale them with workload.time_scale)")
            return
        if self.mode == "closed":
            c = self.max_concurrency
            if isinstance(c, bool) or not isinstance(c, int) or c < 1:
                raise ValueError(f"closed mode needs max_concurrency, an integer >= 1, got {c!r}")
            if self.request_rate is not None:
                raise ValueError("closed mode takes no request_rate (the concurrency sets the pace)")
            return
        if self.max_concurrency is not None:
            raise ValueError("open mode takes no max_concurrency (use mode='closed')")
        r = self.request_rate
        if isinstance(r, bool) or not isinstance(r, int | float) or math.isnan(r) or r <= 0:
            raise ValueError(f"open mode needs request_rate > 0 (inf allowed), got {r!r}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {ARRIVALS}, got {self.arrival!r}")
        b = self.burstiness
        if isinstance(b, bool) or not isinstance(b, int | float) or not math.isfinite(b) or b <= 0:
            raise ValueError(f"burstiness (the gamma shape) must be finite and > 0, got {b!r}")
        if self.arrival == "poisson" and b != 1.0:
            raise ValueError(f"poisson arrivals have burstiness 1.0; use arrival='gamma' for {b}")

    def label(self) -> str:
        if self.mode == "trace":
            return "trace"
        if self.mode == "closed":
            return f"closed-c{self.max_concurrency}"
        shape = "" if self.arrival == "poisson" else f"-k{self.burstiness:g}"
        return f"open-{self.arrival}{shape}-r{self.request_rate:g}"


def arrival_offsets(n: int, spec: LoadSpec) -> np.ndarray:
    """Send times in seconds from the run's start for n requests: non-decreasing, first 0, seeded."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if spec.mode == "trace":
        raise ValueError("trace arrivals come from the workload (a trace workload's arrivals)")
    if spec.mode == "closed" or n == 0 or math.isinf(spec.request_rate):
        return np.zeros(n)
    k = float(spec.burstiness)
    gaps = np.random.default_rng(spec.seed).gamma(shape=k, scale=1.0 / k, size=n - 1)  # mean 1
    return np.concatenate(([0.0], np.cumsum(gaps))) / spec.request_rate


def rate_sweep(rates: list[float], base: LoadSpec) -> list[LoadSpec]:
    """One open-loop spec per rate, everything else (arrival, burstiness, seed) from base."""
    if base.mode != "open":
        raise ValueError("a rate sweep needs an open-loop base spec")
    if not rates:
        raise ValueError("a rate sweep needs at least one rate")
    return [replace(base, request_rate=r) for r in rates]
