"""Where the time goes: cProfile of the manager operations on both sides (top functions by own time).

cProfile adds a fixed cost to every Python call, so absolute times are inflated and call-heavy code looks
worse; the shares still say which functions dominate. Profiled: admission + free of one request at
``profile.context`` tokens (prefix caching off and on), and a decode step of ``profile.decode_requests``
requests of ``profile.decode_context`` tokens (prefix caching on).
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable
from typing import Any

from vllm.v1.request import RequestStatus

from benchmarks.host.manager_ops import SIDES, Tokens, admit, build_managers, make_request

__all__ = ["run"]


def _top(profile: cProfile.Profile, top: int) -> dict[str, Any]:
    stats = pstats.Stats(profile)
    raw = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())  # own time of every function
    rows = []
    for (filename, line, name), (_cc, ncalls, tottime, cumtime, _callers) in raw.items():
        rows.append(
            {
                "function": f"{name} ({_short(filename)}:{line})",
                "ncalls": ncalls,
                "own_s": tottime,
                "own_share": tottime / total if total else 0.0,
                "cum_s": cumtime,
            }
        )
    rows.sort(key=lambda r: r["own_s"], reverse=True)
    return {"total_own_s": total, "top": rows[:top]}


def _short(filename: str) -> str:
    for marker in ("site-packages/", "/work/main/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def _profiled(fn: Callable[[], None], repeats: int, top: int) -> dict[str, Any]:
    fn()  # warm
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(repeats):
        fn()
    profile.disable()
    out = _top(profile, top)
    out["repeats"] = repeats
    return out


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    pcfg = cfg["profile"]
    block_size = int(cfg["block_size"])
    top = int(pcfg["top"])
    policy = cfg["manager"]["policy"]
    context = int(pcfg["context"])
    n = context // block_size
    out: dict[str, Any] = {"description": __doc__}
    for caching in (False, True):
        managers = build_managers(
            (2 * n if caching else n) + 64, block_size, context + block_size, caching, policy
        )
        for side in SIDES:
            manager = managers[side]
            tokens = Tokens(cfg["seed"])
            # Request construction (it hashes the prompt) stays out of the profile: build them first.
            count = int(pcfg["repeats"]) + 1
            if caching:
                reqs = [make_request(f"p{i}", tokens(context), block_size, True) for i in range(count)]
            else:
                reqs = [make_request("p", tokens(context), block_size, False)] * count
            it = iter(reqs)

            def step(manager: Any = manager, it: Any = it) -> None:
                req = next(it)
                admit(manager, req)
                manager.free(req)

            out[f"admission_free_caching_{'on' if caching else 'off'}_{side}"] = _profiled(
                step, int(pcfg["repeats"]), top
            )
        del managers
    # decode step
    requests, dctx = int(pcfg["decode_requests"]), int(pcfg["decode_context"])
    steps = int(pcfg["decode_steps"])
    managers = build_managers(
        requests * (dctx // block_size + steps // block_size + 3) + 64,
        block_size,
        dctx + steps + block_size,
        True,
        policy,
    )
    tokens = Tokens(cfg["seed"] + 1)
    prompts = [tokens(dctx - i % block_size) for i in range(requests)]
    for side in SIDES:
        manager = managers[side]
        reqs = [make_request(f"d{i}", prompts[i], block_size, True) for i in range(requests)]
        for req in reqs:
            admit(manager, req)
            req.num_computed_tokens = req.num_tokens
            req.status = RequestStatus.RUNNING
        profile = cProfile.Profile()
        for _ in range(steps):
            for req in reqs:
                req.append_output_token_ids(7)
            profile.enable()
            manager.new_step_starts()
            for req in reqs:
                manager.allocate_slots(req, 1)
            profile.disable()
            for req in reqs:
                req.num_computed_tokens += 1
        res = _top(profile, top)
        res["steps"] = steps
        res["requests"] = requests
        out[f"decode_step_caching_on_{side}"] = res
    return out
