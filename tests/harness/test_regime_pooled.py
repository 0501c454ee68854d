"""The map pooled (harness/regime/pooled.py): jobs are the unit, the A/B's one-sample interval over job means,
the A/A's the same way, the A/B over the A/A, the host-heavy subset, and the FINDINGS rows they give."""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import mean, stdev
from typing import Any

import pytest

from harness.analysis.statistics import t_quantile
from harness.config import Arm
from harness.designs.abba import abba_order
from harness.regime.analysis import MAP_PRIMARY
from harness.regime.findings import untraced_rows
from harness.regime.pooled import job_means, pooled, pooled_family
from harness.regime.pooled_text import POOLED_ROW, order_section, pooled_answer, pooled_section

ARMS = (Arm(name="baseline", backend="paged"), Arm(name="candidate", backend="paged"))
RECORDED = Path(__file__).resolve().parent / "data" / "regime_map_smoke.json"


def cell(ratio: float, share: float = 0.05, predicted: float = 0.99) -> dict[str, Any]:
    return {
        "metrics": {m: {"ratio": ratio if m != "output_throughput" else 1 / ratio} for m in MAP_PRIMARY},
        "composition": {"baseline": {"host_share": share}, "candidate": {"host_share": share}},
        "prediction": {"step_ratio": predicted},
    }


def job(name: str, aa: bool, cells: list[dict[str, Any]]) -> dict[str, Any]:
    return {"job": name, "aa": aa, "run_id": f"m/{name}", "cells": cells}


def make_map(ab: list[list[float]], aa: list[list[float]], share: float = 0.05) -> dict[str, Any]:
    jobs = [job(f"g{i}", False, [cell(r, share) for r in rs]) for i, rs in enumerate(ab)]
    jobs += [job(f"g{i}-aa", True, [cell(r, share) for r in rs]) for i, rs in enumerate(aa)]
    return {"map_id": "m", "jobs": jobs}


def test_a_jobs_cells_are_one_sample_and_the_interval_is_a_t_over_jobs() -> None:
    ab = [[0.9, 1.1], [1.0], [0.95, 0.97, 0.99], [1.04]]
    means = job_means([make_map(ab, [])], "p50_tpot_ms", aa=False)
    logs = [mean(math.log(r) for r in rs) for rs in ab]
    assert [v for v, _ in means.values()] == pytest.approx([math.exp(x) for x in logs])
    assert [n for _, n in means.values()] == [2, 1, 3, 1]
    row = next(r for r in pooled_family([make_map(ab, [])], "ab") if r["metric"] == "p50_tpot_ms")
    half = t_quantile(0.975, len(logs) - 1) * stdev(logs) / math.sqrt(len(logs))
    assert row["ratio"] == pytest.approx(math.exp(mean(logs)))
    assert row["ci"] == pytest.approx([math.exp(mean(logs) - half), math.exp(mean(logs) + half)])
    assert (row["jobs"], row["cells"]) == (4, 7)


def test_parity_calls_and_a_lean_shows_in_the_aa_and_in_the_ab_over_aa() -> None:
    ab = [[1.0, 1.005], [0.995], [1.002], [0.998, 1.0]]
    aa = [[0.94], [0.95, 0.93], [0.945], [0.94]]
    result = {r["metric"]: r for r in pooled_family([make_map(ab, aa)], "ab")}
    assert all(r["verdict"] == "parity" for r in result.values())
    leaning = {r["metric"]: r for r in pooled_family([make_map(ab, aa)], "aa")}
    assert leaning["p50_tpot_ms"]["verdict"] == "faster"
    assert leaning["output_throughput"]["verdict"] == "higher"
    corrected = {r["metric"]: r for r in pooled_family([make_map(ab, aa)], "ab_over_aa")}
    assert corrected["p50_tpot_ms"]["verdict"] == "slower"
    assert corrected["p50_tpot_ms"]["ratio"] == pytest.approx(
        result["p50_tpot_ms"]["ratio"] / leaning["p50_tpot_ms"]["ratio"]
    )
    assert all(r["p_adjusted"] >= r["p_value"] for r in corrected.values())  # Holm over the five


