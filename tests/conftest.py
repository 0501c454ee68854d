"""Fixtures shared by the test modules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.serve import tiny_model
from tagma.contract import ENV_ENFORCE_EAGER
from tests import parallel

# Every vLLM server the tests start (here, in the harness, in subprocesses) skips torch.compile: tests check
# behaviour, both arms run the same mode, and the compile warm-up was a third of each server's start on CI's
# 2-core machines. Benchmarks leave it unset. TAGMA_ENFORCE_EAGER=0 in the environment runs tests compiled.
os.environ.setdefault(ENV_ENFORCE_EAGER, "1")
parallel.bind_cores()  # under pytest-xdist (make test): each worker's servers on a core of their own


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    parallel.longest_first(items)


@pytest.fixture(scope="session")
def tok_dir() -> Path:
    """The tiny model's folder (its tokenizer), built first when missing."""
    if not (tiny_model.DEFAULT_DIR / "tiny_model_spec.json").exists():
        subprocess.run([sys.executable, "-m", "harness.serve.tiny_model"], check=True)
    return tiny_model.DEFAULT_DIR


# The regime map's smoke group, one lifetime per arm, run once through Hydra's submitit local launcher
# (`+cluster=local`): the end-to-end findings test reads it and the SLURM test compares its own run with it.
SMOKE_MAP_OVERRIDES = ("regime=smoke", "regime.repeats=1", "map_id=ci-smoke")


@pytest.fixture(scope="session")
def smoke_map(tmp_path_factory: pytest.TempPathFactory, tok_dir: Path) -> Path:
    """The map folder of the smoke map run locally (its Hydra sweep folder is ``<map>/../sweep``), made once
    for all xdist workers."""
    from tests.harness.multirun import run_multirun

    del tok_dir  # the tiny model exists
    with parallel.made_once(tmp_path_factory, "smoke-map") as (root, to_make):
        if to_make:
            run_multirun("harness.regime.main", [*SMOKE_MAP_OVERRIDES, f"map_dir={root / 'map'}"],
                         cluster="local", sweep_dir=root / "sweep", timeout_s=1800)  # fmt: skip
    return root / "map"
