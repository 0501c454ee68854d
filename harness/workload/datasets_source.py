"""Where a workload's text comes from: the packaged ShareGPT copy, a local JSON/JSONL file, or a hub dataset.

``workload.dataset`` names the source:

- ``None``: the packaged, truncated ShareGPT copy, recovered by :mod:`harness.workload.sharegpt_file` (the
  offline default; its provenance record is unchanged).
- a local ``.json`` / ``.jsonl`` file, loaded with HF ``datasets`` (Arrow-cached). A ShareGPT-style file
  (rows with ``conversations``: ``from``/``value`` turns, or ``messages``: ``role``/``content`` turns) gives
  conversations. A file of trace records (``timestamp``, ``input_length``, ``output_length``, ``hash_ids``
  per line) is a trace: the workload is then replayed from it (see :mod:`harness.workload.mooncake`). A JSON
  array that ``datasets`` cannot parse because it was cut mid-element is recovered element by element, as
  the packaged copy is.
- anything else is taken as a hub dataset id (``owner/name``, optionally ``owner/name:split``), loaded with
  ``datasets`` where the machine can reach the hub; where it cannot, a :class:`DatasetUnavailable` says so.

Tokenization of many texts goes through ``Dataset.map`` with ``num_proc`` worker processes when asked.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.workload import sharegpt_file as sharegpt

__all__ = ["DatasetUnavailable", "Source", "is_trace_file", "load_conversations", "tokenize_texts"]

TRACE_KEYS = frozenset({"input_length", "output_length", "hash_ids"})
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]+)?$")
_ROLE_TO_FROM = {"user": "human", "assistant": "gpt", "system": "system"}


class DatasetUnavailable(RuntimeError):
    """A hub dataset could not be loaded (no network, unknown id, no access)."""


@dataclass(frozen=True)
class Source:
    """Conversations and where they came from. ``key`` identifies the content (a file's sha256, or the
    hub dataset's fingerprint) for workload caches."""

    items: list[dict]
    provenance: dict[str, Any]
    key: str


def _looks_local(spec: str) -> bool:
    return spec.endswith((".json", ".jsonl")) or "/" not in spec or spec.startswith((".", "/", "~")) \
        or Path(spec).expanduser().exists()


def first_record(path: Path) -> Any:
    """The first JSON value of a JSONL file's first non-empty line (None if that line is not JSON)."""
    with open(path, "rb") as f:
        for raw in f:
            line = raw.strip()
            if line:
                try:
                    return json.loads(line)
                except ValueError:
                    return None
    return None


def is_trace_file(path: Path) -> bool:
    """Whether path is a JSONL file of trace records (its first line has input/output lengths and
    hash_ids). Missing files are not traces (the loader reports them)."""
    if not path.is_file():
        return False
    rec = first_record(path)
    return isinstance(rec, dict) and rec.keys() >= TRACE_KEYS


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _normalize(row: dict, where: str) -> dict:
    """A ShareGPT conversation as packing reads it: ``id`` and ``conversations`` of ``from``/``value``
    turns, with the None values Arrow fills in for absent keys removed."""
    turns = row.get("conversations")
    if turns is None and row.get("messages") is not None:
        turns = [{"from": _ROLE_TO_FROM.get(str(m.get("role")), str(m.get("role"))),
                  "value": m.get("content")} for m in row["messages"]]
    if not isinstance(turns, list):
        raise ValueError(f"{where}: a row has no 'conversations' (or 'messages') list; "
                         "ShareGPT-style rows look like {'conversations': [{'from': 'human', 'value': ...}]}")
    out: dict[str, Any] = {k: v for k, v in row.items()
                           if v is not None and k not in ("conversations", "messages")}
    out["conversations"] = [{k: v for k, v in t.items() if v is not None}
                            for t in turns if isinstance(t, dict)]
    return out


def _load_local(path: Path, cache_dir: Path | None) -> Source:
    import datasets

    if not path.is_file():
        raise FileNotFoundError(f"dataset file {path} not found")
    if is_trace_file(path):
        raise ValueError(f"{path} is a trace file (records with {sorted(TRACE_KEYS)}), not conversations")
    sha = _sha256(path)
    size = path.stat().st_size
    try:
        ds = datasets.load_dataset("json", data_files=str(path), split="train",
                                   cache_dir=str(cache_dir) if cache_dir else None)
    except Exception as err:  # datasets wraps parse errors in several types
        head = path.read_bytes()[:64].lstrip()
        if head.startswith(b"["):  # a JSON array cut mid-element: recover what is complete
            items, prov = sharegpt.load(path)
            items = [_normalize(it, str(path)) for it in items if isinstance(it, dict)]
            return Source(items, {**asdict(prov), "source": f"local file {path.name} (recovered)",
                                  "loader": "harness.workload.sharegpt_file (datasets could not parse it)"},
                          sha)
        raise ValueError(f"{path} is not a readable JSON/JSONL dataset: {type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}") from err
    if len(ds) == 0:
        raise ValueError(f"{path} holds no rows")
    items = [_normalize(row, str(path)) for row in ds.to_list()]
    prov = sharegpt.Provenance(source=f"local file {path.name}", path=str(path), size_bytes=size, sha256=sha,
                               conversations=len(items), truncated=False)
    return Source(items, {**asdict(prov), "loader": f"datasets {datasets.__version__} (json)"}, sha)


def _load_hub(spec: str, cache_dir: Path | None) -> Source:
    import datasets

    name, _, split = spec.partition(":")
    split = split or "train"
    try:
        ds = datasets.load_dataset(name, split=split, cache_dir=str(cache_dir) if cache_dir else None)
    except Exception as err:
        raise DatasetUnavailable(
            f"could not load hub dataset {name!r} (split {split!r}): {type(err).__name__}: {err}. "
            f"This machine may not reach the hub; pass a local JSON/JSONL file as workload.dataset, or "
            f"leave it null for the packaged ShareGPT copy") from err
    items = [_normalize(row, spec) for row in ds.to_list()]
    fingerprint = getattr(ds, "_fingerprint", None) or hashlib.sha256(
        json.dumps(items[:100], sort_keys=True, default=str).encode()).hexdigest()
    prov = {"source": f"hub dataset {name}", "path": spec, "split": split, "fingerprint": fingerprint,
            "conversations": len(items), "truncated": False, "loader": f"datasets {datasets.__version__}"}
    return Source(items, prov, fingerprint)


def load_conversations(spec: str | Path | None, cache_dir: Path | None = None) -> Source:
    """The conversations named by spec (see the module docstring); None: the packaged ShareGPT copy."""
    if spec is None:
        path = sharegpt.packaged_path()
        items, prov = sharegpt.load(path)
        return Source(items, asdict(prov), prov.sha256)
    text = str(spec)
    if isinstance(spec, Path) or _looks_local(text):
        return _load_local(Path(text).expanduser(), cache_dir)
    if not _HUB_ID.match(text):
        raise ValueError(f"workload.dataset {text!r} is neither a local .json/.jsonl file nor a hub id "
                         f"(owner/name[:split])")
    return _load_hub(text, cache_dir)


def tokenize_texts(texts: list[str], tokenizer: Any, num_proc: int | None = None) -> list[list[int]]:
    """Token ids of each text (no special tokens), through ``Dataset.map`` with num_proc processes when
    num_proc > 1, else in this process (a fast tokenizer batches on its own threads)."""
    if not texts:
        return []
    if num_proc is None or num_proc <= 1:
        return [list(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    import datasets

    ds = datasets.Dataset.from_dict({"text": texts})
    out = ds.map(lambda b: {"ids": tokenizer(b["text"], add_special_tokens=False)["input_ids"]},
                 batched=True, num_proc=min(num_proc, len(texts)), remove_columns=["text"])
    return [list(x) for x in out["ids"]]
