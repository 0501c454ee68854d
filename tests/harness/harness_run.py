"""Runs the serve harness (`python -m harness.main`) as a user does, for the end-to-end tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_harness(
    results_dir: Path, run_id: str, *overrides: str, config_name: str | None = None, timeout_s: int = 1500
) -> dict[str, Any]:
    """One harness run (a config by name, Hydra overrides) into results_dir/run_id; it must succeed.

    Returns the run's summary.json.
    """
    cmd = [sys.executable, "-m", "harness.main"]
    if config_name is not None:
        cmd += ["--config-name", config_name]
    cmd += [f"results_dir={results_dir}", f"run_id={run_id}", *overrides]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((results_dir / run_id / "summary.json").read_text())
