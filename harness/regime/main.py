"""`python -m harness.regime.main [--multirun] regime=<profile> [job=<group>]`: one group of the regime map.

The Hydra entry: the config names the profile (configs/regime/) and the job (a group, or ``<group>-aa`` for
its A/A); the job's server lifetimes run (resuming what an earlier call left), then its cells are analysed
into ``<map dir>/<job>/group_summary.json``. :mod:`harness.regime.collect` joins the groups of a map.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from harness.config import BenchConfig, from_mapping
from harness.files import read_json, write_json
from harness.regime.analysis import analyse_cell
from harness.regime.cells import GroupSpec, MapSpec, expand_grid
from harness.regime.driver import GroupRun
from harness.serve import tiny_model
from harness.serve.environment import environment

log = logging.getLogger("harness.regime")

AA_SUFFIX = "-aa"


def map_spec(regime: dict[str, Any]) -> MapSpec:
    """The profile's map from its resolved config (``regime:``)."""
    groups = []
    for g in regime["groups"]:
        g = dict(g)
        grid = g.pop("grid")
        groups.append(
            GroupSpec(cells=expand_grid(grid), extra_args=tuple(g.pop("extra_args", ()) or ()), **g)
        )
    return MapSpec(
        profile=str(regime["profile"]),
        groups=tuple(groups),
        repeats=int(regime.get("repeats", 2)),
        aa_groups=tuple(regime.get("aa_groups") or ()),
        warmup_lifetimes=int(regime.get("warmup_lifetimes", 1)),
    )


def jobs(spec: MapSpec) -> list[str]:
    """Every job of a map: its groups, then the A/As it asks for."""
    return [g.name for g in spec.groups] + [f"{name}{AA_SUFFIX}" for name in spec.aa_groups]


def run_job(cfg: BenchConfig, spec: MapSpec, job: str, out_dir: Path) -> Path:
    """Run (or resume) one job and write its group_summary.json; returns that file's path."""
    if cfg.server.dry_run:  # a map's cells become FINDINGS.md: they must measure vLLM
        raise ValueError("server.dry_run runs the mock server: a regime map measures vLLM, so it is refused")
    aa = job.endswith(AA_SUFFIX)
    group = spec.group(job.removesuffix(AA_SUFFIX) if aa else job)
    if aa and group.name not in spec.aa_groups:
        raise ValueError(
            f"profile {spec.profile} runs no A/A of group {group.name} (aa_groups: {spec.aa_groups})"
        )
    backends = (cfg.backends[0], cfg.backends[0]) if aa else cfg.backends
    cfg = dataclasses.replace(cfg, backends=backends)
    if cfg.model.build_tiny:
        tiny_model.build_tiny(Path(cfg.model.path), cfg.model.family)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "environment.json", environment())
    t0 = time.perf_counter()
    try:
        GroupRun(cfg, group, out_dir, spec.repeats, (), spec.profile, spec.warmup_lifetimes).run()
    finally:  # wall time adds up over resumed calls
        wall_path = out_dir / "wall.json"
        before = read_json(wall_path)["wall_s"] if wall_path.exists() else 0.0
        write_json(wall_path, {"wall_s": round(before + time.perf_counter() - t0, 1)})
    cells = [analyse_cell(out_dir / "cells" / c.name, n_boot=cfg.run.n_boot) for c in group.cells]
    path = out_dir / "group_summary.json"
    write_json(
        path,
        {
            "job": job,
            "profile": spec.profile,
            "group": group.name,
            "aa": aa,
            "backends": list(backends),
            "cells": cells,
        },
    )
    return path


@hydra.main(config_path="../../configs", config_name="regime_map", version_base=None)
def main(dcfg: DictConfig) -> None:
    resolved = OmegaConf.to_container(dcfg, resolve=True, throw_on_missing=True)
    assert isinstance(resolved, dict)
    spec = map_spec(resolved["regime"])
    job = str(resolved["job"])
    if job not in jobs(spec):
        raise SystemExit(f"job {job!r} is not one of profile {spec.profile}'s jobs: {jobs(spec)}")
    # bench's workload and load stay as composed (they validate the base config); each cell builds its own
    path = run_job(from_mapping(resolved), spec, job, Path(resolved["out_dir"]))
    log.info("group summary: %s", path)


if __name__ == "__main__":
    main()
