"""Host time per step inside the server: record format, writer, wrappers (fake and real vLLM classes),
the harness reader, and (slow) real paged and tagma servers writing it."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.analysis import host_time as reader
from tagma.probes import host_time_hooks as hooks
from tagma.probes.host_time import (
    COLUMNS,
    ChunkWriter,
    HostTimeChunk,
    HostTimeFormatError,
    host_time_files,
    interval_from_env,
    process_file,
    read_chunks,
)

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------- records


def _chunk(role: str = "scheduler", rows: int = 3, start: int = 0) -> HostTimeChunk:
    width = len(COLUMNS[role])
    return HostTimeChunk(
        role=role, pid=123, backend="paged", t=1.5, timer_overhead_ns=700, columns=COLUMNS[role],
        rows=[(start + i, *range(10 * i, 10 * i + width - 1)) for i in range(rows)],
    )  # fmt: skip


@pytest.mark.parametrize("role", ["scheduler", "worker"])
def test_chunk_round_trip(role: str) -> None:
    chunk = _chunk(role)
    back = HostTimeChunk.from_json(chunk.to_json())
    assert back == chunk
    assert "\n" not in chunk.to_json()


def test_chunk_rejects_bad_lines() -> None:
    good = json.loads(_chunk().to_json())
    with pytest.raises(HostTimeFormatError, match="unknown role"):
        HostTimeChunk.from_json(json.dumps(good | {"role": "api"}))
    with pytest.raises(HostTimeFormatError, match="columns of role 'scheduler'"):
        HostTimeChunk.from_json(json.dumps(good | {"columns": good["columns"][::-1]}))
    with pytest.raises(HostTimeFormatError, match="a row has 2 values"):
        HostTimeChunk.from_json(json.dumps(good | {"rows": [[1, 2]]}))
    with pytest.raises(HostTimeFormatError, match="format version 7"):
        HostTimeChunk.from_json(json.dumps(good | {"version": 7}))
    with pytest.raises(HostTimeFormatError, match="lacks the field 'pid'"):
        HostTimeChunk.from_json(json.dumps({k: v for k, v in good.items() if k != "pid"}))
    with pytest.raises(HostTimeFormatError, match="bad value"):
        HostTimeChunk.from_json(json.dumps(good | {"rows": [["x"] * len(good["columns"])]}))
    with pytest.raises(HostTimeFormatError, match="not a JSON line"):
        HostTimeChunk.from_json("{cut")


def test_file_names_and_reading(tmp_path: Path) -> None:
    base = tmp_path / "host_time.jsonl"
    sched = process_file(base, "scheduler", 11)
    worker = process_file(base, "worker", 12)
    assert (sched.name, worker.name) == ("host_time.scheduler.11.jsonl", "host_time.worker.12.jsonl")
    with pytest.raises(ValueError, match="unknown role"):
        process_file(base, "api", 1)
    sched.write_text(_chunk().to_json() + "\n" + _chunk(start=3).to_json() + "\n" + '{"version": 1, "ro')
    worker.write_text(_chunk("worker").to_json() + "\n")
    assert host_time_files(base) == sorted([sched, worker])
    assert host_time_files(base, "worker") == [worker]
    chunks = read_chunks(sched)  # the cut last line (a killed writer) is skipped
    assert [r[0] for c in chunks for r in c.rows] == [0, 1, 2, 3, 4, 5]
    sched.write_text("garbage\n" + _chunk().to_json() + "\n")
    with pytest.raises(HostTimeFormatError, match=r"scheduler\.11\.jsonl:1"):
        read_chunks(sched)


def test_interval_from_env() -> None:
    assert interval_from_env({}) == 0.5
    assert interval_from_env({"TAGMA_TELEMETRY_INTERVAL_S": "2"}) == 2.0
    assert interval_from_env({"TAGMA_TELEMETRY_INTERVAL_S": "0"}) == 0.5
    with pytest.raises(ValueError, match="not a number"):
        interval_from_env({"TAGMA_TELEMETRY_INTERVAL_S": "soon"})


def test_writer_flushes_on_interval_and_on_close(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    with pytest.raises(ValueError, match="interval"):
        ChunkWriter(path, "scheduler", "paged", 0.0)
    writer = ChunkWriter(path, "scheduler", "paged", 0.05)
    assert writer.timer_overhead_ns > 0
    width = len(COLUMNS["scheduler"])
    writer.add((0,) * width)
    writer.add((1,) * width)
    deadline = time.monotonic() + 5
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # the flusher thread writes without any further call
    assert [r[0] for c in read_chunks(path) for r in c.rows] == [0, 1]
    writer.add((2,) * width)
    writer.close()
    writer.close()  # idempotent
    chunks = read_chunks(path)
    assert [r[0] for c in chunks for r in c.rows] == [0, 1, 2]
    assert all(c.pid == os.getpid() and c.backend == "paged" for c in chunks)
    assert writer.flush() == 0  # nothing left: no empty line


# ------------------------------------------------------------------------- wrappers on fake classes


class FakeClock:
    """Stands in for thread_time_ns: each read advances by ``tick``; ``burn`` models work."""

    def __init__(self, tick: int) -> None:
        self.now = 0
        self.tick = tick
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        self.now += self.tick
        return self.now

    def burn(self, ns: int) -> None:
        self.now += ns


CLOCK = FakeClock(0)


class FakeManager:
    """Plays vLLM's KVCacheManager: allocate_slots calls another public method on self (nested)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def get_computed_blocks(self, request: Any) -> int:
        CLOCK.burn(100)
        return 0

    def allocate_slots(self, request: Any, n: int) -> list[int]:
        CLOCK.burn(1000)
        self.create_kv_cache_blocks()  # nested: not a second timed call
        return list(range(n))

    def create_kv_cache_blocks(self) -> None:
        CLOCK.burn(10)

    def free(self, request: Any) -> None:
        CLOCK.burn(300)

    def new_step_starts(self) -> None:
        CLOCK.burn(1)


