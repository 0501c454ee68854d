"""`python -m harness.regime.findings` (make findings): FINDINGS.md and its figures from the maps it names.

The sources are ``findings/sources.yaml``: the collected maps (``findings/maps/<map id>.json``, written by
:mod:`harness.regime.collect`), the GPU projection's published inputs, and the GPU runs (``findings/gpu/``,
copied from ``results/gpu/`` of a run on a GPU: ``python -m benchmarks.gpu.decode_step``, ``python -m
benchmarks.gpu``), and one full-size bench-host run (``findings/host/``, from ``results/host/``). Every
number in the document is read from those files (and the paired runs' records, ``findings/serve/``, from
:mod:`harness.regime.paired_text`), and every table row names the run it came from
(``<map id>/<job>``, its runs, the commit and the machine), so the document can be checked against
them line by line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from harness.files import read_json, write_text_atomic
from harness.regime.collect import REPO, structure_problems
from harness.regime.figures import write_figures
from harness.regime.gpu_text import gpu_run_problems
from harness.regime.host_text import host_run_problems
from harness.regime.inserver_text import inserver_aa_problems
from harness.regime.paired_text import paired_problems
from harness.regime.pooled_text import POOLED_ROW
from harness.regime.text import document

__all__ = ["load_sources", "main", "render", "run_ids", "untraced_rows"]

SOURCES = REPO / "findings" / "sources.yaml"


def load_sources(path: Path = SOURCES) -> dict[str, Any]:
    """The sources file with its maps read (paths relative to the file's folder)."""
    spec = yaml.safe_load(path.read_text())
    base = path.parent
    maps = [read_json(base / m) for m in spec.get("maps") or ()]
    for m, name in zip(maps, spec.get("maps") or (), strict=True):
        if problems := structure_problems(m):
            raise ValueError(f"{name}: " + "; ".join(problems[:5]))
    gpu_runs = {name: read_json(base / f) for name, f in (spec.get("gpu_runs") or {}).items()}
    if problems := [p for name, run in gpu_runs.items() for p in gpu_run_problems(name, run)]:
        raise ValueError("; ".join(problems))
    host_run = read_json(base / spec["host_run"]) if spec.get("host_run") else None
    if host_run is not None and (problems := host_run_problems(host_run)):
        raise ValueError("; ".join(problems))
    inserver_aa = read_json(base / spec["inserver_aa"]) if spec.get("inserver_aa") else None
    if inserver_aa is not None and (problems := inserver_aa_problems(inserver_aa)):
        raise ValueError("; ".join(problems))
    paired = [read_json(base / f) for f in spec.get("paired_runs") or ()]
    if problems := [p for rec in paired for p in paired_problems(rec)]:
        raise ValueError("; ".join(problems))
    return {
        **spec,
        "paired_runs": paired,
        "maps": maps,
        "map_files": list(spec.get("maps") or ()),
        "gpu_runs": gpu_runs,
        "host_run": host_run,
        "inserver_aa": inserver_aa,
    }


def run_ids(sources: dict[str, Any]) -> set[str]:
    """Every run a row may name: the maps' jobs, the GPU runs, the bench-host run, the in-server A/A and the
    paired runs."""
    host = {sources[k]["run_id"] for k in ("host_run", "inserver_aa") if sources.get(k)}
    paired = {rec["run_id"] for rec in sources.get("paired_runs") or ()}
    return {job["run_id"] for m in sources["maps"] for job in m["jobs"]} | host | paired | {
        run["run_id"] for run in (sources.get("gpu_runs") or {}).values()
    }


def untraced_rows(document: str, sources: dict[str, Any]) -> list[str]:
    """The table rows of ``document`` that hold a number but name none of the sources' runs (``<map>/<job>``,
    a GPU run id): every measured number must trace to a named run."""
    ids = run_ids(sources)
    lines = document.splitlines()
    headers = {i for i, line in enumerate(lines[1:]) if line.startswith("|---")}  # the line above a rule
    rows = [
        line for i, line in enumerate(lines)
        if line.startswith("| ") and not line.startswith("| group") and i not in headers
    ]
    # GPU rows name their run in the section's text; pooled rows are computed from the per-job rows below.
    skipped = ("| GPU |", "| kernel |", POOLED_ROW)
    rows = [r for r in rows if not r.startswith(skipped) and any(ch.isdigit() for ch in r)]
    return [r for r in rows if not any(f"| {rid} |" in r for rid in ids)]


def render(sources: dict[str, Any], out: Path, figures_dir: Path) -> Path:
    """Write the figures, then the document that shows them; returns the document's path."""
    figures = write_figures(sources["maps"], figures_dir)
    rel = {k: Path(v).relative_to(out.parent).as_posix() for k, v in figures.items()}
    write_text_atomic(out, document(sources, rel))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sources", type=Path, default=SOURCES)
    p.add_argument("--out", type=Path, default=REPO / "FINDINGS.md")
    p.add_argument("--figures", type=Path, default=None, help="default: <out's folder>/findings/figures")
    args = p.parse_args(argv)
    figures_dir = args.figures or args.out.parent / "findings" / "figures"
    print(render(load_sources(args.sources), args.out, figures_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
