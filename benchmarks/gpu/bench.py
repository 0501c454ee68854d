"""Every configuration of the GPU kernel benchmark: placements, correctness checks, timings and ratios."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.gpu.settings import Settings
from benchmarks.gpu.timing import Timer, ratio, summarize

WRITE_KERNELS = ("slot_mapping", "kv_write", "kv_write_fused")
BYTES_MODEL = {  # the useful bytes a call must move; bandwidth = bytes / median time
    "decode_attention": "K and V of every context token (2 * batch * context * kv_heads * head_dim * elem) "
    "+ query + output; not the split partials or descriptors (equal for paged and tagma)",
    "slot_mapping": "16 B per new token: its int64 position read, its int64 slot written",
    "kv_write": "the new K and V rows read and written (4 * tokens * kv_heads * head_dim * elem) + 24 B per "
    "token (position, slot written then read)",
    "kv_write_fused": "the new K and V rows read and written + 12 B per token (position, request row)",
}



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


