"""Real vLLM servers on the bfloat16 tiny families beside the window ones: the DeepSeek-V2 shape (MLA: one
latent KV per token, rank 512 + rope 64), the Qwen3-Next shape (Gated DeltaNet state layers beside full
attention) and the Llama 4 shape (chunked local attention beside full attention), random weights: tagma
generates exactly what paged generates.

MLA is one KV cache group that the manager treats as full attention; what differs is the worker's cache op
(``do_kv_cache_update`` of the MLA backend), which writes each token's latent through the slot mapping tagma
computes from its ranges, and the decode kernel, which reads the block table tagma's rows materialize.
Qwen3-Next gives two groups of equal page size (vLLM pads them: attention blocks of 640 tokens here, one state
block of max_model_len tokens per request with caching off, state blocks of 640 tokens with caching on),
served by tagma's group managers; its GDN layers read their state block from the state group's row. Cases:
- ``mla-amx``: vLLM's default MLA backend on a CPU with AMX tiles (block 128; chunked prefill and prefix
  caching on): tagma's prefix-index manager; prompts share prefixes, so later requests hit the cache;
- ``mla-reference``: the reference CPU MLA backend (``--attention-backend CPU_MLA``), whose kernel needs
  block 16, with prefix caching off (that backend has none): tagma's range manager;
- ``gdn``: Qwen3-Next, prefix caching off, prefill in 512-token chunks, so the state carries across chunks;
- ``gdn-caching``: the same with prefix caching on (vLLM's mamba cache mode "align", tagma's group prefix
  manager): states kept at block boundaries, a hit resumes from the cached state at the prompt's last
  boundary (null blocks before it), the row's state blocks moving with the prefill;
- ``chunked-local``: Llama 4, prefix caching off, chunk 256: a request releases its chunked group's blocks
  at each chunk boundary (one engine call), prefill in 512-token chunks crossing them;
- ``chunked-local-caching``: the same with prefix caching on (tagma's group prefix manager): a hit needs
  the chunked group's cached blocks from the chunk its end falls in (null blocks before), as vLLM's rule.
One request at a time: in bfloat16 (the only dtype these take here) greedy tokens depend on which requests
share a step. Here a wave of 10 requests, 4 or 6 at a time, differed paged vs paged on 5 to 6 of the 10 (both
families), so a concurrent equality would test vLLM's batch invariance, not tagma. Preemption is covered on
the float32 families in test_window_serving.py and on these layouts in the lockstep tests. Token ids must be
identical per request, prefix-cache hits equal (and present with caching on), every computed position
written through tagma's range write path, and no block held after the queue drained.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.serve.launcher import Server, ServerSpec, serving
from harness.serve.tiny_families import FAMILIES, build_family
from tagma.worker import write_path_counter
from tests.tagma.test_window_serving import _metrics, _post

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 2048
BACKENDS = ("paged", "tagma")  # started together, driven one after the other (2 cores)
METRICS = {
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:prefix_cache_queries_total": "prefix_queries",
}


@dataclass(frozen=True)
class Case:
    family: str
    extra_args: tuple[str, ...]
    caching: bool
    needs_amx: bool = False


CASES = {
    "mla-amx": Case("deepseek-v2", ("--max-num-batched-tokens", "512"), caching=True, needs_amx=True),
    "mla-reference": Case("deepseek-v2", ("--attention-backend", "CPU_MLA", "--no-enable-prefix-caching"),
                          caching=False),
    "gdn": Case("qwen3-next", ("--max-num-batched-tokens", "512", "--no-enable-prefix-caching"),
                caching=False),
    # prefix caching on: state checkpoints (mode align) at the full group's prefix index
    "gdn-caching": Case("qwen3-next", ("--max-num-batched-tokens", "512"), caching=True),
    # chunked local attention (chunk 256) beside full attention; prefill chunks of 512 cross its chunks
    "chunked-local": Case("llama4", ("--max-num-batched-tokens", "512", "--no-enable-prefix-caching"),
                          caching=False),
    # the same with prefix caching on: the chunked group's cached blocks kept at the full group's index
    "chunked-local-caching": Case("llama4", ("--max-num-batched-tokens", "512"), caching=True),
}  # fmt: skip


def plan(seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens): 4 pairs of prompts, each pair sharing a 300-900-token prefix, then 50-400
    tokens of its own; 40-120 output tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(4):
        prefix = [rng.randrange(3, 1000) for _ in range(rng.randint(300, 900))]
        for _ in range(2):
            tail = [rng.randrange(3, 1000) for _ in range(rng.randint(50, 400))]
            out.append((prefix + tail, rng.randint(40, 120)))
    return out


def _amx() -> bool:
    import torch

    return bool(torch.cpu._is_amx_tile_supported())


def server_spec(model: Path, backend: str, case: Case, log: Path) -> ServerSpec:
    # The worker's write-path counter (written only by tagma's range write path) shows that the MLA cache
    # op got tagma's slot mapping: a fallback to vLLM's block table leaves no file.
    counters = log.parent / f"{log.stem}-write-path-{{pid}}.json"
    return ServerSpec(model=str(model), backend=backend, dtype=FAMILIES[case.family].dtype,
                      max_model_len=MAX_MODEL_LEN, kv_cache_space_gib=1,
                      extra_args=("--seed", "0", "--max-num-seqs", "1", *case.extra_args),
                      env={write_path_counter.ENV_COUNTER_FILE: str(counters),
                           write_path_counter.ENV_COUNTER_INTERVAL: "0"})  # fmt: skip


def drive(model: Path, server: Server) -> dict[str, Any]:
    tokens = [_post(server.base_url, str(model), p, n) for p, n in plan()]
    after = _metrics(server.base_url, METRICS)
    lines = server.log_text().splitlines()
    backend_line = next((ln for ln in lines if "MLA backend" in ln or "GDN" in ln), "")
    return {"tokens": tokens, "backend_line": backend_line, **after}


def range_write_positions(log: Path) -> int:
    """Positions tagma's range write path wrote, from the server's counter files (read once it stopped)."""
    return sum(json.loads(f.read_text())["positions"] for f in log.parent.glob(f"{log.stem}-write-path-*"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tok_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("bf16-serving")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, case in CASES.items():
        if case.needs_amx and not _amx():
            continue
        model = build_family(root / case.family, case.family, tok_dir)
        logs = {b: root / f"{name}-{b}.log" for b in BACKENDS}
        with serving([(server_spec(model, b, case, logs[b]), logs[b]) for b in BACKENDS]) as servers:
            out[name] = {b: drive(model, server) for b, server in zip(BACKENDS, servers, strict=True)}
        for b in BACKENDS:
            out[name][b]["range_write_positions"] = range_write_positions(logs[b])
    summary = {n: {b: {k: v for k, v in r.items() if k != "tokens"} for b, r in arms.items()}
               for n, arms in out.items()}  # fmt: skip
    print("bf16 family serving:", json.dumps(summary))
    return out


def _case(runs: dict[str, dict[str, dict[str, Any]]], name: str) -> dict[str, dict[str, Any]]:
    if name not in runs:
        pytest.skip(f"{name}: this CPU has no AMX tiles, so vLLM picks the reference MLA backend only")
    return runs[name]


@pytest.mark.parametrize("name", CASES)
def test_tagma_generates_what_paged_generates(runs: dict[str, dict[str, dict[str, Any]]], name: str) -> None:
    arms = _case(runs, name)
    paged, tagma = arms["paged"], arms["tagma"]
    for i, (a, b) in enumerate(zip(paged["tokens"], tagma["tokens"], strict=True)):
        assert a == b, f"{name} request {i}: tagma's tokens differ from paged's"
    assert paged["prefix_queries"] == tagma["prefix_queries"]
    assert paged["prefix_hits"] == tagma["prefix_hits"]
    if CASES[name].caching:
        assert tagma["prefix_hits"] > 0, f"{name}: shared prefixes are meant to hit the cache"
    # every prompt token not served from the cache, and each output token but the last, went through
    # tagma's write path; none on the paged arm
    computed = sum(len(p) + n - 1 for p, n in plan()) - tagma["prefix_hits"]
    assert tagma["range_write_positions"] >= computed, (tagma["range_write_positions"], computed)
    assert paged["range_write_positions"] == 0


@pytest.mark.parametrize("name", CASES)
def test_no_block_is_held_after_drain(runs: dict[str, dict[str, dict[str, Any]]], name: str) -> None:
    arms = _case(runs, name)
    assert arms["tagma"]["kv_usage"] == 0.0
    assert arms["paged"]["kv_usage"] == 0.0
