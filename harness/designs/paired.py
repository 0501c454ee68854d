"""The paired-interleaving design: both arms' servers up at once, every prompt sent to both seconds apart.

On a shared machine the dominant noise is slow drift between server lifetimes minutes apart (other tenants,
thermal and frequency state, the server's own warm-up); it is far larger than host-side effects. Here each
prompt goes to arm A, then (as soon as A has answered) to arm B, with the first arm alternating from pair
to pair (A B, B A, A B, ...), so both measurements of a pair are seconds apart and the order effect cancels.
The second request waits ``run.pair_gap_s`` (1.5 s) first: a vLLM reader busy-waits for 1 s after its last
read, and a request sent to the other server inside that second waited 0.5-1 s for its first token here, on
one server of the two only (so the alternation did not cancel it). The next pair's first request goes to the
server that just answered, so it needs no pause. The first wave of a round waits the same pause after both
servers' warm-ups: without it, the server warmed up last was still spinning while the other took the round's
first wave, and that wave's first prefill step ran 5-10x slower on that arm alone (seen on this 2-core
machine in 4 of 6 rounds, always the baseline's: every round opened with the baseline, since an even number
of waves per round kept the alternation in phase). Rounds alternate which arm opens them as well.
At concurrency c (``load.max_concurrency``, closed loop) the unit is a wave: c consecutive prompts sent to one
server at once, then, when all c have answered, the same c to the other; the first arm alternates wave by
wave. Only one server is busy at a time, so the idle one does not compete for the cores. A wave is a batch
that starts together and, with every output the same length (ignore_eos), decodes together: it measures
the steps of c running requests, not a steady state where requests arrive and leave (that is the ABBA
design's closed cells). ``run.repeats`` rounds each start a fresh pair of servers, so server-lifetime effects
also enter the comparison.

Each arm's requests.jsonl carries ``pair`` (the position of the request in measurement order over all
rounds), ``wave`` (its wave's, the same at concurrency 1), ``round`` and ``first`` (whether this arm went
first in the wave).

Comparison: requests are paired (the same prompt to both arms, seconds apart); latency statistics compare the
paired arrays in measurement order, and the jackknife's batches keep each wave whole (the requests of a wave
share their steps, so they are not independent samples). ITL enters as each request's mean gap. Output
throughput at concurrency 1 is tokens over latency; with identical output lengths on both arms (ignore_eos)
its ratio is the inverse of the mean-E2EL ratio, which is how it is computed. At concurrency c > 1 it is the
inverse of the ratio of mean wave spans (first send to last answer), paired by wave. In-server host time is
also compared per request, paired by prompt: at c > 1 each request is charged the steps that ended while it
was in flight, shared with its wave.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator, Mapping, Sequence

import aiohttp
import numpy as np
from tqdm import tqdm

from harness.analysis.runs import LATENCY_KEYS, LATENCY_STATS, ok_runs
from harness.analysis.statistics import Comparison, compare_pairs
from harness.client import ClientConfig, RequestResult, completions_url, encode_body, make_session, send_one
from harness.config import ARM_NAMES, BenchConfig
from harness.designs.base import Design, HostSteps
from harness.designs.server_run import RunFailed, ServerRun, failure_reason, run_dir_name, run_is_done
from harness.files import read_json
from harness.serve.launcher import ServerError
from harness.serve.noise import pinned
from harness.workload.spec import RequestSpec, Workload


def first_arm_of(wave_in_round: int, round_index: int) -> int:
    """0 (baseline first) or 1: the order alternates wave by wave within a round, and the arm that opens a
    round alternates round by round, so neither arm always takes the first wave after the warm-ups."""
    return (wave_in_round + round_index) % 2


def wave_size(cfg: BenchConfig) -> int:
    """Prompts sent to one server at once: the closed loop's concurrency (1: one request in flight)."""
    return int(cfg.load.max_concurrency or 1)


@dataclasses.dataclass
class PairedReplay:
    """Per arm, in request order: results and wall windows (time_ns sent, done), which attribute in-server
    host time to requests; per arm, busy seconds (the sum of its waves' spans: its share of the wall time);
    per request, its wave's number over all rounds and the arm that went first in it."""

    results: list[list[RequestResult]]
    walls: list[list[tuple[int, int]]]
    busy: list[float]
    waves: list[int]
    first: list[int]


