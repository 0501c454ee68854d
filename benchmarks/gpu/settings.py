"""The GPU kernel benchmark's settings and command line."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

@dataclass(frozen=True, slots=True)
class Settings:
    contexts: tuple[int, ...] = (4096, 16384, 32768, 131072)
    batches: tuple[int, ...] = (1, 8, 64)
    placements: tuple[str, ...] = ("contiguous", "fragmented:headroom", "fragmented:best_fit")
    dtype: str = "bfloat16"
    num_q_heads: int = 32  # Llama-3.1-8B
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    prefill_tokens: int = 8192
    rounds: int = 2  # ABBA: round r times the pair in order (paged, tagma) when r is even, reversed when odd
    warmup_ms: int = 25
    rep_ms: int = 100
    cpu_reps: int = 3
    check_rows: int = 2
    seed: int = 0
    device: str = "cuda"
    interpret: bool = False
    out_dir: Path = ROOT / "results" / "gpu"
    run_id: str = ""

    def __post_init__(self) -> None:
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError("num_q_heads must be a multiple of num_kv_heads")
        for p in self.placements:
            if p != "contiguous" and not p.startswith("fragmented:"):
                raise ValueError(f"unknown placement {p!r}: contiguous or fragmented:<policy>")


DESCRIPTION = "Kernel-level benchmark of the KV write and read paths: block table vs range descriptors."
DRY_RUN = {
    "contexts": (64, 200), "batches": (1, 3), "num_q_heads": 4, "num_kv_heads": 2, "head_dim": 32,
    "dtype": "float16", "prefill_tokens": 48, "rounds": 1, "cpu_reps": 1, "device": "cpu", "interpret": True,
}  # fmt: skip


def parse_args(argv: list[str] | None) -> Settings:
    d = Settings()
    ints = lambda s: tuple(int(x) for x in s.split(","))  # noqa: E731
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=DESCRIPTION)
    p.add_argument("--contexts", type=ints, default=d.contexts)
    p.add_argument("--batches", type=ints, default=d.batches)
    p.add_argument("--placements", type=lambda s: tuple(s.split(",")), default=d.placements)
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=d.dtype)
    for name in (
        "num_q_heads",
        "num_kv_heads",
        "head_dim",
        "block_size",
        "prefill_tokens",
        "rounds",
        "warmup_ms",
        "rep_ms",
        "cpu_reps",
        "check_rows",
        "seed",
    ):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    p.add_argument("--device", choices=("cuda", "cpu"), default=d.device)
    p.add_argument("--interpret", action="store_true", help="run the kernels under TRITON_INTERPRET=1")
    p.add_argument("--dry-run", action="store_true", help="CPU + interpreter at tiny sizes (CI smoke test)")
    p.add_argument("--out-dir", type=Path, default=d.out_dir)
    p.add_argument("--run-id", default="")
    args = vars(p.parse_args(argv))
    dry = args.pop("dry_run")
    if dry:
        args.update(DRY_RUN)
    if args["device"] == "cpu" and not args["interpret"]:
        p.error("--device cpu runs Triton kernels only under the interpreter: add --interpret (or --dry-run)")
    return Settings(**args)


