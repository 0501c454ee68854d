"""FINDINGS.md's calibration of the in-server row: the A/A record (harness.regime.inserver_text) from a run
directory in the servers' own format, what it refuses, and the lines it renders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.regime.findings import untraced_rows
from harness.regime.inserver_text import inserver_aa_problems, inserver_aa_section, main, record
from tests.harness.test_inserver import _make_run_dir


def _aa(tmp_path: Path, name: str = "aa-run", candidate_us: float = 300.0, runs_per_arm: int = 2) -> Path:
    root = _make_run_dir(tmp_path / name, 300.0, candidate_us, runs_per_arm, seed=5,
                         backends=("paged", "paged"))  # fmt: skip
    env = {"cpu": "cpu", "cpu_count": 2, "git": {"commit": "abc1234567", "dirty": False}}
    (root / "environment.json").write_text(json.dumps(env))
    return root


def test_an_aa_run_becomes_a_record_and_a_traced_row(tmp_path: Path) -> None:
    rec = record(_aa(tmp_path))
    assert inserver_aa_problems(rec) == [] and rec["run_id"] == "aa-run"
    assert rec["backends"] == ["paged", "paged"] and "per_step" not in rec["result"]
    lines = inserver_aa_section({"inserver_aa": rec})
    row = next(line for line in lines if line.startswith("| A/A"))
    assert row.endswith("| aa-run |") and "| yes |" in row
    assert untraced_rows("\n".join(lines), {"maps": [], "inserver_aa": rec}) == []
    assert "abc1234567" in "\n".join(lines)


def test_a_biased_aa_says_the_ab_interval_cannot_be_leaned_on(tmp_path: Path) -> None:
    rec = record(_aa(tmp_path, candidate_us=200.0))
    text = "\n".join(inserver_aa_section({"inserver_aa": rec}))
    assert "| **no** |" in text and "cannot be leaned on" in text


def test_what_is_refused(tmp_path: Path) -> None:
    ab = _make_run_dir(tmp_path / "ab", 300.0, 30.0, 2)
    with pytest.raises(ValueError, match="not an A/A"):
        record(ab)
    one = _aa(tmp_path, "one-run", runs_per_arm=1)
    with pytest.raises(ValueError, match="no interval across runs"):
        record(one)
    other = _make_run_dir(tmp_path / "other", 300.0, 300.0, 2, workload="sharegpt_16k_cpu",
                          backends=("paged", "paged"))  # fmt: skip
    with pytest.raises(ValueError, match="workload"):
        record(other)
    assert inserver_aa_problems({"schema": "x"})[0].startswith("inserver_aa: schema 'x'")


def test_the_command_writes_the_record_where_sources_name_it(tmp_path: Path) -> None:
    root = _aa(tmp_path)
    assert main([str(root), "--findings", str(tmp_path / "findings")]) == 0
    saved = json.loads((tmp_path / "findings" / "inserver" / "aa-run.json").read_text())
    assert saved["run_id"] == "aa-run" and inserver_aa_problems(saved) == []
