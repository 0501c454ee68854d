"""The prefix-index section (benchmarks.host.prefix_index): headline rows and figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.host.report.axes import COLOR, loglog, plt
from benchmarks.host.report.table import TARGETS, at, row
from harness.analysis.plots import save_figure

__all__ = ["headline_rows", "plot"]


def headline_rows(section: dict[str, Any], contexts: list[int]) -> list[dict[str, Any]]:
    """Index cost per token against vLLM's hashing, the engine-level prefix-hit lookup, the fixed cost."""
    measured = sorted(e["context_tokens"] for e in section["per_token"])
    top = (
        max(c for c in measured if c <= max(contexts)) if any(c <= max(contexts) for c in measured) else None
    )
    rows: list[dict[str, Any]] = []
    for c in measured:
        if c not in contexts and c != top:
            continue
        e = at(section["per_token"], context_tokens=c)
        assert e is not None
        hash_ns = e["hash"]["median"]
        rows.append(
            row(
                "index cost per prompt token: insert + lookup, C side (int32 tokens) vs vLLM's block hashing",
                c,
                hash_ns,
                e["index_array_ns_per_token"],
                "ns/token",
                TARGETS["prefix_index_per_token"] if c == top else None,
                note=f"vLLM: {e['hash_function']} chain of get_request_block_hasher; tagma: insert "
                f"{e['insert_array']['median']:.2f} + lookup {e['lookup_array']['median']:.2f} ns/token",
            )
        )
        rows.append(
            row(
                "index cost per prompt token: insert + lookup from the Python list",
                c,
                hash_ns,
                e["index_list_ns_per_token"],
                "ns/token",
                note=f"list read in C: {'yes' if e['c_list_reader'] else 'no (array.array fallback)'}; "
                f"array.array('i', list) alone costs {e['convert_array_array']['median']:.1f} ns/token",
            )
        )
    for e in section["hit_lookup"]:
        c = e["context_tokens"]
        if c not in contexts and c != top:
            continue
        rows.append(
            row(
                "prefix-hit lookup, engine level: index lookup_ids vs vLLM get_computed_blocks",
                c,
                e["paged"]["median"],
                e["tagma"]["median"],
                "us",
                TARGETS["prefix_hit_lookup_engine"] if c == top else None,
                note=f"tokens as int32 (converted once per request, as vLLM hashes once); from the Python "
                f"list: {e['tagma_from_list']['median']:.1f} us ({e['speedup_from_list']:.1f}x)",
            )
        )
    modes = section.get("eviction_modes", {})
    for pool in modes.get("pools", []):
        by_mode = {m["mode"]: m for m in pool["modes"]}
        lru, contiguous = by_mode["lru"], by_mode["contiguous"]
        where = f"{modes['records']} trace requests, pool {pool['pool_blocks']} blocks"
        rows.append(
            row(
                f"eviction: hit rate, contiguous vs exact LRU ({where})",
                None,
                100.0 * lru["hit_rate"],
                100.0 * contiguous["hit_rate"],
                "%",
                TARGETS["prefix_eviction_hit_rate"],
                note="engine-level replay (no vLLM scheduler)",
            )
        )
        rows.append(
            row(
                f"eviction: ranges per request, contiguous vs exact LRU ({where})",
                None,
                lru["ranges_mean"],
                contiguous["ranges_mean"],
                "ranges",
                note=f"p99 {lru['ranges_p99']:.0f} (LRU) vs {contiguous['ranges_p99']:.0f} (contiguous)",
            )
        )
    f = section["fixed_cost"]
    rows.append(
        row(
            "prefix binding cost per call over a bare ctypes call",
            None,
            None,
            f["binding_cost_ns"],
            "ns",
            TARGETS["binding_fixed"],
            note=f"one-block lookup {f['tagma']['median']:.0f} ns vs bare ctypes call "
            f"{f['paged']['median']:.0f} ns on this machine",
        )
    )
    return rows


def plot(section: dict[str, Any], path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ax = axes[0]
    per = sorted(section["per_token"], key=lambda e: e["context_tokens"])
    xs = [e["context_tokens"] for e in per]
    ax.plot(xs, [e["hash"]["median"] for e in per], "o-", color=COLOR["paged"], label="vLLM block hashing")
    for key, style in (
        ("insert_array", "-"),
        ("lookup_array", "--"),
        ("insert_list", ":"),
        ("lookup_list", "-."),
    ):
        ax.plot(xs, [e[key]["median"] for e in per], "o" + style, color=COLOR["tagma"], label=f"tagma {key}")
    loglog(ax, "prefix index cost per prompt token", "prompt (tokens)", "ns/token")
    ax.legend(fontsize=7)
    ax = axes[1]
    hits = sorted(section["hit_lookup"], key=lambda e: e["context_tokens"])
    xs = [e["context_tokens"] for e in hits]
    ax.plot(
        xs, [e["paged"]["median"] for e in hits], "o-", color=COLOR["paged"], label="vLLM get_computed_blocks"
    )
    ax.plot(
        xs, [e["tagma"]["median"] for e in hits], "o-", color=COLOR["tagma"], label="tagma lookup_ids (int32)"
    )
    ax.plot(
        xs,
        [e["tagma_from_list"]["median"] for e in hits],
        "o--",
        color=COLOR["tagma"],
        label="tagma (from list)",
    )
    loglog(ax, "prefix-hit lookup of a cached prompt", "cached prompt (tokens)", "us")
    ax.legend(fontsize=7)
    return save_figure(fig, path)