class FakeTagmaManager(FakeManager):
    """Plays tagma's subclass: overrides that call super() (and do no work of their own here)."""

    def allocate_slots(self, request: Any, n: int) -> list[int]:
        return super().allocate_slots(request, n)

    def free(self, request: Any) -> None:
        super().free(request)

    def new_step_starts(self) -> None:
        super().new_step_starts()


class LazyIds(list):
    """Plays tagma's RangeBlocks: the ids exist only once the manager's deferred work has run."""

    def __init__(self, manager: FakeDeferringManager, n: int) -> None:
        super().__init__()
        self.manager, self.n = manager, n

    def __iter__(self):  # type: ignore[no-untyped-def]
        if not list.__len__(self):
            self.manager._flush()
            self.extend(range(self.n))
        return list.__iter__(self)


class FakeDeferringManager(FakeManager):
    """Plays tagma's range manager: allocate_slots only queues; the engine call (``_flush``, 700 ns) runs when
    the scheduler first reads the new ids, outside any manager method."""

    DEFERRED_WORK_METHODS = ("_flush",)

    def allocate_slots(self, request: Any, n: int) -> list[int]:  # type: ignore[override]
        CLOCK.burn(300)
        return LazyIds(self, n)

    def _flush(self) -> None:
        CLOCK.burn(700)


@dataclass
class FakeNewReq:
    block_ids: tuple[list[int], ...]


@dataclass
class FakeCached:
    new_block_ids: list[tuple[list[int], ...] | None]


@dataclass
class FakeOutput:
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_new_reqs: list[FakeNewReq] = field(default_factory=list)
    scheduled_cached_reqs: FakeCached = field(default_factory=lambda: FakeCached([]))


