"""FINDINGS.md's host-side section from the bench-host run named in findings/sources.yaml."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.regime.findings import load_sources, untraced_rows
from harness.regime.host_text import host_answer, host_run_problems, host_section, record, targeted_rows
from harness.regime.text import document

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "findings" / "sources.yaml"


@pytest.fixture(scope="module")
def sources() -> dict:
    return load_sources(SOURCES)


def test_the_committed_host_run_is_a_full_size_run_with_passing_checks(sources: dict) -> None:
    run = sources["host_run"]
    assert run is not None and host_run_problems(run) == []
    assert max(run["config"]["headline_contexts"]) == 131072


def test_every_headline_row_is_in_the_section_and_names_the_run(sources: dict) -> None:
    run = sources["host_run"]
    lines = host_section(sources)
    rows = [line for line in lines if line.endswith(f"| {run['run_id']} |")]
    assert len(rows) == len(targeted_rows(run)) > 0
    for line, row in zip(rows, targeted_rows(run), strict=True):
        assert line.startswith(f"| {row['metric']}")
        assert ("**no**" in line) == (row["met"] is False)
    doc = document(sources, {})
    assert untraced_rows(doc, sources) == []
    assert "## On this CPU: tagma's host work against vLLM's own code" in doc


def test_the_answer_counts_met_and_missed_targets(sources: dict) -> None:
    run = copy.deepcopy(sources["host_run"])
    targeted = [r for r in run["headline"] if r["met"] is not None]
    targeted[0]["met"] = False
    for r in targeted[1:]:
        r["met"] = True
    answer = host_answer({"host_run": run})[0]
    assert f"{len(targeted) - 1} of {len(targeted)} targets met" in answer
    assert f"missed: {targeted[0]['metric']} at {targeted[0]['context_tokens']}" in answer


def _write_sources(tmp_path: Path, run: dict[str, Any]) -> Path:
    spec = yaml.safe_load(SOURCES.read_text())
    spec["maps"] = [str(SOURCES.parent / m) for m in spec["maps"]]
    spec["gpu_runs"] = {k: str(SOURCES.parent / v) for k, v in (spec.get("gpu_runs") or {}).items()}
    (tmp_path / "host.json").write_text(json.dumps(run))
    spec["host_run"] = "host.json"
    (tmp_path / "sources.yaml").write_text(yaml.safe_dump(spec))
    return tmp_path / "sources.yaml"


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"config": {"headline_contexts": [256, 1024]}}, "smoke run"),
        ({"checks": {"manager_outcomes_identical": False}}, "checks failed: manager_outcomes_identical"),
        ({"schema": "other"}, "expected 'tagma-host-bench/1'"),
        ({"headline": []}, "no headline rows"),
    ],
)
def test_a_smoke_run_or_failed_checks_are_refused_as_a_source(
    sources: dict, tmp_path: Path, change: dict, match: str
) -> None:
    run = {**copy.deepcopy(sources["host_run"]), **change}
    with pytest.raises(ValueError, match=match):
        load_sources(_write_sources(tmp_path, run))


def test_the_record_keeps_what_the_findings_read_and_refuses_a_bad_run(sources: dict) -> None:
    run = sources["host_run"]
    full = {**copy.deepcopy(run), "sections": {"manager": {"samples": [1, 2, 3]}}}
    rec = record(full)
    assert "sections" not in rec and rec["headline"] == run["headline"]
    assert host_section({"host_run": rec}) == host_section({"host_run": run})
    with pytest.raises(ValueError, match="smoke run"):
        record({**full, "config": {"headline_contexts": [1024]}})
