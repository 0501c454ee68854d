"""The in-server KV cache manager statistic (harness.analysis.inserver) and bench-host's row built from it, on
synthetic host-time records written in the servers' own format; the shipped config's shape."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from benchmarks.host import inserver as host_section
from benchmarks.host.report import inserver as host_row
from benchmarks.host.report.table import TARGETS
from harness.analysis import inserver
from harness.analysis.runs import load_runs
from harness.config import from_mapping
from tagma.contract import PLACEMENT_TELEMETRY_FILE
from tagma.probes.host_time import COLUMNS, HostTimeChunk
from tests.harness.harness_run import run_harness

REPO = Path(__file__).resolve().parents[2]
OVERHEAD_NS = 500  # the clock-read cost the synthetic chunks declare
REPLAY_NS = 10_000  # replay_start_ns of every synthetic run


def _rows(kv_us: float, rng: np.random.Generator, decode_steps: int, running: int = 64,
          telemetry_every: int = 0) -> tuple[list[tuple], list[float]]:  # fmt: skip
    """A run's scheduler rows and its placement-telemetry times: warm-up steps (before the replay), prefill
    steps, decode-only steps with ``running`` requests, then decode-only steps with fewer running and an
    idle step. Only the decode-only steps with ``running`` requests cost ``kv_us``; every other step costs
    100x more, so a wrong selection shows in the mean. Every ``telemetry_every``-th of those decode steps
    writes a telemetry line and costs 1000 us more (a step's record is made 1 ms after the previous one's)."""
    rows: list[tuple] = []
    telemetry: list[float] = []
    step = 0

    def add(reqs: int, tokens: int, us: float, after_replay: bool = True, tel: bool = False) -> None:
        nonlocal step
        calls = max(reqs, 1)
        end_ns = REPLAY_NS + (step + 1) * 1_000_000 if after_replay else REPLAY_NS - 1
        if tel:
            us += 1000.0
            telemetry.append((end_ns - 500_000) / 1e9)  # written while the step ran
        total = int(us * 1000) + OVERHEAD_NS * calls  # what the wrappers measured, clock reads included
        # step, kv, update_kv, outside_kv, schedule_other, update_other, kv_calls, update_kv_calls,
        # outside_kv_calls, num_reqs, num_tokens, new_block_ids, end_ns
        rows.append((step, total, 0, 0, 1000, 1000, calls, 0, 0, reqs, tokens, 0, end_ns))
        step += 1

    for _ in range(5):  # warm-up
        add(1, 1, 100 * kv_us, after_replay=False)
    for i in range(1, running + 1):  # one prompt per step next to the running decodes
        add(i, 16000 + i - 1, 100 * kv_us)
    for k in range(decode_steps):
        add(running, running, kv_us * math.exp(rng.normal(0, 0.05)),
            tel=bool(telemetry_every) and k % telemetry_every == 0)  # fmt: skip
    for i in range(running - 1, 0, -1):  # requests finishing
        add(i, i, 100 * kv_us)
    add(0, 0, 100 * kv_us)  # idle
    return rows, telemetry


def _write_run(root: Path, index: int, arm: str, backend: str, kv_us: float, rng: np.random.Generator,
               decode_steps: int = 60, caching: bool = False, telemetry_every: int = 0) -> None:  # fmt: skip
    d = root / "runs" / f"{index:02d}-{arm}-{backend}"
    d.mkdir(parents=True)
    rows, telemetry = _rows(kv_us, rng, decode_steps, telemetry_every=telemetry_every)
    chunk = HostTimeChunk(role="scheduler", pid=100 + index, backend=backend, t=0.0,
                          timer_overhead_ns=OVERHEAD_NS, columns=COLUMNS["scheduler"], rows=rows)  # fmt: skip
    (d / f"host_time.scheduler.{100 + index}.jsonl").write_text(chunk.to_json() + "\n")
    if telemetry:
        lines = [json.dumps({"t": t, "live_requests": 64}) for t in telemetry]
        (d / PLACEMENT_TELEMETRY_FILE).write_text("\n".join(lines) + "\n" + '{"t": 1')  # last line cut
    (d / "server.log").write_text(f"INFO engine config: model='m', enable_prefix_caching={caching}, x=1\n")
    (d / "summary.json").write_text("{}")
    (d / "requests.jsonl").write_text("")
    status = {"arm": arm, "backend": backend, "index": index, "status": "ok", "replay_start_ns": REPLAY_NS}
    (d / "status.json").write_text(json.dumps(status))


def _make_run_dir(root: Path, paged_us: float, tagma_us: float, runs_per_arm: int, seed: int = 0,
                  caching: bool = False, workload: str = inserver.WORKLOAD_NAME,
                  telemetry_every: int = 0,
                  backends: tuple[str, str] = ("paged", "tagma")) -> Path:  # fmt: skip
    """A run directory; ``paged_us`` is the baseline arm's cost and ``tagma_us`` the candidate's (an A/A
    with ``backends`` = (paged, paged) gives both arms the paged backend)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True)
    config = {"backends": list(backends), "workload": {"name": workload},
              "load": {"mode": "closed", "max_concurrency": 64}, "inserver": {"min_running": 64},
              "run": {"design": "abba"}}  # fmt: skip
    (root / "config.json").write_text(json.dumps(config))
    order = []
    for i in range(runs_per_arm):
        order += [("baseline", backends[0]), ("candidate", backends[1])][:: 1 if i % 2 == 0 else -1]
    for index, (arm, backend) in enumerate(order):
        # each run its own level (run-to-run noise), as on a shared machine
        level = math.exp(rng.normal(0, 0.05))
        _write_run(root, index, arm, backend, (paged_us if arm == "baseline" else tagma_us) * level, rng,
                   caching=caching, telemetry_every=telemetry_every)  # fmt: skip
    return root