class FakeScheduler:
    vllm_config = None

    def __init__(self, manager: FakeManager) -> None:
        self.kv_cache_manager = manager
        self.step = 0

    def schedule(self) -> FakeOutput:
        m = self.kv_cache_manager
        m.new_step_starts()
        CLOCK.burn(5000)
        if self.step == 0:
            m.get_computed_blocks("a")
            ids = list(m.allocate_slots("a", 3))  # building the step's output reads the new ids
            self.step += 1
            return FakeOutput({"a": 40}, 40, [FakeNewReq((ids,))])
        ids = list(m.allocate_slots("a", 1))
        self.step += 1
        return FakeOutput({"a": 1}, 1, [], FakeCached([(ids,)]))

    def update_from_output(self, out: FakeOutput, model_output: Any) -> None:
        CLOCK.burn(2000)
        if self.step == 2:
            self.kv_cache_manager.free("a")
            self.kv_cache_manager.free("a")


class ListWriter:
    def __init__(self) -> None:
        self.rows: list[tuple[int, ...]] = []

    def add(self, row: tuple[int, ...]) -> None:
        self.rows.append(row)


def _run_fake(manager_cls: type, tick: int, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, int]]:
    global CLOCK
    CLOCK = FakeClock(tick)
    monkeypatch.setattr(hooks, "_clock", CLOCK)
    clock = hooks.SchedulerClock()
    writer = ListWriter()
    clock.writer_factory = lambda role, backend: writer  # type: ignore[assignment,return-value]

    sched_cls = type("Sched", (FakeScheduler,), {})
    hooks.wrap_scheduler_class(sched_cls, clock)
    hooks.wrap_scheduler_class(sched_cls, clock)  # idempotent
    manager = manager_cls()
    hooks.instrument_kv_manager(manager, clock, hooks.kv_manager_methods(FakeManager))
    hooks.instrument_kv_manager(manager, clock, hooks.kv_manager_methods(FakeManager))  # idempotent
    scheduler = sched_cls(manager)
    for _ in range(2):
        out = scheduler.schedule()
        scheduler.update_from_output(out, None)
    manager.free("b")  # between steps (an abort): charged to the next step
    out = scheduler.schedule()
    scheduler.update_from_output(out, None)
    rows = [dict(zip(COLUMNS["scheduler"], row, strict=True)) for row in writer.rows]
    assert all(r.pop("end_ns") > 0 for r in rows)  # wall time: differs between runs
    return rows


def test_wrappers_split_a_step_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _run_fake(FakeManager, tick=0, monkeypatch=monkeypatch)
    assert [r["step"] for r in rows] == [0, 1, 2]
    first, second, third = rows
    # step 0: new_step_starts 1 + get_computed_blocks 100 + allocate_slots 1000 (+ nested 10, once)
    assert first["kv_manager_ns"] == 1111 and first["kv_calls"] == 3
    assert first["schedule_other_ns"] == 5000
    assert first["update_other_ns"] == 2000 and first["update_kv_manager_ns"] == 0
    assert (first["num_reqs"], first["num_tokens"], first["new_block_ids"]) == (1, 40, 3)
    # step 1: two frees in update_from_output
    assert second["kv_manager_ns"] == 1011 and second["kv_calls"] == 2
    assert second["update_kv_manager_ns"] == 600 and second["update_kv_calls"] == 2
    assert second["update_other_ns"] == 2000
    assert (second["num_reqs"], second["num_tokens"], second["new_block_ids"]) == (1, 1, 1)
    # step 2: the free between steps
    assert third["outside_kv_manager_ns"] == 300 and third["outside_kv_calls"] == 1
    assert second["outside_kv_manager_ns"] == 0


