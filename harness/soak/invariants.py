"""The soak's invariants, as pure functions over what the driver recorded (unit-tested without a server).

* per request, both arms: the same HTTP status and error class; no 5xx and no broken stream; a bad request
  refused (a 4xx, or a client-error event in a started stream); a good one served in full (``n`` choices of
  ``max_tokens`` tokens); an abort really
  cut mid-stream; the same greedy (or seeded) tokens, where a divergence counts only if it is not a near-tie
  (the two tokens' logprobs within ``tie_tol`` on the arm that diverged first: float32 sums in another batch
  order may flip such a tie, which says nothing about the KV cache);
* after drain, per arm: the manager's free blocks back at the idle count taken before traffic (the pool
  size), no live request, the KV usage gauge back at its idle value;
* per arm: the engine core's RSS without a growth trend after warm-up (a fitted slope times the window
  stays under a bound).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from harness.soak.client import TRANSPORT, ArmReply
from harness.soak.plan import ABORT, ERROR, OK, SoakRequest


@dataclass
class PairVerdict:
    violations: list[str] = field(default_factory=list)
    near_ties: int = 0  # divergences explained by a near-tie (see the module docstring)
    compared_tokens: int = 0


def _lp(top: Mapping[str, float], token: int) -> float | None:
    for key in (f"token_id:{token}", str(token)):
        if key in top:
            return float(top[key])
    return None


def is_near_tie(tops: Sequence[Mapping[str, float]], j: int, mine: int, other: int, tol: float) -> bool:
    """Whether ``other`` was within ``tol`` (logprob) of ``mine`` at position ``j`` on this arm."""
    if j >= len(tops):
        return False
    a, b = _lp(tops[j], mine), _lp(tops[j], other)
    return a is not None and b is not None and abs(a - b) <= tol


def compare_tokens(a: ArmReply, b: ArmReply, prefix_only: bool, tol: float, v: PairVerdict) -> None:
    for i in sorted(set(a.tokens) & set(b.tokens)):
        ta, tb = a.tokens[i], b.tokens[i]
        n = min(len(ta), len(tb))
        if not prefix_only and len(ta) != len(tb):
            v.violations.append(f"output_length_mismatch choice {i}: {len(ta)} vs {len(tb)}")
        j = next((k for k in range(n) if ta[k] != tb[k]), None)
        v.compared_tokens += n if j is None else j
        if j is None:
            continue
        if is_near_tie(a.top.get(i, []), j, ta[j], tb[j], tol) or is_near_tie(
            b.top.get(i, []), j, tb[j], ta[j], tol
        ):
            v.near_ties += 1
        else:
            v.violations.append(f"output_mismatch choice {i} at token {j}: {ta[j]} vs {tb[j]}")


def _served_in_full(r: ArmReply, req: SoakRequest) -> bool:
    return (
        r.status == 200
        and r.done
        and r.error_type is None
        and len(r.tokens) == req.n
        and all(len(t) == req.max_tokens for t in r.tokens.values())
    )


def refused(r: ArmReply) -> bool:
    """A request the server refused as the client's fault: a 4xx, or (streaming) a 200 whose stream carried
    a client-error event (vLLM validates some inputs only once the stream has started)."""
    return 400 <= r.status < 500 or (r.status == 200 and (r.error_type or "").endswith("BadRequestError"))


def outcome(r: ArmReply) -> str:
    """The status a tally counts: ``refused`` for :func:`refused`, else the HTTP status."""
    return "refused" if refused(r) else str(r.status)


def check_pair(req: SoakRequest, a: ArmReply, b: ArmReply, tie_tol: float) -> PairVerdict:
    """Every per-request invariant of one request sent to both arms (a: baseline, b: candidate)."""
    v = PairVerdict()
    for name, r in (("baseline", a), ("candidate", b)):
        if r.status >= 500:
            v.violations.append(f"{name} 5xx: {r.status} {r.error_type}: {r.error[:120]}")
        if r.status == TRANSPORT or (r.status == 200 and not r.aborted and not r.done):
            v.violations.append(f"{name} broken stream: {r.error_type}: {r.error[:120]}")
    if (a.status, a.error_type) != (b.status, b.error_type):
        v.violations.append(f"status_mismatch: {a.status} {a.error_type} vs {b.status} {b.error_type}")
    if req.expect == ERROR and not all(refused(r) for r in (a, b)):
        v.violations.append(f"bad request not refused: {a.status} {a.error_type} / {b.status} {b.error_type}")
    if req.expect == OK and not (_served_in_full(a, req) and _served_in_full(b, req)):
        v.violations.append("good request not served in full")
    if req.expect == ABORT and not (a.aborted and b.aborted):
        v.violations.append(f"abort not cut mid-stream: {a.aborted} / {b.aborted}")
    if a.status == 200 and b.status == 200 and not refused(a) and not refused(b):
        if req.temperature > 0 and req.seed is None:  # unseeded sampling: only the lengths must agree
            for i in sorted(set(a.tokens) & set(b.tokens)):
                if len(a.tokens[i]) != len(b.tokens[i]):
                    v.violations.append(
                        f"output_length_mismatch choice {i}: {len(a.tokens[i])} vs {len(b.tokens[i])}"
                    )
        else:
            compare_tokens(a, b, prefix_only=req.expect == ABORT, tol=tie_tol, v=v)
    return v


def drain_violations(label: str, idle: Mapping, drained: Mapping) -> list[str]:
    """Leaks after drain: ``idle`` and ``drained`` are :func:`harness.soak.driver.idle_state` readings."""
    out = []
    if drained.get("free_blocks") is None:
        out.append(f"{label}: no placement telemetry line after drain")
    elif drained["free_blocks"] != idle.get("free_blocks"):
        out.append(
            f"{label}: free blocks {drained['free_blocks']} after drain, {idle.get('free_blocks')} idle "
            f"before traffic (pool {drained.get('num_blocks')})"
        )
    if drained.get("live_requests"):
        out.append(f"{label}: {drained['live_requests']} requests still hold blocks after drain")
    usage, usage0 = drained.get("kv_cache_usage"), idle.get("kv_cache_usage")
    if usage is None or usage0 is None or abs(usage - usage0) > 1e-9:
        out.append(f"{label}: KV usage gauge {usage} after drain, {usage0} idle")
    if drained.get("running") or drained.get("waiting"):
        out.append(
            f"{label}: {drained.get('running')} running / {drained.get('waiting')} waiting after drain"
        )
    return out


def rss_trend(
    t_s: Sequence[float], rss_bytes: Sequence[float], warmup_frac: float, max_growth_mib: float
) -> dict:
    """The fitted RSS slope after warm-up and the growth it implies over that window; ok when under bound
    (one arm's figure: the invariant is :func:`rss_bounded`, candidate against baseline)."""
    t, y = np.asarray(t_s, dtype=float), np.asarray(rss_bytes, dtype=float) / 2**20
    if len(t) == 0:
        return {"ok": False, "reason": "no RSS samples"}
    keep = t >= t[0] + warmup_frac * (t[-1] - t[0])
    t, y = t[keep], y[keep]
    if len(t) < 3 or t[-1] - t[0] <= 0:
        return {"ok": False, "reason": f"{len(t)} RSS samples after warm-up: too few to fit"}
    slope = float(np.polyfit(t, y, 1)[0])  # MiB per second
    growth = slope * float(t[-1] - t[0])
    return {
        "ok": growth <= max_growth_mib,
        "samples": int(len(t)),
        "window_s": float(t[-1] - t[0]),
        "slope_mib_per_min": slope * 60.0,
        "fitted_growth_mib": growth,
        "max_growth_mib": max_growth_mib,
        "rss_mib_first": float(y[0]),
        "rss_mib_last": float(y[-1]),
        "rss_mib_max": float(y.max()),
    }


def rss_bounded(trends: dict[str, dict], max_excess_mib: float) -> dict:
    """tagma adds no memory growth: the candidate's fitted growth after warm-up exceeds the baseline's by at
    most ``max_excess_mib``. Relative, because the baseline, stock vLLM on the same traffic, grows too (the
    first long soak: 5.4 MiB/min on vLLM for CPU 0.32.0), and a growth both arms show is not tagma's. Each
    arm's absolute growth against the same bound is reported beside it (``absolute_ok``). A baseline that
    shrank (memory returned after an early peak) counts as no growth: it does not make the candidate's own
    growth tagma's beyond what that growth is (a CI soak beside other tests: paged -242 MiB from a peak,
    tagma +111 MiB, both ending at 1,620 MiB)."""
    base, cand = trends.get("baseline", {}), trends.get("candidate", {})
    if "fitted_growth_mib" not in base or "fitted_growth_mib" not in cand:
        reasons = [t.get("reason") for t in (base, cand) if t.get("reason")]
        return {"ok": False, "reason": "; ".join(str(r) for r in reasons) or "an arm has no RSS fit"}
    excess = cand["fitted_growth_mib"] - max(base["fitted_growth_mib"], 0.0)
    return {
        "ok": excess <= max_excess_mib,
        "excess_mib": excess,
        "max_excess_mib": max_excess_mib,
        "absolute_ok": {name: t["fitted_growth_mib"] <= max_excess_mib for name, t in trends.items()},
    }
