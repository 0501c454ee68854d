"""A/B statistics that stay calibrated with a handful of server runs per arm.

Two arms, *baseline* and *candidate*; every ratio is candidate / baseline. An A/A has the same backend on
both arms, so nothing here assumes backend names.

Why not a bootstrap over pooled requests: the dominant noise on a shared machine is run-to-run (server
lifetime, machine load, other tenants; about 13% sd of per-run mean TPOT here, far more than the spread of
requests within a run). Requests pooled over runs look independent when they are not, so such intervals
miss the run-level variance and ~20-30% of null A/Bs get a verdict. A percentile bootstrap over 2-3 runs is
anti-conservative too (it cannot produce a wider spread than the few runs it has seen).

Methods (all intervals 95% by default, two-sided p-values):

* ``compare_by_run`` (per-request values grouped by run) and ``compare_run_values`` (one value per run):
  the statistic (mean, p50, p99, throughput...) is computed PER RUN; each arm's point estimate is the
  geometric mean of its runs' statistics, and the ratio of the arms is compared with a **Welch t test on the
  log per-run statistics** with the Welch-Satterthwaite degrees of freedom. The run is the unit of
  replication, so the interval contains the run-to-run variance and, through each run's statistic, the
  request sampling too; the t quantile with small df is what keeps 2-6 runs per arm honest (close to exact
  for log-normal per-run statistics, conservative under heavier tails). With one run in an arm there is no
  run-level variance to judge by: the ratio is shown and the verdict is "inconclusive".
* ``compare_pairs`` (paired-interleaved design: element i of both arrays is the same prompt sent to both
  servers seconds apart, in measurement order): the ratio of the arms' statistics over all pairs, with a
  standard error from a **delete-one-batch jackknife over k consecutive batches of pairs** (k = 5, up to
  10 for long runs; a batch keeps autocorrelated drift together) and a t interval on the log ratio with
  k - 1 degrees of freedom. Drift shared by both arms cancels within a pair; what the batches must absorb
  is noise of one arm that persists over a few pairs. A moving-block bootstrap was tried first: with
  cube-root blocks its standard error misses the correlation beyond one block, and on the simulated drift
  below it rejected 8-10% of null A/Bs per metric at 40 pairs. The batch jackknife rejects 5% with
  independent pair noise, ~6% with AR(1) noise of each arm at phi 0.5 and ~12% at phi 0.8 (before Holm),
  so it assumes one arm's own noise decorrelates within a few pairs, which interleaving seconds apart is
  meant to ensure. A tail quantile needs enough pairs beyond it (``MIN_TAIL_SAMPLES``): a p99 of 40
  pairs is their maximum, which nothing can bound, so it is "inconclusive".

Verdicts: primary metrics form one family, corrected with Holm (``holm``). A direction verdict
(faster/slower, higher/lower) needs the Holm-adjusted p-value below alpha AND the interval excluding 1.
"parity" is a claim too: the whole 95% interval lies within +-``parity_margin`` (an equivalence test at
2.5% per side). Everything else is "inconclusive", with the reason. Other metrics are "descriptive": value
and interval shown, no verdict. A zero or non-finite statistic gives "n/a", never a ratio of 0.

``simulate_null_verdict_rate`` measures the rates on simulated data with run-level noise (or drift, for
the paired design); tests/harness/test_statistics.py holds the calibration and power checks. No SciPy:
the Student t distribution is computed here from the regularized incomplete beta function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

PRIMARY_METRICS: tuple[str, ...] = (
    "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "output_throughput",
)  # fmt: skip
MIN_RUNS = 2  # per arm, for an interval: one run has no run-to-run variance
MIN_PAIRS = 20  # paired design: below this, no interval
MIN_BATCHES, MAX_BATCHES, MIN_BATCH_PAIRS = 5, 10, 25  # see _n_batches
MIN_TAIL_SAMPLES = 5  # pairs beyond a quantile needed to bound it (p99 -> 500 pairs, p90 -> 50)
PARITY_MARGIN = 0.05
NO_SPREAD = 1e-12  # a standard error of a log ratio below this is rounding: the noise is unknown
DIRECTION = {True: ("faster", "slower"), False: ("higher", "lower")}  # lower_is_better -> (better, worse)
DIRECTION_VERDICTS = frozenset(v for pair in DIRECTION.values() for v in pair)  # a difference was called

Statistic = Callable[[np.ndarray], float]


def _quantile(q: float) -> Statistic:
    return lambda a: float(np.percentile(a, q))


# "inverse_mean" turns per-request seconds per output token into tokens/s (exact for equal output lengths),
# the paired design's output throughput at concurrency 1.
STATS: dict[str, Statistic] = {"mean": lambda a: float(np.mean(a)), "p50": _quantile(50),
                               "p90": _quantile(90), "p95": _quantile(95), "p99": _quantile(99),
                               "inverse_mean": lambda a: float(1.0 / np.mean(a))}  # fmt: skip


@dataclass(frozen=True)
class Comparison:
    metric: str
    baseline: float | None  # the arm's point estimate
    candidate: float | None
    ratio: float | None  # candidate / baseline
    ci_low: float | None
    ci_high: float | None
    p_value: float | None  # two-sided, unadjusted
    p_adjusted: float | None  # Holm-adjusted within the primary family (None for descriptive)
    verdict: str  # faster|slower|higher|lower|parity|inconclusive|n/a|descriptive
    reason: str | None  # why inconclusive / n/a, one short sentence
    primary: bool
    method: str
    runs_baseline: int
    runs_candidate: int
    samples: int  # requests (or pairs) that entered
    lower_is_better: bool = True
    parity_margin: float = PARITY_MARGIN

    @property
    def half_width(self) -> float | None:
        """Half the interval's width, in ratio units (0.03 = +-3%)."""
        if self.ci_low is None or self.ci_high is None:
            return None
        return (self.ci_high - self.ci_low) / 2

    def to_dict(self) -> dict:
        return asdict(self) | {"half_width": self.half_width}


