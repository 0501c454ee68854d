"""FINDINGS.md's GPU sections from the GPU runs named in findings/sources.yaml (no GPU needed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from harness.regime.findings import load_sources, untraced_rows
from harness.regime.gpu_text import gpu_answer, gpu_kernels, gpu_projection, gpu_run_problems
from harness.regime.text import document

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "findings" / "sources.yaml"


@pytest.fixture(scope="module")
def sources() -> dict:
    return load_sources(SOURCES)


def test_the_committed_gpu_runs_are_gpu_measurements(sources: dict) -> None:
    runs = sources["gpu_runs"]
    assert set(runs) == {"decode_step", "kernels"}
    assert all(not gpu_run_problems(name, run) for name, run in runs.items())
    assert all(c["ok"] for c in runs["kernels"]["checks"])


def test_a_dry_run_or_the_wrong_kind_is_refused_as_a_source(tmp_path: Path) -> None:
    spec = yaml.safe_load(SOURCES.read_text())
    dry = {
        "kind": "gpu_kernels",
        "measurement": "interpreter smoke run, NOT a GPU measurement",
        "run_id": "x",
    }
    (tmp_path / "dry.json").write_text(json.dumps(dry))
    spec["maps"] = [str(SOURCES.parent / m) for m in spec["maps"]]
    spec["gpu_runs"] = {"kernels": "dry.json"}
    (tmp_path / "sources.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match="not a GPU measurement"):
        load_sources(tmp_path / "sources.yaml")
    problems = gpu_run_problems("decode_step", dry)
    assert len(problems) == 2 and "expected 'gpu_decode_step'" in problems[0]
    assert "not a GPU measurement" in problems[1]
    assert gpu_run_problems("other", dry)[0].startswith("gpu_runs.other: unknown")


def test_the_projection_adds_a_measured_row_only_for_the_gpu_that_measured(sources: dict) -> None:
    lines = gpu_projection(sources, sources["maps"])
    step = sources["gpu_runs"]["decode_step"]
    measured = [line for line in lines if f"| {step['run_id']} |" in line]
    points = sources["gpu_projection"]["points"]
    assert len(measured) == len(points)  # one per point, on the H200 only
    assert all(line.startswith("| H200 |") for line in measured)
    by_point = {(p["context"], p["batch"]): p["median_ms"] for p in step["points"]}
    for line, point in zip(measured, points, strict=True):
        assert f"| {by_point[(point['context'], point['batch'])]:.3g} |" in line
    other = copy.deepcopy(sources)
    other["gpu_runs"]["decode_step"]["machine"]["device"] = "NVIDIA A100-SXM4-80GB"
    assert not [line for line in gpu_projection(other, other["maps"]) if f"| {step['run_id']} |" in line]


def test_the_kernel_table_counts_every_configuration_once(sources: dict) -> None:
    run = sources["gpu_runs"]["kernels"]
    rows = [line for line in gpu_kernels(sources) if line.endswith(f"| {run['run_id']} |")]
    assert sum(int(line.split("|")[4]) for line in rows) == len(run["ratios"])
    answer = gpu_answer(sources)[0]
    assert run["run_id"] in answer and "fragmented placement" in answer


def test_every_row_of_the_committed_findings_names_a_run(sources: dict) -> None:
    doc = document(sources, {})
    assert untraced_rows(doc, sources) == []
    assert "## tagma's Triton kernels on a GPU, measured" in doc
