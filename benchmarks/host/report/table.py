"""Headline rows of the host benchmark: the one table of targets, the row type and the printed table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FRAGMENTATION_GOAL", "GUIDE", "TARGETS", "Target", "at", "fmt", "row", "summary_table"]


@dataclass(frozen=True, slots=True)
class Target:
    """What tagma should reach on one headline metric, at the largest headline context.

    ``better`` says how ``goal`` is read: ``speedup`` (met when paged / tagma >= goal), ``ratio`` (met when
    tagma / paged <= goal, paged being a floor such as memcpy), ``max`` (met when tagma <= goal), ``below``
    (met when paged - tagma <= goal, e.g. hit-rate points) or ``points`` (the same, both in percent: at most
    ``goal`` points below vLLM).
    """

    text: str
    goal: float
    better: str = "speedup"

    def met(self, paged: float | None, tagma: float | None) -> bool | None:
        """Whether the measured pair meets the target (None when a value is missing)."""
        if tagma is None:
            return None
        if self.better == "max":
            return tagma <= self.goal
        if self.better == "below":  # tagma at most `goal` units below paged (e.g. hit-rate points)
            return None if paged is None else paged - tagma <= self.goal
        if self.better == "points":
            return None if paged is None else tagma >= paged - self.goal
        if not paged:
            return None
        ratio = tagma / paged
        if self.better == "ratio":
            return ratio <= self.goal
        return bool(ratio) and 1.0 / ratio >= self.goal

    def left(self, paged: float | None, tagma: float | None, unit: str) -> str:
        """For a missed target: how far the measurement is from the goal."""
        if self.better == "max":
            return f"missed: {tagma:.3g} {unit}, {self.goal:g} allowed"
        if self.better == "below" and paged is not None and tagma is not None:
            return f"missed: {paged - tagma:.2f} {unit} below, {self.goal:g} allowed"
        if self.better == "points" and paged is not None and tagma is not None:
            return f"missed: {paged - tagma:.2f} points below vLLM, {self.goal:g} allowed"
        ratio = tagma / paged if paged and tagma is not None else None
        if ratio is None:
            return "missed"
        if self.better == "ratio":
            return f"missed: {ratio:.2f}x the floor, {self.goal:g}x allowed"
        have = 1.0 / ratio if ratio else 0.0
        return f"missed: {have:.2f}x of {self.goal:g}x ({self.goal / have:.2f}x left)" if have else "missed"


# Speedup = paged / tagma; "within" = tagma / floor.
TARGETS: dict[str, Target] = {
    "admission_free_caching_off": Target(">= 20x cheaper than vLLM", 20.0),
    "admission_free_caching_on": Target(">= 10x cheaper than vLLM", 10.0),
    "decode_step": Target(">= 3x cheaper than vLLM", 3.0),
    "write_per_position": Target(">= 5x faster than vLLM's op", 5.0),
    "write_vs_memcpy": Target("<= 1.5x the memcpy floor", 1.5, "ratio"),
    "write_fixed": Target("<= 2 us fixed cost per call, <= vLLM's op", 2.0, "max"),
    "write_decode_worker": Target(">= 2x cheaper than vLLM (worker)", 2.0),
    "block_table_bytes": Target(">= 100x fewer bytes per step", 100.0),
    "resident_bytes": Target(">= 10x fewer Python bytes per resident request than vLLM", 10.0),
    "binding_fixed": Target("< 1 us binding cost per engine crossing on hot paths", 1000.0, "max"),
    "admission_free_prefix_hashed": Target(">= 20x cheaper than vLLM incl. its request hashing", 20.0),
    # the same target against vLLM's fastest hash (--prefix-caching-hash-algo xxhash; sha256 is its default)
    "admission_free_prefix_hashed_xxhash": Target(
        ">= 20x cheaper than vLLM with xxhash incl. its request hashing", 20.0
    ),
    "prefix_hit_lookup": Target(">= 10x cheaper than vLLM's get_computed_blocks", 10.0),
    "prefix_index_per_token": Target("<= 2 ns per prompt token (insert + lookup)", 2.0, "max"),
    "prefix_hit_lookup_engine": Target(">= 10x cheaper than vLLM's get_computed_blocks", 10.0),
    "prefix_eviction_hit_rate": Target("hit rate <= 1 point below exact LRU", 1.0, "below"),
    "inserver_kv_manager": Target(">= 5x lower than paged in a real server (95% interval's lower bound)",
                                  5.0),
    "fragmentation": Target("pool x0.7, saturated (paged preempts): mean <= 4, p99 <= 32 ranges/request, "
                            "none rejected", 4.0, "max"),
    "trace_hit_rate": Target("hit rate on the conversation trace at equal pool size: tagma within 1 point "
                             "of vLLM", 1.0, "points"),
    # Hybrid layouts (sliding window + full attention groups), against vLLM's coordinator and managers.
    "group_decode_step": Target(">= 3x cheaper than vLLM's hybrid coordinator", 3.0),
    "group_admission_free": Target(">= 10x cheaper than vLLM's hybrid coordinator", 10.0),
    "group_window_blocks": Target("window groups hold <= vLLM's blocks per request", 1.0, "ratio"),
    "group_resident_bytes": Target(">= 10x fewer Python bytes per resident request than vLLM", 10.0),
}
# The target is measured on the range manager's placement under TAGMA_PLACEMENT=reserve (its default
# admission 100/4), hinted prompt + output; "saturated" means vLLM's paged pool preempts in that trace.
FRAGMENTATION_GOAL = {"pool_factor": 0.7, "mean": 4.0, "p99": 32.0, "policy": "reserve+hint+admit100x4"}
# The scale vLLM's own code was expected to cost (low, high), against what a run measures.
GUIDE = {
    "admission_free_caching_off_ms": (2.5, 3.9),
    "admission_free_caching_on_ms": (16.0, 21.0),
    "decode_allocate_slots_us_per_request_step": (6.0, 7.0),
    "vllm_op_per_position_ns": (2.5, 2.5),
    "vllm_op_fixed_us": (25.0, 50.0),
    "memcpy_per_position_ns": (0.25, 0.35),
}


def row(
    metric: str,
    context: int | None,
    paged: float | None,
    tagma: float | None,
    unit: str,
    target: Target | None = None,
    note: str = "",
    paged_fast: float | None = None,
    fast_hash: str | None = None,
) -> dict[str, Any]:
    """One headline row: the pair, their ratio and, with a target, whether it is met. ``paged_fast`` is
    vLLM with a faster prefix-caching hash (``fast_hash``, e.g. xxhash) where the row times vLLM's hashing:
    the row then carries tagma's ratio against it too (the target stays against ``paged``)."""
    ratio = tagma / paged if (paged and tagma is not None) else None
    met = target.met(paged, tagma) if target else None
    if met is False and target is not None:  # a missed target says what is left
        left = target.left(paged, tagma, unit)
        note = f"{note}; {left}" if note else left
    out: dict[str, Any] = {
        "metric": metric,
        "context_tokens": context,
        "paged": paged,
        "tagma": tagma,
        "unit": unit,
        "tagma/paged": ratio,
        "speedup": (1.0 / ratio) if ratio else None,
        "target": target.text if target else None,
        "met": met,
        "note": note,
    }
    if paged_fast is not None:
        out["fast_hash"] = fast_hash
        out["paged_fast"] = paged_fast
        out["tagma/paged_fast"] = tagma / paged_fast if (paged_fast and tagma is not None) else None
    return out


