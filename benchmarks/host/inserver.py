"""The in-server section of the host benchmark: KV cache manager CPU per scheduler step in real servers.

Nothing is timed here: the numbers come from a serve run of ``configs/inserver_64x16k.yaml``
(``make bench-inserver``: 64 concurrent 16K requests on the tiny model, prefix caching off on both arms),
through :mod:`harness.analysis.inserver`. The run read is ``inserver_run`` when given (``make bench-host
ARGS="inserver_run=<dir>"``), else the newest A/B run of that workload under ``inserver_results_dir`` in
which both arms have a successful server run. Without one the section says so and its headline row is "not
measured" (never a number from elsewhere). Its calibration is the A/A run of the same size
(``make bench-inserver ARGS="backends=[paged,paged]"``; ``inserver_aa_run`` or the newest): identical
servers, whose interval shows what the instrument calls a difference where there is none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.analysis.inserver import WORKLOAD_NAME, find_run, from_run_dir

__all__ = ["run"]


def _source(cfg: dict[str, Any], key: str, aa: bool) -> Path | None:
    given = cfg.get(key)
    if given:
        source = Path(given)
        if not (source / "config.json").exists():
            raise FileNotFoundError(f"{key}={given}: not a serve run directory (no config.json)")
        return source
    return find_run(cfg.get("inserver_results_dir") or Path(cfg["repo_dir"]) / "results" / "serve",
                    WORKLOAD_NAME, aa=aa)  # fmt: skip


def _summary(source: Path) -> dict[str, Any]:
    from harness.files import read_json

    config = read_json(source / "config.json")
    env = read_json(source / "environment.json") if (source / "environment.json").exists() else {}
    return {
        "source": str(source.resolve()),
        "run_id": source.name,
        "backends": list(config.get("backends") or ()),
        "workload": (config.get("workload") or {}).get("name"),
        "concurrency": (config.get("load") or {}).get("max_concurrency"),
        "prompt_tokens": [(config.get("workload") or {}).get("input_len")],
        "commit": (env.get("git") or {}).get("commit"),
        "reason": None,
        "result": from_run_dir(source).to_dict(),
    }


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    """The section: ``{"source": run dir or None, "reason": why none, "result": the headline's dict, "aa":
    the same of the A/A run at this size (paged vs paged: the calibration of the interval) or None}``.
    The A/B run is ``inserver_run`` or the newest A/B run; the A/A ``inserver_aa_run`` or the newest A/A."""
    source = _source(cfg, "inserver_run", aa=False)
    aa_source = _source(cfg, "inserver_aa_run", aa=True)
    aa = _summary(aa_source) if aa_source is not None else None
    if source is None:
        return {"source": None, "workload": WORKLOAD_NAME, "result": None, "aa": aa,
                "reason": f"no A/B serve run of {WORKLOAD_NAME} with an ok run on both arms"}  # fmt: skip
    return {**_summary(source), "aa": aa}
