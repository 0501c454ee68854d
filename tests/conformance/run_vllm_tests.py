"""Run vLLM's own tests (fetched by fetch_vllm_tests) against the installed vLLM, optionally with another
KV cache manager swapped into the scheduler.

    python -m tests.conformance.run_vllm_tests [--kv-manager module:Class] [--denylist deny.json]
        [--allowlist allow.json] [--per-file --timeout S] [--summary out.json] [TARGET ...]
        [-- pytest options]

TARGETs are paths or node ids relative to the fetched tree (default: tests/v1/core, or the files that
--allowlist lists under "run").

pytest runs in a child process rooted at `.vllm-tests/<version>/` (vLLM's tests are the package `tests`,
which must not meet this repo's `tests/`), with `vllm_conformance_plugin` loaded (see that module).
With --per-file, each test file (node ids of one file together) runs in its own process under a time limit,
and the counts per file (from pytest's junit XML) and in total are printed and optionally written as JSON,
with how many times the swapped-in manager was built (the plugin's TAGMA_CONFORMANCE_STATS).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tagma.contract import ENV_CONFORMANCE_DENYLIST, ENV_CONFORMANCE_KV_MANAGER, ENV_CONFORMANCE_STATS

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fetch_vllm_tests import DEFAULT_ROOT, fetch
else:
    from .fetch_vllm_tests import DEFAULT_ROOT, fetch

HERE = Path(__file__).resolve().parent
DEFAULT_TARGET = "tests/v1/core"


def pytest_cmd(extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "vllm_conformance_plugin", "-p", "no:cacheprovider", *extra]


def load_allowlist(path: Path) -> dict:
    """{"run": {file: reason}, "not_run": {file: reason}, ...} (lists/<version>/allowlist.json)."""
    return json.loads(Path(path).read_text())


def child_env(
    kv_manager: str | None, denylist: Path | None = None, stats: Path | None = None
) -> dict[str, str]:
    env = dict(os.environ)
    if stats:
        env[ENV_CONFORMANCE_STATS] = str(stats)
    if denylist:
        env[ENV_CONFORMANCE_DENYLIST] = str(Path(denylist).resolve())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    if kv_manager:
        env[ENV_CONFORMANCE_KV_MANAGER] = kv_manager
        # The manager's own package lives in this repo.
        env["PYTHONPATH"] += os.pathsep + str(HERE.parents[1])
    return env


def _summary(text: str | None) -> str:
    """The first lines of a failure message, enough to tell why (e.g. which model a config wanted)."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return " | ".join(lines[:3])[:400]


def parse_junit(path: Path) -> dict:
    counts = Counter()
    problems = []
    outcomes: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        kind = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                kind = {"failure": "failed", "error": "errors", "skipped": "skipped"}[child.tag]
                if kind == "skipped" and child.get("type") == "pytest.xfail":
                    kind = "xfailed"
                problems.append(
                    {"test": name, "outcome": kind, "message": _summary(child.get("message") or child.text)}
                )
                break
        counts[kind] += 1
        outcomes[name] = kind
    return {"counts": dict(counts), "problems": problems, "outcomes": outcomes}


def run_per_file(
    dest: Path,
    targets: list[str],
    extra: list[str],
    kv_manager: str | None,
    timeout: float,
    denylist: Path | None = None,
    jobs: int = 1,
) -> list[dict]:
    """One pytest process per file (`jobs` at a time); results in the targets' order."""
    groups: dict[str, list[str]] = {}  # file -> its targets (the file itself, or node ids in it)
    for t in targets:
        p = dest / t
        if p.is_dir():
            for f in sorted(p.rglob("test_*.py")):
                rel = f.relative_to(dest).as_posix()
                groups[rel] = [rel]
        else:
            groups.setdefault(t.split("::")[0], []).append(t)

    def run_one(rel: str, node_ids: list[str], tmp: Path) -> dict:
        xml = tmp / (rel.replace("/", "_") + ".xml")
        stats = xml.with_suffix(".stats.json")
        start = time.monotonic()
        try:
            proc = subprocess.run(
                pytest_cmd(["-q", f"--junitxml={xml}", *extra, *node_ids]),
                cwd=dest,
                env=child_env(kv_manager, denylist, stats),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-2000:]
        except subprocess.TimeoutExpired as e:
            rc, tail = "timeout", str(e)
        entry = {"file": rel, "rc": rc, "seconds": round(time.monotonic() - start, 1)}
        if node_ids != [rel]:
            entry["node_ids"] = node_ids
        if xml.exists():
            entry.update(parse_junit(xml))
        else:
            entry.update({"counts": {}, "problems": [], "output_tail": tail})
        if rc != 0 and not entry["problems"]:
            entry["output_tail"] = tail  # e.g. a collection or usage error
        if stats.exists():
            swap = json.loads(stats.read_text())
            entry["swap"] = {k: v for k, v in swap.items() if k != "per_test"}
        print(f"{rel}: rc={rc} {entry['seconds']}s {format_counts(entry)}", flush=True)
        return entry

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max(1, jobs)) as pool:
        futures = [pool.submit(run_one, rel, ids, Path(tmp)) for rel, ids in groups.items()]
        return [f.result() for f in futures]