def test_tagma_like_overrides_count_once_and_cost_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    # Exact with a free clock: the subclass's super() chain is not timed a second time.
    assert _run_fake(FakeTagmaManager, 0, monkeypatch) == _run_fake(FakeManager, 0, monkeypatch)
    # With a clock that costs 7 ns a read, every number is still identical: the instrumentation reads the
    # clock exactly as often on both arms (no extra wrapper layer for a subclass's overrides).
    paged = _run_fake(FakeManager, 7, monkeypatch)
    paged_reads = CLOCK.reads
    tagma = _run_fake(FakeTagmaManager, 7, monkeypatch)
    assert CLOCK.reads == paged_reads
    assert paged == tagma
    assert paged[0]["kv_manager_ns"] == 1111 + 3 * 7  # one clock read's cost inside each timed call


def test_async_order_pairs_each_schedule_with_its_own_update(monkeypatch: pytest.MonkeyPatch) -> None:
    global CLOCK
    CLOCK = FakeClock(0)
    monkeypatch.setattr(hooks, "_clock", CLOCK)
    clock = hooks.SchedulerClock()
    writer = ListWriter()
    clock.writer_factory = lambda role, backend: writer  # type: ignore[assignment,return-value]
    sched_cls = type("Sched", (FakeScheduler,), {})
    hooks.wrap_scheduler_class(sched_cls, clock)
    manager = FakeManager()
    hooks.instrument_kv_manager(manager, clock, hooks.kv_manager_methods(FakeManager))
    scheduler = sched_cls(manager)
    first = scheduler.schedule()  # async scheduling: the next step is scheduled before this one's update
    second = scheduler.schedule()
    scheduler.update_from_output(first, None)
    scheduler.update_from_output(second, None)
    rows = [dict(zip(COLUMNS["scheduler"], r, strict=True)) for r in writer.rows]
    assert [(r["step"], r["num_tokens"], r["kv_manager_ns"]) for r in rows] == [(0, 40, 1111), (1, 1, 1011)]
    assert [r["update_kv_manager_ns"] for r in rows] == [600, 600]  # each update's own frees


def test_deferred_work_is_charged_to_the_kv_manager_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ids a deferring manager returns are read by the scheduler's own code (here: the step's context
    counts the new block ids); the deferred engine call is still the manager's time, not schedule_other."""
    rows = _run_fake(FakeDeferringManager, tick=0, monkeypatch=monkeypatch)
    first = rows[0]
    # new_step_starts 1 + get_computed_blocks 100 + allocate_slots 300 + the deferred _flush 700
    assert first["kv_manager_ns"] == 1101 and first["kv_calls"] == 4
    assert first["schedule_other_ns"] == 5000  # as for vLLM's manager: only the scheduler's own work
    assert first["new_block_ids"] == 3


class FakeBlockTable:
    def __init__(self) -> None:
        self.rows: dict[int, list[int]] = {}

    def append_row(self, ids: list[int], row: int) -> None:
        CLOCK.burn(20)
        self.rows.setdefault(row, []).extend(ids)

    def commit_block_table(self, n: int) -> None:
        CLOCK.burn(30)

    def compute_slot_mapping(self, n: int, qsl: Any, pos: Any) -> None:
        CLOCK.burn(40)


class FakeRunner:
    vllm_config = None

    def __init__(self) -> None:
        self.block_table = FakeBlockTable()

    def _update_states(self, out: FakeOutput) -> None:
        CLOCK.burn(500)
        self.block_table.append_row([1, 2], 0)

    def _prepare_inputs(self, out: FakeOutput, n: Any) -> None:
        CLOCK.burn(700)
        self.block_table.commit_block_table(1)
        self.block_table.compute_slot_mapping(1, None, None)

    def execute_model(self, out: FakeOutput) -> None:
        self._update_states(out)
        self._prepare_inputs(out, None)
        CLOCK.burn(100000)  # the forward pass: not preparation


