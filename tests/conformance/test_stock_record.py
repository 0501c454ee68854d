"""The recorded stock pass set: how a record is made from a stock run, and when it no longer applies."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.stock_record import (
    ENV_STOCK_MODE,
    StaleRecord,
    StockRecord,
    check_current,
    differences,
    load_record,
    record_from_summary,
    stock_mode,
)

FILES = ["tests/v1/core/test_a.py", "tests/v1/core/test_b.py"]
TREE = "a" * 64


def _summary(outcomes: dict[str, dict[str, str]]) -> dict:
    return {"files": [{"file": f, "outcomes": o} for f, o in outcomes.items()]}


def _record() -> StockRecord:
    summary = _summary(
        {
            FILES[0]: {"tests.v1.core.test_a::t1": "passed", "tests.v1.core.test_a::t2": "failed"},
            FILES[1]: {"tests.v1.core.test_b::t3[x]": "passed"},
        }
    )
    return record_from_summary(summary, "0.33.0", TREE, FILES)


def test_a_record_keeps_the_passes_only_and_round_trips(tmp_path: Path) -> None:
    record = _record()
    assert record.passed == {"tests.v1.core.test_a::t1", "tests.v1.core.test_b::t3[x]"}
    path = tmp_path / "stock_passed.json"
    path.write_text(record.to_json())
    assert load_record(path) == record
    assert load_record(tmp_path / "missing.json") is None


def test_a_record_of_other_files_is_refused() -> None:
    with pytest.raises(ValueError, match="not the allowlisted"):
        record_from_summary(_summary({FILES[0]: {}}), "0.33.0", TREE, FILES)


def test_a_record_for_other_tests_or_files_is_stale() -> None:
    record = _record()
    assert check_current(record, "0.33.0", TREE, list(reversed(FILES))) is record
    with pytest.raises(StaleRecord, match="no stock record"):
        check_current(None, "0.33.0", TREE, FILES)
    with pytest.raises(StaleRecord, match=f"{ENV_STOCK_MODE}=record"):
        check_current(record, "0.33.0", "b" * 64, FILES)
    with pytest.raises(StaleRecord, match="not 0.34.0"):
        check_current(record, "0.34.0", TREE, FILES)
    with pytest.raises(StaleRecord, match="the allowlist"):
        check_current(record, "0.33.0", TREE, FILES[:1])


def test_differences_name_gained_and_lost_passes() -> None:
    record = _record()
    assert differences(record, record) == ""
    live = StockRecord("0.33.0", TREE, tuple(FILES), frozenset({"tests.v1.core.test_a::t1", "new::t"}))
    text = differences(record, live)
    assert "1 the record does not list" in text and "new::t" in text and "test_b::t3[x]" in text


def test_a_duplicate_pass_in_a_record_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "stock_passed.json"
    path.write_text('{"vllm_version": "0.33.0", "tests_tree_sha256": "x", "files": [], "passed": ["a", "a"]}')
    with pytest.raises(ValueError, match="twice"):
        load_record(path)


def test_the_mode_defaults_to_run_and_refuses_unknown_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_STOCK_MODE, raising=False)
    assert stock_mode() == "run"
    monkeypatch.setenv(ENV_STOCK_MODE, "recorded")
    assert stock_mode() == "recorded"
    monkeypatch.setenv(ENV_STOCK_MODE, "skip")
    with pytest.raises(ValueError, match="expected one of"):
        stock_mode()
