"""One A/B serve run, in the design ``run.design`` names (:mod:`harness.designs.registry`):

- ``abba`` (:mod:`harness.designs.abba`): one server at a time; each arm gets ``run.repeats`` server
  lifetimes in ABBA order; each lifetime replays the whole workload with the configured load.
- ``paired`` (:mod:`harness.designs.paired`): both arms' servers up at once, each prompt sent to both,
  seconds apart, ``run.repeats`` rounds of fresh server pairs.

What a run directory holds is described in :mod:`harness.designs.server_run`.
"""

from __future__ import annotations

from harness.config import BenchConfig
from harness.designs.registry import design
from harness.workload.spec import Workload


def run_ab(cfg: BenchConfig, workload: Workload) -> list[dict]:
    """Run the configured design; returns every run's status."""
    return design(cfg.run.design).run(cfg, workload)


def arms_without_a_run(cfg: BenchConfig, statuses: list[dict]) -> list[str]:
    """The arms (by label) none of whose runs succeeded."""
    ok = {s.get("arm") for s in statuses if s["status"] == "ok"}
    return [arm.label for arm in cfg.arms if arm.name not in ok]