async def replay_pairs(
    cfg: BenchConfig, urls: tuple[str, str], workload: Workload, round_index: int, bar: tqdm
) -> PairedReplay:
    """Send each wave of prompts to both servers, one server at a time (a wave: ``wave_size`` prompts at
    once, all answered before the other server gets them)."""
    config = ClientConfig()
    timeout = aiohttp.ClientTimeout(total=cfg.run.request_timeout_s)
    size = wave_size(cfg)
    requests = workload.requests
    wave0 = round_index * math.ceil(len(requests) / size)
    out = PairedReplay(results=[[], []], walls=[[], []], busy=[0.0, 0.0], waves=[], first=[])
    if cfg.run.pair_gap_s:
        await asyncio.sleep(cfg.run.pair_gap_s)  # the server warmed up last: its readers stop spinning
    async with make_session(config) as session:
        t0 = time.perf_counter()

        async def send(arm: int, req: RequestSpec, body: bytes) -> tuple[RequestResult, tuple[int, int]]:
            res = RequestResult(index=req.index, scheduled_s=time.perf_counter() - t0,
                                expected_prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens)
            wall_start = time.time_ns()
            await send_one(session, completions_url(urls[arm]), body, res, t0, timeout, False)
            return res, (wall_start, time.time_ns())

        for w, k0 in enumerate(range(0, len(requests), size)):
            wave = requests[k0:k0 + size]
            bodies = [encode_body(cfg.model.path, req, config) for req in wave]
            first = first_arm_of(w, round_index)
            for arm in (first, 1 - first):
                if arm != first and cfg.run.pair_gap_s:
                    await asyncio.sleep(cfg.run.pair_gap_s)  # the first server's readers stop spinning
                start = time.perf_counter()
                done = await asyncio.gather(*(send(arm, r, b) for r, b in zip(wave, bodies, strict=True)))
                out.busy[arm] += time.perf_counter() - start
                for res, wall in done:
                    out.results[arm].append(res)
                    out.walls[arm].append(wall)
            out.waves += [wave0 + w] * len(wave)
            out.first += [first] * len(wave)
            bar.update(len(wave))
    return out


def run_round(cfg: BenchConfig, workload: Workload, round_index: int) -> list[dict]:
    """One round: a fresh server per arm, both up, the whole workload replayed in pairs (waves of pairs)."""
    arms = cfg.arms
    indices = (2 * round_index, 2 * round_index + 1)
    runs = [ServerRun(cfg, arm, i, cfg.out_dir / "runs" / run_dir_name(i, arm))
            for arm, i in zip(arms, indices, strict=True)]
    pair0 = round_index * len(workload.requests)
    try:
        with contextlib.ExitStack() as stack:
            for run in runs:
                stack.enter_context(run)
            for run in runs:
                run.warm_up(workload)
            for run in runs:
                run.begin_replay()
            cores = runs[0].client_cores()
            if cores is not None:
                cores &= runs[1].client_cores() or cores
            desc = f"round {round_index} pairs"
            bar_ = tqdm(total=len(workload.requests), desc=desc, unit="pair", leave=False)
            with pinned(cores), bar_ as bar:
                replay = asyncio.run(asyncio.wait_for(
                    replay_pairs(cfg, (runs[0].base_url, runs[1].base_url), workload, round_index, bar),
                    timeout=cfg.run.run_timeout_s))  # fmt: skip
            for a, run in enumerate(runs):
                walls, waves = replay.walls[a], replay.waves
                extra = [{"pair": pair0 + k, "wave": waves[k], "round": round_index,
                          "first": replay.first[k] == a,
                          "wall_start_ns": walls[k][0], "wall_end_ns": walls[k][1]}
                         for k in range(len(replay.results[a]))]  # fmt: skip
                run.finish(replay.results[a], replay.busy[a], extra)
    except (ServerError, TimeoutError, RunFailed) as e:
        reason = failure_reason(cfg, e)
        return [run.write_status(reason) for run in runs]
    return [run.write_status() for run in runs]


def run(cfg: BenchConfig, workload: Workload) -> list[dict]:
    """Every round of the paired design; a round whose two runs are both ok is skipped on resume."""
    statuses: list[dict] = []
    for r in tqdm(range(cfg.run.repeats), desc="paired rounds", unit="round"):
        dirs = [cfg.out_dir / "runs" / run_dir_name(2 * r + a, arm) for a, arm in enumerate(cfg.arms)]
        if all(run_is_done(d) for d in dirs):
            statuses += [read_json(d / "status.json") for d in dirs]
            continue
        round_statuses = run_round(cfg, workload, r)
        for s in round_statuses:
            if s["status"] != "ok":
                tqdm.write(f"round {r} {s['arm']} ({s['backend']}) FAILED: {s['reason'].splitlines()[0]}")
        statuses += round_statuses
    return statuses


# --------------------------------------------------------------------------------------------- comparison

