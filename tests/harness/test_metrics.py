"""Metric math against hand-computed cases."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.client import RequestResult
from harness.metrics import VLLM_RESULT_KEYS, distribution, parse_slos, summarize


def ok(
    index: int, scheduled: float, sent: float, chunks: list[float], n_out: int, n_in: int = 100
) -> RequestResult:
    return RequestResult(
        index=index, scheduled_s=scheduled, sent_s=sent, first_token_s=chunks[0], end_s=chunks[-1],
        done_s=chunks[-1], chunk_times=chunks, prompt_tokens=n_in, completion_tokens=n_out,
        expected_prompt_tokens=n_in, max_tokens=n_out, success=True,
    )


def failed(index: int, kind: str) -> RequestResult:
    return RequestResult(index=index, scheduled_s=0.0, sent_s=0.0, success=False, error=f"{kind}!",
                         error_kind=kind, expected_prompt_tokens=7)


def test_request_result_derived_times() -> None:
    # scheduled 1.0, sent 1.5 (queued 0.5), chunks at 2.0, 2.1, 2.4, 5 tokens (last chunk carries 3)
    r = ok(0, 1.0, 1.5, [2.0, 2.1, 2.4], n_out=5)
    assert r.queue_s == pytest.approx(0.5)
    assert r.ttft == pytest.approx(1.0)  # from the scheduled time, not the send time
    assert r.e2el == pytest.approx(1.4)
    assert r.itl == pytest.approx([0.1, 0.3])
    # the last two events arrived in one network read: one delivery, one gap, no zero
    both = ok(3, 1.0, 1.5, [2.0, 2.1, 2.4, 2.4], n_out=5)
    assert both.itl == pytest.approx([0.1, 0.3]) and sum(both.itl) == pytest.approx(both.e2el - both.ttft)
    assert r.tpot == pytest.approx(0.4 / 4)
    assert ok(1, 0, 0, [1.0], n_out=1).tpot is None
    assert failed(2, "timeout").ttft is None


def test_itl_never_zero_when_chunks_arrive_together() -> None:
    # every other delivery carried two token events (same arrival time): a naive per-event ITL would make
    # half the gaps zero and the p50 ITL 0; per delivery the gaps are all 20 ms
    t = [0.1 + 0.02 * (k // 2) for k in range(20)]
    s = summarize([ok(0, 0.0, 0.0, t, n_out=20)], duration_s=1.0)
    assert s["median_itl_ms"] == pytest.approx(20) and s["min_itl_ms"] == pytest.approx(20)
    assert len(s["itls"][0]) == 9 and sum(s["itls"][0]) == pytest.approx(t[-1] - t[0])


def test_summary_hand_computed() -> None:
    rs = [
        ok(0, 0.0, 0.0, [0.1, 0.2, 0.3], n_out=3, n_in=10),  # ttft 100, e2el 300, tpot 100, itl 100,100
        ok(1, 1.0, 1.0, [1.3, 1.5], n_out=2, n_in=20),  # ttft 300, e2el 500, tpot 200, itl 200
        ok(2, 2.0, 2.5, [3.0], n_out=1, n_in=30),  # ttft 1000, e2el 1000, no tpot, queued 500
        failed(3, "http_500"),
        failed(4, "timeout"),
        failed(5, "timeout"),
    ]
    s = summarize(rs, duration_s=4.0)
    assert (s["completed"], s["failed"], s["num_requests"]) == (3, 3, 6)
    assert s["failure_reasons"] == {"http_500": 1, "timeout": 2}
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (60, 6)
    assert s["request_throughput"] == pytest.approx(0.75)
    assert s["output_throughput"] == pytest.approx(1.5)
    assert s["total_token_throughput"] == pytest.approx(16.5)
    assert s["mean_ttft_ms"] == pytest.approx(1400 / 3)
    assert s["median_ttft_ms"] == pytest.approx(300)
    assert s["std_ttft_ms"] == pytest.approx(np.std([100, 300, 1000]))
    # linear interpolation: p90 of [100, 300, 1000] is at rank 1.8 -> 300 + 0.8 * 700
    assert s["p90_ttft_ms"] == pytest.approx(860)
    assert s["p99_ttft_ms"] == pytest.approx(300 + 0.98 * 700)
    assert (s["min_ttft_ms"], s["max_ttft_ms"]) == pytest.approx((100, 1000))
    assert s["mean_tpot_ms"] == pytest.approx(150)  # request 2 has one token: no tpot
    assert s["p50_tpot_ms"] == pytest.approx(150)
    assert s["mean_itl_ms"] == pytest.approx(400 / 3)  # pooled [100, 100, 200]
    assert s["median_e2el_ms"] == pytest.approx(500)
    assert s["max_client_queue_time_ms"] == pytest.approx(500)
    assert s["request_goodput"] is None and s["goodput_fraction"] is None  # no SLOs
    assert s["ttfts"][3] is None and s["errors"][4] == "timeout!" and s["errors"][0] == ""
    assert s["input_lens"] == [10, 20, 30, 7, 7, 7] and s["output_lens"] == [3, 2, 1, 0, 0, 0]
    assert s["output_len_mismatches"] == 0
    json.dumps(s, allow_nan=False)


@pytest.mark.parametrize(
    ("slos", "good"),
    [
        ({"ttft_ms": 350}, 2),  # requests 0, 1
        ({"ttft_ms": 350, "tpot_ms": 150}, 1),  # request 1's tpot is 200
        ({"tpot_ms": 150}, 2),  # request 0, and request 2 (one token: tpot counts as 0)
        ({"e2el_ms": 1000}, 3),  # limits are inclusive
        ({"e2el_ms": 999}, 2),
        ({"ttft": 2000, "tpot": 1000, "e2el": 2000}, 3),  # vLLM-style names
    ],
)
def test_goodput_slo_subsets(slos: dict[str, float], good: int) -> None:
    rs = [
        ok(0, 0.0, 0.0, [0.1, 0.2, 0.3], n_out=3),
        ok(1, 1.0, 1.0, [1.3, 1.5], n_out=2),
        ok(2, 2.0, 2.5, [3.0], n_out=1),
        failed(3, "timeout"),  # a failed request is never good
    ]
    s = summarize(rs, duration_s=2.0, slos=slos)
    assert s["good_completed"] == good
    assert s["request_goodput"] == pytest.approx(good / 2.0)
    assert s["goodput_fraction"] == pytest.approx(good / 4)


def test_zero_completed_gives_none_not_nan() -> None:
    s = summarize([failed(0, "connection"), failed(1, "connection")], duration_s=1.0, slos={"ttft_ms": 10})
    text = json.dumps(s, allow_nan=False)  # raises on NaN/inf
    assert "NaN" not in text
    for m in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p99", "min", "max"):
            assert s[f"{stat}_{m}_ms"] is None
    assert s["completed"] == 0 and s["request_throughput"] == 0.0
    assert s["request_goodput"] == 0.0 and s["goodput_fraction"] == 0.0
    assert summarize([], duration_s=0.0)["request_throughput"] is None  # no duration: no rate


def test_single_token_requests_have_no_tpot_but_have_ttft() -> None:
    s = summarize([ok(0, 0.0, 0.0, [0.05], n_out=1)], duration_s=1.0)
    assert s["mean_tpot_ms"] is None and s["mean_itl_ms"] is None
    assert s["mean_ttft_ms"] == pytest.approx(50)


def test_keys_superset_of_vllm_bench_serve() -> None:
    s = summarize([ok(0, 0.0, 0.0, [0.1, 0.2], n_out=2)], duration_s=1.0)
    assert set(VLLM_RESULT_KEYS) <= set(s)
    for m in ("ttft", "tpot", "itl", "e2el"):
        assert {f"p{p}_{m}_ms" for p in (50, 90, 95, 99)} <= set(s)


def test_bad_slo_names_rejected() -> None:
    with pytest.raises(ValueError, match="unknown SLO"):
        parse_slos({"itl_ms": 5})
    with pytest.raises(ValueError, match="> 0"):
        parse_slos({"ttft_ms": 0})


@given(st.lists(st.floats(min_value=0, max_value=1e3, allow_nan=False), min_size=1, max_size=50))
def test_distribution_matches_numpy_linear(values: list[float]) -> None:
    d = distribution("x", values, percentiles=(50, 90, 99.9))
    ms = np.asarray(values) * 1000
    assert d["p99.9_x_ms"] == pytest.approx(np.percentile(ms, 99.9, method="linear"))
    assert d["median_x_ms"] == pytest.approx(d["p50_x_ms"])
    eps = 1e-9 * (1 + d["max_x_ms"])
    assert d["min_x_ms"] - eps <= d["p90_x_ms"] <= d["max_x_ms"] + eps


def test_summary_of_a_real_run_is_strict_json() -> None:
    import asyncio
    from dataclasses import dataclass

    from harness.client import run_requests
    from harness.serve.mock_server import MockConfig, MockServer

    @dataclass
    class Req:
        index: int
        prompt: str = "p" * 400
        prompt_tokens: int = 100
        max_tokens: int = 5

    async def scenario() -> tuple[list[RequestResult], float]:
        cfg = MockConfig(token_delay_s=0.002, fail_for=lambda n, b: "http500" if n == 2 else None)
        async with MockServer(cfg) as srv:
            return await run_requests(srv.url, "m", [Req(i) for i in range(4)], [0.0, 0.01, 0.02, 0.03],
                                      max_concurrency=2)

    results, duration = asyncio.run(scenario())
    s = summarize(results, duration, slos={"ttft_ms": 10_000})
    json.dumps(s, allow_nan=False)
    assert (s["completed"], s["failed"], s["failure_reasons"]) == (3, 1, {"http_500": 1})
    assert s["total_input_tokens"] == 300 and s["total_output_tokens"] == 15
    assert s["good_completed"] == 3 and s["goodput_fraction"] == pytest.approx(0.75)
    assert s["max_concurrent_requests"] >= 1 and s["max_output_tokens_per_s"] > 0
    assert s["mean_itl_ms"] is not None and s["mean_itl_ms"] > 0
