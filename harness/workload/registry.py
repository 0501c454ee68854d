"""``workload.kind`` -> the module that builds it: the one place a workload kind chooses code. A new kind is
a module with ``build_workload(spec, tokenizer_dir, cache_dir) -> Workload`` and one entry here (its fields
and name go into :mod:`harness.workload.spec`, which validates specs without importing the builders)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.workload import mooncake, sharegpt
from harness.workload.spec import KINDS, Workload, WorkloadSpec

Builder = Callable[[WorkloadSpec, Path, Path | None], Workload]
WORKLOADS: dict[str, Builder] = {"sharegpt": sharegpt.build_workload, "mooncake": mooncake.build_workload}
if tuple(WORKLOADS) != KINDS:
    raise ImportError(f"harness.workload.spec.KINDS {KINDS} != registered workloads {tuple(WORKLOADS)}")


def build_workload(spec: WorkloadSpec, tokenizer_dir: Path, cache_dir: Path | None) -> Workload:
    """The workload for spec, built by its kind's module (sharegpt: from cache_dir when a valid cached copy
    exists; cache_dir None: no cache)."""
    if spec.max_model_len is None:
        raise ValueError(f"workload {spec.name}: max_model_len is not resolved "
                         f"(see harness.serve.model_context)")  # fmt: skip
    return WORKLOADS[spec.kind](spec, Path(tokenizer_dir), cache_dir)