def test_selection_and_across_run_interval(tmp_path: Path) -> None:
    root = _make_run_dir(tmp_path / "r", paged_us=300.0, tagma_us=30.0, runs_per_arm=2)
    res = inserver.from_run_dir(root)
    assert res.interval == "across runs" and "Welch" in res.method
    b, c = res.arms["baseline"], res.arms["candidate"]
    # only the 60 decode-only steps with 64 running per run, clock cost subtracted
    assert b.steps == c.steps == 120
    s = b.summary()
    assert s["min_running"] == 64 and s["mean_running"] == 64 and s["kv_calls_per_step"] == 64
    assert 270 < res.baseline_us < 330 and 27 < res.candidate_us < 33
    assert res.speedup == pytest.approx(10.0, rel=0.15)
    lo, hi = res.speedup_ci
    assert lo < res.speedup < hi and lo > 5
    assert res.caching_off_everywhere
    # the descriptive split: the bin of 64 holds the counted steps; the finishing steps land below it
    top = b.bins[-1]
    assert (top.low, top.high, top.steps) == (64, None, 120)
    assert sum(x.steps for x in b.bins[:-1]) == 2 * 63
    assert s["prefill_steps"] == 2 * 64


def test_steps_that_wrote_telemetry_are_left_out(tmp_path: Path) -> None:
    root = _make_run_dir(tmp_path / "r", paged_us=300.0, tagma_us=30.0, runs_per_arm=2, telemetry_every=3)
    res = inserver.from_run_dir(root)
    b = res.arms["baseline"].summary()
    assert b["steps"] == 2 * 40 and b["telemetry_steps_left_out"] == 2 * 20
    assert b["telemetry_steps_mean_us"] > 1000
    assert 270 < res.baseline_us < 330 and 27 < res.candidate_us < 33
    assert res.speedup == pytest.approx(10.0, rel=0.15)
    end = np.asarray([10, 20, 30, 40])
    assert inserver.telemetry_steps(end, np.asarray([5, 20, 21, 99])).tolist() == [True, True, True, False]


def test_single_run_per_arm_gives_a_per_step_interval_and_says_so(tmp_path: Path) -> None:
    root = _make_run_dir(tmp_path / "r", paged_us=300.0, tagma_us=100.0, runs_per_arm=1)
    res = inserver.from_run_dir(root)
    assert res.interval == "per step"
    assert "within-run only" in (res.reason or "")
    assert res.per_step["batches"] == [6, 6]
    assert res.ci_low < res.ratio < res.ci_high
    assert res.speedup == pytest.approx(3.0, rel=0.15)
    row = host_row.headline_rows({"source": str(root), "result": res.to_dict()}, [16384])[0]
    assert row["met"] is False and "missed" in row["note"] and "per step" in row["note"]


def test_batch_means_interval_is_calibrated_under_autocorrelation() -> None:
    """A/As whose steps carry AR(1) noise (phi 0.6): the 95% per-step interval excludes 1 rarely; an
    interval that treated the steps as independent would exclude it far more often."""
    rng = np.random.default_rng(1)
    phi, n, sims, misses = 0.6, 200, 300, 0

    def series() -> np.ndarray:
        e = rng.normal(0, 0.1, n)
        x = np.empty(n)
        x[0] = e[0]
        for i in range(1, n):
            x[i] = phi * x[i - 1] + math.sqrt(1 - phi**2) * e[i]
        return 50.0 * np.exp(x)

    for _ in range(sims):
        out = inserver.batch_means_interval([series()], [series()])
        misses += not out["ci_low"] <= 1.0 <= out["ci_high"]
    assert misses / sims < 0.10


