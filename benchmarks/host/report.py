"""Headline rows against the targets, the printed summary table and the plots of a host benchmark run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness.plots import COLORS, _save  # noqa: E402

__all__ = ["GUIDE", "TARGETS", "headline", "plots", "profile_lines", "summary_table"]

# The targets at 128K (speedup = paged / tagma; "within" = tagma / floor).
TARGETS = {
    "admission_free_caching_off": ">= 20x cheaper than vLLM",
    "admission_free_caching_on": ">= 10x cheaper than vLLM",
    "decode_step": ">= 3x cheaper than vLLM",
    "write_per_position": ">= 5x faster than vLLM's op",
    "write_vs_memcpy": "<= 1.5x the memcpy floor",
    "write_fixed": "<= 5 us fixed cost per call",
    "block_table_bytes": ">= 100x fewer bytes per step",
    "resident_bytes": ">= 10x fewer Python bytes per resident request than vLLM",
    "binding_fixed": "< 1 us binding cost per engine crossing on hot paths",
    "fragmentation": "pool x0.7 with preemptions: mean <= 4, p99 <= 32 ranges/request, none rejected",
}
FRAGMENTATION_GOAL = {"pool_factor": 0.7, "mean": 4.0, "p99": 32.0}
# What vLLM's own code was expected to cost (the guide to the scale), against what this run measured.
GUIDE = {
    "admission_free_caching_off_ms": (2.5, 3.9),
    "admission_free_caching_on_ms": (16.0, 21.0),
    "decode_allocate_slots_us_per_request_step": (6.0, 7.0),
    "vllm_op_per_position_ns": (2.5, 2.5),
    "vllm_op_fixed_us": (25.0, 50.0),
    "memcpy_per_position_ns": (0.25, 0.35),
}

COLOR = {
    **COLORS,
    "vllm_op": COLORS["paged"],
    "vllm_worker": "#6baed6",
    "tagma_binding": COLORS["tagma"],
    "tagma_raw": "#ff9896",
    "tagma_worker": "#9467bd",
    "memcpy": "0.3",
    "native": "#2ca02c",
    "ctypes": COLORS["tagma"],
}


def _row(
    metric: str,
    context: int | None,
    paged: float | None,
    tagma: float | None,
    unit: str,
    target: str | None = None,
    goal: float | None = None,
    better: str = "speedup",
    note: str = "",
) -> dict[str, Any]:
    """One headline row. ``better``: "speedup" (met when paged / tagma >= goal) or "ratio" (met when
    tagma / paged <= goal, paged being the floor) or "max" (met when tagma <= goal)."""
    ratio = tagma / paged if (paged and tagma is not None) else None
    met = None
    if goal is not None and tagma is not None:
        if better == "speedup" and ratio:
            met = 1.0 / ratio >= goal
        elif better == "ratio" and ratio is not None:
            met = ratio <= goal
        elif better == "max":
            met = tagma <= goal
    return {
        "metric": metric,
        "context_tokens": context,
        "paged": paged,
        "tagma": tagma,
        "unit": unit,
        "tagma/paged": ratio,
        "speedup": (1.0 / ratio) if ratio else None,
        "target": target,
        "met": met,
        "note": note,
    }


def _at(rows: list[dict[str, Any]], **keys: Any) -> dict[str, Any] | None:
    for r in rows:
        if all(r.get(k) == v for k, v in keys.items()):
            return r
    return None


def headline(result: dict[str, Any], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    sections = result["sections"]
    contexts = [int(c) for c in cfg["headline_contexts"]]
    top = max(contexts)
    rows: list[dict[str, Any]] = []
    mgr = sections.get("manager")
    if mgr:
        for caching, key, goal in (
            (False, "admission_free_caching_off", 20.0),
            (True, "admission_free_caching_on", 10.0),
        ):
            for c in contexts:
                e = _at(mgr["admission_free"], context_tokens=c, prefix_caching=caching)
                if e:
                    rows.append(
                        _row(
                            f"admission+free, prefix caching {'on' if caching else 'off'}",
                            c,
                            e["paged"]["median"],
                            e["tagma"]["median"],
                            "ms",
                            TARGETS[key] if c == top else None,
                            goal if c == top else None,
                        )
                    )
        decode = mgr["decode_step"]
        for e in decode:
            if e["context_tokens"] not in contexts:
                continue
            largest = max(d["context_tokens"] for d in decode if d["requests"] == e["requests"])
            is_target = e["context_tokens"] == largest
            note = (
                ""
                if e["context_tokens"] == top or not is_target
                else f"largest context run for {e['requests']} reqs"
            )
            rows.append(
                _row(
                    f"decode step per request ({e['requests']} reqs, caching "
                    f"{'on' if e['prefix_caching'] else 'off'})",
                    e["context_tokens"],
                    e["paged"]["median"],
                    e["tagma"]["median"],
                    "us",
                    TARGETS["decode_step"] if is_target else None,
                    3.0 if is_target else None,
                    note=note,
                )
            )
        for e in mgr.get("resident_bytes", []):
            if e["context_tokens"] not in contexts:
                continue
            is_target = e["context_tokens"] == top and not e["prefix_caching"]
            rows.append(
                _row(
                    f"Python bytes per resident request (tracemalloc, caching "
                    f"{'on' if e['prefix_caching'] else 'off'})",
                    e["context_tokens"],
                    e["bytes_per_request"]["paged"],
                    e["bytes_per_request"]["tagma"],
                    "B",
                    TARGETS["resident_bytes"] if is_target else None,
                    10.0 if is_target else None,
                    note=f"tagma side: {e['manager_class']['tagma']}",
                )
            )
        for e in mgr["prefix_hit"]:
            if e["context_tokens"] in contexts:
                rows.append(
                    _row(
                        e["op"].replace("_", " "),
                        e["context_tokens"],
                        e["paged"]["median"],
                        e["tagma"]["median"],
                        "us",
                    )
                )
    wp = sections.get("write_path")
    if wp:
        fit = wp["prefill_fit"]
        at = wp.get("per_position_at_longest_prefill_ns")
        if at:
            rows.append(
                _row(
                    "write path per position (longest prefill)",
                    at["positions"],
                    at["vllm_op"],
                    at["tagma_binding"],
                    "ns",
                    TARGETS["write_per_position"],
                    5.0,
                    note="vLLM's CPU op vs tagma's binding, one request",
                )
            )
            rows.append(
                _row(
                    "write path vs memcpy floor (per position)",
                    at["positions"],
                    at["memcpy"],
                    at["tagma_binding"],
                    "ns",
                    TARGETS["write_vs_memcpy"],
                    1.5,
                    better="ratio",
                    note="paged column = numpy memcpy of the same bytes",
                )
            )
        if fit.get("vllm_op") and fit.get("tagma_binding"):
            v, t = fit["vllm_op"], fit["tagma_binding"]
            rows.append(
                _row(
                    "write path fixed cost per call (binding)",
                    None,
                    v["fixed_us"],
                    t["fixed_us"],
                    "us",
                    TARGETS["write_fixed"],
                    5.0,
                    better="max",
                    note="intercept of the prefill fit; tagma_raw (bare ctypes call) "
                    f"{fit['tagma_raw']['fixed_us']:.2f} us",
                )
            )
            w, tw = fit["vllm_worker"], fit["tagma_worker"]
            rows.append(
                _row("worker compute_slot_mapping fixed cost", None, w["fixed_us"], tw["fixed_us"], "us")
            )
        for p in wp["prefill"]:
            if p["positions"] in contexts:
                rows.append(
                    _row(
                        "prefill slot mapping per call (op vs binding)",
                        p["positions"],
                        p["variants"]["vllm_op"]["median"] / 1e3,
                        p["variants"]["tagma_binding"]["median"] / 1e3,
                        "us",
                    )
                )
        for d in wp["decode"]:
            if d["context_tokens"] in contexts:
                rows.append(
                    _row(
                        f"decode slot mapping per call ({d['requests']} reqs, worker)",
                        d["context_tokens"],
                        d["variants"]["vllm_worker"]["median"] / 1e3,
                        d["variants"]["tagma_worker"]["median"] / 1e3,
                        "us",
                    )
                )
    eng = sections.get("engine_ops")
    if eng:
        for op, label in (
            ("alloc_release", "engine alloc+release n blocks (vLLM BlockPool vs ctypes)"),
            ("grow_in_place", "engine one decode block (vLLM get_new_blocks(1) vs ctypes)"),
            ("prefix_hit_release", "engine prefix hit+release n blocks (touch/free vs attach)"),
        ):
            for c in contexts:
                e = _at(eng["rows"], op=op, context_tokens=c)
                if e and e.get("paged"):
                    native = e["native"]["median"] if e.get("native") else None
                    note = f"native {native:.0f} ns" if native is not None else ""
                    rows.append(_row(label, c, e["paged"]["median"], e["ctypes"]["median"], "ns", note=note))
        for c in contexts:
            e = _at(eng["rows"], op="grow_in_place_lean", context_tokens=c)
            if e and e.get("native") and c == top:
                overhead = e["binding_overhead_ns"]
                row = _row(
                    "binding fixed cost per crossing (lean append of 1 block, ctypes - native)",
                    c,
                    None,
                    overhead,
                    "ns",
                    TARGETS["binding_fixed"],
                    1000.0,
                    better="max",
                    note=f"ctypes {e['ctypes']['median']:.0f} ns, native {e['native']['median']:.0f} ns",
                )
                rows.append(row)
    bt = sections.get("block_table_traffic")
    if bt:
        for s in bt["scenarios"]:
            if s["context_tokens"] not in contexts:
                continue
            c = s["context_tokens"]
            b = s["per_step_bytes"]
            is_target = c == top
            rows.append(
                _row(
                    f"worker block-table bytes/step, MRV1 vs ranges ({s['requests']} reqs)",
                    c,
                    b["worker_mrv1"]["mean"],
                    b["worker_ranges"]["mean"],
                    "B",
                    TARGETS["block_table_bytes"] if is_target else None,
                    100.0 if is_target else None,
                )
            )
            rows.append(
                _row(
                    f"worker block-table bytes/step, MRV2 vs ranges ({s['requests']} reqs)",
                    c,
                    b["worker_mrv2"]["mean"],
                    b["worker_ranges"]["mean"],
                    "B",
                )
            )
            rows.append(
                _row(
                    f"scheduler->worker block bytes/step ({s['requests']} reqs)",
                    c,
                    b["sched_paged"]["mean"],
                    b["sched_ranges"]["mean"],
                    "B",
                )
            )
            rows.append(
                _row(
                    f"tagma plugin today (dense + ranges) vs MRV1 ({s['requests']} reqs)",
                    c,
                    b["worker_mrv1"]["mean"],
                    b["tagma_plugin_now"]["mean"],
                    "B",
                )
            )
    frag = sections.get("fragmentation")
    if frag:
        for t in frag["traces"]:
            if t["context_tokens"] not in contexts:
                continue
            pol = t["policies"]
            head = pol.get("headroom")
            paged = t.get("paged_vllm_blockpool")
            if head is None:
                continue
            others = ", ".join(
                f"{name} mean {v['ranges_at_completion']['mean']:.0f} "
                f"({v['requests_over_256_ranges']} reqs > 256)"
                for name, v in pol.items()
                if name != "headroom"
            )
            if abs(float(t["pool_factor"]) - FRAGMENTATION_GOAL["pool_factor"]) < 1e-9:
                # The target: mean and p99 of the manager's default placement, no request rejected.
                at = head["ranges_at_completion"]
                row = _row(
                    f"fragmentation target, headroom (pool x{t['pool_factor']}, {head['preemptions']} "
                    "preemptions)",
                    t["context_tokens"],
                    None,
                    at["mean"],
                    "ranges",
                    TARGETS["fragmentation"],
                    note=f"mean {at['mean']:.1f} (<= {FRAGMENTATION_GOAL['mean']:.0f}), p99 {at['p99']:.1f} "
                    f"(<= {FRAGMENTATION_GOAL['p99']:.0f}), rejected {head.get('rejected', 0)}",
                )
                row["met"] = bool(
                    at["mean"] <= FRAGMENTATION_GOAL["mean"]
                    and at["p99"] <= FRAGMENTATION_GOAL["p99"]
                    and head.get("rejected", 0) == 0
                    and head["preemptions"] > 0
                )
                if head["preemptions"] == 0:
                    row["note"] += "; no preemption happened in this trace (the target asks for some)"
                rows.append(row)
            rows.append(
                _row(
                    f"ranges/request at completion, headroom (pool x{t['pool_factor']}, "
                    f"{head['preemptions']} preemptions)",
                    t["context_tokens"],
                    paged["ranges_at_completion"]["mean"] if paged else None,
                    head["ranges_at_completion"]["mean"],
                    "ranges",
                    note=f"p99 {head['ranges_at_completion']['p99']:.0f}, "
                    f"max {head['ranges_at_completion']['max']}, "
                    f"{head['requests_over_256_ranges']} reqs > 256, decode in place "
                    f"{100 * head['decode_in_place_share']:.1f}%; paged = runs of vLLM ids; {others}",
                )
            )
    return rows


def baseline_vs_guide(result: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """vLLM's costs measured in this run next to the issue's guide ranges."""
    sections = result["sections"]
    top = max(int(c) for c in cfg["headline_contexts"])
    measured: dict[str, float | None] = dict.fromkeys(GUIDE)
    mgr = sections.get("manager")
    if mgr:
        for caching, key in (
            (False, "admission_free_caching_off_ms"),
            (True, "admission_free_caching_on_ms"),
        ):
            e = _at(mgr["admission_free"], context_tokens=top, prefix_caching=caching)
            measured[key] = e["paged"]["median"] if e else None
        dec = [d["paged"]["median"] for d in mgr["decode_step"]]
        measured["decode_allocate_slots_us_per_request_step"] = min(dec) if dec else None
    wp = sections.get("write_path")
    if wp and wp["prefill_fit"].get("vllm_op"):
        at = wp["per_position_at_longest_prefill_ns"]
        measured["vllm_op_per_position_ns"] = at["vllm_op"]
        measured["vllm_op_fixed_us"] = wp["prefill_fit"]["vllm_op"]["fixed_us"]
        measured["memcpy_per_position_ns"] = at["memcpy"]
    out: dict[str, Any] = {k: {"guide": list(GUIDE[k]), "measured": measured[k]} for k in GUIDE}
    for key in ("admission_free_caching_off_ms", "admission_free_caching_on_ms"):
        out[key]["context_tokens"] = top  # the guide is for 131072 tokens
    return out


def _fmt(x: Any) -> str:
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


def _where(function: str) -> str:
    """'name (path/file.py:line)' -> 'name (file.py)'."""
    name, _, rest = function.partition(" (")
    file = rest.rsplit(":", 1)[0].rsplit("/", 1)[-1]
    return f"{name} ({file})" if file and file != "~" else name


def profile_lines(result: dict[str, Any], top: int = 4) -> list[str]:
    """The functions with the most own time in each profiled manager operation (both sides)."""
    prof = result["sections"].get("profile")
    if not prof:
        return []
    lines = ["Where the manager's time goes (cProfile, share of own time):"]
    for key, value in prof.items():
        if not isinstance(value, dict) or "top" not in value:
            continue
        parts = [f"{_where(r['function'])} {100 * r['own_share']:.0f}%" for r in value["top"][:top]]
        lines.append(f"  {key}: " + ", ".join(parts))
    return lines


def summary_table(rows: list[dict[str, Any]], guide: dict[str, Any] | None = None) -> str:
    """The headline rows as a text table; row notes and vLLM's measured cost against the guide follow it."""
    head = ["metric", "context", "paged", "tagma", "unit", "tagma/paged", "target", "met", "note"]
    notes: list[str] = []
    body = []
    for r in rows:
        mark = ""
        if r.get("note"):
            notes.append(r["note"])
            mark = f"[{len(notes)}]"
        body.append(
            [
                r["metric"],
                _fmt(r["context_tokens"]),
                _fmt(r["paged"]),
                _fmt(r["tagma"]),
                r["unit"],
                _fmt(r["tagma/paged"]),
                r["target"] or "",
                _fmt(r["met"]),
                mark,
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    lines = [
        "  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip()
        for line in [head, *body]
    ]
    lines.insert(1, "-" * len(lines[0]))
    lines += [f"[{i}] {note}" for i, note in enumerate(notes, 1)]
    if guide:
        lines.append("")
        lines.append("vLLM's own cost in this run vs the issue's guide:")
        for key, g in guide.items():
            lo, hi = g["guide"]
            span = f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"
            at = f" at {g['context_tokens']} tokens" if "context_tokens" in g else ""
            lines.append(f"  {key}: measured {_fmt(g['measured'])}{at} (guide {span})")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ plots


def _loglog(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")


def _plot_engine_ops(section: dict[str, Any], path: Path) -> Path:
    rows = section["rows"]
    ops = list(dict.fromkeys(r["op"] for r in rows))
    fig, axes = plt.subplots(
        2, (len(ops) + 1) // 2, figsize=(3.6 * ((len(ops) + 1) // 2), 6.4), squeeze=False
    )
    for ax, op in zip(axes.flat, ops, strict=False):
        sel = [r for r in rows if r["op"] == op]
        xs = [r["context_tokens"] for r in sel]
        for key, label in (
            ("native", "tagma native"),
            ("ctypes", "tagma ctypes"),
            ("paged", "vLLM BlockPool"),
        ):
            ys = [r[key]["median"] if r.get(key) else None for r in sel]
            pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y]
            if pts:
                ax.plot(
                    *zip(*pts, strict=True),
                    "o-",
                    label=label,
                    color=COLOR["native" if key == "native" else "tagma" if key == "ctypes" else "paged"],
                )
        _loglog(ax, op, "context (tokens)", "ns per operation")
    for ax in list(axes.flat)[len(ops) :]:
        ax.axis("off")
    labels: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            labels.setdefault(label, handle)
    spare = list(axes.flat)[len(ops)] if len(ops) < axes.size else axes.flat[0]
    spare.legend(list(labels.values()), list(labels), fontsize=8, loc="center")
    return _save(fig, path)


def _plot_manager(section: dict[str, Any], path: Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ax = axes[0]
    for caching, style in ((False, "--"), (True, "-")):
        sel = [e for e in section["admission_free"] if e["prefix_caching"] == caching]
        xs = [e["context_tokens"] for e in sel]
        for side in ("paged", "tagma"):
            ax.plot(
                xs,
                [e[side]["median"] for e in sel],
                "o" + style,
                color=COLOR[side],
                label=f"{side}, caching {'on' if caching else 'off'}",
            )
    _loglog(ax, "admission + free of one request", "prompt (tokens)", "ms")
    ax.legend(fontsize=7)
    ax = axes[1]
    keys = sorted({(e["requests"], e["prefix_caching"]) for e in section["decode_step"]})
    for reqs, caching in keys:
        sel = [e for e in section["decode_step"] if e["requests"] == reqs and e["prefix_caching"] == caching]
        xs = [e["context_tokens"] for e in sel]
        for side in ("paged", "tagma"):
            ax.plot(
                xs,
                [e[side]["median"] for e in sel],
                "o-" if caching else "s--",
                color=COLOR[side],
                alpha=1.0 if reqs == keys[0][0] else 0.55,
                label=f"{side}, {reqs} reqs, caching {'on' if caching else 'off'}",
            )
    _loglog(ax, "decode step, per request-step", "context (tokens)", "us")
    ax.legend(fontsize=6)
    ax = axes[2]
    for op, style in (("prefix_hit_lookup", "--"), ("prefix_hit_admission", "-")):
        sel = [e for e in section["prefix_hit"] if e["op"] == op]
        xs = [e["context_tokens"] for e in sel]
        for side in ("paged", "tagma"):
            ax.plot(
                xs, [e[side]["median"] for e in sel], "o" + style, color=COLOR[side], label=f"{side}, {op}"
            )
    _loglog(ax, "prefix-cache hit", "cached prompt (tokens)", "us")
    ax.legend(fontsize=7)
    return _save(fig, path)


def _plot_write_path(section: dict[str, Any], path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    ax = axes[0]
    xs = [p["positions"] for p in section["prefill"]]
    for name in ("vllm_op", "vllm_worker", "tagma_binding", "tagma_raw", "tagma_worker", "memcpy"):
        ax.plot(
            xs,
            [p["variants"][name]["median"] / 1e3 for p in section["prefill"]],
            "o-",
            label=name,
            color=COLOR[name],
        )
    nat = [r for r in section.get("native", []) if r["layout"] == "one_range"]
    for variant, label in (("slot_mapping_ranges", "native ranges"), ("memcpy", "native memcpy")):
        sel = [r for r in nat if r["variant"] == variant]
        if sel:
            ax.plot(
                [r["positions"] for r in sel],
                [r["time"]["median"] / 1e3 for r in sel],
                "x:",
                label=label,
                color=COLOR["tagma_binding"] if variant != "memcpy" else COLOR["memcpy"],
            )
    _loglog(ax, "prefill slot mapping, one request", "positions", "us per call")
    ax.legend(fontsize=7)
    ax = axes[1]
    for reqs in sorted({d["requests"] for d in section["decode"]}):
        sel = [d for d in section["decode"] if d["requests"] == reqs]
        xs = [d["context_tokens"] for d in sel]
        for name, style in (
            ("vllm_op", "o-"),
            ("tagma_binding", "o-"),
            ("vllm_worker", "s--"),
            ("tagma_worker", "s--"),
        ):
            ax.plot(
                xs,
                [d["variants"][name]["median"] / 1e3 for d in sel],
                style,
                color=COLOR[name],
                label=f"{name}, {reqs} reqs",
                alpha=1.0 if reqs == sel[0]["requests"] else 0.6,
            )
    _loglog(ax, "decode batch slot mapping (1 token per request)", "context (tokens)", "us per call")
    ax.legend(fontsize=6)
    return _save(fig, path)


def _plot_traffic(section: dict[str, Any], path: Path) -> Path:
    reqs = sorted({s["requests"] for s in section["scenarios"]})
    fig, axes = plt.subplots(1, len(reqs), figsize=(6 * len(reqs), 4), squeeze=False)
    for ax, r in zip(axes[0], reqs, strict=True):
        sel = [s for s in section["scenarios"] if s["requests"] == r]
        xs = [s["context_tokens"] for s in sel]
        for metric, color, style in (
            ("worker_mrv1", COLOR["paged"], "o-"),
            ("worker_mrv2", "#6baed6", "o--"),
            ("worker_ranges", COLOR["tagma"], "o-"),
            ("tagma_plugin_now", "#9467bd", "x:"),
            ("sched_paged", COLOR["paged"], "s:"),
            ("sched_ranges", COLOR["tagma"], "s:"),
        ):
            ax.plot(
                xs,
                [max(s["per_step_bytes"][metric]["mean"], 1e-1) for s in sel],
                style,
                color=color,
                label=metric,
            )
        _loglog(ax, f"block-table bytes per decode step, {r} requests", "context (tokens)", "bytes per step")
        ax.legend(fontsize=7)
    return _save(fig, path)


def _plot_fragmentation(section: dict[str, Any], path: Path) -> Path:
    traces = section["traces"]
    cols = min(2, len(traces))
    nrows = -(-len(traces) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 4 * nrows), squeeze=False)
    for ax in list(axes.flat)[len(traces) :]:
        ax.axis("off")
    for ax, t in zip(axes.flat, traces, strict=False):
        names = list(t["policies"])
        labels = names + (["vLLM paged"] if t.get("paged_vllm_blockpool") else [])
        data = [t["policies"][p] for p in names] + (
            [t["paged_vllm_blockpool"]] if t.get("paged_vllm_blockpool") else []
        )
        xs = range(len(labels))
        ax.bar(
            [x - 0.2 for x in xs],
            [d["ranges_at_completion"]["mean"] for d in data],
            0.4,
            label="mean",
            color="#1f77b4",
        )
        ax.bar(
            [x + 0.2 for x in xs],
            [d["ranges_at_completion"]["p99"] for d in data],
            0.4,
            label="p99",
            color="#ff7f0e",
        )
        ax.set_yscale("log")
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_ylabel("ranges per request at completion")
        for x, d in zip(xs, data, strict=True):
            share = d.get("decode_in_place_share")
            if share is not None:
                ax.text(
                    x, 0.02, f"in place {100 * share:.0f}%", transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=7,
                )  # fmt: skip
        ax.set_title(
            f"{t['context_tokens']} tokens, {t['requests']} concurrent, pool x{t['pool_factor']}, "
            f"{t['policies'][names[0]]['preemptions']} preemptions",
            fontsize=9,
        )
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def plots(result: dict[str, Any], out_dir: Path) -> list[str]:
    sections = result["sections"]
    made: list[str] = []
    for key, fn, name in (
        ("engine_ops", _plot_engine_ops, "engine_ops.png"),
        ("manager", _plot_manager, "manager.png"),
        ("write_path", _plot_write_path, "write_path.png"),
        ("block_table_traffic", _plot_traffic, "block_table_traffic.png"),
        ("fragmentation", _plot_fragmentation, "fragmentation.png"),
    ):
        if sections.get(key):
            fn(sections[key], out_dir / name)
            made.append(name)
    return made
