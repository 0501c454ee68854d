"""Real vLLM servers on the sliding-window families (tiny gpt-oss, Gemma 3 and Mistral shapes, random
weights): tagma's group managers generate exactly what paged generates, with prefix caching on (vLLM's
default; tagma's group prefix manager: gpt-oss's and Gemma 3's window blocks cached at the full group's index
nodes, Mistral's, whose every layer slides, under chained content keys).

Per family, a paged and a tagma server with the same settings (started together, driven one after the
other: 2 cores) get the same requests together: prompts past the window (so window groups drop blocks while
prefilling in chunks and while decoding), greedy decoding, a KV pool small enough that the scheduler preempts
(gpt-oss: one request at a time, see MAX_NUM_SEQS). The generated token ids must be identical per request,
the pool must have preempted, and after the queue drained the tagma server's KV usage is back to zero (no
block leaked). With caching on, a chain of requests runs one at a time first (a prompt, its resend, two
prompts sharing its prefix: the window's hit rules and vLLM's sparse window retention decide every hit, with
no timing in it), and both arms must hit equally; the concurrent wave that follows (caching on or off) is
where the pool preempts. The paged arm is vLLM's own result: what tagma must match."""

from __future__ import annotations

import json
import random
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.host_time import load_run
from harness.serve.launcher import Server, ServerSpec, serving
from harness.serve.server_telemetry import parse_prometheus
from harness.serve.tiny_families import FAMILIES, build_family
from tagma.contract import ENV_HOST_TIME_FILE, ENV_HOST_TIME_FLUSH_S, ENV_HOST_TIME_GROUPS, HOST_TIME_FILE

pytestmark = pytest.mark.slow

BLOCK = 32
MAX_MODEL_LEN = 2048
# Blocks in the pool per family: every request fits alone, the concurrent wave does not (preemption).
# (Gemma 3's six groups: one 1,500-token request peaks near 290 blocks while its window groups prefill.)
POOL_BLOCKS = {"gpt-oss": 140, "mistral": 110, "gemma3": 310}
WINDOW_FAMILIES = tuple(POOL_BLOCKS)
BACKENDS = ("paged", "tagma")
# Requests running together per family. gpt-oss runs one at a time: in bfloat16 its greedy tokens depend on
# which requests share a step, so paged itself is not reproducible with a concurrent wave (3 paged runs of
# this test's wave here: 2 of the 3 pairs differed, at token 200 of one request and 298 of another), and a
# tagma-vs-paged equality would test vLLM's batch invariance. Alone it still drops window blocks while
# prefilling in chunks and decoding; preemption is exercised on the two float32 families.
MAX_NUM_SEQS = {"gpt-oss": 1, "mistral": 6, "gemma3": 6}
PREFIX_CACHING = {"gpt-oss": True, "mistral": True, "gemma3": True}
SERVER_ARGS = (
    "--block-size", str(BLOCK),
    "--max-num-batched-tokens", "512",  # chunked prefill: window groups drop blocks between chunks
    "--seed", "0",
)  # fmt: skip
METRICS = {
    "vllm:num_preemptions_total": "preemptions",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:prefix_cache_hits_total": "prefix_hits",
}
REQUEST_TIMEOUT_S = 900