def test_worker_wrappers(monkeypatch: pytest.MonkeyPatch) -> None:
    global CLOCK
    CLOCK = FakeClock(0)
    monkeypatch.setattr(hooks, "_clock", CLOCK)
    clock = hooks.WorkerClock()
    writer = ListWriter()
    clock.writer_factory = lambda role, backend: writer  # type: ignore[assignment,return-value]
    runner_cls = type("Runner", (FakeRunner,), {})
    table_cls = type("Table", (FakeBlockTable,), {})
    hooks.wrap_runner_class(runner_cls, clock)
    hooks.wrap_block_table_class(table_cls, clock)
    hooks.wrap_runner_class(runner_cls, clock)  # idempotent
    hooks.wrap_block_table_class(table_cls, clock)
    runner = runner_cls()
    runner.block_table = table_cls()
    runner.block_table.commit_block_table(1)  # outside a step (a dummy run): not counted
    runner._prepare_inputs(FakeOutput({}, 0), None)
    runner.execute_model(FakeOutput({"a": 5, "b": 1}, 6))
    (row,) = [dict(zip(COLUMNS["worker"], r, strict=True)) for r in writer.rows]
    assert row["update_states_ns"] == 520 and row["prepare_inputs_ns"] == 770
    assert row["worker_prepare_ns"] == 1290
    assert row["block_table_ns"] == 90 and row["block_table_calls"] == 3
    assert (row["num_reqs"], row["num_tokens"], row["step"]) == (2, 6, 0)


def test_nothing_is_wrapped_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TAGMA_HOST_TIME_FILE", raising=False)
    monkeypatch.delenv("TAGMA_TELEMETRY_FILE", raising=False)
    assert hooks.install_engine_side() is False
    assert hooks.install_worker_side() is False
    manager = FakeManager()
    before = dict(manager.__dict__)
    hooks.after_kv_manager_init(manager)
    assert manager.__dict__ == before  # no instance attribute: the class's methods, untouched


# --------------------------------------------------------------------- real vLLM and tagma managers


