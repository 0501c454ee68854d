"""The trace replay section (benchmarks.host.trace_replay): headline rows and figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.host.report.axes import COLOR, plt
from benchmarks.host.report.table import TARGETS, row
from harness.analysis.plots import save_figure

__all__ = ["FAMILY_TARGET", "family_rows", "headline_rows", "plot"]


def _pct(x: float | None) -> float | None:
    return None if x is None else 100.0 * x


def _mean(block: dict[str, Any] | None) -> float | None:
    return None if block is None else block["mean"]


def _name(section: dict[str, Any]) -> str:
    trace = section["trace"]
    return Path(trace["path"]).stem + ("" if not trace.get("truncated") else " (truncated file)")


def headline_rows(section: dict[str, Any], contexts: list[int]) -> list[dict[str, Any]]:
    """Hit rate against the target; admission cost, ranges per request and preemptions for both sides."""
    paged, tagma = section["sides"]["paged"], section["sides"]["tagma"]
    fast_name, fast = next(iter((section.get("fast_hash") or {}).items()), (None, None))
    fast_note = (
        f"; paged {fast['algo']} = vLLM hashing with {fast['algo']}, request build "
        f"{fast['request_build_us_mean'][fast_name]:.0f} us mean against sha256's "
        f"{fast['request_build_us_mean']['paged']:.0f} us"
        if fast
        else ""
    )
    pool = section["config"]["pool_blocks"]
    where = f"{_name(section)}, {section['requests']} requests, pool {pool} blocks"
    sel = section["selection"]
    left_out = sel["too_large_for_pool"] + (sel["over_max_input_length"] if sel["cap_mode"] == "drop" else 0)
    rows = [
        row(
            f"prefix hit rate ({where})",
            None,
            _pct(paged["hit_rate"]),
            _pct(tagma["hit_rate"]),
            "%",
            TARGETS["trace_hit_rate"],
            note=f"tokens found cached at first admission / prompt tokens; never-evicting pool "
            f"{_pct(section['infinite_pool_hit_rate']):.1f}%; hits over the reuse bound (wrong hits): "
            f"paged {paged.get('hits_over_reuse_bound')}, tagma {tagma.get('hits_over_reuse_bound')}; "
            f"same hit per request: "
            f"{'yes' if section['same_hits_per_request'] else 'no'}; {left_out} requests left out of "
            f"the window ({sel['too_large_for_pool']} larger than the pool, "
            f"{sel['over_max_input_length']} over max_input_length, {sel['cap_mode']}); tagma = "
            f"{_label(tagma)}{_eviction_note(section)}",
        ),
        row(
            "trace admission per request (get_computed_blocks + allocate_slots)",
            None,
            _mean(paged["admission_us"]),
            _mean(tagma["admission_us"]),
            "us",
            note=f"per prompt token: paged {paged['admission_ns_per_prompt_token']:.1f} ns, tagma "
            f"{tagma['admission_ns_per_prompt_token']:.1f} ns; p99 paged "
            f"{paged['admission_us']['p99']:.0f} us, tagma {tagma['admission_us']['p99']:.0f} us",
        ),
        row(
            "trace admission + request hashing per request",
            None,
            paged["admission_with_build_us_mean"],
            tagma["admission_with_build_us_mean"],
            "us",
            note="building vLLM's Request (its block hasher runs in the constructor) for each side; "
            f"tagma's requests {'are' if tagma['request_block_hashes'] else 'are not'} hashed{fast_note}",
            paged_fast=fast["admission_with_build_us_mean"][fast_name] if fast else None,
            fast_hash=fast["algo"] if fast else None,
        ),
        row(
            "trace ranges/request at completion",
            None,
            _mean(paged["ranges_per_request"]),
            _mean(tagma["ranges_per_request"]),
            "ranges",
            note=f"runs of consecutive block ids in the block table; p99 paged "
            f"{paged['ranges_per_request']['p99']:.0f}, tagma {tagma['ranges_per_request']['p99']:.0f}",
        ),
        row(
            "trace preemptions",
            None,
            float(paged["preemptions"]),
            float(tagma["preemptions"]),
            "count",
        ),
    ]
    same = section.get("same_hits_per_request_vs_paged") or {}
    for name, side in section["sides"].items():
        if name in ("paged", "tagma"):
            continue
        hashed = side.get("hash_algo")
        label = _label(side) + (f", requests hashed with {hashed}" if hashed else "")
        rows.append(
            row(
                f"prefix hit rate, {name} ({label})",
                None,
                _pct(paged["hit_rate"]),
                _pct(side["hit_rate"]),
                "%",
                note=f"ranges/request mean {_mean(side['ranges_per_request']):.1f} "
                f"(p99 {side['ranges_per_request']['p99']:.0f}), {side['preemptions']} preemptions, "
                f"admission {_mean(side['admission_us']):.0f} us mean; same hit per request as paged: "
                f"{'yes' if same.get(name) else 'NO' if name in same else '-'}",
            )
        )
    if section.get("family"):
        rows += family_rows(section["family"])
    return rows


FAMILY_TARGET = "loses <= max(0.5 point, 5% of exact LRU's hit rate); missed prompt tokens <= 5% above LRU's"


def family_rows(family: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace family's worst cases: for tagma's default (the headline, with ``met``: every trace and
    pool within the bound) and every variant, hit rate and missed prompt tokens against vLLM's exact LRU
    at the point that uses most of the bound, and the worst mean ranges per request."""
    rows: list[dict[str, Any]] = []
    n_traces, factors = len(family["members"]), family["factors"]
    span = f"{n_traces} {family['scale']}-scale traces x pools {min(factors):g}x-{max(factors):g}x"
    for name, worst in family["worst"].items():
        o = worst["overall"]
        w = o["worst"]
        label = "tagma default" if name == "tagma" else name
        where = f"{o['trace']} at {o['factor']:g}x ({o['pool_blocks']} blocks)"
        per_factor = ", ".join(
            f"{f}x {'met' if s['met'] else 'broken ' + str(s['broken'])}"
            for f, s in worst["per_factor"].items()
        )
        hit = row(
            f"trace family worst case: prefix hit rate, {label} "
            f"(eviction {worst['prefix_eviction']}) vs exact LRU ({span} working set)",
            None,
            w["lru_hit_rate"],
            w["hit_rate"],
            "%",
            note=f"worst of {o['points']} points: {where}; loss {w['loss_points']:.2f} points of "
            f"{w['allowed_points']:.2f} allowed; largest loss anywhere {o['max_loss_points']:.2f} points; "
            f"bound broken at {o['broken']} points ({per_factor}); paged = vLLM's KVCacheManager (exact LRU)",
        )
        missed = row(
            f"trace family worst case: missed prompt tokens (prefill), {label} vs exact LRU",
            None,
            w["lru_missed_share"],
            w["missed_share"],
            "% of prompt tokens",
            note=f"at {where}: {100 * w['missed_excess']:+.1f}% vs LRU's; largest excess anywhere "
            f"{100 * o['max_missed_excess']:+.1f}% (5% allowed)",
        )
        ranges = row(
            f"trace family ranges/request, {label}: largest mean over the family",
            None,
            o["lru_ranges_mean_max"],
            o["ranges_mean_max"],
            "ranges",
            note="contiguity, the second objective: mean runs of consecutive block ids per request, the "
            "largest over traces and pools (paged: vLLM's)",
        )
        if name == "tagma":
            for r in (hit, missed):
                r["target"] = FAMILY_TARGET
                r["met"] = bool(o["met"])
        rows += [hit, missed, ranges]
    same = family.get("lru_matches_vllm") or {}
    if rows and same:
        rows[0]["note"] += "; same hit per request as vLLM on every point: " + ", ".join(
            f"{n} {'yes' if v else 'no'}" for n, v in same.items()
        )
    return rows


