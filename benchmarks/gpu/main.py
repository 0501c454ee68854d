"""Kernel-level benchmark of the KV write and read paths: block table (paged) vs range descriptors (tagma).

For every context length x batch size x KV placement it times, per call (median and spread):

* ``decode_attention``: split-KV decode attention reading KV through the block table (paged) or by range
  arithmetic (tagma), and PyTorch SDPA on a contiguous [batch, kv_heads, seq, dim] copy of the KV (the
  contiguous reference; it does not depend on the placement, so it is timed once per context x batch);
* ``slot_mapping``: slots of the batch's new tokens from the block table vs from the ranges;
* ``kv_write``: vLLM's write path, slot mapping then ``reshape_and_cache``, driven by each;
* ``kv_write_fused``: the scatter with each token's slot found inside the same kernel;

the write kernels for a decode step (one new token per request, at the end of its context) and for a
chunked-prefill step (``--prefill-tokens`` new tokens shared by the batch, at the end of each context).
It reports achieved memory bandwidth (useful bytes: KV read, or new K/V rows read and written, plus
queries/outputs/positions/slots) as a fraction of the device's peak and of a measured device copy, and
the tagma/paged ratio of medians with a bootstrap 95% interval. Placements: ``contiguous`` (each request
one range: tagma's assumption holds) and ``fragmented:<policy>`` (range lengths drawn from the tagma
engine's serving trace under that policy, ``benchmarks/gpu/fragmentation_trace.json``; see
``benchmarks.fragmentation_sim``). Before timing, every configuration checks that paged and tagma agree
and match a float32 SDPA reference on the first requests.

    python benchmarks/gpu/main.py                 # a CUDA GPU; about 5 min on an H100/H200
    python benchmarks/gpu/main.py --contexts 16384 --batches 8 --placements contiguous
    python benchmarks/gpu/main.py --dry-run       # CPU, Triton interpreter, tiny sizes: NOT a measurement

Needs torch and Triton, not vLLM. Writes ``results/gpu/<run-id>/kernels.json`` (config, machine,
versions, commit, placements, checks, every timing and ratio), ``ratios.png`` and ``bandwidth.png``;
exits non-zero when a correctness check failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# Peak DRAM bandwidth (GB/s) by device-name substring, most specific first (vendor datasheets).
PEAK_GBPS = (
    ("GH200", 4000.0), ("H200", 4800.0), ("H100 NVL", 3900.0), ("H100 PCIe", 2000.0), ("H100", 3350.0),
    ("H800", 3350.0), ("H20", 4000.0), ("B200", 8000.0), ("B100", 8000.0),
    ("A100-SXM4-80GB", 2039.0), ("A100 80GB PCIe", 1935.0), ("A100", 1555.0), ("A800", 2039.0),
    ("L40S", 864.0), ("L40", 864.0), ("L4", 300.0), ("A10G", 600.0), ("A10", 600.0),
    ("RTX 6000 Ada", 960.0), ("RTX 4090", 1008.0), ("V100", 900.0), ("T4", 320.0),
)  # fmt: skip
WRITE_KERNELS = ("slot_mapping", "kv_write", "kv_write_fused")
BYTES_MODEL = {  # the useful bytes a call must move; bandwidth = bytes / median time
    "decode_attention": "K and V of every context token (2 * batch * context * kv_heads * head_dim * elem) "
    "+ query + output; not the split partials or descriptors (equal for paged and tagma)",
    "slot_mapping": "16 B per new token: its int64 position read, its int64 slot written",
    "kv_write": "the new K and V rows read and written (4 * tokens * kv_heads * head_dim * elem) + 24 B per "
    "token (position, slot written then read)",
    "kv_write_fused": "the new K and V rows read and written + 12 B per token (position, request row)",
}


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


DRY_RUN = {
    "contexts": (64, 200), "batches": (1, 3), "num_q_heads": 4, "num_kv_heads": 2, "head_dim": 32,
    "dtype": "float16", "prefill_tokens": 48, "rounds": 1, "cpu_reps": 1, "device": "cpu", "interpret": True,
}  # fmt: skip


def parse_args(argv: list[str] | None) -> Settings:
    d = Settings()
    ints = lambda s: tuple(int(x) for x in s.split(","))  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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


def check_device(s: Settings) -> None:
    import torch

    if s.device == "cuda" and not torch.cuda.is_available():
        sys.exit(
            f"gpu_kernels: no CUDA GPU visible to torch {torch.__version__}; this benchmark needs one. "
            "`python benchmarks/gpu/main.py --dry-run` runs the pipeline on CPU under Triton's interpreter"
        )
    try:
        import triton  # noqa: F401
    except ImportError:
        sys.exit("gpu_kernels: Triton is not installed")


# ------------------------------------------------------------------------------------------ machine


def peak_gbps(name: str) -> float | None:
    return next((gbps for key, gbps in PEAK_GBPS if key in name), None)


def machine(s: Settings) -> dict[str, Any]:
    import torch
    import triton

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "platform": platform.platform(),
    }
    try:
        from harness.environment import environment, git_state

        info["git"] = git_state()
        info["environment"] = environment()
    except ImportError as exc:  # a bare GPU box without the harness's dependencies
        info["environment_error"] = str(exc)
    if s.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            device=props.name,
            capability=f"{props.major}.{props.minor}",
            sms=props.multi_processor_count,
            memory_bytes=props.total_memory,
            peak_gbps=peak_gbps(props.name),
            peak_source="datasheet table in benchmarks/gpu/main.py",
            copy_gbps=copy_bandwidth(),
        )
    else:
        info.update(device="cpu (Triton interpreter)", peak_gbps=None, copy_gbps=None)
    return info


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy (read + write): what the memory system achieves."""
    import torch
    import triton.testing

    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