def at(rows: list[dict[str, Any]], **keys: Any) -> dict[str, Any] | None:
    """The first entry of ``rows`` whose fields equal ``keys``."""
    for r in rows:
        if all(r.get(k) == v for k, v in keys.items()):
            return r
    return None


def fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, float):
        if x == 0:
            return "0"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        if abs(x) >= 10:
            return f"{x:.1f}"
        if abs(x) >= 0.1:
            return f"{x:.3f}"
        return f"{x:.2e}"
    return str(x)


def summary_table(rows: list[dict[str, Any]], guide: dict[str, Any] | None = None) -> str:
    """The headline rows as a text table; row notes and vLLM's measured cost against the guide follow it."""
    fast = next((r.get("fast_hash") or "fast hash" for r in rows if r.get("paged_fast") is not None), None)
    head = ["metric", "context", "paged", "tagma", "unit", "tagma/paged", "target", "met", "note"]
    if fast is not None:  # vLLM with its faster hash, on the rows that time vLLM's hashing
        head[6:6] = [f"paged {fast}", f"tagma/{fast}"]
    notes: list[str] = []
    body = []
    for r in rows:
        mark = ""
        if r.get("note"):
            notes.append(r["note"])
            mark = f"[{len(notes)}]"
        line = [
            r["metric"],
            fmt(r["context_tokens"]),
            fmt(r["paged"]),
            fmt(r["tagma"]),
            r["unit"],
            fmt(r["tagma/paged"]),
            r["target"] or "",
            fmt(r["met"]),
            mark,
        ]
        if fast is not None:
            line[6:6] = [fmt(r.get("paged_fast")), fmt(r.get("tagma/paged_fast"))]
        body.append(line)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    lines = [
        "  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip()
        for line in [head, *body]
    ]
    lines.insert(1, "-" * len(lines[0]))
    lines += [f"[{i}] {note}" for i, note in enumerate(notes, 1)]
    if guide:
        lines.append("")
        lines.append("vLLM's own cost in this run vs the expected scale:")
        for key, g in guide.items():
            lo, hi = g["guide"]
            span = f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"
            where = f" at {g['context_tokens']} tokens" if "context_tokens" in g else ""
            lines.append(f"  {key}: measured {fmt(g['measured'])}{where} (guide {span})")
    return "\n".join(lines)
