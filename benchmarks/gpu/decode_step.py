"""A Llama-3.1-8B decode step on the GPU, timed: the forward time that FINDINGS.md's GPU projection needs.

    python -m benchmarks.gpu.decode_step                  # CUDA GPU, torch only; about 1 min on an H200
    python -m benchmarks.gpu.decode_step --dry-run        # CPU, tiny geometry: the pipeline, no numbers

Random bf16 weights in Llama-3.1-8B's geometry (32 layers, hidden 4096, 32 query and 8 KV heads of 128, MLP
14336, vocabulary 128256). One decode token per request, each request attending over a contiguous KV cache of
the point's context. A layer is RMSNorm, the fused QKV projection, attention, the output projection, RMSNorm,
the fused gate/up projection, SiLU-and-multiply and the down projection; the step ends with the final norm and
the LM head. Rotary embedding and sampling are left out (element-wise work on a few KiB per request).

Attention is timed two ways, each KV head's 4 query heads packed as 4 query rows (exact for a decode token,
which sees every key; no K/V is copied): ``sdpa``, PyTorch's fused scaled_dot_product_attention, whose flash
kernel does not split the context and so leaves most of the GPU idle at batch 1 and long context; and
``matmul``, scores by a batched matrix product, a float32 softmax and a second product, which spreads a long
context over the whole GPU for a few percent more bytes. A point's step time is the faster of the two: the
floor a serving engine's split-KV decode kernel (vLLM's FlashAttention) approaches.

The whole step is captured in a CUDA graph, as vLLM captures decode steps, and timed by replaying it
between CUDA events. Each layer has its own weights; each layer has its own KV cache while the batch's
caches fit in `--kv-budget-gib`, else all layers read one cache, which changes nothing measurable when one
layer's cache is far larger than the GPU's L2 (`kv_per_layer` in the output says which).
Writes ``<out-dir>/<run id>/decode_step.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.gpu.settings import ROOT


@dataclass(frozen=True, slots=True)
class Geometry:
    layers: int = 32
    hidden: int = 4096
    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    vocab: int = 128256

    def weight_elems(self) -> int:
        qkv = self.hidden * (self.q_heads + 2 * self.kv_heads) * self.head_dim
        o = self.q_heads * self.head_dim * self.hidden
        mlp = self.hidden * 2 * self.intermediate + self.intermediate * self.hidden
        return self.layers * (qkv + o + mlp + 2 * self.hidden) + self.hidden * self.vocab + self.hidden

    def kv_elems_per_token_layer(self) -> int:
        return 2 * self.kv_heads * self.head_dim


# the GPU projection's points (findings/sources.yaml) and the regime map's concurrency x prompt cells
DEFAULT_POINTS = "1024x1,1024x32,1024x128,4096x8,4096x32,16384x1,16384x8,16384x32,131072x1,131072x8"
ATTENTION = ("sdpa", "matmul")
TINY = Geometry(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512)


@dataclass(frozen=True, slots=True)
class Point:
    context: int
    batch: int


class Weights:
    """Every layer's projections and the LM head, random, made once for all points."""

    def __init__(self, g: Geometry, device: str, dtype: Any) -> None:
        import torch

        self.g, self.device, self.dtype = g, device, dtype
        self.gen = torch.Generator(device=device).manual_seed(0)
        qkv_out = (g.q_heads + 2 * g.kv_heads) * g.head_dim
        self.layers = [
            (self.rand(g.hidden, qkv_out), self.rand(g.q_heads * g.head_dim, g.hidden),
             self.rand(g.hidden, 2 * g.intermediate), self.rand(g.intermediate, g.hidden))
            for _ in range(g.layers)
        ]  # fmt: skip
        self.lm_head = self.rand(g.hidden, g.vocab)

    def rand(self, *shape: int) -> Any:
        import torch

        out = torch.empty(*shape, device=self.device, dtype=self.dtype)
        rows_per_slice = max(1, (1 << 28) // max(1, out[0].numel()))  # no float32 copy of a many-GiB cache
        for part in out.view(shape[0], -1).split(rows_per_slice, dim=0):
            part.copy_(torch.randn(part.shape, generator=self.gen, device=self.device) * 0.02)
        return out


class Step:
    """One decode step at one point: the batch's KV caches and input, with a static forward a CUDA graph can
    replay."""

    def __init__(self, w: Weights, point: Point, kv_budget_bytes: int) -> None:
        import torch

        g, self.g, self.point, self.w = w.g, w.g, point, w
        self.attention = ATTENTION[0]
        elem = torch.finfo(w.dtype).bits // 8
        kv_bytes_layer = point.batch * point.context * g.kv_elems_per_token_layer() * elem
        self.kv_per_layer = kv_bytes_layer * g.layers <= kv_budget_bytes
        shape = (point.batch, g.kv_heads, point.context, g.head_dim)
        self.kv = [(w.rand(*shape), w.rand(*shape)) for _ in range(g.layers if self.kv_per_layer else 1)]
        self.x = w.rand(point.batch, g.hidden)
        self.bytes_read = (
            g.weight_elems() + g.layers * point.batch * point.context * g.kv_elems_per_token_layer()
        ) * elem

    def forward(self) -> Any:
        import torch
        import torch.nn.functional as F

        g, b = self.g, self.point.batch
        group = g.q_heads // g.kv_heads
        h = self.x
        for i, (w_qkv, w_o, w_gate_up, w_down) in enumerate(self.w.layers):
            k_cache, v_cache = self.kv[i % len(self.kv)]
            qkv = F.rms_norm(h, (g.hidden,)) @ w_qkv
            q = qkv[:, : g.q_heads * g.head_dim].reshape(b, g.kv_heads, group, g.head_dim)
            if self.attention == "sdpa":
                attn = F.scaled_dot_product_attention(q, k_cache, v_cache)  # (b, kv_heads, group, head_dim)
            else:
                scores = (
                    q @ k_cache.transpose(-1, -2)
                ).float() * g.head_dim**-0.5  # (b, kv_heads, group, ctx)
                attn = torch.softmax(scores, dim=-1).to(q.dtype) @ v_cache
            h = h + attn.reshape(b, g.q_heads * g.head_dim) @ w_o
            gate, up = (F.rms_norm(h, (g.hidden,)) @ w_gate_up).chunk(2, dim=-1)
            h = h + (F.silu(gate) * up) @ w_down
        return torch.argmax(F.rms_norm(h, (g.hidden,)) @ self.w.lm_head, dim=-1)


def time_step(step: Step, device: str, replays: int, warmup: int) -> list[float]:
    """Milliseconds per step: CUDA-graph replays between events on a GPU, wall time on CPU."""
    import time

    import torch

    if device != "cuda":
        out = []
        for _ in range(replays):
            t0 = time.perf_counter()
            step.forward()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm the kernels' choices before capture
            step.forward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step.forward()
    for _ in range(warmup):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def measure(w: Weights, point: Point, replays: int, kv_budget_gib: float) -> dict:
    """The point's step under each attention; its time is the faster one's."""
    import torch

    step = Step(w, point, int(kv_budget_gib * 2**30))
    by_attention = {}
    for attention in ATTENTION:
        step.attention = attention
        ms = np.asarray(time_step(step, w.device, replays, warmup=5))
        med = float(np.median(ms))
        by_attention[attention] = {
            "median_ms": med,
            "p10_ms": float(np.percentile(ms, 10)),
            "p90_ms": float(np.percentile(ms, 90)),
            "n": int(ms.size),
            "gbps": step.bytes_read / (med * 1e-3) / 1e9,
        }
    best = min(by_attention, key=lambda a: by_attention[a]["median_ms"])
    row = {
        **asdict(point),
        **by_attention[best],
        "attention": best,
        "by_attention": by_attention,
        "bytes_read": int(step.bytes_read),
        "kv_per_layer": step.kv_per_layer,
    }
    del step
    if w.device == "cuda":
        torch.cuda.empty_cache()
    return row


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu.decode_step", description=__doc__.split("\n")[0]
    )
    p.add_argument("--points", default=DEFAULT_POINTS, help="CONTEXTxBATCH,...")
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--kv-budget-gib", type=float, default=80.0)
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny geometry, float32")
    p.add_argument("--out-dir", type=Path, default=ROOT / "results" / "gpu")
    p.add_argument("--run-id", default="")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import torch

    from benchmarks.gpu.machine import machine
    from benchmarks.gpu.settings import Settings

    a = parse(argv)
    points = [Point(*(int(v) for v in spec.split("x"))) for spec in a.points.split(",")]
    if a.dry_run:
        device, dtype, g = "cpu", torch.float32, TINY
        points = [replace(p, context=min(p.context, 256), batch=min(p.batch, 3)) for p in points]
    elif torch.cuda.is_available():
        device, dtype, g = "cuda", torch.bfloat16, Geometry()
    else:
        sys.exit("decode_step: no CUDA GPU visible to torch; --dry-run runs the pipeline on CPU")
    started = datetime.now(UTC)
    run_id = a.run_id or (
        "decode-step-" + ("dryrun-" if a.dry_run else "") + started.strftime("%Y%m%dT%H%M%S")
    )
    info = machine(Settings(device=device, interpret=a.dry_run))
    weights, rows = Weights(g, device, dtype), []
    for p in points:
        rows.append(measure(weights, p, a.replays if not a.dry_run else 2, a.kv_budget_gib))
        r = rows[-1]
        spread = f"[p10 {r['p10_ms']:.3f}, p90 {r['p90_ms']:.3f}]"
        where = f"ctx {p.context:>6} batch {p.batch:>3}"
        rate = f"{r['gbps']:.0f} GB/s ({r['attention']}), KV per layer: {r['kv_per_layer']}"
        print(f"{where}: {r['median_ms']:.3f} ms {spread}, {rate}", flush=True)
    result = {
        "kind": "gpu_decode_step",
        "measurement": "CPU dry run, NOT a GPU measurement" if a.dry_run else "GPU",
        "run_id": run_id,
        "started": started.isoformat(),
        "seconds": (datetime.now(UTC) - started).total_seconds(),
        "geometry": asdict(g),
        "dtype": str(dtype),
        "method": "a CUDA graph of one decode step, CUDA events around each replay; the faster attention",
        "machine": info,
        "points": rows,
    }
    out = a.out_dir / run_id
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode_step.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out / 'decode_step.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
