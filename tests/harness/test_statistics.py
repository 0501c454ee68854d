"""A/B statistics: hand-computed cases, edge cases, and calibration/power on simulated A/Bs (seeded)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from harness.analysis.statistics import (
    DIRECTION_VERDICTS,
    PRIMARY_METRICS,
    Comparison,
    compare_by_run,
    compare_pairs,
    compare_run_values,
    holm,
    holm_adjust,
    simulate_null_verdict_rate,
    simulate_verdict_rates,
    t_quantile,
    t_two_sided_p,
)

# --- Student t --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("df", "q975", "q995"),
    [(1, 12.7062, 63.6567), (2, 4.3027, 9.9248), (4, 2.7764, 4.6041), (10, 2.2281, 3.1693),
     (30, 2.0423, 2.7500), (1e7, 1.9600, 2.5758)],
)  # fmt: skip
def test_t_quantiles_match_the_tables(df: float, q975: float, q995: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(q975, abs=1e-4)
    assert t_quantile(0.995, df) == pytest.approx(q995, abs=1e-4)
    assert t_two_sided_p(t_quantile(0.975, df), df) == pytest.approx(0.05, rel=1e-9)


def test_t_p_values() -> None:
    for t in (0.3, 1.0, 2.5, 7.0):  # df = 2 has a closed form: p = 1 - t / sqrt(2 + t^2)
        assert t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-10)
    assert t_two_sided_p(-2.0, 5) == t_two_sided_p(2.0, 5)
    assert t_two_sided_p(0.0, 3) == 1.0 and t_two_sided_p(math.inf, 3) == 0.0
    assert t_two_sided_p(1.5, 7.5) < t_two_sided_p(1.5, 2.5)  # fractional df (Welch) and heavier tails
    # df = 1 is Cauchy: p = 1 - 2 atan(t) / pi. t = 1 sits on the incomplete beta's own boundary (x = 1/2 with
    # a = b = 1/2), where the mirrored evaluation used to recurse forever.
    for t in (0.5, 1.0, 3.0):
        assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, rel=1e-10)
    with pytest.raises(ValueError):
        t_two_sided_p(1.0, 0)
    with pytest.raises(ValueError):
        t_quantile(0.4, 3)


# --- run-level comparisons --------------------------------------------------------------------------


def test_run_values_welch_on_logs_hand_computed() -> None:
    # logs: baseline [0, 0.2], candidate [0.3, 0.5]: d = 0.3, var 0.02 each, se = sqrt(0.02), df = 2
    c = compare_run_values("output_throughput", list(np.exp([0.0, 0.2])), list(np.exp([0.3, 0.5])),
                           primary=True)  # fmt: skip
    t, se = 0.3 / math.sqrt(0.02), math.sqrt(0.02)
    assert c.ratio == pytest.approx(math.exp(0.3)) and c.baseline == pytest.approx(math.exp(0.1))
    assert c.p_value == pytest.approx(1 - t / math.sqrt(2 + t * t))
    assert c.ci_low == pytest.approx(math.exp(0.3 - 4.302653 * se), rel=1e-6)
    assert c.ci_high == pytest.approx(math.exp(0.3 + 4.302653 * se), rel=1e-6)
    assert c.verdict == "inconclusive" and "includes 1" in (c.reason or "")
    assert (c.runs_baseline, c.runs_candidate, c.method) == (2, 2, "run-level Welch t (log)")


def test_run_values_directions_and_parity() -> None:
    hi = compare_run_values("output_throughput", [100, 101, 99, 100.5], [120, 121, 119, 120.5], primary=True)
    assert hi.verdict == "higher" and hi.ci_low > 1.0
    lo = compare_run_values("output_throughput", [100, 101, 99, 100.5], [80, 81, 79, 80.5], primary=True)
    assert lo.verdict == "lower" and lo.ci_high < 1.0
    faster = compare_run_values("mean_tpot_ms", [10, 10.1, 9.9], [8, 8.1, 7.9], lower_is_better=True,
                                primary=True)  # fmt: skip
    assert faster.verdict == "faster"
    aa = compare_run_values("output_throughput", [100, 101, 99, 100.5, 99.5, 100.2],
                            [100.3, 99.2, 100.8, 99.9, 100.1, 100.6], primary=True)  # fmt: skip
    assert aa.verdict == "parity" and 1 / 1.05 <= aa.ci_low <= 1 <= aa.ci_high <= 1.05
    desc = compare_run_values("request_goodput", [100, 101, 99], [120, 121, 119])  # not primary
    assert desc.verdict == "descriptive" and desc.ci_low is not None and desc.p_adjusted is None


def test_by_run_computes_the_statistic_per_run() -> None:
    base = [np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0, 30.0])]  # per-run means 2 and 20
    cand = [np.array([2.0, 2.0, 2.0]), np.array([20.0, 20.0, 20.0, np.nan])]
    c = compare_by_run("mean_tpot_ms", base, cand, "mean")
    assert c.baseline == pytest.approx(math.sqrt(2 * 20))  # geometric mean of the runs, not the pooled 11
    assert c.ratio == pytest.approx(1.0) and c.samples == 12  # the NaN does not enter
    p50 = compare_by_run("p50_tpot_ms", base, cand, lambda a: float(np.median(a)))
    assert p50.baseline == pytest.approx(math.sqrt(2 * 20))
    # the run-level spread (2 vs 20) dominates: no verdict however tight each run is
    assert compare_by_run("mean_tpot_ms", base, [r * 1.3 for r in base], "mean", primary=True).verdict \
        == "inconclusive"


def test_run_level_noise_is_in_the_interval() -> None:
    """Requests within a run tight (1%), runs 13% apart: a pooled-request interval would be +-0.2%."""
    rng = np.random.default_rng(5)
    base = [f * np.exp(rng.normal(0, 0.01, 200)) for f in np.exp([-0.13, 0.0, 0.13])]
    cand = [f * np.exp(rng.normal(0, 0.01, 200)) for f in np.exp([0.13, 0.0, -0.13])]
    c = compare_by_run("mean_tpot_ms", base, cand, "mean", primary=True)
    # t(4) * 0.13 * sqrt(2/3) = 0.29 on the log scale
    assert c.ratio == pytest.approx(1.0, abs=0.01) and c.half_width is not None and c.half_width > 0.25
    assert c.verdict == "inconclusive" and c.samples == 1200


def test_edge_cases_give_na_or_inconclusive_never_a_ratio_of_zero() -> None:
    empty = compare_by_run("mean_ttft_ms", [], [np.array([1.0])], "mean", primary=True)
    assert empty.verdict == "n/a" and empty.ratio is None and "baseline" in (empty.reason or "")
    no_data = compare_by_run("mean_ttft_ms", [np.array([np.nan])], [np.array([1.0])], "mean", primary=True)
    assert no_data.verdict == "n/a"
    one = compare_by_run("mean_ttft_ms", [np.array([1.0, 2.0])], [np.array([3.0, 4.0])], "mean", primary=True)
    assert one.verdict == "inconclusive" and one.ratio == pytest.approx(7 / 3) and one.ci_low is None
    assert "needs >= 2 runs" in (one.reason or "")
    zero = [np.array([0.0, 0.0, 5.0]), np.array([0.0, 0.0, 6.0])]  # p50 ITL of 0 in every run
    z = compare_by_run("p50_itl_ms", zero, [np.array([1.0, 2.0, 3.0])] * 2, "p50", primary=True)
    assert z.verdict == "n/a" and z.ratio is None and z.ci_low is None and "baseline" in (z.reason or "")
    zc = compare_by_run("p50_itl_ms", [np.array([1.0, 2.0, 3.0])] * 2, zero, "p50", primary=True)
    assert zc.verdict == "n/a" and zc.ratio is None
    flat = compare_run_values("x", [5.0, 5.0], [6.0, 6.0], primary=True)
    assert flat.verdict == "inconclusive" and "no spread" in (flat.reason or "")
    nan = compare_run_values("x", [1.0, None, float("nan"), 1.1], [1.2, 1.3], primary=True)
    assert nan.runs_baseline == 2 and nan.ci_low is not None
    assert compare_run_values("x", [], []).verdict == "n/a"
    with pytest.raises(ValueError, match="unknown statistic"):
        compare_by_run("x", [np.array([1.0])], [np.array([1.0])], "p42")


# --- paired design ----------------------------------------------------------------------------------


def test_pairs_find_a_real_effect_and_parity() -> None:
    rng = np.random.default_rng(3)
    base = 6.0 * np.exp(rng.normal(0, 0.1, 80) + np.cumsum(rng.normal(0, 0.02, 80)))  # drifting
    slow = compare_pairs("mean_tpot_ms", base, base * 1.1 * np.exp(rng.normal(0, 0.03, 80)), "mean",
                         primary=True)  # fmt: skip
    assert slow.verdict == "slower" and slow.ci_low > 1.0 and slow.ratio == pytest.approx(1.1, rel=0.02)
    assert slow.samples == 80 and slow.method.startswith("paired")
    same = compare_pairs("mean_tpot_ms", base, base * np.exp(rng.normal(0, 0.02, 80)), "mean", primary=True)
    assert same.verdict == "parity"
    thr = compare_pairs("output_throughput", base, base * 0.8, "inverse_mean", lower_is_better=False,
                        primary=True)  # fmt: skip
    assert thr.ratio == pytest.approx(1.25) and thr.verdict == "inconclusive"  # no spread at all
    thr = compare_pairs("output_throughput", base, base * 0.8 * np.exp(rng.normal(0, 0.02, 80)),
                        "inverse_mean", lower_is_better=False, primary=True)  # fmt: skip
    assert thr.verdict == "higher"


def test_pairs_edge_cases() -> None:
    with pytest.raises(ValueError, match="paired"):
        compare_pairs("x", np.ones(3), np.ones(4), "mean")
    assert compare_pairs("x", np.array([]), np.array([]), "mean").verdict == "n/a"
    few = compare_pairs("x", np.arange(1.0, 11.0), np.arange(1.0, 11.0) * 2, "mean", primary=True)
    assert few.verdict == "inconclusive" and "too few" in (few.reason or "") and few.ratio == pytest.approx(2)
    rng = np.random.default_rng(0)
    b, c = rng.lognormal(0, 0.3, 60), rng.lognormal(0.5, 0.3, 60)
    tail = compare_pairs("p99_ttft_ms", b, c, "p99", primary=True)
    assert tail.verdict == "inconclusive" and "500 pairs" in (tail.reason or "")
    z = compare_pairs("p50_itl_ms", np.zeros(60), c, "p50", primary=True)
    assert z.verdict == "n/a" and z.ratio is None
    b[3] = np.nan  # that pair is left out
    assert compare_pairs("x", b, c, "mean").samples == 59


def test_pairs_in_waves_keep_each_wave_in_one_jackknife_batch() -> None:
    """The requests of a wave share their steps: a noise common to the wave is one sample, not eight. Kept
    whole, the waves widen the interval to what the waves' own spread gives; labelled one per pair, the
    units change nothing."""
    rng = np.random.default_rng(5)
    waves, size = 30, 8
    units = np.repeat(np.arange(waves), size)
    base = 6.0 * np.exp(rng.normal(0, 0.05, waves * size))
    wave_noise = np.repeat(rng.normal(0, 0.08, waves), size)  # the wave's steps, shared by its requests
    cand = base * np.exp(wave_noise + rng.normal(0, 0.005, waves * size))
    loose = compare_pairs("mean_tpot_ms", base, cand, "mean", units=None)
    whole = compare_pairs("mean_tpot_ms", base, cand, "mean", units=units)
    assert whole.ratio == loose.ratio and whole.samples == loose.samples == waves * size
    assert "whole waves" in whole.method and "whole waves" not in loose.method
    # the wave means' own spread: what 30 independent waves resolve
    per_wave = [np.log(cand[units == w].mean() / base[units == w].mean()) for w in range(waves)]
    se_waves = np.std(per_wave, ddof=1) / np.sqrt(waves)
    half_whole = np.log(whole.ci_high / whole.ci_low) / 2
    assert 0.6 * 2.0 * se_waves < half_whole < 1.6 * 2.3 * se_waves
    same = compare_pairs("mean_tpot_ms", base, cand, "mean", units=np.arange(waves * size))
    assert (same.ci_low, same.ci_high, same.method) == (loose.ci_low, loose.ci_high, loose.method)
    one = compare_pairs("mean_tpot_ms", base, cand, "mean", primary=True,
                        units=np.zeros(waves * size, dtype=int))  # fmt: skip
    assert one.verdict == "inconclusive" and "1 unit(s)" in (one.reason or "")
    with pytest.raises(ValueError, match="one label per pair"):
        compare_pairs("x", base, cand, "mean", units=np.arange(3))
    recurs = units.copy()
    recurs[2 * size:3 * size] = 0  # wave 0's label again after wave 1's pairs
    with pytest.raises(ValueError, match="must be consecutive"):
        compare_pairs("x", base, cand, "mean", units=recurs)


# --- Holm -------------------------------------------------------------------------------------------


def test_holm_adjust_hand_computed() -> None:
    # sorted 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 -> max(0.06, 0.04) = 0.06
    assert holm_adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_adjust([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    assert holm_adjust([0.02]) == pytest.approx([0.02])
    assert holm_adjust([]) == []


def _row(metric: str, p: float | None, lo: float | None, hi: float | None, primary: bool = True,
         verdict: str = "inconclusive") -> Comparison:  # fmt: skip
    return Comparison(metric, 1.0, 1.1, 1.1, lo, hi, p, None, verdict, None, primary, "test", 3, 3, 30)


def test_holm_verdicts_need_the_adjusted_test() -> None:
    rows = [_row("mean_ttft_ms", 0.02, 1.02, 1.2), _row("mean_tpot_ms", 0.03, 1.01, 1.2),
            _row("output_throughput", 0.5, 0.9, 1.3), _row("p50_ttft_ms", 0.001, 1.1, 1.2, primary=False),
            _row("p99_tpot_ms", None, None, None, verdict="n/a")]  # fmt: skip
    out = holm(rows)
    assert [r.metric for r in out] == [r.metric for r in rows]
    assert [r.p_adjusted for r in out[:3]] == pytest.approx([0.06, 0.06, 0.5])
    assert all(r.verdict == "inconclusive" for r in out[:3])
    assert "Holm over 3" in (out[0].reason or "") and "includes 1" in (out[2].reason or "")
    assert out[3].verdict == "descriptive" and out[3].p_adjusted is None
    assert out[4].verdict == "n/a" and out[4].p_adjusted is None
    two = holm(rows[:2])  # 0.02 * 2 = 0.04, then max(0.04, 0.03) = 0.04: both reject
    assert [r.p_adjusted for r in two] == pytest.approx([0.04, 0.04])
    assert [r.verdict for r in two] == ["slower", "slower"]
    json.dumps([r.to_dict() for r in out], allow_nan=False)


# --- calibration and power (simulated A/Bs; see simulate_verdict_rates for the noise model) -----------

NULL_SIMS = 250  # binomial sd of a 5% rate: 1.4 points


@pytest.mark.parametrize("runs", [2, 3, 4, 6])
def test_null_verdict_rate_by_run(runs: int) -> None:
    r = simulate_null_verdict_rate("by_run", runs=runs, n_sims=NULL_SIMS, seed=runs)
    assert set(r["direction_rate"]) == set(PRIMARY_METRICS)
    for metric, rate in r["direction_rate"].items():
        assert rate <= 0.05, (metric, r["verdicts"][metric])
    # each test alone at nominal 5% (2 sd of simulation noise allowed), and the family-wise rate
    assert max(r["unadjusted_rejection_rate"].values()) <= 0.08, r["unadjusted_rejection_rate"]
    assert r["any_direction_rate"] <= 0.08


def test_null_verdict_rate_paired_with_drift() -> None:
    r = simulate_null_verdict_rate("pairs", pairs=40, n_sims=300, seed=12)
    for metric, rate in r["direction_rate"].items():
        assert rate <= 0.05, (metric, r["verdicts"][metric])
    assert r["any_direction_rate"] <= 0.08
    # before Holm: ~6% per test under this model's persistent noise of each arm (see compare_pairs); pooled
    # over the three metrics that get an interval at 40 pairs (900 tests, sd 0.8 points)
    tested = [v for m, v in r["unadjusted_rejection_rate"].items() if not m.startswith("p99")]
    assert sum(tested) / len(tested) <= 0.09, r["unadjusted_rejection_rate"]


def test_power_by_run_20_percent_with_6_runs() -> None:
    # 13% run sd, 6 runs per arm: the log ratio's sd is 0.075, so a 20% effect is 2.4 sd: even a z test that
    # knew the variance, with no multiplicity, would see it 68% of the time.
    r = simulate_verdict_rates("by_run", runs=6, effect=1.2, n_sims=200, seed=21)
    wrong = {m: v.get("faster", 0) + v.get("higher", 0) for m, v in r["verdicts"].items()}
    assert max(wrong.values()) == 0
    assert r["any_direction_rate"] >= 0.4
    assert min(r["direction_rate"].values()) >= 0.25, r["direction_rate"]
    r30 = simulate_verdict_rates("by_run", runs=6, effect=1.3, n_sims=100, seed=22)
    assert r30["any_direction_rate"] >= 0.75 and min(r30["direction_rate"].values()) >= 0.5


def test_power_paired_10_percent_with_40_pairs() -> None:
    r = simulate_verdict_rates("pairs", pairs=40, effect=1.1, n_sims=200, seed=31)
    assert r["any_direction_rate"] >= 0.85
    assert r["direction_rate"]["mean_tpot_ms"] >= 0.7 and r["direction_rate"]["output_throughput"] >= 0.7
    assert r["verdicts"]["mean_tpot_ms"].get("faster", 0) == 0
    assert r["verdicts"]["p99_tpot_ms"] == {"inconclusive": 1.0}  # 40 pairs cannot bound a p99
    allowed = DIRECTION_VERDICTS | {"inconclusive", "parity"}
    assert all(v in allowed for m in r["verdicts"].values() for v in m)


def test_simulation_rejects_an_unknown_design() -> None:
    with pytest.raises(ValueError, match="design"):
        simulate_null_verdict_rate("abba")
