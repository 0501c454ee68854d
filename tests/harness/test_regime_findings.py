"""The regime map's analysis and findings: the MDE rule, a collected map's structure, FINDINGS.md written
from a recorded map (every table row names its run), and (slow) the smoke map end to end on real servers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.analysis.compare import host_steps
from harness.analysis.runs import load_runs
from harness.analysis.statistics import Comparison
from harness.regime.analysis import mde
from harness.regime.collect import collect, structure_problems
from harness.regime.findings import load_sources, render, untraced_rows
from tests.conftest import SMOKE_MAP_OVERRIDES

REPO = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).resolve().parent / "data" / "regime_map_smoke.json"


def comparison(lo: float | None, hi: float | None) -> Comparison:
    return Comparison(
        metric="m",
        baseline=1.0,
        candidate=1.0,
        ratio=1.0,
        ci_low=lo,
        ci_high=hi,
        p_value=0.5,
        p_adjusted=0.5,
        verdict="inconclusive",
        reason=None,
        primary=True,
        method="t",
        runs_baseline=2,
        runs_candidate=2,
        samples=10,
    )


def test_mde_is_the_interval_scaled_to_80_percent_power() -> None:
    h = math.log(1.1 / 0.9) / 2
    assert mde(comparison(0.9, 1.1)) == pytest.approx(math.exp(h * (1 + 0.8416212 / 1.959964)) - 1, rel=1e-6)
    assert mde(comparison(None, None)) is None
    wider = mde(comparison(0.8, 1.25))
    assert wider is not None and wider > mde(comparison(0.9, 1.1))  # type: ignore[operator]


def sources_for(tmp_path: Path, record: dict) -> Path:
    (tmp_path / "maps").mkdir()
    (tmp_path / "maps" / "m.json").write_text(json.dumps(record))
    spec = yaml.safe_load((REPO / "findings" / "sources.yaml").read_text())
    spec["maps"] = ["maps/m.json"]
    spec["gpu_runs"] = {k: str(REPO / "findings" / v) for k, v in (spec.get("gpu_runs") or {}).items()}
    for key in ("host_run", "inserver_aa"):
        if spec.get(key):
            spec[key] = str(REPO / "findings" / spec[key])
    spec["paired_runs"] = [str(REPO / "findings" / f) for f in spec.get("paired_runs") or ()]
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_findings_from_a_recorded_map_name_a_run_on_every_row(tmp_path: Path) -> None:
    record = json.loads(RECORDED.read_text())
    assert structure_problems(record) == []
    sources = load_sources(sources_for(tmp_path, record))
    out = render(sources, tmp_path / "FINDINGS.md", tmp_path / "figures")
    doc = out.read_text()
    for section in (
        "## The answer",
        "## The map",
        "## Calibration",
        "## Where a step goes",
        "## Attribution",
        "## On a GPU: host time projected",
        "## Provenance",
    ):
        assert section in doc, section
    assert untraced_rows(doc, sources) == []
    cells = [c for job in record["jobs"] for c in job["cells"]]
    assert sum(line.startswith("| ") and "dev-smoke/" in line for line in doc.splitlines()) >= len(cells)
    first = cells[0]["metrics"]["output_throughput"]
    assert f"{first['ratio']:.3g}" in doc  # a number of the record, as the table prints it
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == [
        "heat_output_throughput.png",
        "heat_p50_tpot.png",
        "heat_p50_ttft.png",
        "predicted_vs_measured.png",
        "step_composition.png",
    ]


def test_the_answer_names_every_cell_shown_at_parity_with_its_run(tmp_path: Path) -> None:
    record = json.loads(RECORDED.read_text())
    for j in record["jobs"]:  # no parity anywhere, then two metrics of one A/B cell
        for c in j["cells"]:
            for row in c["metrics"].values():
                row["verdict"] = "inconclusive" if row["verdict"] == "parity" else row["verdict"]
    job = next(j for j in record["jobs"] if not j.get("aa"))
    for metric in ("p50_tpot_ms", "output_throughput"):
        job["cells"][0]["metrics"][metric]["verdict"] = "parity"
    doc = render(load_sources(sources_for(tmp_path, record)), tmp_path / "F.md", tmp_path / "fig").read_text()
    lines = doc.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("- Parity shown"))
    assert "for 2 metrics in 1 cells" in lines[head]
    assert lines[head + 1].startswith(f"  - {job['group']} ")
    assert "p50_tpot_ms, output_throughput" in lines[head + 1] and f"(run {job['run_id']})" in lines[head + 1]


def test_a_row_without_a_run_is_caught() -> None:
    record = json.loads(RECORDED.read_text())
    doc = "| prefix-on | closed c=1 | 0.98 [0.9, 1.1] | no run here |\n"
    assert untraced_rows(doc, {"maps": [record]}) == [doc.strip()]


def test_structure_problems_name_what_is_missing() -> None:
    record = json.loads(RECORDED.read_text())
    cell = record["jobs"][0]["cells"][0]
    del cell["composition"]
    cell["metrics"]["p50_ttft_ms"]["mde"] = None
    problems = structure_problems(record)
    assert any("no composition" in p for p in problems)
    assert any("inconclusive without a minimum detectable effect" in p for p in problems)


@pytest.mark.slow
def test_the_smoke_map_runs_end_to_end_on_real_servers(tmp_path: Path, smoke_map: Path) -> None:
    """make regime-map PROFILE=smoke with one lifetime per arm (CI's time; the profile's 2 per arm add only
    intervals; the session's run, tests/conftest.py): the group summary, the collected record, FINDINGS.md
    from it; then a re-run resumes (no server starts, the warm-up lifetime included)."""
    map_dir = smoke_map
    record = collect(map_dir)
    assert structure_problems(record) == []
    (job,) = record["jobs"]
    assert job["job"] == "prefix-on" and len(job["cells"]) == 4
    for cell in job["cells"]:
        assert cell["runs"] == {"baseline": ["00-baseline-paged"], "candidate": ["01-candidate-tagma"]}
        assert set(cell["metrics"]) == {
            "output_throughput",
            "p50_ttft_ms",
            "p99_ttft_ms",
            "p50_tpot_ms",
            "p99_tpot_ms",
        }
        assert all(cell["composition"][a]["steps"] > 0 for a in ("baseline", "candidate"))
    # Every segment's host time reaches the end of its replay: the lifetime's last segment too (its server
    # is stopped only after writing one more host-time line; before, a short last cell lost its final steps)
    for cell_dir in (map_dir / "prefix-on" / "cells").iterdir():
        for run in load_runs(cell_dir):
            steps = host_steps(run)
            assert steps is not None and len(steps["end_ns"]), run["dir"]
            assert steps["end_ns"].max() >= int(run["replay_end_ns"]) - 500_000_000, run["dir"]
    # one unmeasured lifetime came first (the first server of a job ran slower: warmup_lifetimes), served the
    # first closed cell, and wrote nothing into the cells
    warmups = sorted((map_dir / "prefix-on" / "lifetimes").glob("warmup-*/a*/status.json"))
    assert [p.parent.parent.name for p in warmups] == ["warmup-baseline-paged"]
    warm = json.loads(warmups[0].read_text())
    assert warm["status"] == "warmup" and warm["reason"] is None and warm["cell"] == "c1-p1024"
    assert not list((map_dir / "prefix-on" / "cells").glob("*/runs/*warmup*"))
    rates = json.loads((map_dir / "prefix-on" / "rates.json").read_text())
    assert rates["open0.8-p1024"]["rate"] > 0
    sources = load_sources(sources_for(tmp_path, record))
    doc = render(sources, tmp_path / "FINDINGS.md", tmp_path / "figures").read_text()
    assert untraced_rows(doc, sources) == []
    before = sorted((map_dir / "prefix-on" / "lifetimes").rglob("a*"))
    # resume, as a user re-runs it (Hydra's basic launcher this time): every segment is done
    cmd = [sys.executable, "-m", "harness.regime.main", "--multirun", *SMOKE_MAP_OVERRIDES,
           f"map_dir={map_dir}", f"hydra.sweep.dir={tmp_path / 'resume'}"]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, check=True, timeout=600)
    assert sorted((map_dir / "prefix-on" / "lifetimes").rglob("a*")) == before
