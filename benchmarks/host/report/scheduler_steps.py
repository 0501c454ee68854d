"""The scheduler section (benchmarks.host.scheduler_steps): descriptive rows, no target.

One row per part of a step (KV manager, the rest of ``schedule()``, the rest of ``update_from_output()``) per
measured cell: us per busy step on each arm, with the per-run ratios' spread and whether both arms made the
same steps. They say where a step's scheduler CPU goes without a server's lifetime-to-lifetime spread; the
serving cells (the regime map) say whether a user sees it.
"""

from __future__ import annotations

from typing import Any

from benchmarks.host.report.table import row
from benchmarks.host.timing import ratio_range

__all__ = ["headline_rows"]


def _label(e: dict[str, Any]) -> str:
    caching = "caching on" if e["caching"] else "caching off"
    return (
        f"{e['layout']}, block {e['block_size']}, {caching}, {e['concurrency']} x {e['prompt_tokens']} tok"
    )


def headline_rows(section: dict[str, Any], contexts: list[int]) -> list[dict[str, Any]]:
    del contexts  # each cell names its own prompt length
    rows: list[dict[str, Any]] = []
    for e in section["entries"]:
        for part in section["parts"]:
            p = e[part]
            lo, hi = ratio_range(p)
            note = (
                f"per-run ratios {lo:.3f}-{hi:.3f} over {e['repeats']} runs per arm, "
                f"{e['steps']} steps each, same steps on both arms: {e['same_steps']}"
            )
            rows.append(
                row(f"in-process scheduler step, {part} ({_label(e)})", e["prompt_tokens"],
                    p["paged"]["median"], p["tagma"]["median"], "us/step", note=note)  # fmt: skip
            )
    return rows
