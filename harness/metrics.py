"""Aggregate ``RequestResult``s into one JSON-ready dict whose keys are a superset of ``vllm bench serve``'s.

Conventions (vLLM's, unless noted):

* Latency statistics use SUCCESSFUL requests only. ``ttft``/``e2el`` are measured from the request's
  SCHEDULED send time (unlike vLLM, which starts its clock after its concurrency semaphore), so client
  queueing is included; ``*_client_queue_time_ms`` reports the queueing alone, and
  ``*_e2el_including_client_queue_ms`` (vLLM's name for the queue-inclusive e2el) equals ``*_e2el_ms``.
* ``tpot = (e2el - ttft) / (completion_tokens - 1)`` for requests with more than one output token;
  ``itl`` pools the gaps between consecutive token-bearing chunks of every request; chunks that arrived
  in one network read are one delivery and give one gap, never zeros (see harness.client).
* mean / median / std (population, ddof=0) / percentiles are numpy's; percentiles use numpy's default
  ``linear`` interpolation: ``p`` is at rank ``(n-1) * p/100`` between the sorted values, as vLLM.
* Token totals come from the server's ``usage`` events.
* Goodput (DistServe): a successful request is *good* if it meets EVERY configured SLO (value <= limit);
  a request with one output token has tpot 0 for this test (as vLLM). ``request_goodput`` = good /
  duration; ``goodput_fraction`` = good / all requests (failed ones are not good). Both are None when no
  SLO is configured.
* A statistic with no data (no successful request, no multi-token request) is None, never NaN or 0;
  every value passes through ``_json_safe`` so the dict can be written with ``allow_nan=False``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.client import RequestResult

PERCENTILES: tuple[float, ...] = (50, 90, 95, 99)
SLO_NAMES = ("ttft", "tpot", "e2el")

# Keys of the result JSON that `vllm bench serve` (vllm/benchmarks/serve.py, 0.32/0.33) saves for a
# generation run, minus the run-configuration keys its CLI adds (date, backend, model_id, request_rate,
# ...), which belong to the runner. summarize() writes all of them.
VLLM_RESULT_KEYS: tuple[str, ...] = (
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
    "generated_texts", "errors", "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
    *(f"{stat}_{m}_ms"
      for m in ("ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue")
      for stat in ("mean", "median", "std", "p99")),
)


def _json_safe(x: Any) -> Any:
    """numpy scalars -> Python; NaN/inf -> None; recursive over dicts and lists."""
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_safe(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _p_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def distribution(name: str, values_s: Sequence[float], percentiles: Sequence[float] = PERCENTILES) -> dict:
    """``mean_/median_/std_/pXX_/min_/max_{name}_ms`` of ``values_s`` (seconds), in ms; None if empty."""
    keys = ["mean", "median", "std", *(f"p{_p_word(p)}" for p in percentiles), "min", "max"]
    if len(values_s) == 0:
        return {f"{k}_{name}_ms": None for k in keys}
    v = np.asarray(values_s, dtype=float) * 1000.0
    stats = [np.mean(v), np.median(v), np.std(v), *np.percentile(v, list(percentiles)), v.min(), v.max()]
    return {f"{k}_{name}_ms": float(s) for k, s in zip(keys, stats, strict=True)}


def parse_slos(slos: Mapping[str, float] | None) -> dict[str, float]:
    """Accept ``ttft_ms``/``tpot_ms``/``e2el_ms`` (or vLLM's ``ttft``/``tpot``/``e2el``), in ms."""
    out: dict[str, float] = {}
    for key, limit in (slos or {}).items():
        name = key.removesuffix("_ms")
        if name not in SLO_NAMES:
            raise ValueError(f"unknown SLO {key!r}; use ttft_ms, tpot_ms, e2el_ms")
        if not limit > 0:
            raise ValueError(f"SLO {key} must be > 0 ms, got {limit}")
        out[name] = float(limit)
    return out


def is_good(r: RequestResult, slos_ms: Mapping[str, float]) -> bool:
    """True if the successful request ``r`` meets every SLO in ``slos_ms`` (from parse_slos)."""
    if not r.success:
        return False
    values = {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.e2el}
    return all(values[n] is not None and values[n] * 1000.0 <= lim for n, lim in slos_ms.items())


def _per_second_peaks(ok: Sequence[RequestResult]) -> tuple[float | None, int | None]:
    """vLLM's max_output_tokens_per_s / max_concurrent_requests over 1 s buckets from the first send.

    Each token-bearing chunk counts completion_tokens / n_chunks tokens (vLLM counts 1 per chunk), so the
    buckets add up to the server's token count."""
    if not ok:
        return None, None
    start = min(r.sent_s or 0.0 for r in ok)
    end = max(r.end_s or 0.0 for r in ok)
    n = int(math.ceil(end - start)) + 1
    tokens = np.zeros(n)
    active = np.zeros(n)
    for r in ok:
        w = (r.completion_tokens or 0) / max(1, len(r.chunk_times))
        for t in r.chunk_times:
            tokens[min(n - 1, int(t - start))] += w
        active[int((r.sent_s or 0.0) - start): int((r.end_s or 0.0) - start) + 1] += 1
    return float(tokens.max()), int(active.max())


def summarize(
    results: Sequence[RequestResult],
    duration_s: float,
    slos: Mapping[str, float] | None = None,
    *,
    percentiles: Sequence[float] = PERCENTILES,
    per_request: bool = True,
) -> dict[str, Any]:
    """All metrics of one run (see the module docstring); ``per_request`` adds vLLM's per-request lists."""
    slos_ms = parse_slos(slos)
    ok = [r for r in results if r.success]
    n_in = sum(r.prompt_tokens or 0 for r in ok)
    n_out = sum(r.completion_tokens or 0 for r in ok)
    good = sum(is_good(r, slos_ms) for r in ok) if slos_ms else None

    def rate(x: float | None) -> float | None:
        return None if x is None or duration_s <= 0 else x / duration_s

    peak_tokens, peak_active = _per_second_peaks(ok)
    out: dict[str, Any] = {
        "duration": duration_s,
        "num_requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "failure_reasons": dict(Counter(r.error_kind or "unknown" for r in results if not r.success)),
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "request_throughput": rate(len(ok)),
        "output_throughput": rate(n_out),
        "total_token_throughput": rate(n_in + n_out),
        "slos_ms": {f"{k}_ms": v for k, v in slos_ms.items()},
        "good_completed": good,
        "request_goodput": rate(good),
        "goodput_fraction": None if good is None or not results else good / len(results),
        "output_len_mismatches": sum(r.max_tokens is not None and r.completion_tokens != r.max_tokens
                                     for r in ok),
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_active,
        "rtfx": 0.0,  # audio only; vLLM writes 0.0 for text runs
    }
    out |= distribution("ttft", [r.ttft for r in ok if r.ttft is not None], percentiles)
    out |= distribution("tpot", [t for r in ok if (t := r.tpot) is not None], percentiles)
    out |= distribution("itl", [x for r in ok for x in r.itl], percentiles)
    out |= distribution("e2el", [r.e2el for r in ok if r.e2el is not None], percentiles)
    out |= distribution("client_queue_time", [q for r in ok if (q := r.queue_s) is not None], percentiles)
    # vLLM reports this apart because its e2el starts after the queue; ours starts at the scheduled time.
    out |= {k.replace("_e2el_", "_e2el_including_client_queue_"): v
            for k, v in out.items() if k.endswith("_e2el_ms")}
    if per_request:
        out |= {
            "input_lens": [r.prompt_tokens if r.success else r.expected_prompt_tokens for r in results],
            "output_lens": [r.completion_tokens if r.success else 0 for r in results],
            "ttfts": [r.ttft if r.success else None for r in results],
            "itls": [r.itl if r.success else [] for r in results],
            "latencies": [r.e2el if r.success else None for r in results],
            "start_times": [r.sent_s for r in results],
            "scheduled_times": [r.scheduled_s for r in results],
            "queue_times": [r.queue_s for r in results],
            "generated_texts": [r.text or "" for r in results],
            "errors": [r.error for r in results],
        }
    return _json_safe(out)
