"""`python -m harness.main [overrides]`: one paged-vs-tagma serve A/B (the Hydra entry point).

Thin on purpose: resolve the config, record what the run is, then hand typed objects to the library.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from harness import report
from harness.config import BenchConfig, from_mapping
from harness.files import point_latest, write_json, write_text_atomic
from harness.runner import arms_without_a_run, run_ab
from harness.serve import tiny_model
from harness.serve.environment import environment
from harness.serve.model_context import ContextError, model_context_limit, resolve_max_model_len
from harness.workload.packing import clear_caches
from harness.workload.registry import build_workload
from harness.workload.spec import Workload

log = logging.getLogger("harness")


def resolve_context(cfg: BenchConfig) -> BenchConfig:
    """The config with the server's context resolved against the model's own limit (before any server)."""
    wl = cfg.workload
    needed = wl.input_len.upper + wl.output_len.upper if wl.input_len.upper and wl.output_len.upper else None
    limit = model_context_limit(Path(cfg.model.path))
    chosen = resolve_max_model_len(cfg.server.max_model_len, limit, needed, cfg.model.name)
    return cfg.with_max_model_len(chosen)


def prepare(cfg: BenchConfig, resolved: dict) -> tuple[BenchConfig, Workload]:
    """Record what the run is, build the model if asked, check the context, build the workload."""
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.model.build_tiny:
        tiny_model.build_tiny(Path(cfg.model.path), cfg.model.family)
    cfg = resolve_context(cfg)
    resolved = {**resolved, "server": {**resolved["server"], "max_model_len": cfg.server.max_model_len},
                "workload": {**resolved["workload"], "max_model_len": cfg.workload.max_model_len}}
    write_text_atomic(cfg.out_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(resolved)))
    write_json(cfg.out_dir / "config.json", resolved)
    write_json(cfg.out_dir / "environment.json", environment())
    workload = build_workload(cfg.workload, cfg.model.tokenizer_dir, cfg.data_dir / "workloads")
    clear_caches()  # the decoded dataset (~0.4 GB) is not needed while servers run
    write_json(
        cfg.out_dir / "workload.json",
        {
            "spec": resolved["workload"],
            "provenance": workload.provenance,
            "prompt_lengths": workload.prompt_lengths(),
            "output_lengths": workload.output_lengths(),
            "num_warmup": len(workload.warmup),
            "from_cache": workload.from_cache,
            "build_seconds": workload.build_seconds,
        },
    )
    return cfg, workload


class NoSuccessfulRun(RuntimeError):
    """An arm had no successful run: there is nothing to compare (the report still says why)."""


def run(cfg: BenchConfig, resolved: dict) -> Path:
    cfg, workload = prepare(cfg, resolved)
    statuses = run_ab(cfg, workload)
    path = report.write_report(cfg.out_dir, n_boot=cfg.run.n_boot)
    point_latest(cfg.out_dir.parent / "latest", cfg.out_dir)
    ok = sum(s["status"] == "ok" for s in statuses)
    log.info("%d/%d runs ok; report: %s", ok, len(statuses), path)
    if missing := arms_without_a_run(cfg, statuses):
        raise NoSuccessfulRun(f"no successful run for {', '.join(missing)}; see {path}")
    return path


@hydra.main(config_path="../configs", config_name="bench", version_base=None)
def main(dcfg: DictConfig) -> None:
    resolved = OmegaConf.to_container(dcfg, resolve=True, throw_on_missing=True)
    assert isinstance(resolved, dict)
    try:
        path = run(from_mapping(resolved), resolved)
    except (ContextError, NoSuccessfulRun) as err:
        log.error("%s", err)
        raise SystemExit(1) from None
    print(path.read_text())


if __name__ == "__main__":
    main()
