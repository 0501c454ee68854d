"""The soak's traffic: a seeded plan of request kinds, one request per index, the same on both arms.

Every prompt is a list of token ids (exact lengths, no tokenizer in the loop). Request ``i`` depends only on
``(seed, i)``, so the plan does not depend on the order in which concurrent workers draw indices. The first
indices go through every kind with a positive weight once (each kind is exercised even in a short run);
after that kinds are drawn by weight.

``KINDS`` maps each kind to what it expects: ``OK``, 200 and exactly ``max_tokens`` tokens per choice
(``ignore_eos``); ``ERROR``, refused (a 4xx, or a client-error event once the stream started); ``EITHER``,
whatever the first arm says the second must say too;
``ABORT``, the client closes the stream after ``abort_after`` token chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

OK, ERROR, EITHER, ABORT = "ok", "error", "either", "abort"
# kind -> expected outcome; the docstring of each builder below says what the kind is
KINDS: dict[str, str] = {
    "plain": OK,  # a unique prompt, a short decode
    "shared_prefix": OK,  # a tenant's system prompt (shared with its other requests) + a unique question
    "long_decode": OK,  # a long decode that fills the small pool: preemption
    "max_tokens_1": OK,  # one output token
    "at_limit": OK,  # prompt + max_tokens == max_model_len
    # n > 1 needs sampling (vLLM refuses n > 1 under greedy); unseeded: vLLM for CPU kills its engine core on
    # a seeded request whose prefill is chunked ("CPU Generator does not use offset", seen here; vLLM's
    # model runner code, the same on both arms), so only the lengths are compared
    "n_sampled": OK,
    "abort": ABORT,  # the client disconnects mid-stream
    "over_limit_prompt": ERROR,  # the prompt alone is longer than max_model_len
    "over_limit_total": EITHER,  # the prompt fits, prompt + max_tokens does not (vLLM 0.32 serves it)
    "invalid_token": ERROR,  # a token id outside the vocabulary
    "empty_ids": ERROR,  # prompt: []
    "empty_text": EITHER,  # prompt: "" (accepted or refused, the same on both arms)
    "n_greedy": ERROR,  # n > 1 with temperature 0 (refused by vLLM)
}
FIRST_TOKEN = 3  # ids 0, 1, 2 are bos, eos and pad in the tiny model


@dataclass(frozen=True)
class TrafficConfig:
    """The mix: weights per kind and the sizes each kind draws from (inclusive ranges)."""

    max_model_len: int
    vocab_size: int
    seed: int = 0
    weights: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 1.0))
    tenants: int = 4
    global_prefix_tokens: int = 256  # the same tokens in every tenant's system prompt (salts keep them apart)
    tenant_prefix_tokens: int = 192
    suffix_tokens: tuple[int, int] = (16, 128)
    plain_prompt: tuple[int, int] = (16, 512)
    plain_output: tuple[int, int] = (4, 48)
    long_prompt: tuple[int, int] = (256, 768)
    long_output: tuple[int, int] = (128, 384)
    abort_output: int = 256
    abort_after: tuple[int, int] = (1, 4)
    limit_output: int = 4
    n_choices: int = 2

    def __post_init__(self) -> None:
        unknown = set(self.weights) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown traffic kinds {sorted(unknown)}; known: {list(KINDS)}")
        if not any(w > 0 for w in self.weights.values()):
            raise ValueError("at least one traffic kind needs a positive weight")
        if (
            self.global_prefix_tokens + self.tenant_prefix_tokens + self.suffix_tokens[1]
            >= self.max_model_len
        ):
            raise ValueError("the shared prefix and suffix must fit max_model_len")

    @classmethod
    def from_dict(cls, d: dict[str, Any], max_model_len: int, vocab_size: int) -> TrafficConfig:
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        if "weights" in kw:
            kw["weights"] = {str(k): float(v) for k, v in dict(kw["weights"]).items()}
        return cls(max_model_len=max_model_len, vocab_size=vocab_size, **kw)

    @property
    def active_kinds(self) -> list[str]:
        return [k for k in KINDS if self.weights.get(k, 0.0) > 0]


@dataclass(frozen=True)
class SoakRequest:
    index: int
    kind: str
    expect: str
    prompt: list[int] | str
    max_tokens: int
    tenant: str | None = None
    n: int = 1
    temperature: float = 0.0
    seed: int | None = None
    abort_after: int | None = None

    def body(self, model: str) -> dict[str, Any]:
        """The /v1/completions body: streamed, token ids and top-2 logprobs back (to explain near-ties)."""
        body: dict[str, Any] = {
            "model": model,
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "n": self.n,
            "temperature": self.temperature,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
            "logprobs": 2,
            "return_tokens_as_token_ids": True,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        if self.tenant is not None:
            body["cache_salt"] = self.tenant
        return body


def _ids(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return [int(x) for x in rng.integers(FIRST_TOKEN, vocab, size=n)]


def _between(rng: np.random.Generator, lo_hi: tuple[int, int]) -> int:
    return int(rng.integers(lo_hi[0], lo_hi[1] + 1))


class TrafficPlan:
    """Request ``i`` of the soak (see the module docstring)."""

    def __init__(self, cfg: TrafficConfig) -> None:
        self.cfg = cfg
        self.kinds = cfg.active_kinds
        w = np.asarray([cfg.weights[k] for k in self.kinds], dtype=float)
        self.p = w / w.sum()
        root = np.random.default_rng([cfg.seed, 1_000_003])
        shared = _ids(root, cfg.global_prefix_tokens, cfg.vocab_size)
        self.tenant_prefix = {
            f"tenant-{t}": shared + _ids(root, cfg.tenant_prefix_tokens, cfg.vocab_size)
            for t in range(cfg.tenants)
        }

    def kind_of(self, index: int, rng: np.random.Generator) -> str:
        if index < len(self.kinds):
            return self.kinds[index]
        return self.kinds[int(rng.choice(len(self.kinds), p=self.p))]

    def request(self, index: int) -> SoakRequest:
        c = self.cfg
        rng = np.random.default_rng([c.seed, index])
        kind = self.kind_of(index, rng)
        tenant = f"tenant-{int(rng.integers(c.tenants))}"
        base = {"index": index, "kind": kind, "expect": KINDS[kind], "tenant": tenant}
        ids = lambda n: _ids(rng, n, c.vocab_size)  # noqa: E731
        if kind == "shared_prefix":
            prompt = self.tenant_prefix[tenant] + ids(_between(rng, c.suffix_tokens))
            return SoakRequest(prompt=prompt, max_tokens=_between(rng, c.plain_output), **base)
        if kind == "long_decode":
            return SoakRequest(
                prompt=ids(_between(rng, c.long_prompt)), max_tokens=_between(rng, c.long_output), **base
            )
        if kind == "max_tokens_1":
            return SoakRequest(prompt=ids(_between(rng, c.plain_prompt)), max_tokens=1, **base)
        if kind == "at_limit":
            return SoakRequest(
                prompt=ids(c.max_model_len - c.limit_output), max_tokens=c.limit_output, **base
            )
        if kind == "n_sampled":
            return SoakRequest(
                prompt=ids(_between(rng, c.plain_prompt)),
                max_tokens=_between(rng, c.plain_output),
                n=c.n_choices,
                temperature=0.8,
                **base,
            )
        if kind == "abort":
            return SoakRequest(
                prompt=ids(_between(rng, c.plain_prompt)),
                max_tokens=c.abort_output,
                abort_after=_between(rng, c.abort_after),
                **base,
            )
        if kind == "over_limit_prompt":
            return SoakRequest(prompt=ids(c.max_model_len + _between(rng, (1, 256))), max_tokens=4, **base)
        if kind == "over_limit_total":
            return SoakRequest(prompt=ids(c.max_model_len - 8), max_tokens=64, **base)
        if kind == "invalid_token":
            prompt = ids(_between(rng, (8, 64)))
            prompt[int(rng.integers(len(prompt)))] = c.vocab_size + int(rng.integers(1, 1000))
            return SoakRequest(prompt=prompt, max_tokens=4, **base)
        if kind == "empty_ids":
            return SoakRequest(prompt=[], max_tokens=4, **base)
        if kind == "empty_text":
            return SoakRequest(prompt="", max_tokens=4, **base)
        if kind == "n_greedy":
            return SoakRequest(prompt=ids(_between(rng, (8, 64))), max_tokens=4, n=c.n_choices, **base)
        return SoakRequest(
            prompt=ids(_between(rng, c.plain_prompt)), max_tokens=_between(rng, c.plain_output), **base
        )
