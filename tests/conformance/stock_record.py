"""The stock pass set of a pinned vLLM release, recorded: what vLLM's own tests pass with vLLM's own manager.

The conformance test compares tagma's pass set with stock's. Stock's is a property of the pinned release (its
sdist is verified by sha256, its tests tree by a digest in the fetch marker) and of this machine class, so it
can be recorded once (lists/<version>/stock_passed.json) instead of re-run on every CI run. The mode is
``TAGMA_CONFORMANCE_STOCK``:

- ``run`` (default): run stock in the same job, compare tagma with it, and check the record against it (the
  record is proved true on every run of that version);
- ``recorded``: do not run stock; compare tagma with the record, which must be for the same tests tree and the
  same allowlisted files (`make test-vllm033`: it saves vLLM 0.33's stock run, about 6 minutes, from CI's
  serial tail; vLLM 0.32's record stays checked by ``run`` in `make test`);
- ``record``: run stock and (re)write the record from it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from tagma.contract import ENV_CONFORMANCE_STOCK as ENV_STOCK_MODE

MODES = ("run", "recorded", "record")
RECORD_NAME = "stock_passed.json"


@dataclass(frozen=True)
class StockRecord:
    vllm_version: str
    tests_tree_sha256: str  # the fetch marker's digest of the fetched tests/ tree
    files: tuple[str, ...]  # the allowlisted files it ran
    passed: frozenset[str]  # junit ids (tests.v1.core.test_x::name[...])

    def to_json(self) -> str:
        body = {
            "about": "vLLM's own tests with vLLM's own KV cache manager (no denylist): the passes, "
            f"recorded from a stock conformance run ({ENV_STOCK_MODE}=record); see "
            "tests/conformance/stock_record.py",
            "vllm_version": self.vllm_version,
            "tests_tree_sha256": self.tests_tree_sha256,
            "files": sorted(self.files),
            "passed": sorted(self.passed),
        }
        return json.dumps(body, indent=1) + "\n"


class StaleRecord(AssertionError):
    """The record is not for the tests that are fetched, or not for the files that are allowlisted."""


def stock_mode() -> str:
    mode = os.environ.get(ENV_STOCK_MODE, "run")
    if mode not in MODES:
        raise ValueError(f"{ENV_STOCK_MODE}={mode!r}: expected one of {MODES}")
    return mode


def record_path(lists_folder: Path) -> Path:
    return Path(lists_folder) / RECORD_NAME


def load_record(path: Path) -> StockRecord | None:
    if not Path(path).is_file():
        return None
    raw = json.loads(Path(path).read_text())
    passed = raw["passed"]
    if len(set(passed)) != len(passed):
        raise ValueError(f"{path}: a pass is listed twice")
    return StockRecord(raw["vllm_version"], raw["tests_tree_sha256"], tuple(raw["files"]), frozenset(passed))


def passed_ids(summary: dict) -> set[str]:
    """The junit ids a run_vllm_tests summary reports as passed."""
    return {t for f in summary["files"] for t, kind in f.get("outcomes", {}).items() if kind == "passed"}


def record_from_summary(summary: dict, version: str, tree_sha256: str, files: list[str]) -> StockRecord:
    """The record of a stock run's summary (run_vllm_tests --summary), for the files it ran."""
    ran = sorted(f["file"] for f in summary["files"])
    if ran != sorted(files):
        raise ValueError(f"the stock run ran {ran}, not the allowlisted {sorted(files)}")
    return StockRecord(version, tree_sha256, tuple(sorted(files)), frozenset(passed_ids(summary)))


def check_current(
    record: StockRecord | None, version: str, tree_sha256: str, files: list[str]
) -> StockRecord:
    """The record, if it is for this version's fetched tests and these files; else StaleRecord."""
    refresh = f"run the conformance test once with {ENV_STOCK_MODE}=record"
    if record is None:
        raise StaleRecord(f"no stock record for vLLM {version}: {refresh}")
    if record.vllm_version != version or record.tests_tree_sha256 != tree_sha256:
        raise StaleRecord(
            f"the stock record is for vLLM {record.vllm_version}'s tests {record.tests_tree_sha256[:12]}, "
            f"not {version}'s {tree_sha256[:12]}: {refresh}"
        )
    if sorted(record.files) != sorted(files):
        raise StaleRecord(
            f"the stock record ran {sorted(record.files)}, the allowlist lists {sorted(files)}: {refresh}"
        )
    return record


def differences(record: StockRecord, live: StockRecord) -> str:
    """'' if the live stock run passed exactly what the record says, else what differs."""
    gained, lost = live.passed - record.passed, record.passed - live.passed
    if not gained and not lost:
        return ""
    return (
        f"stock passed {len(gained)} the record does not list ({sorted(gained)[:5]}) and not {len(lost)} it "
        f"lists ({sorted(lost)[:5]})"
    )
