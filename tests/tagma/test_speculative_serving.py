"""Real vLLM servers with speculative decoding (ngram, a draft model): tagma generates what paged generates.

ngram proposes drafts from the request's own tokens, so the KV manager sees a decode step of 1 + k tokens
whose rejected tail the scheduler takes back off ``num_computed_tokens`` (the next step rewrites those
slots). Two configurations, each a paged and a tagma server (started together, driven one after the other:
2 cores) given the same requests together:
- the tiny Llama with prefix caching on (tagma's prefix manager): prompts share a system prefix, so
  requests hit the cache while others speculate;
- the tiny Gemma 3 shape (5 window groups to 1 full) with prefix caching off (tagma's group manager:
  window groups drop blocks while drafts are scheduled and rejected). Not gpt-oss: in bfloat16 its greedy
  tokens under speculative decoding change with the batch (here a paged arm once proposed 905 drafts where
  three other paged runs proposed 907), so equality there would test vLLM's batch invariance, not tagma.
- a draft model (the tiny Llama drafting for itself) with prefix caching on: the drafter's layers join the
  target's KV cache group, so its KV lives in tagma's blocks and it drafts through the rows tagma
  materializes; drafting for itself, every draft is accepted unless the drafter reads the wrong KV (seen
  here: 1,239 of 1,239 paged, 1,242 of 1,242 tagma; totals differ with where preemption fell).
- an EAGLE drafter (harness/serve/tiny_drafters.py: one random-weight layer on the target's hidden states,
  in the target's KV cache group) with prefix caching on: every hit loses its last block (use_eagle), the
  drafter reads one prefill token ahead and writes its KV into the request's blocks. Random weights propose
  tokens the target rarely accepts, so acceptance is not checked (the hit rule is checked against vLLM's
  manager in lockstep in tests/tagma/test_prefix_manager.py).
- an EAGLE-3 drafter (harness/serve/tiny_drafters.py: its layer reads the target's auxiliary hidden states
  from both of its layers through fc) with prefix caching on: for the KV cache the same as EAGLE (the
  target's group, the hit rule, one prefill token read ahead); what differs is the model runner's path (the
  target returns the auxiliary hidden states, the drafter combines them), which runs on both arms with
  tagma's block tables.
- a model with an MTP layer (harness/serve/tiny_drafters.py: a MiMo-shaped model, 2 Qwen2 layers and one
  random-weight MTP layer) drafting one token per step through vLLM's EAGLE path (method=mtp), prefix caching
  on: its MTP layer's KV joins the target's group; the same hit rule and read-ahead as EAGLE.
- an EAGLE-3 drafter built for the tiny Mistral shape (every layer a 1,024-token window; a Llama layer of the
  target's sizes): the drafter's layer takes the target's window (vLLM's Attention falls back to the
  model-level sliding window), so the three layers are one window group. Prefix caching off: tagma's group
  manager takes the lookahead slots; on: the group prefix manager finds cached blocks by content key and
  drops each hit's last block, as vLLM's EAGLE rule does (no group is marked, so every group drops).
Prompts repeat a phrase so that ngram finds drafts; greedy decoding; a pool small enough to preempt.
Token ids must be identical per request; on both arms drafts must have been proposed, some of ngram's
rejected and the self-drafting model's (nearly) all accepted; no block is held after the queue drained."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from harness.serve.launcher import Server, ServerSpec, serving
from harness.serve.tiny_drafters import build_eagle3_drafter, build_eagle_drafter, build_mtp_model
from harness.serve.tiny_families import FAMILIES, build_family
from tests.tagma.test_window_serving import _metrics, _post
from tests.tagma.tiny_configs import TINY_MODEL

pytestmark = pytest.mark.slow

SPECULATIVE = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                          "prompt_lookup_max": 4})  # fmt: skip
BACKENDS = ("paged", "tagma")  # started together, driven one after the other (2 cores)
METRICS = {
    "vllm:num_preemptions_total": "preemptions",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",
}


# A draft model: the tiny Llama drafting for itself. Its layers join the target's KV cache group, so its KV
# lives in the request's blocks; it drafts from its own KV (slots from the block-table rows tagma
# materializes), so a drafter reading wrong KV would propose other tokens and lose acceptance.
DRAFT_MODEL = json.dumps({"method": "draft_model", "model": str(TINY_MODEL), "num_speculative_tokens": 3})


@dataclass(frozen=True)
class Case:
    family: str  # "llama" (the tiny model), "mimo" (build_mtp_model) or a tiny_families name
    pool_blocks: int  # every request fits alone, the concurrent wave does not
    caching: bool
    speculative: str = SPECULATIVE
    prompt_tokens: tuple[int, int] = (300, 1400)  # the plan's range of prompt lengths
    output_tokens: tuple[int, int] = (100, 300)  # and of max_tokens
    target_drafter: str | None = None  # "eagle" | "eagle3": a drafter built for the case's own target


# An EAGLE drafter, built at test time into data/ beside the tiny model (EAGLE_DRAFTER).
EAGLE_DRAFTER = TINY_MODEL.parent / "tiny-eagle"
EAGLE = json.dumps({"method": "eagle", "model": str(EAGLE_DRAFTER), "num_speculative_tokens": 3})
EAGLE3_DRAFTER = TINY_MODEL.parent / "tiny-eagle3"
EAGLE3 = json.dumps({"method": "eagle3", "model": str(EAGLE3_DRAFTER), "num_speculative_tokens": 3})
# A model that carries its drafter (one MTP layer), built at test time into data/.
MTP_MODEL = TINY_MODEL.parent / "tiny-mimo-mtp"
MTP = json.dumps({"method": "mtp", "num_speculative_tokens": 1})

CASES = {
    "llama-caching": Case("llama", pool_blocks=90, caching=True),
    # Preempts by construction: any two of these requests outgrow 310 blocks before either finishes (a
    # 700-900-token prompt takes 22-29 blocks in each of the six groups; 250-350 output tokens carry
    # 950-1,250-token sequences to 180-205 blocks, the windows capped at 33), and one fits alone. With
    # 300-1,400-token prompts past the window, whose window groups stop growing, a CI run once had none.
    "gemma3-window": Case("gemma3", pool_blocks=310, caching=False, prompt_tokens=(700, 900),
                          output_tokens=(250, 350)),
    "llama-draft-model": Case("llama", pool_blocks=90, caching=True, speculative=DRAFT_MODEL),
    "llama-eagle": Case("llama", pool_blocks=90, caching=True, speculative=EAGLE),
    "llama-eagle3": Case("llama", pool_blocks=90, caching=True, speculative=EAGLE3),
    "mimo-mtp": Case("mimo", pool_blocks=90, caching=True, speculative=MTP),
    # An EAGLE-3 drafter beside the Mistral shape's two window layers (every layer slides, the drafter's too,
    # window 1,024: one window group of three layers), caching off (the group range manager). Preempts: a
    # request's 700-1,200-token sequence holds up to 33 blocks of 32 tokens (the window's), so the six
    # running at once (--max-num-seqs 6) outgrow 140 blocks once they decode (seen: 2 preemptions each).
    "mistral-eagle3": Case("mistral", pool_blocks=140, caching=False, prompt_tokens=(300, 600),
                           output_tokens=(400, 600), target_drafter="eagle3"),
    # The same with prefix caching on (the group prefix manager, content keys, vLLM's unitary EAGLE rule: a
    # hit's last block dropped); the system prefix is hit. Seen here: 448 hit tokens and 4 / 9 preemptions
    # (paged / tagma), token-identical.
    "mistral-eagle3-caching": Case("mistral", pool_blocks=140, caching=True, prompt_tokens=(300, 600),
                                   output_tokens=(400, 600), target_drafter="eagle3"),
}  # fmt: skip
DRAFTER_BUILDERS = {"eagle": build_eagle_drafter, "eagle3": build_eagle3_drafter}


def plan(case: Case, seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens): a 96-token system prefix shared by all, then a 20-60-token phrase repeated to
    the case's prompt length (ngram's drafts come from repeats), and its output length."""
    rng = random.Random(seed)
    system = [rng.randrange(3, 1000) for _ in range(96)]
    out = []
    for _ in range(8):
        phrase = [rng.randrange(3, 1000) for _ in range(rng.randint(20, 60))]
        prompt = (system + phrase * 70)[: rng.randint(*case.prompt_tokens)]
        out.append((prompt, rng.randint(*case.output_tokens)))
    return out