def test_batch_means_interval_edge_cases() -> None:
    few = inserver.batch_means_interval([np.full(15, 2.0)], [np.full(15, 1.0)])
    assert few["ratio"] == 0.5 and few["ci_low"] is None and "fewer than 2 batches" in few["reason"]
    empty = inserver.batch_means_interval([np.empty(0)], [np.ones(30)])
    assert empty["ratio"] is None and "no selected step" in empty["reason"]


def test_caching_on_is_never_met(tmp_path: Path) -> None:
    root = _make_run_dir(tmp_path / "r", paged_us=300.0, tagma_us=10.0, runs_per_arm=2, caching=True)
    res = inserver.from_run_dir(root)
    assert res.speedup_ci[0] > 5 and not res.caching_off_everywhere
    row = host_row.headline_rows({"source": str(root), "result": res.to_dict()}, [16384])[0]
    assert row["met"] is False and "prefix caching" in row["note"]


def test_no_step_with_all_running(tmp_path: Path) -> None:
    root = _make_run_dir(tmp_path / "r", paged_us=300.0, tagma_us=30.0, runs_per_arm=2)
    res = inserver.kv_manager_per_step(load_runs(root), json.loads((root / "config.json").read_text()),
                                       min_running=65)  # fmt: skip
    assert res.ratio is None and "no decode-only step with >= 65" in (res.reason or "")
    row = host_row.headline_rows({"source": str(root), "result": res.to_dict()}, [16384])[0]
    assert row["met"] is False


def test_bench_host_row_met_from_the_interval(tmp_path: Path) -> None:
    results = tmp_path / "serve"
    cfg: dict[str, Any] = {"repo_dir": str(tmp_path), "inserver_results_dir": str(results)}
    # none yet: not measured, never a number
    results.mkdir()
    section = host_section.run(cfg)
    row = host_row.headline_rows(section, [16384])[0]
    assert row["paged"] is None and row["tagma"] is None and row["met"] is False
    assert row["note"].startswith("not measured: run make bench-inserver")
    assert row["target"] == TARGETS["inserver_kv_manager"].text
    # another workload's run, and a run whose tagma arm failed, do not count
    _make_run_dir(results / "other", 300.0, 30.0, 2, workload="sharegpt_16k_cpu")
    broken = _make_run_dir(results / "broken", 300.0, 30.0, 1)
    status = broken / "runs" / "01-candidate-tagma" / "status.json"
    status.write_text(json.dumps(json.loads(status.read_text()) | {"status": "failed"}))
    assert host_section.run(cfg)["source"] is None
    # a 10x run: met, with the interval in the row
    good = _make_run_dir(results / "good", 300.0, 30.0, 2)
    section = host_section.run(cfg)
    assert Path(section["source"]) == good.resolve()
    row = host_row.headline_rows(section, [16384])[0]
    assert row["met"] is True and row["interval"] == "across runs"
    assert row["speedup"] == pytest.approx(10.0, rel=0.15)
    lo, hi = row["speedup_ci_95"]
    assert 5 <= lo < row["speedup"] < hi
    # a newer 4x run is the one read: missed, with what is left
    newer = _make_run_dir(results / "newer", 300.0, 75.0, 2)
    os.utime(newer / "config.json", (2e9, 2e9))
    section = host_section.run(cfg)
    assert Path(section["source"]) == newer.resolve()
    row = host_row.headline_rows(section, [16384])[0]
    assert row["met"] is False and row["note"].startswith("missed")
    # an explicit run wins over the newest
    section = host_section.run(cfg | {"inserver_run": str(good)})
    assert host_row.headline_rows(section, [16384])[0]["met"] is True
    with pytest.raises(FileNotFoundError, match="not a serve run directory"):
        host_section.run(cfg | {"inserver_run": str(tmp_path / "nowhere")})


