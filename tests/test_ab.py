"""A/B statistics: run order, bootstrap intervals and verdicts on data with a known answer."""

from __future__ import annotations

import numpy as np
import pytest

from harness.ab import abba_order, paired_ratio_ci, run_ratio_ci


def test_abba_order_balances_position() -> None:
    assert abba_order(1) == ["paged", "tagma"]
    assert abba_order(2) == ["paged", "tagma", "tagma", "paged"]
    assert abba_order(3) == ["paged", "tagma", "tagma", "paged", "paged", "tagma"]
    order = abba_order(4)
    assert order.count("paged") == order.count("tagma") == 4
    with pytest.raises(ValueError):
        abba_order(0)


def _requests(rng: np.random.Generator, n: int, scale: float, repeats: int = 2) -> list[np.ndarray]:
    base = rng.lognormal(mean=0.0, sigma=0.3, size=n)  # request i's own difficulty
    return [base[i] * scale * rng.normal(1.0, 0.02, size=repeats) for i in range(n)]


def test_paired_ci_finds_a_real_slowdown() -> None:
    rng = np.random.default_rng(1)
    paged = _requests(rng, 200, 1.0)
    rng = np.random.default_rng(1)  # the same requests, every latency 20% longer under tagma
    tagma = _requests(rng, 200, 1.2)
    ci = paired_ratio_ci("ttft_ms_mean", paged, tagma, np.mean)
    assert ci.ratio == pytest.approx(1.2, rel=0.01)
    assert 1.0 < ci.ci_low <= ci.ratio <= ci.ci_high
    assert ci.verdict == "slower"


def test_paired_ci_reports_parity_for_the_same_distribution() -> None:
    rng = np.random.default_rng(2)
    paged = _requests(rng, 200, 1.0)
    tagma = [x * np.random.default_rng(i).normal(1.0, 0.05, size=len(x)) for i, x in enumerate(paged)]
    ci = paired_ratio_ci("e2el_ms_p99", paged, tagma, lambda a: float(np.percentile(a, 99)))
    assert ci.ci_low <= 1.0 <= ci.ci_high
    assert ci.verdict == "parity"


def test_paired_ci_handles_missing_samples() -> None:
    ci = paired_ratio_ci("tpot_ms_mean", [np.array([])], [np.array([1.0])], np.mean)
    assert ci.verdict == "n/a" and ci.ratio is None
    with pytest.raises(ValueError):
        paired_ratio_ci("x", [np.array([1.0])], [], np.mean)


def test_run_ratio_ci_direction_for_throughput() -> None:
    ci = run_ratio_ci("output_throughput", [100.0, 101.0, 99.0], [120.0, 121.0, 119.0])
    assert ci.ratio == pytest.approx(1.2, rel=1e-3)
    assert ci.verdict == "higher"
    ci = run_ratio_ci("output_throughput", [100.0, 101.0], [80.0, 81.0])
    assert ci.verdict == "lower"
    ci = run_ratio_ci("output_throughput", [100.0, 120.0], [110.0, 105.0])
    assert ci.verdict == "parity"
    assert run_ratio_ci("x", [], [1.0]).verdict == "n/a"
    single = run_ratio_ci("output_throughput", [100.0], [80.0])  # one repeat: no spread to judge by
    assert single.ratio == pytest.approx(0.8) and single.ci_low is None and single.verdict.startswith("n/a")
