"""What a design is: its run loop, its comparison rows, and the few words the report says about it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from harness.analysis.statistics import Comparison
    from harness.config import BenchConfig
    from harness.workload.spec import Workload

# arm -> [(run, its busy steps: component -> per-step CPU us, plus "end_ns")], as analysis.compare reads them
HostSteps = Mapping[str, Sequence[tuple[Mapping, Mapping[str, "np.ndarray"]]]]


@dataclass(frozen=True)
class Design:
    """One A/B design (``run.design``), registered in :mod:`harness.designs.registry`.

    ``run``: every run of both arms into cfg.out_dir, skipping those already done; returns their statuses.
    ``rows(runs, backends, primary, n_boot)``: the comparison rows (before Holm) of a run directory's runs.
    ``host_rows(component, steps, n_boot)``: design-specific in-server host-time rows (beyond per step).
    ``samples_note(n)``: how the report counts the samples of a primary metric; ``runs_heading``: what the
    runs table lists; ``checks(runs, backends)``: the report's lines on the design's own assumptions (none by
    default).
    """

    name: str
    run: Callable[[BenchConfig, Workload], list[dict]]
    rows: Callable[[Sequence[dict], Sequence[str], set[str], int], list[Comparison]]
    host_rows: Callable[[str, HostSteps, int], list[Comparison]]
    samples_note: Callable[[int], str]
    runs_heading: str
    checks: Callable[[Sequence[Mapping], Sequence[str]], list[str]] = lambda runs, backends: []