def server_spec(case: Case, model: Path, backend: str) -> ServerSpec:
    args = ["--block-size", "32", "--max-num-seqs", "6", "--max-num-batched-tokens", "512", "--seed", "0",
            "--speculative-config", case.speculative]  # fmt: skip
    if not case.caching:
        args.append("--no-enable-prefix-caching")
    dtype = FAMILIES[case.family].dtype if case.family in FAMILIES else "float32"
    return ServerSpec(
        model=str(model),
        backend=backend,
        dtype=dtype,
        max_model_len=2048,
        kv_cache_space_gib=1,
        num_gpu_blocks_override=case.pool_blocks,
        extra_args=tuple(args),
    )


def drive(case: Case, model: Path, server: Server) -> dict[str, Any]:
    requests = plan(case)
    with ThreadPoolExecutor(len(requests)) as pool:
        futures = [pool.submit(_post, server.base_url, str(model), p, n) for p, n in requests]
        tokens = [f.result() for f in futures]
    return {"tokens": tokens, **_metrics(server.base_url, METRICS)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tok_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("speculative-serving")
    build_eagle_drafter(EAGLE_DRAFTER, TINY_MODEL)
    build_eagle3_drafter(EAGLE3_DRAFTER, TINY_MODEL)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, case in CASES.items():
        if case.family == "mimo":
            model = build_mtp_model(MTP_MODEL, TINY_MODEL)
        else:
            model = TINY_MODEL if case.family == "llama" else build_family(root / name, case.family, tok_dir)
        if case.target_drafter is not None:
            drafter = DRAFTER_BUILDERS[case.target_drafter](root / f"{name}-drafter", model)
            speculative = {"method": case.target_drafter, "model": str(drafter), "num_speculative_tokens": 3}
            case = replace(case, speculative=json.dumps(speculative))
        specs = [(server_spec(case, model, b), root / f"{name}-{b}.log") for b in BACKENDS]
        with serving(specs) as servers:
            out[name] = {b: drive(case, model, server) for b, server in zip(BACKENDS, servers, strict=True)}
    summary = {n: {b: {k: v for k, v in r.items() if k != "tokens"} for b, r in arms.items()}
               for n, arms in out.items()}  # fmt: skip
    print("speculative serving:", json.dumps(summary))
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_tagma_generates_what_paged_generates(runs: dict[str, dict[str, dict[str, Any]]], name: str) -> None:
    paged, tagma = runs[name]["paged"], runs[name]["tagma"]
    for i, (a, b) in enumerate(zip(paged["tokens"], tagma["tokens"], strict=True)):
        assert a == b, f"{name} request {i}: tagma's tokens differ from paged's"
    for arm in (paged, tagma):
        if CASES[name].speculative == DRAFT_MODEL:  # drafting for itself from its KV in the request's blocks
            assert arm["draft_tokens"] > 0 and arm["accepted_tokens"] >= 0.99 * arm["draft_tokens"], arm
        elif CASES[name].speculative in (EAGLE, EAGLE3, MTP) or CASES[name].target_drafter:  # random weights
            assert arm["draft_tokens"] > 0, arm
        else:
            assert 0 < arm["accepted_tokens"] < arm["draft_tokens"], f"{name}: drafts proposed, some rejected"
    assert max(paged["preemptions"], tagma["preemptions"]) > 0, f"{name}: the pool is meant to preempt"
    if CASES[name].caching:
        assert paged["prefix_hits"] > 0 and tagma["prefix_hits"] > 0, "the shared system prefix is hit"


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_block_is_held_after_drain(runs: dict[str, dict[str, dict[str, Any]]], name: str) -> None:
    assert runs[name]["tagma"]["kv_usage"] == 0.0
    assert runs[name]["paged"]["kv_usage"] == 0.0
