"""The native benchmark binary (``tagma/csrc/bench/bench_engine.cpp``, CMake target ``tagma_bench``).

It is built on demand (by default in ``build/release``, the engine library's Release build folder, where
``make engine`` builds it too) and run once per benchmark run; its JSON (per operation and context: ns per
operation in each repeat) feeds the engine operations and the write path sections.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from harness.serve.environment import REPO

__all__ = ["build", "run"]

SOURCE_DIR = REPO / "tagma" / "csrc"


def build(build_dir: Path) -> Path:
    """Build the ``tagma_bench`` target in ``build_dir`` (configured as Release first when it is not), turning
    ``TAGMA_BUILD_BENCH`` on when the folder was configured without it; returns the binary's path."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("cmake is not on PATH: cannot build tagma_bench")

    def configure() -> None:
        subprocess.run(
            [cmake, "-S", str(SOURCE_DIR), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
             "-DTAGMA_BUILD_BENCH=ON"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip

    def compile_() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [cmake, "--build", str(build_dir), "--target", "tagma_bench", "-j2"],
            capture_output=True,
            text=True,
        )

    if not (build_dir / "CMakeCache.txt").is_file():
        configure()
    done = compile_()
    if done.returncode != 0:  # e.g. configured before the target existed, or with TAGMA_BUILD_BENCH=OFF
        configure()
        done = compile_()
    if done.returncode != 0:
        raise RuntimeError(f"building tagma_bench failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    binary = build_dir / "tagma_bench"
    if not binary.is_file():
        raise RuntimeError(f"{binary} was not produced (is the tagma_bench target in CMakeLists.txt?)")
    return binary


def run(
    binary: Path,
    contexts: list[int],
    block_size: int,
    repeats: int,
    min_batch_us: int,
    max_batch: int,
    max_batch_blocks: int,
    decode_batches: list[int],
    seed: int,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Run the binary; returns its JSON document (``results``: one row per operation and context)."""
    args = [
        str(binary),
        "--contexts",
        ",".join(str(c) for c in contexts),
        "--block-size",
        str(block_size),
        "--repeats",
        str(repeats),
        "--min-batch-us",
        str(min_batch_us),
        "--max-batch",
        str(max_batch),
        "--max-batch-blocks",
        str(max_batch_blocks),
        "--decode-batches",
        ",".join(str(r) for r in decode_batches),
        "--seed",
        str(seed),
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"tagma_bench failed ({done.returncode}): {done.stderr[-2000:]}")
    data = json.loads(done.stdout)
    data["command"] = args
    return data