def test_real_managers_instrumented_identically(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    from tagma.core.registry import build_kv_cache_manager
    from tests.tagma.twin import make_config, make_request, manager_kwargs

    monkeypatch.setenv("TAGMA_HOST_TIME_FILE", str(tmp_path / "host_time.jsonl"))
    monkeypatch.setenv("TAGMA_TELEMETRY_FILE", str(tmp_path / "telemetry.jsonl"))
    monkeypatch.setenv("TAGMA_TELEMETRY_INTERVAL_S", "0")
    methods = hooks.kv_manager_methods(KVCacheManager)
    assert {"allocate_slots", "free", "get_computed_blocks", "new_step_starts", "take_new_block_ids"} <= set(
        methods
    )
    monkeypatch.setattr(hooks, "KV_MANAGER_METHODS", methods)
    clocks = {}
    managers = {}
    for name, cls in (("paged", KVCacheManager), ("tagma", build_kv_cache_manager)):
        manager = cls(make_config(64), **manager_kwargs())
        clocks[name] = hooks.SchedulerClock()
        hooks.after_kv_manager_init(manager, clocks[name])
        managers[name] = manager
    paged, tagma = managers["paged"], managers["tagma"]
    assert paged.telemetry.policy == "paged" and tagma.telemetry.policy == "headroom"
    for manager in managers.values():
        assert set(methods) <= set(manager.__dict__)  # instance attributes: one timed layer each
        req = make_request("r", list(range(100)))
        computed, hit, _ = manager.get_computed_blocks(req)
        manager.allocate_slots(req, 100 - hit, hit, computed)
        manager.new_step_starts()
        manager.free(req)
    assert clocks["paged"].kv_calls == clocks["tagma"].kv_calls == [4, 0, 0]
    assert all(c.kv_ns[0] > 0 for c in clocks.values())
    lines = [json.loads(s) for s in (tmp_path / "telemetry.jsonl").read_text().splitlines()]
    by_policy = {ln["policy"]: ln for ln in lines}
    assert set(by_policy) == {"paged", "headroom"}
    for line in by_policy.values():  # contiguity measured by the same code on both
        assert line["live_requests"] == 1
        assert line["ranges_per_request"] == {"mean": 1.0, "p99": 1.0, "max": 1}
    assert "in_place_growths" in by_policy["headroom"] and "in_place_growths" not in by_policy["paged"]


def test_block_runs_incremental() -> None:
    from tagma.probes.telemetry import BlockRuns, runs_summary

    @dataclass
    class B:
        block_id: int

    runs = BlockRuns()
    table: dict[str, list[B]] = {"a": [B(7), B(8), B(9)], "b": [], "c": [B(3)]}
    assert runs.update(table) == [1, 1]  # "b" holds nothing: not live
    table["a"] += [B(3), B(4)]
    table["c"] += [B(4), B(10)]
    assert runs.update(table) == [2, 2]
    table["a"] = [B(20), B(21)]  # freed and allocated again: walked from the start
    assert runs.update(table) == [1, 2]
    assert runs_summary([]) == {"mean": 0.0, "p99": 0.0, "max": 0}
    assert runs_summary([1] * 99 + [5]) == {"mean": 1.04, "p99": 1.0, "max": 5}


# ------------------------------------------------------------------------------------- the reader


def _write_run(tmp_path: Path, sched_rows: list[tuple[int, ...]], worker_rows: list[tuple[int, ...]]) -> Path:
    base = tmp_path / "host_time.jsonl"
    for role, rows, pid in (("scheduler", sched_rows, 10), ("worker", worker_rows, 11)):
        chunk = HostTimeChunk(role=role, pid=pid, backend="tagma", t=0.0, timer_overhead_ns=100,
                              columns=COLUMNS[role], rows=rows)  # fmt: skip
        process_file(base, role, pid).write_text(chunk.to_json() + "\n")
    return tmp_path


def _sched_row(step: int, kv: int, reqs: int, tokens: int) -> tuple[int, ...]:
    # step kv upd_kv out_kv sched_other upd_other kv_calls upd_calls out_calls reqs tokens new_ids end_ns
    return (step, kv, 500, 0, 4000, 3000, 2, 1, 0, reqs, tokens, 1, 1000 + step)


def _worker_row(step: int, reqs: int, tokens: int) -> tuple[int, ...]:
    # step upd_states prep_inputs worker_prep block_table bt_calls reqs tokens exec_wall end_ns
    return (step, 2000, 3000, 5000, 800, 2, reqs, tokens, 10**6, 1000 + step)


def test_reader_per_step_arrays_and_summary(tmp_path: Path) -> None:
    steps = [(0, 1000, 1, 40), (1, 2000, 2, 2), (2, 0, 0, 0), (3, 3000, 2, 2)]
    sched = [_sched_row(s, kv, r, t) for s, kv, r, t in steps]
    run_dir = _write_run(tmp_path, sched, [_worker_row(s, r, t) for s, _, r, t in steps])
    run = reader.load_run(run_dir)
    assert run.backend == "tagma" and run.aligned and run.num_steps == 4
    assert run.steps["kv_manager_ns"].tolist() == [1000, 2000, 0, 3000]
    assert run.steps["kv_manager_ns_net"].tolist() == [800, 1800, -200, 2800]  # 2 calls x 100 ns clock
    assert run.steps["kv_manager_total_ns"].tolist() == [1500, 2500, 500, 3500]
    assert run.steps["schedule_other_ns_net"].tolist() == [3700] * 4  # (2 calls + itself) x 100
    assert run.steps["update_other_ns_net"].tolist() == [2800] * 4
    assert run.steps["worker_prepare_ns_net"].tolist() == [5000 - 100 * 6] * 4
    assert run.steps["block_table_ns_net"].tolist() == [600] * 4
    summary = reader.summarize(run)
    assert summary["steps"] == 3 and summary["steps_total"] == 4  # the idle step left out
    kv = summary["components"]["kv_manager_ns_net"]
    assert kv["mean_ns"] == pytest.approx((800 + 1800 + 2800) / 3)
    assert kv["p50_ns"] == 1800
    assert kv["per_request_ns"] == pytest.approx((800 + 1800 + 2800) / 5)
    assert summary["components"]["worker_prepare_ns_net"]["mean_ns"] == 4400
    assert reader.summarize(run, since_ns=1002)["steps"] == 1
    assert json.dumps(summary)  # plain JSON for the report


def test_reader_refuses_misaligned_workers_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="host_time.scheduler"):
        reader.load_run(tmp_path)
    run_dir = _write_run(tmp_path, [_sched_row(0, 1000, 1, 40)], [_worker_row(0, 1, 41)])
    run = reader.load_run(run_dir)
    assert not run.aligned and len(run.worker) == 1
    assert "worker_prepare_ns_net" not in run.steps
    assert "worker_prepare_ns_net" not in reader.summarize(run)["components"]
    gap = [_sched_row(0, 1, 1, 1), _sched_row(2, 1, 1, 1)]
    _write_run(tmp_path, gap, [])
    with pytest.raises(ValueError, match="not consecutive"):
        reader.load_run(tmp_path)


