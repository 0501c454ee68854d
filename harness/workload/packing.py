"""Packed prompts: real ShareGPT text cut to an exact token count with the served model's tokenizer.

vLLM's own ShareGPT sampler drops prompts over 1024 tokens, so it never exercises long context. Here a
packed prompt is built from consecutive ShareGPT conversations (every turn, with light role markers), from
a seed-determined conversation on, and cut at a token's end offset, then re-tokenized and the cut moved
until the served model's tokenizer counts EXACTLY the drawn target. `prompt_tokens` is what the server
reports as usage.prompt_tokens for /v1/completions with a string prompt (special tokens the tokenizer adds,
e.g. BOS, included). Where no prefix cut can give the target (byte-level BPE: a cut inside "\n\n" before a
word), the prompt starts a word later; failing that, the closest cut within TOLERANCE (1%) is kept and its
real count recorded. Nothing outside the tolerance is ever accepted.

Each request starts at its own conversation and the spans follow one another (measured requests first,
then warm-up), so no two prompts share a prefix and the prefix cache cannot turn the run into a cache-hit
test. "natural" lengths use ShareGPT as it is: the first human turn is the prompt and the reply's token
length the output, like vLLM's sampler but without its caps.
"""

from __future__ import annotations

import bisect
import hashlib
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from harness.workload import sharegpt_file as sharegpt

TOLERANCE = 0.01  # largest relative prompt-length error accepted when no cut is exact
_ROLES = {"human": "User", "user": "User", "gpt": "Assistant", "chatgpt": "Assistant", "bing": "Assistant",
          "bard": "Assistant", "system": "System"}
_HEAD_CHARS = 32  # prompts differ within this many characters: inside the first KV block (16 tokens)
_WORD_START = re.compile(r"\s+(?=\S)")


# ---------------------------------------------------------------------------------------------- inputs


def _file_sha256(path: Path) -> str:
    st = path.stat()
    return _sha256_cached(str(path.resolve()), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=16)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


@lru_cache(maxsize=1)  # the decoded dataset is a few hundred MB of Python objects
def _load_dataset_cached(path: str, size: int, mtime_ns: int) -> tuple[list[dict], sharegpt.Provenance]:
    return sharegpt.load(Path(path))


def clear_caches() -> None:
    """Drop the in-process memos (the decoded dataset, token counts), e.g. once a run's workload is built."""
    _load_dataset_cached.cache_clear()
    _COUNTS.clear()


def _load_dataset(path: Path) -> tuple[list[dict], sharegpt.Provenance]:
    st = path.stat()
    return _load_dataset_cached(str(path), st.st_size, st.st_mtime_ns)


def _tokenizer_hashes(tokenizer_dir: Path) -> dict[str, str]:
    tj = tokenizer_dir / "tokenizer.json"
    if not tj.is_file():
        raise FileNotFoundError(f"{tj} not found: a fast tokenizer (tokenizer.json) is needed")
    out = {"tokenizer_json_sha256": _file_sha256(tj)}
    cfg = tokenizer_dir / "tokenizer_config.json"
    if cfg.is_file():
        out["tokenizer_config_sha256"] = _file_sha256(cfg)
    return out


class _Tokenizer:
    """The served model's fast tokenizer, batch-encoding with both special-token settings."""

    def __init__(self, tokenizer_dir: Path) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        self.tok.model_max_length = sys.maxsize  # counting only: no "longer than the model" warnings
        if not getattr(self.tok, "is_fast", False):
            raise TypeError(f"{tokenizer_dir}: a fast tokenizer is needed")
        self.num_special = len(self.tok("", add_special_tokens=True)["input_ids"])

    def count(self, texts: list[str], special: bool) -> list[int]:
        if not texts:
            return []
        ids = self.tok(texts, add_special_tokens=special)["input_ids"]
        return [len(x) for x in ids]

    def ends(self, texts: list[str]) -> list[list[int]]:
        """Per text, the character offset where each token ends (no special tokens)."""
        if not texts:
            return []
        enc = self.tok(texts, add_special_tokens=False, return_offsets_mapping=True)
        return [[e for _, e in offs] for offs in enc["offset_mapping"]]


def _load_tokenizer(tokenizer_dir: Path) -> _Tokenizer:
    return _Tokenizer(tokenizer_dir)