COUNT_KINDS = ("passed", "failed", "errors", "skipped", "xfailed")
SWAP_COUNTS = ("built", "refused", "tests_that_built", "passed_with_manager")


def format_counts(entry: dict) -> str:
    c = entry["counts"]
    text = " ".join(f"{k}={c.get(k, 0)}" for k in COUNT_KINDS)
    if "swap" in entry:
        s = entry["swap"]
        text += (
            f" | manager built={s['built']} (in {s['tests_that_built']} tests) refused={s['refused']}"
            f" passed_with_manager={s['passed_with_manager']}"
        )
    return text


def totals(results: list[dict]) -> dict:
    """Counts summed over files, with the swap counts when there are any."""
    out: dict = {"counts": dict.fromkeys(COUNT_KINDS, 0), "seconds": 0.0}
    swap = [r["swap"] for r in results if "swap" in r]
    if swap:
        out["swap"] = {
            "kv_manager": swap[0]["kv_manager"],
            **{k: sum(s[k] for s in swap) for k in SWAP_COUNTS},
            "passed_without_manager": [t for s in swap for t in s["passed_without_manager"]],
        }
    for r in results:
        for k, v in r["counts"].items():
            out["counts"][k] = out["counts"].get(k, 0) + v
        out["seconds"] += r["seconds"]
    out["seconds"] = round(out["seconds"], 1)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = []
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--version", help="vLLM version of the tests (default: the installed one)")
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    ap.add_argument("--kv-manager", help="module:Class swapped in for the scheduler's KVCacheManager")
    ap.add_argument(
        "--denylist", type=Path, help="denied tests: skipped or expected to fail (vllm_conformance_plugin)"
    )
    ap.add_argument("--allowlist", type=Path, help='JSON whose "run" keys are the default TARGETs')
    ap.add_argument("--per-file", action="store_true", help="one pytest process per test file")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per file (with --per-file)")
    ap.add_argument("--jobs", type=int, default=1, help="files run at the same time (with --per-file)")
    ap.add_argument("--summary", type=Path, help="write per-file results as JSON (with --per-file)")
    ap.add_argument("targets", nargs="*")
    args = ap.parse_args(argv)

    dest = fetch(args.version, args.root)
    paths, opts = args.targets, passthrough
    if not paths:
        paths = list(load_allowlist(args.allowlist)["run"]) if args.allowlist else [DEFAULT_TARGET]
    if not args.per_file:
        return subprocess.call(
            pytest_cmd([*opts, *paths]), cwd=dest, env=child_env(args.kv_manager, args.denylist)
        )
    start = time.monotonic()
    results = run_per_file(dest, paths, opts, args.kv_manager, args.timeout, args.denylist, args.jobs)
    wall = round(time.monotonic() - start, 1)
    total = totals(results)
    total["wall_seconds"] = wall
    print(f"TOTAL: {wall}s wall ({total['seconds']}s of file runs) {format_counts(total)}", flush=True)
    if args.summary:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(
            json.dumps(
                {
                    "kv_manager": args.kv_manager or "stock",
                    "denylist": str(args.denylist or ""),
                    "allowlist": str(args.allowlist or ""),
                    "vllm_tests": str(dest),
                    "total": total,
                    "files": results,
                },
                indent=2,
            )
            + "\n"
        )
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