# --- Student t from the regularized incomplete beta (Lentz's continued fraction) -------------------------


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):  # fmt: skip
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if math.isnan(x):
        raise ValueError("the incomplete beta of NaN")
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    # At the boundary itself the continued fraction is taken directly: the mirrored call would land on the
    # same boundary and never return (t = 1 with 1 degree of freedom is exactly there).
    if x <= (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - _betainc(b, a, 1.0 - x)


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` (> 0, may be fractional) degrees of freedom."""
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df}")
    if math.isinf(t):
        return 0.0
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile (0.5 < q < 1) of Student's t with ``df`` degrees of freedom."""
    if not 0.5 < q < 1.0:
        raise ValueError(f"q must be in (0.5, 1), got {q}")
    target = 2.0 * (1.0 - q)
    lo, hi = 0.0, 2.0
    while t_two_sided_p(hi, df) > target:
        lo, hi = hi, hi * 2.0
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    t = 0.5 * (lo + hi)
    for _ in range(100):  # Newton on the two-sided p (slope -2 * density), kept inside the bracket
        err = t_two_sided_p(t, df) - target
        if err > 0:
            lo = t
        else:
            hi = t
        slope = -2.0 * math.exp(log_c - (df + 1) / 2 * math.log1p(t * t / df))
        step = t - err / slope
        t_next = step if lo < step < hi else 0.5 * (lo + hi)
        if abs(t_next - t) <= 1e-13 * max(1.0, t):
            return t_next
        t = t_next
    return t


# --- comparisons --------------------------------------------------------------------------------------


def _finite(x: float | None) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def _stat_fn(stat: str | Statistic) -> Statistic:
    if isinstance(stat, str):
        if stat not in STATS:
            raise ValueError(f"unknown statistic {stat!r}; use one of {sorted(STATS)} or a function")
        return STATS[stat]
    return stat


def _decide(c: Comparison, p_for_verdict: float | None, alpha: float, why_not: str | None) -> Comparison:
    """The verdict of one comparison from its interval and the p-value it is judged by."""
    if c.verdict == "n/a":
        return c
    if not c.primary:
        return replace(c, verdict="descriptive", reason=None if c.ci_low is not None else c.reason)
    if c.ci_low is None or c.ci_high is None or p_for_verdict is None:
        return replace(c, verdict="inconclusive")
    better, worse = DIRECTION[c.lower_is_better]
    if p_for_verdict < alpha and not c.ci_low <= 1.0 <= c.ci_high:
        wins = c.ci_high < 1.0 if c.lower_is_better else c.ci_low > 1.0
        return replace(c, verdict=better if wins else worse, reason=None)
    m = c.parity_margin
    if 1.0 / (1.0 + m) <= c.ci_low and c.ci_high <= 1.0 + m:
        return replace(c, verdict="parity", reason=None)
    if why_not is None:
        why_not = (f"the interval [{c.ci_low:.3g}, {c.ci_high:.3g}] includes 1 and is wider than "
                   f"+-{m:.0%}")  # fmt: skip
        if not c.ci_low <= 1.0 <= c.ci_high:
            why_not = f"p = {p_for_verdict:.2g} is not below {alpha:g}"
    return replace(c, verdict="inconclusive", reason=why_not)


def _log_welch(
    metric: str, base: np.ndarray, cand: np.ndarray, *, lower_is_better: bool, primary: bool, alpha: float,
    parity_margin: float, samples: int, method: str,
) -> Comparison:
    """Welch t on log per-run values (see the module docstring); ``base``/``cand``: finite per-run values."""
    nb, nc = len(base), len(cand)

    def make(**kw: object) -> Comparison:
        fields: dict = dict(metric=metric, baseline=None, candidate=None, ratio=None, ci_low=None,
                            ci_high=None, p_value=None, p_adjusted=None, verdict="inconclusive", reason=None,
                            primary=primary, method=method, runs_baseline=nb, runs_candidate=nc,
                            samples=samples, lower_is_better=lower_is_better,
                            parity_margin=parity_margin)  # fmt: skip
        return Comparison(**(fields | kw))

    if nb == 0 or nc == 0:
        empty = "baseline" if nb == 0 else "candidate"
        return make(verdict="n/a", reason=f"no run of the {empty} arm has data for this metric")
    gb = float(np.exp(np.mean(np.log(base)))) if (base > 0).all() else float(np.mean(base))
    gc = float(np.exp(np.mean(np.log(cand)))) if (cand > 0).all() else float(np.mean(cand))
    if not (base > 0).all():
        return make(baseline=gb, candidate=gc, verdict="n/a",
                    reason="a baseline run's statistic is 0 (or negative): no ratio")  # fmt: skip
    if not (cand > 0).all():
        return make(baseline=gb, candidate=gc, verdict="n/a",
                    reason="a candidate run's statistic is 0 (or negative): no ratio")  # fmt: skip
    ratio = gc / gb
    if nb < MIN_RUNS or nc < MIN_RUNS:
        c = make(baseline=gb, candidate=gc, ratio=ratio,
                 reason=f"{nb} vs {nc} runs: an arm needs >= {MIN_RUNS} runs to estimate run-to-run noise")
        return _decide(c, None, alpha, c.reason)
    lb, lc = np.log(base), np.log(cand)
    vb, vc = float(lb.var(ddof=1)) / nb, float(lc.var(ddof=1)) / nc
    se = math.sqrt(vb + vc)
    d = float(lc.mean() - lb.mean())
    if se < NO_SPREAD:
        c = make(baseline=gb, candidate=gc, ratio=ratio, reason="no spread between runs: noise unknown")
        return _decide(c, None, alpha, c.reason)
    # Welch-Satterthwaite; a zero-variance arm contributes no term
    df = float((vb + vc) ** 2 / sum(v * v / (n - 1) for v, n in ((vb, nb), (vc, nc)) if v > 0))
    half = t_quantile(1.0 - alpha / 2.0, df) * se
    p = t_two_sided_p(d / se, df)
    c = make(baseline=gb, candidate=gc, ratio=ratio, ci_low=math.exp(d - half), ci_high=math.exp(d + half),
             p_value=p, p_adjusted=p if primary else None)  # fmt: skip
    return _decide(c, p, alpha, None)


def _clean(values: Sequence[float | None]) -> np.ndarray:
    return np.asarray([float(v) for v in values if v is not None and np.isfinite(v)], dtype=float)


def compare_run_values(
    metric: str,
    baseline: Sequence[float | None],
    candidate: Sequence[float | None],
    *,
    lower_is_better: bool = False,
    primary: bool = False,
    alpha: float = 0.05,
    parity_margin: float = PARITY_MARGIN,
) -> Comparison:
    """One value per run (throughput, goodput); None/NaN runs are left out."""
    b, c = _clean(baseline), _clean(candidate)
    return _log_welch(metric, b, c, lower_is_better=lower_is_better, primary=primary, alpha=alpha,
                      parity_margin=parity_margin, samples=len(b) + len(c), method="run-level Welch t (log)")


def compare_by_run(
    metric: str,
    baseline: Sequence[np.ndarray],
    candidate: Sequence[np.ndarray],
    stat: str | Statistic,
    *,
    lower_is_better: bool = True,
    primary: bool = False,
    n_boot: int = 2000,
    seed: int = 0,
    alpha: float = 0.05,
    parity_margin: float = PARITY_MARGIN,
) -> Comparison:
    """Per-request values grouped by run (one array per server run). ``stat`` is applied per run; runs with
    no finite value are left out. ``n_boot``/``seed`` are accepted for a uniform call signature: the
    run-level t interval needs no resampling."""
    del n_boot, seed
    fn = _stat_fn(stat)

    def per_run(groups: Sequence[np.ndarray]) -> tuple[np.ndarray, int]:
        vals, n = [], 0
        for g in groups:
            a = np.asarray(g, dtype=float)
            a = a[np.isfinite(a)]
            if len(a):
                vals.append(fn(a))
                n += len(a)
        return np.asarray(vals, dtype=float), n

    (b, nb), (c, nc) = per_run(baseline), per_run(candidate)
    b, c = b[np.isfinite(b)], c[np.isfinite(c)]
    return _log_welch(metric, b, c, lower_is_better=lower_is_better, primary=primary, alpha=alpha,
                      parity_margin=parity_margin, samples=nb + nc, method="per-run statistic, Welch t (log)")


def _n_batches(n: int) -> int:
    """MIN_BATCHES batches, more (up to MAX_BATCHES) only while each keeps >= MIN_BATCH_PAIRS pairs.

    Long batches keep the correlation between neighbouring batches small (it makes the spread of the batches
    understate the noise); few batches cost degrees of freedom. Null rejections at 5% measured (3,000 A/As
    each) with AR(1) noise of each arm, phi 0.5: 5.9% at 40 pairs (5 x 8), 5.8% at 120 (5 x 24), 5.1% at
    250 (10 x 25); 12-pair batches at 120 pairs gave 6.8%. Independent noise: 5.2%, 5.6%, 4.7%."""
    return max(MIN_BATCHES, min(MAX_BATCHES, n // MIN_BATCH_PAIRS))


def compare_pairs(
    metric: str,
    baseline: np.ndarray,
    candidate: np.ndarray,
    stat: str | Statistic,
    *,
    lower_is_better: bool = True,
    primary: bool = False,
    n_boot: int = 2000,
    seed: int = 0,
    alpha: float = 0.05,
    parity_margin: float = PARITY_MARGIN,
    batches: int | None = None,
    units: np.ndarray | None = None,
) -> Comparison:
    """Paired-interleaved samples in measurement order; pairs with a non-finite side are left out.

    ``stat`` is a name from ``STATS`` (a quantile name lets the tail be checked for enough pairs) or a
    function. ``batches`` overrides the number of jackknife batches. ``units`` (one label per pair, equal
    labels consecutive) names pairs that are not independent (the requests of one wave share their steps):
    a jackknife batch then holds whole units, and there are no more batches than units. ``n_boot``/``seed``
    are accepted for a call signature uniform with the other comparisons: the batch jackknife is
    deterministic."""
    del n_boot, seed
    b, c = np.asarray(baseline, dtype=float), np.asarray(candidate, dtype=float)
    if b.shape != c.shape or b.ndim != 1:
        raise ValueError(f"paired samples need two 1-D arrays of one length, got {b.shape} and {c.shape}")
    u = np.arange(len(b)) if units is None else np.asarray(units)
    if u.shape != b.shape:
        raise ValueError(f"units need one label per pair, got {u.shape} for {b.shape}")
    keep = np.isfinite(b) & np.isfinite(c)
    b, c, u = b[keep], c[keep], u[keep]
    n = len(b)
    starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]]) if n else np.zeros(0, dtype=int)
    if len(starts) != len(np.unique(u)):
        raise ValueError("units: a unit's pairs must be consecutive (a label recurs after another)")
    method = "paired by request, batch jackknife t" + (" over whole waves" if len(starts) < n else "")

    def make(**kw: object) -> Comparison:
        fields: dict = dict(metric=metric, baseline=None, candidate=None, ratio=None, ci_low=None,
                            ci_high=None, p_value=None, p_adjusted=None, verdict="inconclusive", reason=None,
                            primary=primary, method=method, runs_baseline=1, runs_candidate=1, samples=n,
                            lower_is_better=lower_is_better, parity_margin=parity_margin)  # fmt: skip
        return Comparison(**(fields | kw))

    if n == 0:
        return make(verdict="n/a", reason="no pair has data on both arms")
    fn = _stat_fn(stat)
    sb, sc = _finite(fn(b)), _finite(fn(c))
    if sb is None or sb <= 0:
        return make(baseline=sb, candidate=sc, verdict="n/a", reason="the baseline statistic is 0: no ratio")
    if sc is None or sc <= 0:
        return make(baseline=sb, candidate=sc, verdict="n/a", reason="the candidate statistic is 0: no ratio")
    ratio = sc / sb
    k = min(batches or _n_batches(n), len(starts))
    reason = None
    if n < MIN_PAIRS:
        reason = f"{n} pairs are too few for an interval (needs >= {MIN_PAIRS})"
    elif k < 2:
        reason = f"{len(starts)} unit(s) of pairs are too few for an interval (needs >= 2)"
    elif isinstance(stat, str) and stat.startswith("p") and stat in STATS:
        tail = 1.0 - float(stat[1:]) / 100.0
        if tail > 0 and n * tail < MIN_TAIL_SAMPLES:
            need = math.ceil(MIN_TAIL_SAMPLES / tail)
            reason = f"a {stat} of {n} pairs rests on the extreme values (needs >= {need} pairs)"
    if reason is not None:
        return _decide(make(baseline=sb, candidate=sc, ratio=ratio, reason=reason), None, alpha, reason)
    # delete-one-batch jackknife over k consecutive batches of pairs
    log_r = np.empty(k)
    bounds = np.r_[starts, n]
    for j, group in enumerate(np.array_split(np.arange(len(starts)), k)):
        rest = np.ones(n, dtype=bool)
        rest[bounds[group[0]]:bounds[group[-1] + 1]] = False
        with np.errstate(divide="ignore", invalid="ignore"):
            log_r[j] = np.log(fn(c[rest])) - np.log(fn(b[rest]))
    if not np.isfinite(log_r).all():
        reason = "the statistic is 0 without one batch of pairs: no interval"
        return _decide(make(baseline=sb, candidate=sc, ratio=ratio, reason=reason), None, alpha, reason)
    se = math.sqrt((k - 1) / k * float(((log_r - log_r.mean()) ** 2).sum()))
    d = math.log(ratio)
    if se < NO_SPREAD:
        reason = "no spread between batches of pairs: noise unknown"
        return _decide(make(baseline=sb, candidate=sc, ratio=ratio, reason=reason), None, alpha, reason)
    df = k - 1
    half = t_quantile(1.0 - alpha / 2.0, df) * se
    p = t_two_sided_p(d / se, df)
    cmp = make(baseline=sb, candidate=sc, ratio=ratio, ci_low=math.exp(d - half), ci_high=math.exp(d + half),
               p_value=p, p_adjusted=p if primary else None)  # fmt: skip
    return _decide(cmp, p, alpha, None)


# --- multiplicity -------------------------------------------------------------------------------------


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out


def holm(comparisons: Sequence[Comparison], alpha: float = 0.05) -> list[Comparison]:
    """Holm correction over the primary comparisons that have a p-value; verdicts re-decided from the
    adjusted p-values. Non-primary rows become "descriptive" (n/a stays n/a). Order is kept."""
    tested = {i: c.p_value for i, c in enumerate(comparisons) if c.primary and c.p_value is not None}
    adjusted = dict(zip(tested, holm_adjust(list(tested.values())), strict=True))
    m = len(tested)
    out = []
    for i, c in enumerate(comparisons):
        if i not in adjusted:
            out.append(_decide(replace(c, p_adjusted=None), None, alpha, c.reason))
            continue
        p_adj = adjusted[i]
        c = replace(c, p_adjusted=p_adj)
        why = None
        if p_adj >= alpha and c.p_value is not None and c.p_value < alpha:
            why = f"p = {c.p_value:.2g}, {p_adj:.2g} after Holm over {m} primary metrics"
        out.append(_decide(c, p_adj, alpha, why))
    return out


# --- calibration by simulation ------------------------------------------------------------------------


def _simulated_arm_by_run(rng: np.random.Generator, runs: int, requests: int, effect: float, run_sd: float,
                          base_ttft: np.ndarray, base_tpot: np.ndarray, n_out: int) -> dict[str, list]:
    """Per-request TTFT/TPOT (ms) of ``runs`` server runs; each run has its own slowness (log-normal,
    ``run_sd``, TTFT and TPOT correlated 0.5) on top of request-level noise."""
    out: dict[str, list] = {"ttft": [], "tpot": [], "throughput": []}
    for _ in range(runs):
        z_ttft, z = rng.normal(0.0, run_sd, 2)
        z_tpot = 0.5 * z_ttft + math.sqrt(0.75) * z
        ttft = base_ttft * effect * np.exp(z_ttft + rng.normal(0, 0.10, requests))
        tpot = base_tpot * effect * np.exp(z_tpot + rng.normal(0, 0.05, requests))
        e2el_s = (ttft + (n_out - 1) * tpot) / 1000.0
        out["ttft"].append(ttft)
        out["tpot"].append(tpot)
        out["throughput"].append(requests * n_out / e2el_s.sum())  # closed loop, concurrency 1
    return out


def _ar1(rng: np.random.Generator, n: int, phi: float, sd: float) -> np.ndarray:
    """A stationary AR(1) series with marginal standard deviation ``sd``."""
    x = np.empty(n)
    x[0] = rng.normal(0, sd)
    eps = rng.normal(0, sd * math.sqrt(1 - phi**2), n)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + eps[i]
    return x


def simulate_verdict_rates(
    design: str = "by_run",
    *,
    runs: int = 3,
    pairs: int = 40,
    requests: int = 8,
    effect: float = 1.0,
    run_sd: float = 0.13,
    n_sims: int = 400,
    n_out: int = 64,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict:
    """Run ``n_sims`` simulated A/Bs through the methods and ``holm``; rates of each verdict per primary
    metric. ``effect`` multiplies the candidate's latencies (1.0: the null; 1.2: 20% slower).

    by_run: ``runs`` server runs per arm of ``requests`` requests, run-level noise ``run_sd`` (log sd of a
    run's slowness), request noise within a run. pairs: ``pairs`` paired requests in measurement order,
    with a slow drift shared by both arms (AR(1), phi 0.98, sd ``run_sd``) and short-lived noise of each
    arm (AR(1), phi 0.5, sd 0.05), so consecutive pairs are correlated."""
    if design not in ("by_run", "pairs"):
        raise ValueError(f"design must be 'by_run' or 'pairs', got {design!r}")
    rng = np.random.default_rng(seed)
    counts: dict[str, dict[str, int]] = {m: {} for m in PRIMARY_METRICS}
    any_direction = 0
    unadjusted = dict.fromkeys(PRIMARY_METRICS, 0)
    for _ in range(n_sims):
        n_req = requests if design == "by_run" else pairs
        base_ttft = 200.0 * np.exp(rng.normal(0, 0.5, n_req))  # the prompts: shared by both arms
        base_tpot = 6.0 * np.exp(rng.normal(0, 0.1, n_req))
        if design == "by_run":
            a = _simulated_arm_by_run(rng, runs, requests, 1.0, run_sd, base_ttft, base_tpot, n_out)
            b = _simulated_arm_by_run(rng, runs, requests, effect, run_sd, base_ttft, base_tpot, n_out)
            rows = [compare_by_run(f"{s}_{k}_ms", a[k], b[k], s, primary=True, alpha=alpha)
                    for k in ("ttft", "tpot") for s in ("mean", "p99")]  # fmt: skip
            rows.append(compare_run_values("output_throughput", a["throughput"], b["throughput"],
                                           primary=True, alpha=alpha))  # fmt: skip
        else:
            drift_ttft, drift_tpot = _ar1(rng, pairs, 0.98, run_sd), _ar1(rng, pairs, 0.98, run_sd)
            arms = []
            for eff in (1.0, effect):
                noise_ttft = drift_ttft + _ar1(rng, pairs, 0.5, 0.05) + rng.normal(0, 0.10, pairs)
                noise_tpot = drift_tpot + _ar1(rng, pairs, 0.5, 0.05) + rng.normal(0, 0.05, pairs)
                ttft, tpot = base_ttft * eff * np.exp(noise_ttft), base_tpot * eff * np.exp(noise_tpot)
                s_per_token = (ttft + (n_out - 1) * tpot) / 1e3 / n_out
                arms.append({"ttft": ttft, "tpot": tpot, "s_per_token": s_per_token})
            a, b = arms
            rows = [compare_pairs(f"{s}_{k}_ms", a[k], b[k], s, primary=True, alpha=alpha)
                    for k in ("ttft", "tpot") for s in ("mean", "p99")]  # fmt: skip
            rows.append(compare_pairs("output_throughput", a["s_per_token"], b["s_per_token"], "inverse_mean",
                                      lower_is_better=False, primary=True, alpha=alpha))  # fmt: skip
        for c in rows:
            if c.p_value is not None and c.p_value < alpha:
                unadjusted[c.metric] += 1
        judged = holm(rows, alpha)
        any_direction += any(c.verdict in DIRECTION_VERDICTS for c in judged)
        for c in judged:
            counts[c.metric][c.verdict] = counts[c.metric].get(c.verdict, 0) + 1
    rates = {m: {v: k / n_sims for k, v in sorted((k, v) for v, k in cnt.items())[::-1]}
             for m, cnt in counts.items()}  # fmt: skip
    return {
        "design": design, "runs": runs if design == "by_run" else None,
        "pairs": pairs if design == "pairs" else None,
        "effect": effect, "run_sd": run_sd, "n_sims": n_sims, "alpha": alpha,
        "verdicts": rates,
        "direction_rate": {m: sum(r.get(v, 0.0) for v in DIRECTION_VERDICTS) for m, r in rates.items()},
        "any_direction_rate": any_direction / n_sims,
        "unadjusted_rejection_rate": {m: k / n_sims for m, k in unadjusted.items()},
    }


def simulate_null_verdict_rate(design: str = "by_run", **kw: object) -> dict:
    """``simulate_verdict_rates`` under the null (no effect): every direction verdict is a false one."""
    return simulate_verdict_rates(design, **(kw | {"effect": 1.0}))  # type: ignore[arg-type]
