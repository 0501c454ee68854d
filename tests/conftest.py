"""Fixtures shared by the test modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.serve import tiny_model


@pytest.fixture(scope="module")
def tok_dir() -> Path:
    """The tiny model's folder (its tokenizer), built first when missing."""
    if not (tiny_model.DEFAULT_DIR / "tiny_model_spec.json").exists():
        subprocess.run([sys.executable, "-m", "harness.serve.tiny_model"], check=True)
    return tiny_model.DEFAULT_DIR
