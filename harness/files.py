"""Atomic result files: a reader never sees half a file, and an interrupted write leaves the old one."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same directory, fsynced, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; a result file is readable like any other
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: Path, data: Any) -> Path:
    """allow_nan=False: a NaN in a result is a bug to see, not a value to write."""
    return write_text_atomic(path, json.dumps(data, indent=2, allow_nan=False, default=str) + "\n")


def write_jsonl(path: Path, rows: Iterable[Any]) -> Path:
    return write_text_atomic(path, "".join(json.dumps(r, allow_nan=False, default=str) + "\n" for r in rows))


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def read_jsonl(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def point_latest(link: Path, target: Path) -> None:
    """Make `link` (e.g. results/serve/latest) a relative symlink to `target`, atomically."""
    tmp = link.with_name(f".{link.name}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(target, link.parent))
    os.replace(tmp, link)