def test_an_aa_run_calibrates_the_row_and_is_never_taken_for_tagma(tmp_path: Path) -> None:
    """An A/A of the same size (paged vs paged) is the row's calibration, never its source: the newest A/A
    is reported beside the A/B; an A/A whose interval holds 1 leaves a met row met, one that excludes 1
    (identical servers called different) makes it not met."""
    results = tmp_path / "serve"
    results.mkdir()
    cfg: dict[str, Any] = {"repo_dir": str(tmp_path), "inserver_results_dir": str(results)}
    ab = _make_run_dir(results / "ab", 300.0, 30.0, 2)
    section = host_section.run(cfg)
    row = host_row.headline_rows(section, [16384])[0]
    assert row["met"] is True and "no A/A at this size" in row["note"] and "aa_ratio" not in row
    aa = _make_run_dir(results / "aa", 300.0, 300.0, 2, seed=3, backends=("paged", "paged"))
    os.utime(aa / "config.json", (2e9, 2e9))  # the newest run: still not the A/B's source
    section = host_section.run(cfg)
    assert Path(section["source"]) == ab.resolve() and Path(section["aa"]["source"]) == aa.resolve()
    row = host_row.headline_rows(section, [16384])[0]
    lo, hi = row["aa_ci_95"]
    assert lo <= 1.0 <= hi and row["aa_ratio"] == pytest.approx(1.0, rel=0.15)
    assert row["met"] is True and "A/A (paged vs paged)" in row["note"] and "holds 1" in row["note"]
    biased = _make_run_dir(results / "aa-biased", 300.0, 200.0, 2, seed=4, backends=("paged", "paged"))
    section = host_section.run(cfg | {"inserver_aa_run": str(biased)})
    row = host_row.headline_rows(section, [16384])[0]
    assert row["aa_ci_95"][1] < 1.0 and row["met"] is False and "excludes 1" in row["note"]
    # with only an A/A there is no A/B row: not measured
    (ab / "config.json").unlink()
    section = host_section.run(cfg)
    assert section["source"] is None and section["aa"] is not None
    assert host_row.headline_rows(section, [16384])[0]["met"] is False


def test_report_section_lines(tmp_path: Path) -> None:
    root = _make_run_dir(tmp_path / "r", paged_us=300.0, tagma_us=30.0, runs_per_arm=2)
    text = "\n".join(inserver.markdown(inserver.from_run_dir(root)))
    assert ">= 64 running" in text and "off on both arms" in text and "across runs" in text
    assert "| paged | 2 | 120 | 64 |" in text and "| >= 64 | 120," in text


def test_prefix_caching_from_log(tmp_path: Path) -> None:
    (tmp_path / "server.log").write_text("noise\nsomething enable_prefix_caching=False, y\n")
    assert inserver.prefix_caching(tmp_path) is False
    (tmp_path / "server.log").write_text("no config line\n")
    assert inserver.prefix_caching(tmp_path) is None


def test_shipped_config() -> None:
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        dcfg = compose(config_name="inserver_64x16k", overrides=[f"repo_dir={REPO}"])
    resolved = OmegaConf.to_container(dcfg, resolve=True)
    assert isinstance(resolved, dict)
    cfg = from_mapping(resolved)
    assert cfg.run.design == "abba" and cfg.run.repeats >= 2 and cfg.backends == ("paged", "tagma")
    assert cfg.load.mode == "closed" and cfg.load.max_concurrency == 64 == cfg.workload.num_requests
    assert resolved["inserver"]["min_running"] == 64
    args = list(cfg.server.extra_args)
    assert "--no-enable-prefix-caching" in args
    assert int(args[args.index("--max-num-seqs") + 1]) >= 64
    # one whole prompt plus every running request's decode token fit one step's budget
    budget = int(args[args.index("--max-num-batched-tokens") + 1])
    assert budget >= cfg.workload.input_len.high + 63
    assert cfg.workload.input_len.low >= 15 * 1024 and cfg.workload.input_len.high <= 16384
    # the KV pool holds 64 full requests at 4 KiB per token (the tiny model, fp32): no preemption
    need_gib = 64 * (cfg.workload.input_len.high + cfg.workload.output_len.value) * 4096 / 2**30
    assert cfg.server.kv_cache_space_gib >= need_gib


@pytest.mark.slow
def test_shipped_config_runs_end_to_end_at_a_tiny_size(tmp_path: Path) -> None:
    """The shipped config's servers (prefix caching off, its batch budget) through the harness, shrunk to 4
    short requests and one server run per arm: the report carries the in-server section from real records."""
    summary = run_harness(
        tmp_path, "tiny",
        "run.repeats=1", "load.max_concurrency=4",
        "workload.name=inserver_tiny", "workload.num_requests=4", "workload.num_warmup=0",
        "workload.input_len={kind: uniform, low: 300, high: 600}",
        "workload.output_len={kind: fixed, value: 24}",
        "server.max_model_len=1024", "server.kv_cache_space_gib=1",
        config_name="inserver_64x16k",
    )  # fmt: skip
    ins = summary["inserver"]
    assert ins["min_running"] == 4 and ins["prefix_caching_off_everywhere"] is True
    for arm in ("baseline", "candidate"):
        a = ins["arms"][arm]
        assert a["steps"] >= 10 and a["min_running"] == 4 and a["mean_us_per_step"] > 0
    assert ins["ratio"] is not None and ins["ratio"] > 0
    assert "KV cache manager CPU per scheduler step" in (tmp_path / "tiny" / "report.md").read_text()
