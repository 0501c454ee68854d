"""The in-server section of the host benchmark: KV cache manager CPU per scheduler step in real servers.

Nothing is timed here: the numbers come from a serve run of ``configs/inserver_64x16k.yaml``
(``make bench-inserver``: 64 concurrent 16K requests on the tiny model, prefix caching off on both arms),
through :mod:`harness.analysis.inserver`. The run read is ``inserver_run`` when given (``make bench-host
ARGS="inserver_run=<dir>"``), else the newest run of that workload under ``inserver_results_dir`` in which
both arms have a successful server run. Without one the section says so and its headline row is "not
measured" (never a number from elsewhere).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.analysis.inserver import WORKLOAD_NAME, find_run, from_run_dir

__all__ = ["run"]


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    """The section: ``{"source": run dir or None, "reason": why none, "result": the headline's dict}``."""
    given = cfg.get("inserver_run")
    if given:
        source: Path | None = Path(given)
        if not (source / "config.json").exists():
            raise FileNotFoundError(f"inserver_run={given}: not a serve run directory (no config.json)")
    else:
        source = find_run(cfg.get("inserver_results_dir") or Path(cfg["repo_dir"]) / "results" / "serve",
                          WORKLOAD_NAME)  # fmt: skip
    if source is None:
        return {"source": None, "workload": WORKLOAD_NAME, "result": None,
                "reason": f"no serve run of {WORKLOAD_NAME} with an ok run on both arms"}  # fmt: skip
    from harness.files import read_json

    config = read_json(source / "config.json")
    result = from_run_dir(source)
    return {
        "source": str(source.resolve()),
        "workload": (config.get("workload") or {}).get("name"),
        "concurrency": (config.get("load") or {}).get("max_concurrency"),
        "prompt_tokens": [(config.get("workload") or {}).get("input_len")],
        "commit": (read_json(source / "environment.json").get("git") or {}).get("commit")
        if (source / "environment.json").exists() else None,
        "reason": None,
        "result": result.to_dict(),
    }