# ------------------------------------------------------------------------------------------ timing


@dataclass(slots=True)
class Timer:
    s: Settings

    def __call__(self, fn: Callable[[], Any]) -> list[float]:
        if self.s.device == "cuda":
            import triton.testing

            return list(
                triton.testing.do_bench(fn, warmup=self.s.warmup_ms, rep=self.s.rep_ms, return_mode="all")
            )
        times = []
        for _ in range(self.s.cpu_reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return times

    def pair(self, fns: dict[str, Callable[[], Any]]) -> dict[str, list[float]]:
        samples: dict[str, list[float]] = {name: [] for name in fns}
        names = list(fns)
        for r in range(self.s.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                samples[name].extend(self(fns[name]))
        return samples


def summarize(ms: list[float], nbytes: int, info: dict[str, Any]) -> dict[str, Any]:
    a = np.asarray(ms)
    med = float(np.median(a))
    gbps = nbytes / (med * 1e-3) / 1e9 if med > 0 else None
    out = {
        "median_ms": med,
        "p10_ms": float(np.percentile(a, 10)),
        "p90_ms": float(np.percentile(a, 90)),
        "mean_ms": float(a.mean()),
        "std_ms": float(a.std()),
        "n": int(a.size),
        "bytes": int(nbytes),
        "gbps": gbps,
        "frac_peak": gbps / info["peak_gbps"] if gbps and info.get("peak_gbps") else None,
        "frac_copy": gbps / info["copy_gbps"] if gbps and info.get("copy_gbps") else None,
    }
    return out


def ratio(
    num: list[float], den: list[float], rng: np.random.Generator, draws: int = 1000
) -> dict[str, float]:
    """Ratio of medians num/den with a bootstrap 95% interval (resampling each side's samples)."""
    a, b = np.asarray(num), np.asarray(den)
    ra = np.median(rng.choice(a, (draws, a.size)), axis=1)
    rb = np.median(rng.choice(b, (draws, b.size)), axis=1)
    boot = ra / rb
    return {
        "ratio": float(np.median(a) / np.median(b)),
        "ci95_lo": float(np.percentile(boot, 2.5)),
        "ci95_hi": float(np.percentile(boot, 97.5)),
    }


# ------------------------------------------------------------------------------------------ benchmark


@dataclass(slots=True)
class Results:
    timings: list[dict[str, Any]] = field(default_factory=list)
    ratios: list[dict[str, Any]] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    placements: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)


class Bench:
    def __init__(self, s: Settings, info: dict[str, Any]) -> None:
        import torch

        from benchmarks.fragmentation_sim import load_trace
        from benchmarks.gpu import placement, reference
        from tagma.kernels import decode_attention, write

        self.s, self.info = s, info
        self.torch, self.da, self.pl, self.ref, self.wr = torch, decode_attention, placement, reference, write
        self.dtype = getattr(torch, s.dtype)
        self.dev = torch.device(s.device)
        self.timer = Timer(s)
        self.rng = np.random.default_rng(s.seed)
        self.out = Results()
        self.lengths = {
            p: placement.RangeLengths.from_trace(load_trace(p.split(":", 1)[1]))
            for p in s.placements
            if p.startswith("fragmented:")
        }
        self.tok_bytes = s.num_kv_heads * s.head_dim * self.dtype.itemsize
        self.scale = 1.0 / math.sqrt(s.head_dim)
        self.sdpa_samples: list[float] | None = None  # this context x batch's SDPA timings

    def run(self) -> Results:
        for ctx in self.s.contexts:
            for batch in self.s.batches:
                print(f"context {ctx}, batch {batch}", flush=True)
                self.one_config(ctx, batch)
        return self.out

    def fits(self, nbytes: int) -> bool:
        if self.s.device != "cuda":
            return True
        free, _ = self.torch.cuda.mem_get_info()
        return nbytes + (2 << 30) < free

    def one_config(self, ctx: int, batch: int) -> None:
        torch, s = self.torch, self.s
        blocks_per_req = -(-ctx // s.block_size)
        num_blocks = batch * blocks_per_req + 1
        cache_bytes = 2 * num_blocks * s.block_size * self.tok_bytes
        where = {"context": ctx, "batch": batch}
        if not self.fits(cache_bytes):
            self.out.skipped.append(
                {**where, "what": "all", "why": f"KV cache of {cache_bytes} B does not fit"}
            )
            return
        gen = torch.Generator(device=self.dev).manual_seed(s.seed)
        shape = (num_blocks, s.block_size, s.num_kv_heads, s.head_dim)
        key_cache = torch.empty(shape, dtype=self.dtype, device=self.dev).normal_(generator=gen)
        value_cache = torch.empty(shape, dtype=self.dtype, device=self.dev).normal_(generator=gen)
        query = torch.randn(batch, s.num_q_heads, s.head_dim, generator=gen, device=self.dev).to(self.dtype)
        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=self.dev)
        self.sdpa_samples = None
        self.sdpa(where, key_cache, value_cache, query, blocks_per_req)
        for name in s.placements:
            placement = self.make_placement(name, batch, blocks_per_req)
            assert placement.num_blocks == num_blocks
            desc = placement.to_device(self.dev)
            self.out.placements.append({**where, "placement": name, **placement.stats()})
            at = {**where, "placement": name}
            self.attention(at, key_cache, value_cache, query, seq_lens, desc)
            for phase in ("decode", "prefill"):
                self.write_path({**at, "phase": phase}, key_cache, value_cache, desc)
        del key_cache, value_cache
        if s.device == "cuda":
            torch.cuda.empty_cache()

    def make_placement(self, name: str, batch: int, blocks_per_req: int) -> Any:
        if name == "contiguous":
            return self.pl.contiguous([blocks_per_req] * batch)
        return self.pl.fragmented([blocks_per_req] * batch, self.lengths[name], seed=self.s.seed + batch)

    # ---- read path

    def attention_bytes(self, batch: int, ctx: int) -> int:
        qo = 2 * batch * self.s.num_q_heads * self.s.head_dim * self.dtype.itemsize
        return 2 * batch * ctx * self.tok_bytes + qo

    def sdpa(self, where: dict, key_cache: Any, value_cache: Any, query: Any, blocks_per_req: int) -> None:
        """SDPA on a contiguous copy of the KV the contiguous placement gives each request."""
        s = self.s
        batch, ctx = where["batch"], where["context"]
        if not self.fits(2 * batch * ctx * self.tok_bytes):
            self.out.skipped.append(
                {**where, "what": "sdpa_contiguous", "why": "contiguous KV copy does not fit"}
            )
            return

        def contiguous_copy(cache: Any) -> Any:
            flat = cache[1:].view(batch, blocks_per_req * s.block_size, s.num_kv_heads, s.head_dim)
            return flat[:, :ctx].transpose(1, 2).contiguous()

        k, v = contiguous_copy(key_cache), contiguous_copy(value_cache)
        fn = lambda: self.ref.sdpa_decode_contiguous(query, k, v, self.scale)  # noqa: E731
        samples = self.timer(fn)
        if s.rounds > 1:
            samples += self.timer(fn)
        self.out.timings.append(
            {
                "kernel": "decode_attention",
                "phase": "decode",
                "variant": "sdpa_contiguous",
                "placement": "contiguous_tensor",
                **where,
                **summarize(samples, self.attention_bytes(batch, ctx), self.info),
            }
        )
        self.sdpa_samples = samples

    def attention(
        self, at: dict, key_cache: Any, value_cache: Any, query: Any, seq_lens: Any, desc: Any
    ) -> None:
        torch, da = self.torch, self.da
        batch, ctx = at["batch"], at["context"]
        num_splits, _ = da.plan_splits(ctx, batch, self.s.num_kv_heads, self.dev)
        ws_p = da.Workspace.allocate(batch, self.s.num_q_heads, num_splits, self.s.head_dim, self.dev)
        ws_r = da.Workspace.allocate(batch, self.s.num_q_heads, num_splits, self.s.head_dim, self.dev)
        out_p, out_r = torch.empty_like(query), torch.empty_like(query)
        common = {"num_splits": num_splits}

        def paged() -> Any:
            return da.decode_attention_paged(
                query,
                key_cache,
                value_cache,
                desc.block_table,
                seq_lens,
                ctx,
                self.scale,
                workspace=ws_p,
                out=out_p,
                **common,
            )

        def tagma() -> Any:
            return da.decode_attention_ranges(
                query,
                key_cache,
                value_cache,
                desc.ranges,
                desc.range_offsets,
                seq_lens,
                ctx,
                self.scale,
                num_search_steps=desc.num_search_steps,
                workspace=ws_r,
                out=out_r,
                **common,
            )

        paged(), tagma()
        rows = min(batch, self.s.check_rows)
        want = torch.stack(
            [self.reference_row(query, key_cache, value_cache, desc.block_table, ctx, r) for r in range(rows)]
        )
        tol = 2e-2 if self.dtype != torch.float32 else 1e-4
        diffs = {
            "paged_vs_tagma": float((out_p.float() - out_r.float()).abs().max()),
            "paged_vs_reference": float((out_p[:rows].float() - want).abs().max()),
            "tagma_vs_reference": float((out_r[:rows].float() - want).abs().max()),
        }
        ok = all(d <= tol for d in diffs.values())
        self.out.checks.append({"kernel": "decode_attention", **at, **diffs, "tolerance": tol, "ok": ok})
        samples = self.timer.pair({"paged": paged, "tagma": tagma})
        nbytes = self.attention_bytes(batch, ctx)
        for variant, ms in samples.items():
            self.out.timings.append(
                {
                    "kernel": "decode_attention",
                    "phase": "decode",
                    "variant": variant,
                    **at,
                    "num_splits": num_splits,
                    **summarize(ms, nbytes, self.info),
                }
            )
        row = {
            "kernel": "decode_attention",
            "phase": "decode",
            **at,
            "tagma_over_paged": ratio(samples["tagma"], samples["paged"], self.rng),
        }
        if self.sdpa_samples is not None:
            row["sdpa_over_paged"] = ratio(self.sdpa_samples, samples["paged"], self.rng)
            row["tagma_over_sdpa"] = ratio(samples["tagma"], self.sdpa_samples, self.rng)
        self.out.ratios.append(row)

    def reference_row(
        self, query: Any, key_cache: Any, value_cache: Any, table: Any, ctx: int, row: int
    ) -> Any:
        k = self.ref.gather_contiguous_kv(key_cache, table, ctx, row).float().transpose(0, 1)[None]
        v = self.ref.gather_contiguous_kv(value_cache, table, ctx, row).float().transpose(0, 1)[None]
        return self.ref.sdpa_decode_contiguous(query[row : row + 1].float(), k, v, self.scale)[0]

    # ---- write path

    def write_path(self, at: dict, key_cache: Any, value_cache: Any, desc: Any) -> None:
        torch, wr, s = self.torch, self.wr, self.s
        batch, ctx = at["batch"], at["context"]
        chunk = 1 if at["phase"] == "decode" else max(1, min(ctx, s.prefill_tokens // batch))
        at = {**at, "new_tokens_per_request": chunk}
        num_tokens = batch * chunk
        dev = self.dev
        positions = torch.arange(ctx - chunk, ctx, device=dev, dtype=torch.int64).repeat(batch)
        token_rows = torch.arange(batch, device=dev, dtype=torch.int32).repeat_interleave(chunk)
        qsl = torch.arange(0, num_tokens + 1, chunk, device=dev, dtype=torch.int32)
        gen = torch.Generator(device=dev).manual_seed(s.seed + 1)
        new = (num_tokens, s.num_kv_heads, s.head_dim)
        key = torch.randn(new, generator=gen, device=dev).to(self.dtype)
        value = torch.randn(new, generator=gen, device=dev).to(self.dtype)
        slots_p = torch.empty(num_tokens, dtype=torch.int64, device=dev)
        slots_r = torch.empty(num_tokens, dtype=torch.int64, device=dev)
        sm = {"num_reqs": batch, "query_start_loc": qsl, "positions": positions, "block_size": s.block_size}

        def slots_paged() -> None:
            wr.slot_mapping_paged(block_table=desc.block_table, slot_mapping=slots_p, **sm)

        def slots_tagma() -> None:
            wr.slot_mapping_ranges(
                ranges=desc.ranges,
                range_offsets=desc.range_offsets,
                slot_mapping=slots_r,
                num_search_steps=desc.num_search_steps,
                **sm,
            )

        kv = (key, value, key_cache, value_cache)
        pairs = {
            "slot_mapping": {"paged": slots_paged, "tagma": slots_tagma},
            "kv_write": {
                "paged": lambda: (slots_paged(), wr.reshape_and_cache(*kv, slots_p)),
                "tagma": lambda: (slots_tagma(), wr.reshape_and_cache(*kv, slots_r)),
            },
            "kv_write_fused": {
                "paged": lambda: wr.write_kv_paged(*kv, token_rows, positions, desc.block_table),
                "tagma": lambda: wr.write_kv_ranges(
                    *kv, token_rows, positions, desc.ranges, desc.range_offsets, desc.num_search_steps
                ),
            },
        }
        self.check_writes(at, pairs, slots_p, slots_r, positions, token_rows, desc.block_table, kv)
        row_bytes = 2 * num_tokens * self.tok_bytes  # K and V rows
        nbytes = {
            "slot_mapping": 16 * num_tokens,
            "kv_write": 2 * row_bytes + 24 * num_tokens,
            "kv_write_fused": 2 * row_bytes + 12 * num_tokens,
        }
        for kernel, fns in pairs.items():
            samples = self.timer.pair(fns)
            for variant, ms in samples.items():
                self.out.timings.append(
                    {"kernel": kernel, "variant": variant, **at, **summarize(ms, nbytes[kernel], self.info)}
                )
            self.out.ratios.append(
                {
                    "kernel": kernel,
                    **at,
                    "tagma_over_paged": ratio(samples["tagma"], samples["paged"], self.rng),
                }
            )

    def check_writes(self, at, pairs, slots_p, slots_r, positions, token_rows, table, kv) -> None:
        """Slots equal the block table's; every write variant puts each new row at its slot."""
        torch = self.torch
        bs = self.s.block_size
        pos = positions
        want = table[token_rows.long(), pos // bs].long() * bs + pos % bs
        pairs["slot_mapping"]["paged"](), pairs["slot_mapping"]["tagma"]()
        checks = {
            "slots_paged": bool(torch.equal(slots_p, want)),
            "slots_tagma": bool(torch.equal(slots_r, want)),
        }
        key, value, key_cache, value_cache = kv
        flat_k = key_cache.view(-1, *key_cache.shape[2:])
        flat_v = value_cache.view(-1, *value_cache.shape[2:])
        for kernel in ("kv_write", "kv_write_fused"):
            for variant in ("paged", "tagma"):
                flat_k[want] = 0
                flat_v[want] = 0
                pairs[kernel][variant]()
                checks[f"{kernel}_{variant}"] = bool(
                    torch.equal(flat_k[want], key) and torch.equal(flat_v[want], value)
                )
        self.out.checks.append({"kernel": "write", **at, **checks, "ok": all(checks.values())})


# ------------------------------------------------------------------------------------------ output


def plot(result: dict[str, Any], out_dir: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG", file=sys.stderr)
        return []
    s = result["config"]
    placements = s["placements"]
    rows = [("decode_attention", "decode")] + [(k, ph) for k in WRITE_KERNELS for ph in ("decode", "prefill")]
    fig, axes = plt.subplots(
        len(rows),
        len(placements),
        figsize=(4.2 * len(placements), 2.6 * len(rows)),
        squeeze=False,
        sharex=True,
    )
    for i, (kernel, phase) in enumerate(rows):
        for j, pl in enumerate(placements):
            ax = axes[i][j]
            for batch in s["batches"]:
                pts = [
                    (r["context"], r["tagma_over_paged"])
                    for r in result["ratios"]
                    if r["kernel"] == kernel
                    and r["phase"] == phase
                    and r["placement"] == pl
                    and r["batch"] == batch
                ]
                if not pts:
                    continue
                x = [p[0] for p in pts]
                y = [p[1]["ratio"] for p in pts]
                err = [
                    [p[1]["ratio"] - p[1]["ci95_lo"] for p in pts],
                    [p[1]["ci95_hi"] - p[1]["ratio"] for p in pts],
                ]
                ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=f"batch {batch}")
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{kernel} ({phase})\n{pl}", fontsize=9)
            if j == 0:
                ax.set_ylabel("tagma / paged time")
            if i == len(rows) - 1:
                ax.set_xlabel("context (tokens)")
            ax.legend(fontsize=7)
    fig.suptitle(f"{result['machine'].get('device')}: tagma/paged (below 1: tagma faster)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out_dir / "ratios.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(placements), figsize=(4.8 * len(placements), 3.8), squeeze=False)
    key = "frac_peak" if result["machine"].get("peak_gbps") else "median_ms"
    for j, pl in enumerate(placements):
        ax = axes[0][j]
        for variant, style in (("paged", "-"), ("tagma", "--"), ("sdpa_contiguous", ":")):
            for color, batch in enumerate(s["batches"]):
                pts = [
                    (t["context"], t[key])
                    for t in result["timings"]
                    if t["kernel"] == "decode_attention"
                    and t["variant"] == variant
                    and t["batch"] == batch
                    and t["placement"] in (pl, "contiguous_tensor")
                ]
                if pts and all(p[1] is not None for p in pts):
                    ax.plot(
                        [p[0] for p in pts],
                        [p[1] for p in pts],
                        style,
                        color=f"C{color}",
                        marker="o",
                        label=f"{variant} b{batch}",
                    )
        ax.set_xscale("log", base=2)
        ax.set_title(f"decode attention, {pl}", fontsize=9)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("fraction of peak bandwidth" if key == "frac_peak" else "median ms")
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out_dir / "bandwidth.png", dpi=110)
    plt.close(fig)
    return ["ratios.png", "bandwidth.png"]


def print_summary(result: dict[str, Any]) -> None:
    print(
        f"{'kernel':<17}{'phase':<9}{'placement':<22}{'ctx':>7}{'batch':>6}{'tagma/paged':>13}{'95% CI':>17}"
    )
    for r in result["ratios"]:
        t = r["tagma_over_paged"]
        ci = f"[{t['ci95_lo']:.3f}, {t['ci95_hi']:.3f}]"
        print(
            f"{r['kernel']:<17}{r['phase']:<9}{r['placement']:<22}{r['context']:>7}{r['batch']:>6}"
            f"{t['ratio']:>13.3f}{ci:>17}"
        )


def main(argv: list[str] | None = None) -> int:
    s = parse_args(argv)
    if s.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels' modules are imported (below)
    check_device(s)
    info = machine(s)
    started = datetime.now(UTC)
    run_id = s.run_id or ("kernels-" + ("dryrun-" if s.interpret else "") + started.strftime("%Y%m%dT%H%M%S"))
    out_dir = s.out_dir / run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    bench = Bench(s, info)
    results = bench.run()
    from benchmarks.fragmentation_sim import DEFAULT_TRACE_PATH, load_trace

    traces = {p: load_trace(p.split(":", 1)[1]) for p in s.placements if p.startswith("fragmented:")}
    result = {
        "kind": "gpu_kernels",
        "measurement": "interpreter smoke run, NOT a GPU measurement" if s.interpret else "GPU",
        "run_id": run_id,
        "started": started.isoformat(),
        "seconds": (datetime.now(UTC) - started).total_seconds(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(s).items()},
        "machine": info,
        "bytes_model": BYTES_MODEL,
        "fragmentation_source": {
            "file": str(DEFAULT_TRACE_PATH.relative_to(ROOT)),
            "traces": {
                p: {"source": t["source"], "config": t["config"], "summary": t["summary"]}
                for p, t in traces.items()
            },
        },
        **asdict(results),
    }
    (out_dir / "kernels.json").write_text(json.dumps(result, indent=1) + "\n")
    pngs = plot(result, out_dir)
    print_summary(result)
    failed = [c for c in results.checks if not c["ok"]]
    print(f"wrote {out_dir / 'kernels.json'}" + "".join(f", {p}" for p in pngs))
    if failed:
        print(f"CORRECTNESS FAILED in {len(failed)} checks: {failed[:3]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