_FLIP = {"faster": "higher", "slower": "lower"}


def wave_of(row: Mapping) -> int:
    """A request row's wave: its own pair in runs from before waves (one request per wave)."""
    return int(row["wave"] if row.get("wave") is not None else row["pair"])


def _paired_rows(runs: Sequence[dict], backends: Sequence[str], arm: str) -> Iterator[Mapping]:
    """The rows of ``arm``'s ok runs that carry a pair (runs of the paired design)."""
    for run in ok_runs(runs, arm, backends):
        yield from (row for row in run["requests"] if row.get("pair") is not None)


def paired_values(
    runs: Sequence[dict], backends: Sequence[str], key: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(baseline, candidate, wave) values of ``key`` for the pairs both arms served, in measurement order."""
    by_arm: dict[str, dict[int, float]] = {a: {} for a in ARM_NAMES}
    waves: dict[int, int] = {}
    for arm in ARM_NAMES:
        for row in _paired_rows(runs, backends, arm):
            v = row.get(key)
            if isinstance(v, list):
                v = float(np.mean(v)) if v else None
            if row["success"] and v is not None:
                by_arm[arm][int(row["pair"])] = float(v)
                waves[int(row["pair"])] = wave_of(row)
    base, cand = (by_arm[a] for a in ARM_NAMES)
    pairs = sorted(set(base) & set(cand))
    return (np.asarray([base[p] for p in pairs]), np.asarray([cand[p] for p in pairs]),
            np.asarray([waves[p] for p in pairs], dtype=int))  # fmt: skip


def wave_spans(runs: Sequence[dict], backends: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(baseline, candidate) seconds from a wave's first send to its last answer, for the waves whose every
    request both arms served, in measurement order."""
    spans: dict[str, dict[int, list[int]]] = {a: {} for a in ARM_NAMES}
    failed: set[int] = set()
    for arm in ARM_NAMES:
        for row in _paired_rows(runs, backends, arm):
            if row.get("wall_start_ns") is None:
                continue
            w = wave_of(row)
            if not row["success"]:
                failed.add(w)
            span = spans[arm].setdefault(w, [row["wall_start_ns"], row["wall_end_ns"]])
            span[0], span[1] = min(span[0], row["wall_start_ns"]), max(span[1], row["wall_end_ns"])
    base, cand = (spans[a] for a in ARM_NAMES)
    waves = sorted((set(base) & set(cand)) - failed)

    def seconds(d: dict[int, list[int]]) -> np.ndarray:
        return np.asarray([(d[w][1] - d[w][0]) / 1e9 for w in waves])

    return seconds(base), seconds(cand)


def invert(c: Comparison, metric: str, of: str = "mean E2EL") -> Comparison:
    """The comparison of 1/x from that of x (a latency ratio turned into a throughput ratio): higher is better
    now, so a verdict re-decided later (Holm) reads the direction right."""
    inv = lambda x: None if x is None or x == 0 else 1.0 / x  # noqa: E731
    return dataclasses.replace(
        c, metric=metric, baseline=None, candidate=None, ratio=inv(c.ratio),
        ci_low=inv(c.ci_high), ci_high=inv(c.ci_low), verdict=_FLIP.get(c.verdict, c.verdict),
        lower_is_better=not c.lower_is_better, method=f"{c.method}, 1 / {of}",
    )  # fmt: skip


def _units(waves: np.ndarray) -> np.ndarray | None:
    """The jackknife's units: the waves where a wave holds several requests, else each pair its own."""
    return waves if len(np.unique(waves)) < len(waves) else None


def _pair_rows(
    runs: Sequence[dict], backends: Sequence[str], primary: set[str], n_boot: int
) -> list[Comparison]:
    out: list[Comparison] = []
    for key in LATENCY_KEYS:
        a, b, waves = paired_values(runs, backends, key)
        for stat_name in LATENCY_STATS:
            name = f"{stat_name}_{key}"
            out.append(compare_pairs(name, a, b, stat_name, lower_is_better=True, primary=name in primary,
                                     n_boot=n_boot, units=_units(waves)))  # fmt: skip
    a, b, waves = paired_values(runs, backends, "e2el_ms")
    of = "mean E2EL"
    if _units(waves) is not None:  # a wave's throughput: its tokens (equal on both arms) over its span
        (a, b), of = wave_spans(runs, backends), "mean wave span"
    for key in ("output_throughput", "request_throughput"):
        c = compare_pairs(key, a, b, "mean", lower_is_better=True, primary=key in primary,
                          n_boot=n_boot)  # fmt: skip
        out.append(invert(c, key, of))
    return out


def rows(runs: Sequence[dict], backends: Sequence[str], primary: set[str], n_boot: int) -> list[Comparison]:
    rounds = [len(ok_runs(runs, a, backends)) for a in ARM_NAMES]  # the server lifetimes the pairs came from
    return [dataclasses.replace(c, runs_baseline=rounds[0], runs_candidate=rounds[1])
            for c in _pair_rows(runs, backends, primary, n_boot)]  # fmt: skip


def per_request_host(
    steps: Mapping[str, np.ndarray], requests: Sequence[Mapping], name: str
) -> dict[int, float]:
    """pair -> CPU us of component ``name`` over the steps that ended while that request was in flight."""
    end = steps["end_ns"]
    out: dict[int, float] = {}
    for row in requests:
        if row.get("pair") is None or not row["success"] or row.get("wall_start_ns") is None:
            continue
        inside = (end >= row["wall_start_ns"]) & (end <= row["wall_end_ns"])
        out[int(row["pair"])] = float(steps[name][inside].sum())
    return out


def host_rows(component: str, steps: HostSteps, n_boot: int) -> list[Comparison]:
    """In-server CPU time of ``component`` per request, paired by prompt (the jackknife over whole waves)."""
    per: list[dict[int, float]] = [{}, {}]
    waves: dict[int, int] = {}
    for k, arm in enumerate(ARM_NAMES):
        for run, s in steps[arm]:
            per[k].update(per_request_host(s, run["requests"], component))
            waves.update((int(r["pair"]), wave_of(r)) for r in run["requests"] if r.get("pair") is not None)
    pairs = sorted(set(per[0]) & set(per[1]))
    if not pairs:
        return []
    c = compare_pairs(f"{component}_us_per_request", np.asarray([per[0][p] for p in pairs]),
                      np.asarray([per[1][p] for p in pairs]), "mean", n_boot=n_boot,
                      units=_units(np.asarray([waves[p] for p in pairs], dtype=int)))  # fmt: skip
    return [dataclasses.replace(c, runs_baseline=len(steps[ARM_NAMES[0]]),
                                runs_candidate=len(steps[ARM_NAMES[1]]))]  # fmt: skip


def openers(runs: Sequence[Mapping], backends: Sequence[str]) -> list[str]:
    """Per round, the arm that took the round's first wave (its first pair's first request), read from the
    baseline's rows."""
    first: dict[int, tuple[int, bool]] = {}
    for row in _paired_rows(runs, backends, ARM_NAMES[0]):
        if row.get("round") is None or row.get("first") is None:
            continue
        key, pair = int(row["round"]), int(row["pair"])
        if key not in first or pair < first[key][0]:
            first[key] = (pair, bool(row["first"]))
    return [ARM_NAMES[0] if first[k][1] else ARM_NAMES[1] for k in sorted(first)]


SLOW_FACTOR = 5.0  # slow: a TTFT this many times the arm's faster slot median


def slot_lines(runs: Sequence[Mapping], backends: Sequence[str]) -> list[str]:
    """The order within a pair, per arm: TTFT p50 and slow requests when the arm went first and second. The
    alternation cancels an effect of the slot that both arms share; one that hits one arm's server only
    (a reader of the other server still spinning, seen on this 2-core machine) shows here as a gap on
    that arm alone."""
    parts = []
    for arm in ARM_NAMES:
        slots: dict[bool, list[float]] = {True: [], False: []}
        for run in ok_runs(runs, arm, backends):
            for row in run["requests"]:
                if row["success"] and row.get("first") is not None and row.get("ttft_ms") is not None:
                    slots[bool(row["first"])].append(float(row["ttft_ms"]))
        if not slots[True] or not slots[False]:
            continue
        median = min(float(np.median(slots[True])), float(np.median(slots[False])))
        slow = {k: sum(v > SLOW_FACTOR * median for v in vals) for k, vals in slots.items()}
        parts.append(
            f"{arm} {np.median(slots[True]):.1f} / {np.median(slots[False]):.1f} ms, slow {slow[True]} / "
            f"{slow[False]} of {len(slots[True])} / {len(slots[False])}"
        )
    if not parts:
        return []
    return [f"order within a pair (TTFT p50 when first / second; slow: TTFT over {SLOW_FACTOR:g}x the arm's "
            f"faster slot's p50): {'; '.join(parts)}"]  # fmt: skip


DESIGN = Design(
    name="paired",
    run=run,
    rows=rows,
    host_rows=host_rows,
    samples_note=lambda n: f"{n} request pairs",
    runs_heading="rounds of server pairs",
    checks=slot_lines,
)