def _label(side: dict[str, Any]) -> str:
    eviction = side.get("prefix_eviction")
    return side["manager_class"] + (f", eviction {eviction}" if eviction else "")


def _eviction_note(section: dict[str, Any]) -> str:
    cost = section.get("eviction_cost_points")
    skipped = section.get("variants_skipped") or {}
    parts = []
    if cost and cost["points_below_lru"] is not None:
        below = cost["points_below_lru"]
        parts.append(
            f"; {cost.get('eviction', cost['default'])} eviction ({cost.get('side', 'tagma')}) "
            f"{abs(below):.2f} points {'below' if below > 0 else 'above'} exact LRU ({cost['lru_side']})"
        )
    if skipped:
        parts.append(f"; variants not built by this tagma: {', '.join(skipped)}")
    return "".join(parts)


def plot(section: dict[str, Any], path: Path) -> Path:
    data = section["sides"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    ax = axes[0]
    names = list(data)
    rates = [_pct(data[s]["hit_rate"]) or 0.0 for s in names]
    rates.append(_pct(section["infinite_pool_hit_rate"]) or 0.0)
    labels = ["vLLM" if s == "paged" else s for s in names] + ["never evict"]
    colors = [COLOR.get(s, "#9467bd") for s in names] + ["0.6"]
    ax.bar(labels, rates, color=colors)
    for x, v in enumerate(rates):
        ax.text(x, v, f"{v:.1f}%", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("prefix hit rate (% of prompt tokens)")
    ax.set_title(f"{_name(section)}: {section['requests']} requests, pool {section['config']['pool_blocks']}",
                 fontsize=9)  # fmt: skip
    ax = axes[1]
    xs = range(len(names))
    colors = [COLOR.get(s, "#9467bd") for s in names]
    for off, key in ((-0.2, "mean"), (0.2, "p99")):
        vals = [(data[s]["ranges_per_request"] or {}).get(key, 0.0) for s in names]
        ax.bar([x + off for x in xs], vals, 0.4, color=colors, alpha=1.0 if key == "mean" else 0.55)
    ax.set_xticks(list(xs), labels[:-1])
    ax.set_yscale("log")
    ax.set_ylabel("ranges per request at completion")
    ax.set_title("mean (solid), p99 (light)", fontsize=9)
    ax = axes[2]
    for name in names:
        adm, build = data[name]["admission_us"], data[name]["request_build_us"]
        if not adm:
            continue
        label = "vLLM" if name == "paged" else name
        color = COLOR.get(name, "#9467bd")
        ax.bar([label], [adm["mean"]], color=color)
        if build:
            ax.bar([label], [build["mean"]], bottom=[adm["mean"]], color=color, alpha=0.45)
    ax.set_ylabel("us per request, mean")
    ax.set_title("admission (solid) + request build, hashing (light)", fontsize=9)
    for a in axes:
        a.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)
