"""Host time per step inside the server, its wrappers on fake scheduler, KV manager, runner and block-table
classes: a step split exactly into its parts, overrides counted once, async order, deferred work charged
where it runs, and nothing wrapped when unset."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tagma.contract import ENV_HOST_TIME_FILE, ENV_TELEMETRY_FILE
from tagma.probes import host_time_hooks as hooks
from tagma.probes.host_time import COLUMNS

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


class FakeBlocks:
    """Plays vLLM's KVCacheBlocks: ids built from block objects when read."""

    def get_block_ids(self) -> tuple[list[int], ...]:
        CLOCK.burn(50)
        return ([1, 2],)


class FakeRunBlocks(FakeBlocks):
    """Plays tagma's lazy blocks: ids (and block lists, a property) built from runs when read."""

    def get_block_ids(self) -> tuple[list[int], ...]:
        CLOCK.burn(200)
        return ([1, 2],)

    @property
    def blocks(self) -> tuple[list[int], ...]:
        CLOCK.burn(80)
        return ([1, 2],)


class FakeBlockManager(FakeManager):
    blocks_cls: type = FakeRunBlocks

    def get_blocks(self, request: Any) -> FakeBlocks:
        CLOCK.burn(10)
        blocks = self.blocks_cls()
        blocks.get_block_ids()  # a read inside the manager's call: that call's time, counted once
        return blocks


def test_block_id_reads_outside_the_manager_are_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's and tagma's block-id reads made in the scheduler's own code count as the KV manager's time;
    a read inside a manager call is that call's, counted once."""
    global CLOCK
    CLOCK = FakeClock(0)
    monkeypatch.setattr(hooks, "_clock", CLOCK)
    clock = hooks.SchedulerClock()
    base = type("Blocks", (), {"get_block_ids": FakeBlocks.get_block_ids})
    runs = type("RunBlocks", (base,), {"get_block_ids": FakeRunBlocks.get_block_ids,
                                       "blocks": FakeRunBlocks.blocks})  # fmt: skip
    assert sorted(hooks.wrap_block_id_reads(clock, base)) == [
        "Blocks.get_block_ids", "RunBlocks.blocks", "RunBlocks.get_block_ids",
    ]  # fmt: skip
    assert hooks.wrap_block_id_reads(clock, base) == []  # idempotent
    later = type("LaterBlocks", (base,), {"get_block_ids": FakeRunBlocks.get_block_ids})
    assert hooks.wrap_block_id_reads(clock, base) == ["LaterBlocks.get_block_ids"]  # defined after: wrapped

    clock.phase = hooks.SCHEDULE
    base().get_block_ids()  # vLLM's read in the scheduler's code
    assert (clock.kv_ns[hooks.SCHEDULE], clock.kv_calls[hooks.SCHEDULE]) == (50, 1)
    runs().get_block_ids()
    runs().blocks  # noqa: B018 - the property read is the work
    later().get_block_ids()
    assert (clock.kv_ns[hooks.SCHEDULE], clock.kv_calls[hooks.SCHEDULE]) == (50 + 200 + 80 + 200, 4)

    manager = FakeBlockManager()
    manager.blocks_cls = runs
    hooks.instrument_kv_manager(manager, clock, ("get_blocks",))
    got = manager.get_blocks("a")
    assert (clock.kv_ns[hooks.SCHEDULE], clock.kv_calls[hooks.SCHEDULE]) == (530 + 10 + 200, 5)
    assert isinstance(got, runs)
    clock.phase = hooks.OUTSIDE


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
        self._get_slot_mappings()
        self._build_attention_metadata()
        self._preprocess()
        self._model_forward()

    def _get_slot_mappings(self) -> None:
        CLOCK.burn(60)

    def _build_attention_metadata(self) -> None:
        CLOCK.burn(250)
        self._get_slot_mappings()  # nested: counted once, in the outer part

    def _preprocess(self) -> None:
        CLOCK.burn(80)

    def _model_forward(self) -> None:
        CLOCK.burn(100000)  # the forward pass: not preparation


def test_worker_wrappers(monkeypatch: pytest.MonkeyPatch) -> None:
    global CLOCK
    CLOCK = FakeClock(0)
    monkeypatch.setattr(hooks, "_clock", CLOCK)
    clock = hooks.WorkerClock()
    writer = ListWriter()
    parts = ListWriter()
    writers = {"worker": writer, "worker_parts": parts}
    clock.writer_factory = lambda role, backend: writers[role]  # type: ignore[assignment,return-value]
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
    (part,) = [dict(zip(COLUMNS["worker_parts"], r, strict=True)) for r in parts.rows]
    assert (part["step"], part["end_ns"]) == (0, row["end_ns"])
    assert (part["slot_mappings_ns"], part["attn_metadata_ns"], part["preprocess_ns"]) == (60, 310, 80)
    assert part["forward_cpu_ns"] == 100000 and part["forward_wall_ns"] > 0
    runner._model_forward()  # outside a step: not counted
    assert len(parts.rows) == 1


def test_worker_parts_need_every_method(monkeypatch: pytest.MonkeyPatch) -> None:
    global CLOCK
    CLOCK = FakeClock(0)
    monkeypatch.setattr(hooks, "_clock", CLOCK)
    clock = hooks.WorkerClock()
    roles: list[str] = []
    clock.writer_factory = lambda role, backend: roles.append(role) or ListWriter()  # type: ignore[assignment,func-returns-value]
    runner_cls = type("Runner", (FakeRunner,), {"_preprocess": None})  # an older runner: one part missing

    def execute_model(self: Any, out: FakeOutput) -> None:
        self._update_states(out)
        self._prepare_inputs(out, None)

    runner_cls.execute_model = execute_model
    hooks.wrap_runner_class(runner_cls, clock)
    runner_cls().execute_model(FakeOutput({"a": 1}, 1))
    assert roles == ["worker"]  # no worker_parts rows rather than a part read as zero


def test_nothing_is_wrapped_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_HOST_TIME_FILE, raising=False)
    monkeypatch.delenv(ENV_TELEMETRY_FILE, raising=False)
    assert hooks.install_engine_side() is False
    assert hooks.install_worker_side() is False
    manager = FakeManager()
    before = dict(manager.__dict__)
    hooks.after_kv_manager_init(manager)
    assert manager.__dict__ == before  # no instance attribute: the class's methods, untouched
