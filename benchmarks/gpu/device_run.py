"""The one-shot device script: everything a lent GPU should measure, in one command that needs only torch and
Triton (what a lent device has) and ends in about 3 minutes on an H200.

    python -m benchmarks.gpu.device_run --out "$OUT"          # on the device
    python -m benchmarks.gpu.device_run --out DIR --dry-run   # here: the same path on CPU, tiny sizes

1. the Triton kernel pairs (`python -m benchmarks.gpu`): write path and decode attention, paged vs ranges,
   16K and 128K contexts x batches 1, 8, 64 x every placement;
2. a Llama-3.1-8B decode step (`python -m benchmarks.gpu.decode_step`) at the GPU projection's points.

Each writes its JSON (and the kernels' figures) under ``<out>/<run id>/``, at most 2 folders down and 8
files, which is what the device tool brings back. Copy a real run to ``findings/gpu/`` and name it in
``findings/sources.yaml`` for FINDINGS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.gpu import decode_step
from benchmarks.gpu.__main__ import main as kernels_main

KERNEL_ARGS = ("--contexts", "16384,131072", "--batches", "1,8,64")
DRY_KERNELS = ("--dry-run", "--placements", "contiguous")  # the interpreter is slow: one placement


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu.device_run", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", type=Path, required=True, help="the folder the runs are written under ($OUT)")
    p.add_argument("--dry-run", action="store_true", help="CPU: the kernels under Triton's interpreter")
    a = p.parse_args(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    tag, dry = ("dryrun-", ["--dry-run"]) if a.dry_run else ("", [])
    out = ["--out-dir", str(a.out)]
    steps = (
        (
            "kernels",
            kernels_main,
            [*(DRY_KERNELS if dry else KERNEL_ARGS), *out, "--run-id", f"kernels-{tag}{stamp}"],
        ),
        ("decode step", decode_step.main, [*dry, *out, "--run-id", f"decode-step-{tag}{stamp}"]),
    )
    failed = []
    for name, run, args in steps:
        t0 = time.monotonic()
        print(f"== {name}: {' '.join(args)}", flush=True)
        try:
            code = run(args)
        except SystemExit as e:  # a step that stops (no GPU, say) does not stop the next
            code = e.code if isinstance(e.code, int) else 1
            print(e.code, file=sys.stderr)
        print(f"== {name}: exit {code} after {time.monotonic() - t0:.0f} s", flush=True)
        if code:
            failed.append(name)
    if failed:
        print(f"device_run: {', '.join(failed)} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