def plan(seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens): prompts of 100-1,500 tokens, 150-400 output tokens (decode growth is what
    overflows the pool: vLLM admits a request only when its whole sequence so far fits)."""
    rng = random.Random(seed)
    return [
        ([rng.randrange(3, 1000) for _ in range(rng.randint(100, 1500))], rng.randint(150, 400))
        for _ in range(10)
    ]


def chain(seed: int = 1) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens), sent one at a time: A (a 700-token prefix P + 300 tokens), A again (a resend:
    the full group's hit and the window's tail before A's replay boundary), P + 200 tokens (the full group
    hits P; a short window finds no tail there: a shared-prefix junction), P + 250 tokens (the junction's
    tail, cached by the previous request, makes the window hit)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 1000) for _ in range(700)]
    first = prefix + [rng.randrange(3, 1000) for _ in range(300)]
    return [(first, 50), (list(first), 50),
            (prefix + [rng.randrange(3, 1000) for _ in range(200)], 50),
            (prefix + [rng.randrange(3, 1000) for _ in range(250)], 50)]  # fmt: skip


def _post(base_url: str, model: str, prompt: list[int], max_tokens: int) -> list[int]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}  # fmt: skip
    req = urllib.request.Request(
        base_url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
        return list(json.loads(r.read())["choices"][0]["token_ids"])


def _metrics(base_url: str, names: dict[str, str] = METRICS) -> dict[str, float]:
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as r:
        return parse_prometheus(r.read().decode(), names)


def server_spec(name: str, model: Path, backend: str, host_dir: Path) -> ServerSpec:
    # kv_cache_space_gib fixes vLLM for CPU's KV memory: without it vLLM reserves a share of the RAM and
    # refuses to start when other processes hold more than the rest (a fresh CI run hit this).
    # The in-server host time per KV cache group is on (it changes no token): test_host_time_per_group.
    host_dir.mkdir(parents=True, exist_ok=True)
    env = {ENV_HOST_TIME_FILE: str(host_dir / HOST_TIME_FILE), ENV_HOST_TIME_GROUPS: "1",
           ENV_HOST_TIME_FLUSH_S: "0.2"}  # fmt: skip
    return ServerSpec(model=str(model), backend=backend, dtype=FAMILIES[name].dtype, env=env,
                      max_model_len=MAX_MODEL_LEN, kv_cache_space_gib=1,
                      num_gpu_blocks_override=POOL_BLOCKS[name],
                      extra_args=(*SERVER_ARGS, "--max-num-seqs", str(MAX_NUM_SEQS[name]),
                                  "--enable-prefix-caching" if PREFIX_CACHING[name]
                                  else "--no-enable-prefix-caching"))  # fmt: skip


def drive(name: str, model: Path, server: Server) -> dict[str, Any]:
    tokens = []
    chain_hits = 0.0
    if PREFIX_CACHING[name]:
        tokens = [_post(server.base_url, str(model), p, n) for p, n in chain()]
        chain_hits = _metrics(server.base_url)["prefix_hits"]
    requests = plan()
    with ThreadPoolExecutor(len(requests)) as pool:
        futures = [pool.submit(_post, server.base_url, str(model), p, n) for p, n in requests]
        tokens += [f.result() for f in futures]
    after = _metrics(server.base_url)
    return {"tokens": tokens, "chain_hits": chain_hits, **after}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tok_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("window-serving")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name in WINDOW_FAMILIES:
        model = build_family(root / name, name, tok_dir)
        specs = [(server_spec(name, model, b, root / f"{name}-{b}"), root / f"{name}-{b}.log")
                 for b in BACKENDS]  # fmt: skip
        with serving(specs) as servers:
            out[name] = {b: drive(name, model, server) for b, server in zip(BACKENDS, servers, strict=True)}
        for b in BACKENDS:  # the servers have stopped: their last host-time records are on disk
            out[name][b]["host_time"] = load_run(root / f"{name}-{b}")
    shown = lambda r: {k: v for k, v in r.items() if k not in ("tokens", "host_time")}  # noqa: E731
    summary = {n: {b: shown(r) for b, r in arms.items()} for n, arms in out.items()}
    print("window serving:", json.dumps(summary))
    return out


@pytest.mark.parametrize("name", WINDOW_FAMILIES)
def test_tagma_generates_what_paged_generates(runs: dict[str, dict[str, dict[str, Any]]], name: str) -> None:
    paged, tagma = runs[name]["paged"], runs[name]["tagma"]
    for i, (a, b) in enumerate(zip(paged["tokens"], tagma["tokens"], strict=True)):
        assert a == b, f"{name} request {i}: tagma's tokens differ from paged's"
    # Which requests run together depends on arrival timing, so the count differs between runs; the pool
    # is sized so that the scheduler preempts.
    if MAX_NUM_SEQS[name] > 1:
        assert max(paged["preemptions"], tagma["preemptions"]) > 0, f"{name}: the pool is meant to preempt"
    if PREFIX_CACHING[name]:
        assert paged["chain_hits"] == tagma["chain_hits"] > 0, f"{name}: the chain's hits differ or are none"
    else:
        assert paged["prefix_hits"] == tagma["prefix_hits"] == 0


@pytest.mark.parametrize("name", WINDOW_FAMILIES)
def test_no_block_is_held_after_drain(runs: dict[str, dict[str, dict[str, Any]]], name: str) -> None:
    assert runs[name]["tagma"]["kv_usage"] == 0.0
    assert runs[name]["paged"]["kv_usage"] == 0.0


# Groups per family (vLLM's grouping of the tiny models' layers): gpt-oss a window and a full group, Gemma 3
# five window groups and one full, Mistral one window group (one group: no per-group timers).
GROUPS = {
    "gpt-oss": ["kv_group0_window128", "kv_group1_full"],
    "gemma3": [*(f"kv_group{g}_window1024" for g in range(5)), "kv_group5_full"],
    "mistral": [],
}


@pytest.mark.parametrize("name", WINDOW_FAMILIES)
def test_host_time_per_group(runs: dict[str, dict[str, dict[str, Any]]], name: str) -> None:
    """Both arms time the KV manager per group on the same terms: the same groups, each with time in the
    busy steps, their sum inside the manager's own time."""
    for backend in BACKENDS:
        run = runs[name][backend]["host_time"]
        assert run.backend == backend
        assert sorted(run.groups) == sorted(GROUPS[name]), (backend, run.groups)
        if not run.groups:
            continue
        steps = run.steps
        busy = steps["num_tokens"] > 0
        for group in run.groups:
            assert steps[f"{group}_ns"][busy].sum() > 0, (backend, group)
        in_groups = sum(steps[f"{g}_ns"][busy].sum() for g in run.groups)
        assert in_groups < steps["kv_manager_total_ns"][busy].sum(), backend
