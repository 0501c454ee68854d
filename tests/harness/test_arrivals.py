"""Arrival processes: mean rate, burstiness, determinism, the closed-loop mode, rate sweeps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.workload.arrivals import LoadSpec, arrival_offsets, rate_sweep

N = 20000


def open_spec(rate: float, arrival: str = "poisson", k: float = 1.0, seed: int = 0) -> LoadSpec:
    return LoadSpec(mode="open", request_rate=rate, arrival=arrival, burstiness=k, seed=seed)


SHAPES = [("poisson", 1.0), ("gamma", 0.25), ("gamma", 0.5), ("gamma", 4.0)]


@pytest.mark.parametrize(("arrival", "k"), SHAPES)
@pytest.mark.parametrize("rate", [0.5, 8.0, 200.0])
def test_mean_rate_and_burstiness(arrival: str, k: float, rate: float) -> None:
    t = arrival_offsets(N, open_spec(rate, arrival, k))
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert (N - 1) / t[-1] == pytest.approx(rate, rel=0.03)
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(k), rel=0.06)  # gamma's CV


def test_infinite_rate_sends_everything_at_once() -> None:
    assert np.array_equal(arrival_offsets(50, open_spec(math.inf)), np.zeros(50))
    assert arrival_offsets(0, open_spec(3.0)).shape == (0,)


def test_seeded_and_deterministic() -> None:
    a = arrival_offsets(1000, open_spec(5.0, "gamma", 0.5, seed=3))
    assert np.array_equal(a, arrival_offsets(1000, open_spec(5.0, "gamma", 0.5, seed=3)))
    assert not np.array_equal(a, arrival_offsets(1000, open_spec(5.0, "gamma", 0.5, seed=4)))


def test_closed_mode_is_all_ready_at_zero() -> None:
    spec = LoadSpec(mode="closed", max_concurrency=8)
    assert np.array_equal(arrival_offsets(100, spec), np.zeros(100))
    assert spec.label() == "closed-c8"


def test_rate_sweep_scales_one_pattern() -> None:
    specs = rate_sweep([1.0, 4.0, math.inf], open_spec(1.0, "gamma", 2.0, seed=7))
    assert [s.request_rate for s in specs] == [1.0, 4.0, math.inf]
    assert all(s.arrival == "gamma" and s.burstiness == 2.0 and s.seed == 7 for s in specs)
    slow, fast = (arrival_offsets(100, s) for s in specs[:2])
    np.testing.assert_allclose(fast * 4.0, slow)
    with pytest.raises(ValueError, match="open-loop"):
        rate_sweep([1.0], LoadSpec(mode="closed", max_concurrency=1))


@pytest.mark.parametrize(("kw", "match"), [
    (dict(mode="batch"), "mode"),
    (dict(mode="open"), "request_rate"),
    (dict(mode="open", request_rate=0.0), "request_rate"),
    (dict(mode="open", request_rate=-1.0), "request_rate"),
    (dict(mode="open", request_rate=math.nan), "request_rate"),
    (dict(mode="open", request_rate=1.0, arrival="uniform"), "arrival"),
    (dict(mode="open", request_rate=1.0, burstiness=2.0), "poisson"),
    (dict(mode="open", request_rate=1.0, arrival="gamma", burstiness=0.0), "burstiness"),
    (dict(mode="open", request_rate=1.0, max_concurrency=4), "max_concurrency"),
    (dict(mode="closed"), "max_concurrency"),
    (dict(mode="closed", max_concurrency=0), "max_concurrency"),
    (dict(mode="closed", max_concurrency=2, request_rate=1.0), "request_rate"),
    (dict(mode="open", request_rate=1.0, seed=-1), "seed"),
])
def test_load_spec_validation(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LoadSpec(**kw)
