"""The report from run files, and a sweep that resumes without redoing finished runs (no servers here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness import report, runner
from harness.config import BenchConfig, ModelConfig, RunConfig, ServerConfig
from harness.designs import abba, paired
from harness.files import read_json, write_json, write_jsonl
from harness.workload.arrivals import LoadSpec
from harness.workload.lengths import LengthDist
from harness.workload.spec import WorkloadSpec


def _cfg(out: Path, repeats: int = 2) -> BenchConfig:
    return BenchConfig(
        model=ModelConfig(name="m", path="/nowhere"),
        server=ServerConfig(max_model_len=4096),
        workload=WorkloadSpec(
            name="w", num_requests=3, input_len=LengthDist("fixed", value=100),
            output_len=LengthDist("fixed", value=8), max_model_len=4096,
        ),  # fmt: skip
        load=LoadSpec(mode="open", request_rate=1.0),
        run=RunConfig(repeats=repeats, n_boot=200),
        out_dir=out,
        data_dir=out / "data",
    )


ARM_OF = {"paged": "baseline", "tagma": "candidate"}


def _fake_run(root: Path, index: int, backend: str, scale: float, n: int = 40, arm: str | None = None,
              run_noise: float = 0.0, design: str = "abba", wave: int = 1) -> None:  # fmt: skip
    arm = arm or ARM_OF[backend]
    d = root / "runs" / f"{index:02d}-{arm}-{backend}"
    rng = np.random.default_rng(index)
    drift = 1.0 + run_noise * rng.normal()  # one factor for the whole server lifetime
    rows = []
    for i in range(n):
        ttft = 100.0 * (1 + i % 5) * scale * drift * rng.normal(1, 0.01)
        itl = list(10.0 * scale * drift * rng.normal(1, 0.01, size=7))
        row = {"index": i, "success": True, "ttft_ms": ttft, "tpot_ms": float(np.mean(itl)), "itl_ms": itl,
               "e2el_ms": ttft + sum(itl)}  # fmt: skip
        if design == "paired":
            w = i // wave
            row.update(pair=i, round=0, first=(w % 2 == 0) == (arm == "baseline"))
            if wave > 1:  # a wave's prompts sent together, 10 s after the last wave's
                start = int(w * 10e9)
                row.update(wave=w, wall_start_ns=start, wall_end_ns=start + int(row["e2el_ms"] * 1e6))
        rows.append(row)
    write_jsonl(d / "requests.jsonl", rows)
    write_jsonl(d / "telemetry.jsonl", [
        {"t_s": 0.0, "kv_cache_usage": 0.1, "server_rss_bytes": 2**30},
        {"t_s": 1.0, "kv_cache_usage": 0.5, "server_rss_bytes": 2**31, "prefix_cache_queries": 10,
         "prefix_cache_hits": 0, "preemptions": 0,
         "tagma": {"live_requests": 3, "ranges_per_request": {"mean": 1.0, "p99": 1.0, "max": 1},
                   "peak_ranges_per_request": 1, "in_place_growths": 5, "new_ranges": 3, "evictions": 0,
                   "external_fragmentation": 0.0}},
    ])  # fmt: skip
    write_json(d / "summary.json", {"completed": n, "failed": 0, "output_throughput": 100.0 / scale / drift,
                                    "request_throughput": 1.0 / scale / drift, "mean_ttft_ms": 300.0 * scale})
    write_json(d / "status.json", {"arm": arm, "backend": backend, "index": index, "status": "ok",
                                   "reason": None, "startup_s": 60.0, "kv_capacity_tokens": 100000,
                                   "noise": {"loadavg_before": 0.1 if index != 1 else 1.7,
                                             "steal_fraction": 0.0, "server_involuntary_switches": 12,
                                             "under_load": index == 1}})  # fmt: skip


def _meta(root: Path, backends: tuple[str, str] = ("paged", "tagma"), design: str = "abba") -> None:
    primary = ["mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "output_throughput"]
    run = {"design": design, "alpha": 0.05, "n_boot": 200, "primary_metrics": primary}
    write_json(root / "config.json", {"model": {"name": "m"}, "load": {"mode": "open"},
                                      "backends": list(backends), "run": run})  # fmt: skip
    write_json(root / "environment.json", {
        "cpu": "cpu", "cpu_count": 2, "gpus": [], "packages": {"vllm": "0.32.0", "torch": "2.13"},
        "git": {"commit": "abc", "dirty": False}})
    provenance = {"sharegpt": {"source": "s", "sha256": "ff", "conversations": 7}}
    write_json(root / "workload.json", {"spec": {"name": "w"}, "provenance": provenance,
                                        "prompt_lengths": [100, 120, 140], "output_lengths": [8, 8, 8]})


ABBA6 = ["paged", "tagma", "tagma", "paged"] * 3


def test_report_finds_the_slowdown_and_writes_everything(tmp_path: Path) -> None:
    _meta(tmp_path)
    for index, backend in enumerate(ABBA6):
        _fake_run(tmp_path, index, backend, scale=1.25 if backend == "tagma" else 1.0, run_noise=0.02)
    write_json(tmp_path / "runs" / "12-baseline-paged" / "status.json",
               {"arm": "baseline", "backend": "paged", "index": 12, "status": "failed",
                "reason": "server: exited with code 1"})  # fmt: skip
    md = report.write_report(tmp_path, n_boot=200).read_text()
    summary = read_json(tmp_path / "summary.json")
    ab = {r["metric"]: r for r in summary["ab"]}
    assert ab["mean_ttft_ms"]["ratio"] == pytest.approx(1.25, rel=0.03)
    assert ab["mean_ttft_ms"]["verdict"] == "slower" and ab["mean_ttft_ms"]["primary"]
    assert ab["output_throughput"]["verdict"] == "lower"
    assert ab["p50_itl_ms"]["verdict"] == "descriptive" and not ab["p50_itl_ms"]["primary"]
    assert ab["mean_ttft_ms"]["runs_baseline"] == ab["mean_ttft_ms"]["runs_candidate"] == 6
    assert summary["arms"]["baseline"]["repeats_ok"] == 6 and summary["kind"] == "A/B"
    assert summary["telemetry"]["01-candidate-tagma"]["ranges_per_request_max"] == 1
    assert set(summary["resolution"]) == {"mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
                                          "output_throughput"}  # fmt: skip
    assert md.splitlines()[0] == "# Serve A/B: candidate (tagma) vs baseline (paged)"
    assert md.splitlines()[2].startswith("**Resolution (95% half-width of each primary ratio):** mean_ttft")
    assert "s, 7 complete conversations recovered" in md and "1 of 12 ok runs taken under load" in md
    assert "| mean_ttft_ms |" in md and "failed: `server: exited with code 1`" in md
    for png in ("latency_cdfs", "ab_ratios", "per_run", "kv_usage", "prompt_lengths"):
        assert (tmp_path / "plots" / f"{png}.png").stat().st_size > 1000
    json.dumps(summary, allow_nan=False)  # no NaN anywhere


def test_an_aa_keeps_its_arms_apart_and_gives_no_verdict(tmp_path: Path) -> None:
    _meta(tmp_path, backends=("paged", "paged"))
    for index in range(8):
        arm = ("baseline", "candidate")[index % 2]
        _fake_run(tmp_path, index, "paged", scale=1.0, arm=arm, run_noise=0.13)
    md = report.write_report(tmp_path, n_boot=200).read_text()
    summary = read_json(tmp_path / "summary.json")
    assert summary["kind"] == "A/A" and summary["arms"]["candidate"]["repeats_ok"] == 4
    assert md.splitlines()[0] == "# Serve A/A: candidate (paged) vs baseline (paged)"
    for row in summary["ab"]:
        assert row["verdict"] in ("parity", "inconclusive", "descriptive", "n/a"), row


def test_the_backends_order_names_the_arms(tmp_path: Path) -> None:
    """[tagma, paged] makes tagma the baseline: its numbers are in the baseline column, the ratio inverts."""
    _meta(tmp_path, backends=("tagma", "paged"))
    for index, backend in enumerate(ABBA6[:8]):
        arm = "baseline" if backend == "tagma" else "candidate"
        _fake_run(tmp_path, index, backend, scale=1.25 if backend == "tagma" else 1.0, arm=arm)
    md = report.write_report(tmp_path, n_boot=200).read_text()
    ab = {r["metric"]: r for r in read_json(tmp_path / "summary.json")["ab"]}
    assert ab["mean_ttft_ms"]["ratio"] == pytest.approx(0.8, rel=0.03)
    assert ab["mean_ttft_ms"]["verdict"] == "faster"
    assert ab["mean_ttft_ms"]["baseline"] > ab["mean_ttft_ms"]["candidate"]
    assert "candidate (paged) vs baseline (tagma)" in md


@pytest.mark.parametrize(
    ("scale", "latency", "throughput"), [(1.1, "slower", "lower"), (0.9, "faster", "higher")]
)
def test_paired_design_compares_by_pair(tmp_path: Path, scale: float, latency: str, throughput: str) -> None:
    """Throughput is 1 / mean E2EL per pair: its verdict reads the direction of a throughput (Holm re-decides
    it; a slower candidate once came out as 'faster' throughput)."""
    _meta(tmp_path, design="paired")
    _fake_run(tmp_path, 0, "paged", scale=1.0, n=40, design="paired")
    _fake_run(tmp_path, 1, "tagma", scale=scale, n=40, design="paired")
    report.write_report(tmp_path, n_boot=200)
    ab = {r["metric"]: r for r in read_json(tmp_path / "summary.json")["ab"]}
    assert ab["mean_e2el_ms"]["samples"] == 40
    assert ab["mean_ttft_ms"]["ratio"] == pytest.approx(scale, rel=0.02)
    assert ab["mean_ttft_ms"]["verdict"] == latency
    assert ab["output_throughput"]["ratio"] == pytest.approx(1 / ab["mean_e2el_ms"]["ratio"])
    assert ab["output_throughput"]["ci_low"] < ab["output_throughput"]["ci_high"]
    assert ab["output_throughput"]["verdict"] == throughput
    md = (tmp_path / "report.md").read_text()
    assert f"| {throughput} | 1/1 |" in md.split("| output_throughput |")[1].split("\n")[0]
    assert "order within a pair (TTFT p50 when first / second" in md


def test_paired_waves_give_throughput_from_wave_spans(tmp_path: Path) -> None:
    """At concurrency 4 a wave's throughput is its tokens over its span (first send to last answer), paired
    by wave; latencies stay paired by request, their jackknife over whole waves."""
    _meta(tmp_path, design="paired")
    _fake_run(tmp_path, 0, "paged", scale=1.0, n=96, design="paired", wave=4)
    _fake_run(tmp_path, 1, "tagma", scale=0.8, n=96, design="paired", wave=4)
    report.write_report(tmp_path, n_boot=200)
    ab = {r["metric"]: r for r in read_json(tmp_path / "summary.json")["ab"]}
    assert ab["mean_tpot_ms"]["samples"] == 96 and "whole waves" in ab["mean_tpot_ms"]["method"]
    thr = ab["output_throughput"]
    assert thr["samples"] == 24 and thr["method"].endswith("1 / mean wave span")
    assert thr["ratio"] == pytest.approx(1 / 0.8, rel=0.03) and thr["verdict"] == "higher"


def test_resume_skips_finished_runs_and_retries_failed_ones(tmp_path: Path, monkeypatch) -> None:
    calls: list[tuple[int, str]] = []

    def fake_run_one(cfg, arm, index, workload, run_dir):  # type: ignore[no-untyped-def]
        calls.append((index, arm.name))
        status = {"arm": arm.name, "backend": arm.backend, "index": index,
                  "status": "ok" if index != 2 else "failed", "reason": None if index != 2 else "server died"}
        write_json(run_dir / "status.json", status)
        return status

    def fake_warmup(cfg, arm, warmup, workload, replay_cfg, run_dir):  # type: ignore[no-untyped-def]
        calls.append((-1, arm.name))
        return {"status": "warmup"}

    monkeypatch.setattr(abba, "run_one", fake_run_one)
    monkeypatch.setattr(abba, "unmeasured_lifetime", fake_warmup)
    cfg = _cfg(tmp_path, repeats=2)
    for index, arm in enumerate(["baseline-paged", "candidate-tagma", "candidate-tagma", "baseline-paged"]):
        (tmp_path / "runs" / f"{index:02d}-{arm}").mkdir(parents=True, exist_ok=True)
    statuses = runner.run_ab(cfg, workload=None)  # type: ignore[arg-type]
    # one unmeasured lifetime of the first arm to run, then every run; a failure does not stop it
    expected = [(-1, "baseline"), (0, "baseline"), (1, "candidate"), (2, "candidate"), (3, "baseline")]
    assert calls == expected
    assert [s["status"] for s in statuses] == ["ok", "ok", "failed", "ok"]
    assert runner.arms_without_a_run(cfg, statuses) == []
    calls.clear()
    runner.run_ab(cfg, workload=None)  # type: ignore[arg-type]
    assert calls == [(-1, "candidate"), (2, "candidate")]  # only the failed run is redone, warmed up first


def test_a_finished_run_starts_no_server_not_even_a_warm_up(tmp_path: Path, monkeypatch) -> None:
    def no_server(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("a server was started")

    monkeypatch.setattr(abba, "run_one", no_server)
    monkeypatch.setattr(abba, "unmeasured_lifetime", no_server)
    cfg = _cfg(tmp_path, repeats=1)
    for index, arm in enumerate(["baseline-paged", "candidate-tagma"]):
        name, backend = arm.split("-")
        status = {"arm": name, "backend": backend, "index": index, "status": "ok", "reason": None}
        write_json(tmp_path / "runs" / f"{index:02d}-{arm}" / "status.json", status)
    assert [s["status"] for s in runner.run_ab(cfg, workload=None)] == ["ok", "ok"]  # type: ignore[arg-type]


def test_an_arm_without_any_successful_run_is_named() -> None:
    cfg = _cfg(Path("/tmp/x"))
    statuses = [{"arm": "baseline", "status": "ok"}, {"arm": "candidate", "status": "failed"}]
    assert runner.arms_without_a_run(cfg, statuses) == ["candidate (tagma)"]


def test_abba_order_balances_position() -> None:
    a, b = _cfg(Path("/tmp/x")).arms
    assert abba.abba_order(1, a, b) == [a, b]
    assert abba.abba_order(2, a, b) == [a, b, b, a]
    order = abba.abba_order(4, a, b)
    assert order.count(a) == order.count(b) == 4
    with pytest.raises(ValueError):
        abba.abba_order(0, a, b)


def test_a_paired_runs_record_and_its_findings_rows(tmp_path: Path) -> None:
    """harness.regime.paired_text: the record of a paired run names its verdicts and its order check, and
    the FINDINGS rows name the run; an ABBA run is refused."""
    from harness.regime import paired_text

    root = tmp_path / "paired-run"
    _meta(root, design="paired")
    config = read_json(root / "config.json")
    config["workload"] = {"input_len": {"low": 1024, "high": 1024}, "output_len": {"value": 8},
                          "num_requests": 40}  # fmt: skip
    config["server"] = {"extra_args": ["--no-enable-prefix-caching"]}
    config["run"]["repeats"] = 1
    write_json(root / "config.json", config)
    _fake_run(root, 0, "paged", scale=1.0, n=40, design="paired")
    _fake_run(root, 1, "tagma", scale=0.9, n=40, design="paired")
    report.write_report(root, n_boot=200)
    rec = paired_text.record(root)
    assert rec["kind"] == "A/B" and rec["cell"]["prefix_caching"] is False
    assert rec["cell"]["pair_gap_s"] == 0.0  # written before the pause existed
    assert {r["metric"]: r["verdict"] for r in rec["primary"]}["mean_ttft_ms"] == "faster"
    assert rec["slots"] and "baseline" in rec["slots"][0]
    sources = {"paired_runs": [rec]}
    section = "\n".join(paired_text.paired_section(sources))
    assert "| paired-run | A/B | m, 1024 x 8 tok, caching off, 40 prompts x 1 rounds, pause 0 s |" in section
    answer = "\n".join(paired_text.paired_answer(sources))
    assert "Paired run paired-run" in answer and "supported differences: mean_ttft_ms 0.898" in answer, answer
    assert "their A/As made 0 false verdicts in 0 metric tests" in answer
    assert rec["step"] == [] and "Where a busy step goes" not in section  # no worker parts in this run
    abba_root = tmp_path / "abba-run"
    _meta(abba_root)
    _fake_run(abba_root, 0, "paged", scale=1.0)
    _fake_run(abba_root, 1, "tagma", scale=1.0)
    report.write_report(abba_root, n_boot=200)
    with pytest.raises(ValueError, match="design 'abba'"):
        paired_text.record(abba_root)


def test_a_paired_run_taken_with_the_biased_opening_is_marked_and_not_counted() -> None:
    """Before the opening pause every round's first wave went to the baseline beside the candidate's
    spinning warm-up: such records (all rounds opened by one arm, or no openers recorded) are marked in the
    table and their verdicts are left out of the answer."""
    from harness.regime import paired_text

    def rows(opened: list[str]) -> list[dict]:  # the baseline's requests, 2 pairs a round
        return [{"round": r, "pair": 2 * r + k, "first": (k == 0) == (arm == "baseline")}
                for r, arm in enumerate(opened) for k in (1, 0)]  # fmt: skip

    opened = ["baseline", "candidate"]
    runs = [{"status": "ok", "arm": "baseline", "backend": "paged", "requests": rows(opened)}]
    assert paired.openers(runs, ("paged", "tagma")) == ["baseline", "candidate"]
    primary = [{"metric": "mean_tpot_ms", "ratio": 0.9, "ci_low": 0.85, "ci_high": 0.95, "p_adjusted": 0.01,
                "verdict": "faster", "samples": 8}]  # fmt: skip
    cell = {"prompt_tokens": [1024, 1024], "output_tokens": 64, "prefix_caching": False, "requests": 8,
            "concurrency": 1, "rounds": 2, "pair_gap_s": 1.5}  # fmt: skip
    base = {"schema": paired_text.PAIRED_SCHEMA, "design": "paired", "kind": "A/B", "model": "m",
            "cell": cell, "backends": ["paged", "tagma"], "primary": primary, "host": [], "step": [],
            "slots": [], "environment": {}}  # fmt: skip
    old = {**base, "run_id": "old"}  # a record from before the openers were recorded
    same = {**base, "run_id": "same", "openers": ["baseline", "baseline"]}
    turns = {**base, "run_id": "turns", "openers": ["baseline", "candidate"]}
    one = {**base, "run_id": "one", "openers": ["baseline"]}
    assert [paired_text.opening_bias(r) for r in (old, same, turns, one)] == [True, True, False, False]
    sources = {"paired_runs": [old, same, turns]}
    answer = "\n".join(paired_text.paired_answer(sources))
    assert "Paired run turns" in answer and "Paired run old" not in answer and "Paired run same" not in answer
    assert "Paired runs: 1 with the opening pause" in answer
    assert "2 paired runs were taken with the biased opening" in answer
    assert "2 of them with verdicts" in answer
    section = "\n".join(paired_text.paired_section(sources))
    assert "| old | A/B (biased opening) |" in section and "| turns | A/B |" in section


def test_a_paired_runs_step_table_sums_the_whole_step() -> None:
    """The whole step's rows are kept only when every part is there; the table sums them per arm."""
    from harness.regime import paired_text

    host = [{"metric": m, "baseline": 100.0, "candidate": 80.0, "ratio": 0.8, "ci_low": 0.7, "ci_high": 0.9,
             "verdict": "descriptive"} for m in paired_text.STEP_ROWS]  # fmt: skip
    assert paired_text._step_rows(host[1:]) == []  # a part missing: no table rather than a partial sum
    rec = {"run_id": "r", "backends": ["paged", "tagma"], "step": paired_text._step_rows(host),
           "primary": [{"metric": "mean_tpot_ms", "ratio": 0.81, "ci_low": 0.75, "ci_high": 0.86,
                        "verdict": "faster"}]}  # fmt: skip
    table = "\n".join(paired_text.step_table(rec))
    n = len(paired_text.STEP_ROWS)
    assert "| r | model_forward | 100 | 80.0 | 0.8 [0.7, 0.9] |" in table  # each row names its run
    whole = f"Whole step: {100 * n:,} vs {80 * n:,} us, 0.8; mean TPOT measured 0.81 [0.75, 0.86] **faster**."
    assert whole in table