def test_the_host_heavy_subset_keeps_only_cells_past_the_floor() -> None:
    m = make_map([[0.9], [1.0]], [[1.0], [1.0]])
    m["jobs"][0]["cells"].append(cell(0.5, share=0.2))
    heavy = job_means([m], "p50_tpot_ms", aa=False, subset="host_heavy")
    assert list(heavy) == ["m/g0"] and heavy["m/g0"][0] == pytest.approx(0.5) and heavy["m/g0"][1] == 1
    one_job = pooled([m])["host_heavy"]["families"]["ab"][0]
    assert one_job["ci"] == [None, None] and one_job["verdict"] == "inconclusive"  # one job: no interval


def test_the_warm_subset_keeps_jobs_with_a_warmup_lifetime_and_is_left_out_without_any() -> None:
    m = make_map([[0.9], [1.0], [1.1]], [[1.0], [0.98]])
    assert "warm" not in pooled([m])  # maps collected before warm-up lifetimes: no such subset
    for j in m["jobs"]:
        j["warmup_lifetimes"] = 0 if j["job"] == "g0" else 1
    warm = pooled([m])["warm"]
    assert warm["jobs"] == {"ab": ["m/g1", "m/g2"], "aa": ["m/g0-aa", "m/g1-aa"]}
    lines = pooled_section([m])
    assert sum(line.startswith(POOLED_ROW) and "warm-up lifetime" in line for line in lines) == 3


def test_collect_counts_the_warmup_lifetimes_that_served_to_the_end(tmp_path: Path) -> None:
    from harness.regime.collect import _warmup_lifetimes

    life = tmp_path / "lifetimes"
    for name, status in (
        ("warmup-baseline-paged/a0", {"status": "warmup", "reason": "ServerDied: gone"}),
        ("warmup-baseline-paged/a1", {"status": "warmup", "reason": None}),
        ("r0-baseline-paged/a0", {"status": "ok", "reason": None}),
    ):
        (life / name).mkdir(parents=True)
        (life / name / "status.json").write_text(json.dumps(status))
    assert _warmup_lifetimes(tmp_path) == 1


def test_unknown_family_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown pooled family"):
        pooled_family([make_map([[1.0]], [])], "ba")


def test_the_findings_rows_trace_to_their_jobs() -> None:
    record = json.loads(RECORDED.read_text())
    ab = [[1.0, 1.01], [0.99], [1.0]]
    synthetic = make_map(ab, [[1.0], [0.99], [1.01]])
    lines = pooled_section([synthetic])
    assert lines[0].startswith("## The map pooled")
    pooled_rows = [line for line in lines if line.startswith(POOLED_ROW)]
    assert len(pooled_rows) == 6  # three families x two subsets
    doc = "\n".join(lines)
    sources = {"maps": [synthetic, record]}
    assert untraced_rows(doc, sources) == []  # per-job rows name their run; pooled rows are exempt
    assert "m/g0 |" in doc and "m/g2-aa |" in doc
    answer = pooled_answer([synthetic])
    assert answer and "parity" in answer[0] and "no false call" in answer[0]
    assert "A/B over A/A): output_throughput " in answer[0]


def test_the_order_table_reads_each_aa_lifetime_in_run_order() -> None:
    values = [1.2, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # the first lifetime (a baseline) 20% slower
    arms = [a.name for a in abba_order(4, *ARMS)]  # the driver's own order
    aa_cell = cell(1.0)
    aa_cell["cell"] = {"name": "c8-p1024"}
    aa_cell["per_run"] = [
        {"run": f"{i:02d}-{a}-paged", "index": i, "arm": a, "p50_tpot_ms": v}
        for i, (a, v) in reversed(list(enumerate(zip(arms, values, strict=True))))
    ]
    m = {"map_id": "m", "jobs": [job("g-aa", True, [aa_cell])]}
    lines = order_section([m])
    (row,) = [line for line in lines if line.startswith("| c8-p1024 |")]  # TTFT and throughput: no values
    cols = [c.strip() for c in row.strip("|").split("|")]
    assert cols[1] == "p50_tpot_ms" and cols[2] == "bccbbccb" and cols[5] == "m/g-aa"
    gmean = math.exp(mean(math.log(v) for v in values))
    assert cols[3].split()[0] == f"{1.2 / gmean:.3g}"
    assert float(cols[4]) == pytest.approx(1.2, rel=1e-3)  # over the median of its arm's other lifetimes
    assert order_section([make_map([[1.0]], [[1.0]])]) == []  # no per-run values: no table