def _clean(s: str) -> str:
    """Text the tokenizer and UTF-8 accept (ShareGPT holds a few lone surrogates)."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "replace").decode("utf-8")


def _conversation_text(conv: dict) -> str:
    """All turns with light role markers; ends with one newline, so packed conversations split cleanly."""
    parts = []
    for turn in conv.get("conversations") or []:
        value = _clean(str(turn.get("value", ""))).strip()
        if value:
            parts.append(f"{_ROLES.get(turn.get('from'), 'User')}: {value}")
    return "\n\n".join(parts) + "\n" if parts else ""


def _first_exchange(conv: dict) -> tuple[str, str | None]:
    """The first human turn (as it is) and the reply that follows it ('' when none; None: no reply)."""
    turns = conv.get("conversations") or []
    for i, turn in enumerate(turns):
        if turn.get("from") in ("human", "user"):
            prompt = _clean(str(turn.get("value", "")))
            nxt = turns[i + 1] if i + 1 < len(turns) else None
            reply = _clean(str(nxt.get("value", ""))).strip() if nxt and nxt.get("from") == "gpt" else None
            return (prompt if prompt.strip() else ""), reply
    return "", None


# -------------------------------------------------------------------------------------------- packing

# Token counts per conversation text, per (dataset sha256, tokenizer hash): each conversation is tokenized
# once per process, however many workloads are built from it.
_COUNTS: dict[tuple[str, str], dict[int, int]] = {}


@dataclass
class _Span:
    convs: list[int]  # the conversations used (indices into the dataset), the last one cut
    cut_tokens: int  # tokens of the last conversation kept (by its own tokenization)
    target: int
    skip: int = 0  # characters skipped at the start (only when no cut of the whole span is exact)


_Natural = tuple[str, int, int, int]  # prompt, prompt tokens, reply tokens, conversation index


class _Builder:
    def __init__(self, items: list[dict], tok: _Tokenizer, counts: dict[int, int], start: int) -> None:
        self.items, self.tok, self.counts = items, tok, counts
        self.n = len(items)
        self.cursor = start
        self.walked = 0  # conversations passed over, to detect running out of dataset
        self.used_heads: set[str] = set()  # openings of the prompts so far: no two share a first KV block
        self.seen_prompts: set[str] = set()  # natural prompts taken (ShareGPT repeats some first turns)
        self._texts: dict[int, str] = {}
        self.fits = {"exact": 0, "adjusted": 0, "within_tolerance": 0, "max_abs_error": 0}

    def text(self, i: int) -> str:
        if i not in self._texts:
            self._texts[i] = _conversation_text(self.items[i])
        return self._texts[i]

    def _prefetch(self, i: int, tokens_wanted: int) -> None:
        """Count conversations from i on in one batch, about enough for tokens_wanted (4 chars a token)."""
        idx, chars = [], 0
        j = i
        while (chars < 4 * tokens_wanted or len(idx) < 16) and len(idx) < self.n:
            if j not in self.counts:
                idx.append(j)
                chars += len(self.text(j))
            j = (j + 1) % self.n
            if j == i:
                break
        for k, c in zip(idx, self.tok.count([self.text(k) for k in idx], special=False), strict=True):
            self.counts[k] = c

    def _count(self, i: int, tokens_wanted: int) -> int:
        if i not in self.counts:
            self._prefetch(i, tokens_wanted)
        return self.counts[i]

    def _advance(self) -> int:
        i = self.cursor
        self.cursor = (self.cursor + 1) % self.n
        self.walked += 1
        if self.walked > 3 * self.n:
            raise ValueError("the dataset is too small for this workload (it wrapped around three times)")
        return i

    def plan(self, targets: list[int]) -> list[_Span]:
        """Consecutive spans of conversations, one per target, each from a fresh start conversation."""
        spans = []
        for r, target in enumerate(targets):
            want = target - self.tok.num_special
            if want < 1:
                raise ValueError(f"target length {target} leaves no room for text after special tokens")
            remaining = sum(targets[r:]) - self.tok.num_special * (len(targets) - r)
            while True:  # a start: a non-empty conversation opening like no earlier prompt
                i = self._advance()
                head = self.text(i)[:_HEAD_CHARS]
                if head not in self.used_heads and self._count(i, remaining) > 0:
                    break
            self.used_heads.add(head)
            convs, have = [i], self.counts[i]
            while have < want:
                j = self._advance()
                convs.append(j)
                have += self._count(j, remaining - have)
            spans.append(_Span(convs, want - (have - self.counts[convs[-1]]), target))
        return spans

    def realize(self, spans: list[_Span]) -> list[tuple[str, int]]:
        """(prompt, prompt_tokens) per span, cut to the exact target where any cut gives it."""
        ends = self.tok.ends([self.text(s.convs[-1]) for s in spans])
        prompts = []
        for s, e in zip(spans, ends, strict=True):
            head = "".join(self.text(c) for c in s.convs[:-1])
            prompts.append(head + self.text(s.convs[-1])[: e[s.cut_tokens - 1]])
        counts = self.tok.count(prompts, special=True)
        out = []
        for s, p, n in zip(spans, prompts, counts, strict=True):
            if n == s.target:
                self.fits["exact"] += 1
                out.append((p, n))
            else:
                out.append(self._refit(s))
        return out

    def _refit(self, s: _Span) -> tuple[str, int]:
        """Find a cut whose re-tokenized count is the target, along the span's own tokenization.

        A prefix cut can be impossible: with byte-level BPE, a cut inside a blank line before a word
        re-tokenizes the trailing newlines as one token where the full text had two, so the count jumps from
        target-1 to target+1. Then the prompt starts a word or two later (s.skip characters), which moves the
        cut off that spot.
        """
        nxt = (s.convs[-1] + 1) % self.n
        text = "".join(self.text(c) for c in s.convs) + self.text(nxt)  # room to move the cut forward
        ends = self.tok.ends([text])[0]
        want = s.target - self.tok.num_special
        tried: dict[tuple[int, int], int] = {}  # (skip, cut) -> count
        for skip in [0] + [m.end() for m in _WORD_START.finditer(text, 0, 200)][:4]:
            k = want + bisect.bisect_right(ends, skip)  # tokens of text[:skip] make up for the skip
            for _ in range(6):
                cut = ends[min(max(k, 1), len(ends)) - 1]
                if (skip, cut) in tried:
                    break  # the adjustment cycles
                n = tried[skip, cut] = self.tok.count([text[skip:cut]], special=True)[0]
                if n == s.target:
                    self.fits["adjusted"] += 1
                    s.skip = skip
                    return text[skip:cut], n
                k += s.target - n
        tol = TOLERANCE * s.target  # settle for the closest cut within it, preferring one under the target
        (skip, cut), n = min(tried.items(), key=lambda t: (abs(t[1] - s.target) > tol, t[1] > s.target,
                                                            abs(t[1] - s.target)))
        if abs(n - s.target) > tol:
            raise RuntimeError(f"could not cut a prompt of {s.target} tokens from {self.source(s)} "
                               f"(closest: {n} tokens)")
        self.fits["within_tolerance"] += 1
        self.fits["max_abs_error"] = max(self.fits["max_abs_error"], abs(n - s.target))
        s.skip = skip
        return text[skip:cut], n

    def source(self, s: _Span) -> str:
        first, last = self.items[s.convs[0]], self.items[s.convs[-1]]
        skip = f", first {s.skip} characters skipped" if s.skip else ""
        return (f"sharegpt packed conv[{s.convs[0]}..{s.convs[-1]}] ({len(s.convs)} conversations, "
                f"ids {first.get('id', '?')}..{last.get('id', '?')}{skip})")

    def reply_lengths(self, spans: list[_Span]) -> list[int]:
        """Natural output lengths for packed prompts: the first reply in each span."""
        replies = []
        for s in spans:
            reply = next((r for c in s.convs if (r := _first_exchange(self.items[c])[1])), "")
            replies.append(reply)
        return self.tok.count(replies, special=False)

    def naturals(self, num: int, low: int, high: int | None, need_reply: bool) -> list[_Natural]:
        """(prompt, prompt_tokens, reply_tokens, conversation) for the next num usable first human turns."""
        out: list[_Natural] = []
        seen = self.seen_prompts
        while len(out) < num:
            batch = []
            while len(batch) < 256 and self.walked < self.n:
                i = self._advance()
                prompt, reply = _first_exchange(self.items[i])
                if prompt and prompt not in seen and (reply is not None or not need_reply):
                    batch.append((i, prompt, reply or ""))
            if not batch:
                raise ValueError(f"only {len(out)} of the {num} natural requests exist in the dataset "
                                 f"with a first human turn of {low}..{high} tokens")
            p_counts = self.tok.count([p for _, p, _ in batch], special=True)
            r_counts = self.tok.count([r for _, _, r in batch], special=False)
            for (i, prompt, _), pn, rn in zip(batch, p_counts, r_counts, strict=True):
                if low <= pn <= (high or pn) and prompt not in seen and len(out) < num:
                    seen.add(prompt)
                    out.append((prompt, pn, rn, i))
        return out
