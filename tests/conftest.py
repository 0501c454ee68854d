"""Fixtures shared by the test modules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.serve import tiny_model
from harness.serve.launcher import ENV_ENFORCE_EAGER

# Every vLLM server the tests start (here, in the harness, in subprocesses) skips torch.compile: tests check
# behaviour, both arms run the same mode, and the compile warm-up was a third of each server's start on CI's
# 2-core machines. Benchmarks leave it unset. TAGMA_ENFORCE_EAGER=0 in the environment runs tests compiled.
os.environ.setdefault(ENV_ENFORCE_EAGER, "1")


@pytest.fixture(scope="module")
def tok_dir() -> Path:
    """The tiny model's folder (its tokenizer), built first when missing."""
    if not (tiny_model.DEFAULT_DIR / "tiny_model_spec.json").exists():
        subprocess.run([sys.executable, "-m", "harness.serve.tiny_model"], check=True)
    return tiny_model.DEFAULT_DIR