def test_reader_imports_no_vllm() -> None:
    import subprocess
    import sys

    code = (
        "import sys, harness.analysis.host_time; "
        "assert 'vllm' not in sys.modules and 'torch' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------------------- real servers (slow)


@pytest.mark.slow
def test_real_servers_write_host_time(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    import asyncio

    from harness.client import run_requests
    from harness.serve.launcher import Server, ServerSpec

    model = REPO / "data" / "tiny-llama"
    schemas = {}
    summaries = {}
    for backend in ("paged", "tagma"):
        run_dir = tmp_path / backend
        run_dir.mkdir()
        env = {
            "TAGMA_HOST_TIME_FILE": str(run_dir / "host_time.jsonl"),
            "TAGMA_TELEMETRY_FILE": str(run_dir / "tagma_telemetry.jsonl"),
            "TAGMA_TELEMETRY_INTERVAL_S": "0.2",
        }
        spec = ServerSpec(model=str(model), backend=backend, max_model_len=2048, kv_cache_space_gib=1,
                          env=env)  # fmt: skip
        with Server(spec, run_dir / "server.log") as server:
            requests = _requests(4)
            results, _ = asyncio.run(run_requests(server.base_url, str(model), requests, [0.0] * 4,
                                                  max_concurrency=4, timeout_s=300))  # fmt: skip
            assert all(r.success for r in results), [r.error for r in results]
            time.sleep(0.6)  # more than one flush interval: every finished step is on disk
            run = reader.load_run(run_dir)
        assert run.backend == backend and run.aligned, run.files
        busy = run.steps["num_tokens"] > 0
        assert busy.sum() >= 8
        assert (run.steps["kv_manager_ns"][busy] > 0).all()
        assert (run.steps["worker_prepare_ns"][busy] > 0).all()
        assert (run.steps["block_table_ns"][busy] > 0).all()
        schemas[backend] = sorted(run.steps)
        summaries[backend] = reader.summarize(run)
        telemetry = [json.loads(s) for s in (run_dir / "tagma_telemetry.jsonl").read_text().splitlines()]
        assert max(t["peak_live_requests"] for t in telemetry) >= 1
        assert telemetry[-1]["policy"] == ("paged" if backend == "paged" else "headroom")
    assert schemas["paged"] == schemas["tagma"]
    assert set(summaries["paged"]["components"]) == set(summaries["tagma"]["components"])


@dataclass(frozen=True)
class _Req:  # what harness.client needs of a request
    index: int
    prompt: str
    prompt_tokens: int
    max_tokens: int


def _requests(n: int) -> list[_Req]:
    rng = np.random.default_rng(0)
    return [_Req(i, " ".join(f"w{x}" for x in rng.integers(0, 5000, 300)), 300, 16) for i in range(n)]
